"""The control channel as the host's Backend handles it (spec §2.3-§2.12, clauses CTL-*):
message parsing and its error order, hello, features, status, config, vrings, kicks,
calls, ping and bye, driven through Backend.handle with encoded messages (sans-IO)."""

import struct
import time

import msgpack
import pytest

from pvgpu.spec import wire
from pvgpu.transport import codec
from pvgpu.transport.memory import InlineGuestMemory, SharedGuestMemory
from pvgpu.transport.peer import Peer
from pvgpu.transport.virtqueue import DriverQueue, VirtqLayout

from test_backend import MEM, Guest, _backend, cmd

CTL_ERRORS = {v for k, v in vars(wire).items() if k.startswith("CTL_ERR_")}
HELLO = dict(version=list(wire.PROTOCOL_VERSION), name="t", memory=wire.MEMORY_INLINE, mem_size=MEM)


@pytest.fixture
def backend():
    yield from _backend()


def send(backend, peer, msg, frames=()):
    """-> the decoded messages the backend sends for one raw message (msg: a map or bytes)."""
    raw = msg if isinstance(msg, bytes) else msgpack.packb(msg, use_bin_type=True)
    return [codec.decode(f)[0] for _p, f in backend.handle(peer, [raw, *frames], 0.0)]


def hello(g, **fields):
    return g.request(wire.OP_HELLO, **dict(HELLO, **fields))


def to_features_ok(g, dev=0, features=wire.DEVICE_FEATURES):
    for status in (1, 3):
        assert g.request(wire.OP_SET_STATUS, dev=dev, status=status)["ok"]
    assert g.request(wire.OP_SET_FEATURES, dev=dev, features=features)["ok"]
    assert g.request(wire.OP_SET_STATUS, dev=dev, status=11)["ok"]


def status(g, dev=0):
    return g.request(wire.OP_GET_STATUS, dev=dev)["status"]


def vring(g, dev=0, queue=0, size=64, **over):
    layout = VirtqLayout.at(0, size) if 1 <= size <= wire.MAX_QUEUE_SIZE and not size & (size - 1) else None
    fields = dict(dev=dev, queue=queue, size=size, desc=layout.desc, avail=layout.avail,
                  used=layout.used) if layout else dict(dev=dev, queue=queue, size=size)
    return g.request(wire.OP_SET_VRING, **dict(fields, **over))


def reinit(g, dev=0):
    """Reset the device and set it up again as Guest.init does, in the same session."""
    assert g.request(wire.OP_SET_STATUS, dev=dev, status=0)["ok"]
    to_features_ok(g, dev)
    layout = g.queue.layout
    g.mem.write(layout.desc, bytes(layout.end - layout.desc))
    g.queue = DriverQueue(g.mem, layout, event_idx=True, indirect=True)
    assert vring(g, dev)["ok"]
    assert g.request(wire.OP_ENABLE_VRING, dev=dev, queue=0, enable=True)["ok"]
    assert g.request(wire.OP_SET_STATUS, dev=dev, status=15)["ok"]


# --- messages and parsing (§2.3, §2.4) ---

def test_ctl_msg_3_every_request_gets_one_reply_that_echoes_its_seq(backend):
    # [ERR-CTL-1] every error is one of the CTL_ERR_* names
    peer = Peer(0, b"g", "c")
    for seq, msg in [(5, dict(HELLO, op="hello")), (9, {"op": "ping"}), (77, {"op": "frobnicate"}),
                     (3, {"op": "get_status", "dev": 9})]:
        (reply,) = send(backend, peer, dict(msg, seq=seq))
        assert reply["op"] == wire.OP_REPLY and reply["seq"] == seq
        if reply["ok"]:
            assert "error" not in reply
        else:
            assert reply["error"] in CTL_ERRORS and isinstance(reply["message"], str)


def test_ctl_msg_4_notifications_are_never_replied_to(backend):
    g = Guest(backend)
    g.init()
    peer = g.peer
    for note in ({"op": "kick", "dev": 0, "queue": 0}, {"op": "kick", "dev": 5, "queue": 0},
                 {"op": "call", "dev": 0, "queue": 0}, {"op": "config_changed", "dev": 0}):
        assert all(m["op"] != wire.OP_REPLY for m in send(backend, peer, note))


def test_ctl_msg_6_unknown_keys_are_ignored(backend):
    g = Guest(backend)
    r = hello(g, colour="blue", future={"a": 1})
    assert r["ok"]
    assert g.request(wire.OP_GET_STATUS, dev=0, extra_key=[1, 2])["ok"]


def test_ctl_msg_7_replies_come_in_request_order(backend):
    g = Guest(backend)
    hello(g)
    msgs = [{"op": "ping", "seq": 10}, {"op": "get_status", "dev": 0, "seq": 11},
            {"op": "get_status", "dev": 7, "seq": 12}, {"op": "get_features", "dev": 1, "seq": 13}]
    seqs = [r["seq"] for m in msgs for r in send(backend, g.peer, m) if r["op"] == wire.OP_REPLY]
    assert seqs == [10, 11, 12, 13]


def test_ctl_parse_1_a_frame_0_that_is_no_map_is_dropped_and_counted(backend):
    g = Guest(backend)
    hello(g)
    for junk in (b"\xc1\xff", msgpack.packb([1, 2, 3]), msgpack.packb("hello"), msgpack.packb({1: 2})):
        before = backend.stats["bad_messages"]
        assert send(backend, g.peer, junk) == []
        assert backend.stats["bad_messages"] == before + 1
    assert g.request(wire.OP_PING)["ok"]


def test_ctl_parse_2_bad_notifications_are_dropped_and_counted(backend):
    g = Guest(backend)
    g.init()
    stranger = Peer(0, b"stranger", "c-stranger")
    cases = [
        (g.peer, {"op": "kick", "dev": 0}),  # a required field missing
        (g.peer, {"op": "kick", "dev": "0", "queue": 0}),  # ill-typed
        (g.peer, {"op": "kick", "dev": 0, "queue": 0, "patches": [[-8, 0]]}),  # negative gpa
        (g.peer, {"op": "kick", "dev": 0, "queue": 0, "patches": [[0]]}),  # not pairs
        (g.peer, {"op": "call", "dev": 0, "queue": 0}),  # wrong direction
        (g.peer, {"op": "config_changed", "dev": 0}),
        (g.peer, {"op": "reply", "seq": 1, "ok": True}),  # v0.1 hosts send no requests
        (stranger, {"op": "kick", "dev": 0, "queue": 0}),  # no session
    ]
    for peer, note in cases:
        before = sum(backend.stats.values()) - backend.stats["sessions"]
        assert send(backend, peer, note, [b"x"]) == [], note
        assert sum(backend.stats.values()) - backend.stats["sessions"] == before + 1, note
    assert status(g) == 15


def test_ctl_parse_3_a_request_without_an_int_seq_is_dropped_and_counted(backend):
    peer = Peer(0, b"g", "c")
    for msg in (dict(HELLO, op="hello"), dict(HELLO, op="hello", seq="1"),
                dict(HELLO, op="hello", seq=True), dict(HELLO, op="hello", seq=1.0)):
        before = backend.stats["bad_messages"]
        assert send(backend, peer, msg) == []
        assert backend.stats["bad_messages"] == before + 1
    assert not backend.sessions


def test_ctl_parse_4_errors_come_in_the_order_the_spec_gives(backend):
    peer = Peer(0, b"g", "c")

    def error(msg):
        (r,) = send(backend, peer, dict(msg, seq=1))
        return r["error"]
    # before a session: every earlier check wins over no_session
    assert error({"dev": 0}) == wire.CTL_ERR_MISSING_FIELD
    assert error({"op": 5, "dev": 0}) == wire.CTL_ERR_MALFORMED
    assert error({"op": "frobnicate"}) == wire.CTL_ERR_UNKNOWN_OP
    assert error({"op": "get_status"}) == wire.CTL_ERR_MISSING_FIELD
    assert error({"op": "get_status", "dev": "0"}) == wire.CTL_ERR_MALFORMED
    assert error({"op": "set_vring", "dev": 0, "queue": 0, "size": 8, "desc": 0, "avail": 256,
                  "used": 512, "base": "0"}) == wire.CTL_ERR_MALFORMED  # an optional field
    assert error({"op": "get_status", "dev": 99}) == wire.CTL_ERR_NO_SESSION
    assert error({"op": "get_status", "dev": 0}) == wire.CTL_ERR_NO_SESSION


def test_ctl_parse_5_a_refused_request_changes_nothing(backend):
    g = Guest(backend)
    hello(g)
    to_features_ok(g)
    config = g.request(wire.OP_GET_CONFIG, dev=0)["config"]
    refused = [(wire.OP_SET_STATUS, dict(dev=0, status=15)),  # DRIVER_OK without a queue
               (wire.OP_SET_STATUS, dict(dev=0, status=1)),  # clears bits
               (wire.OP_SET_FEATURES, dict(dev=0, features=1 << 32)),  # after FEATURES_OK
               (wire.OP_SET_VRING, dict(dev=0, queue=0, size=100, desc=0, avail=2048, used=4096)),
               (wire.OP_ENABLE_VRING, dict(dev=0, queue=0, enable=True)),
               (wire.OP_SET_MEM_TABLE, dict(regions=[]))]
    for op, fields in refused:
        assert not g.request(op, **fields)["ok"], op
        assert status(g) == 11
        assert g.request(wire.OP_GET_CONFIG, dev=0)["config"] == config
    # the queue refused above stays unconfigured: enabling it is still refused
    assert g.request(wire.OP_ENABLE_VRING, dev=0, queue=0, enable=True)["error"] == wire.CTL_ERR_BAD_STATE


def test_ctl_parse_6_one_sessions_junk_leaves_another_session_alone(backend):
    # [DEV-ISOLATE-3] errors of one session affect only that session
    good, bad = Guest(backend, b"good"), Guest(backend, b"bad")
    good.init()
    hello(bad)
    before = status(good)
    for junk in (b"\x00", msgpack.packb({"op": 5, "seq": 1}), msgpack.packb({"op": "kick", "dev": "x"}),
                 msgpack.packb({"op": "kick", "dev": 0, "queue": 0, "patches": [[0, 9]]}),
                 msgpack.packb({"op": "kick", "dev": 0, "queue": 0, "patches": [[MEM - 1, 0]]}),
                 msgpack.packb({"op": "set_status", "dev": 0, "status": 0xff, "seq": 2})):
        for _peer, frames in backend.handle(bad.peer, [junk, b"ab"], 0.0):
            codec.decode(frames)
    assert status(good) == before
    hdr, _ = good.call(cmd(wire.CMD_NOP))
    assert hdr[0] == wire.RESP_OK_NODATA


# --- hello (§2.5) ---

def test_ctl_hello_1_hello_fields_are_checked(backend):
    g = Guest(backend)
    assert g.request(wire.OP_GET_CONFIG, dev=0)["error"] == wire.CTL_ERR_NO_SESSION  # hello first
    assert hello(g, memory="telepathy")["error"] == wire.CTL_ERR_MALFORMED
    for size in (0, 1000, wire.PAGE_SIZE + 1):
        assert hello(g, mem_size=size)["error"] == wire.CTL_ERR_MALFORMED
    assert hello(g, version=list(wire.PROTOCOL_VERSION))["ok"]  # the driver sends PROTOCOL_VERSION


def test_ctl_hello_2_major_version_must_match_minor_may_differ(backend):
    g = Guest(backend)
    major, minor = wire.PROTOCOL_VERSION
    for version in ([], [major + 1, minor], ["0", minor], [None]):
        assert hello(g, version=version)["error"] == wire.CTL_ERR_BAD_VERSION, version
    assert hello(g, version=[major, minor + 7])["ok"]


def test_ctl_hello_3_memory_beyond_the_host_limit_is_limit(backend):
    assert backend.max_mem_size <= wire.MAX_GUEST_MEM_SIZE
    g = Guest(backend)
    r = hello(g, mem_size=backend.max_mem_size + wire.PAGE_SIZE)
    assert r["error"] == wire.CTL_ERR_LIMIT
    assert not backend.sessions


def test_ctl_hello_5_an_inline_session_has_its_mirror_at_hello(backend):
    g = Guest(backend)
    hello(g)
    (session,) = backend.sessions.values()
    assert isinstance(session.mem, InlineGuestMemory) and session.mem.size == MEM


def test_ctl_hello_6_a_second_hello_is_bad_state_and_a_failed_one_makes_no_session(backend):
    g = Guest(backend)
    assert hello(g, mem_size=1000)["error"] == wire.CTL_ERR_MALFORMED
    assert not backend.sessions
    sid = hello(g)["session"]
    assert hello(g, name="again")["error"] == wire.CTL_ERR_BAD_STATE
    (session,) = backend.sessions.values()
    assert session.sid == sid and session.name == "t"


def test_ctl_hello_7_without_a_session_requests_get_no_session_and_notes_are_counted(backend):
    g = Guest(backend)
    for op, fields in [(wire.OP_GET_STATUS, dict(dev=0)), (wire.OP_PING, {}), (wire.OP_BYE, {}),
                       (wire.OP_SET_MEM_TABLE, dict(regions=[]))]:
        assert g.request(op, **fields)["error"] == wire.CTL_ERR_NO_SESSION
    before = backend.stats["orphan_notifications"]
    assert send(backend, g.peer, {"op": "kick", "dev": 0, "queue": 0}) == []
    assert backend.stats["orphan_notifications"] == before + 1


# --- device selection, features, status, config (§2.6, §2.7) ---

DEV_OPS = [(wire.OP_GET_FEATURES, {}), (wire.OP_SET_FEATURES, dict(features=1 << 32)),
           (wire.OP_GET_STATUS, {}), (wire.OP_SET_STATUS, dict(status=1)), (wire.OP_GET_CONFIG, {}),
           (wire.OP_SET_VRING, dict(queue=0, size=8, desc=0, avail=256, used=512)),
           (wire.OP_ENABLE_VRING, dict(queue=0, enable=True))]


def test_ctl_feat_1_every_op_with_a_dev_refuses_an_unknown_device(backend):
    g = Guest(backend)
    hello(g)
    with_dev = {op for op in wire.REQUEST_OPS if ("dev", int) in wire.CTL_FIELDS[op]}
    assert {op for op, _ in DEV_OPS} == with_dev
    for op, fields in DEV_OPS:
        for dev in (2, 1 << 40):
            assert g.request(op, dev=dev, **fields)["error"] == wire.CTL_ERR_BAD_DEVICE, op


def test_ctl_feat_2_get_features_in_every_status(backend):
    g = Guest(backend)
    hello(g)
    for s in (0, 1, 3, 11):
        if s:
            if s == 11:
                g.request(wire.OP_SET_FEATURES, dev=0, features=wire.DEVICE_FEATURES)
            assert g.request(wire.OP_SET_STATUS, dev=0, status=s)["ok"]
        assert g.request(wire.OP_GET_FEATURES, dev=0)["features"] == wire.DEVICE_FEATURES
    assert vring(g)["ok"] and g.request(wire.OP_ENABLE_VRING, dev=0, queue=0, enable=True)["ok"]
    assert g.request(wire.OP_SET_STATUS, dev=0, status=15)["ok"]
    assert g.request(wire.OP_GET_FEATURES, dev=0)["features"] == wire.DEVICE_FEATURES


def test_ctl_feat_3_set_features_window_offer_and_replacement(backend):
    g = Guest(backend)
    hello(g)
    v1 = 1 << wire.VIRTIO_F_VERSION_1
    assert g.request(wire.OP_SET_FEATURES, dev=0, features=v1)["error"] == wire.CTL_ERR_BAD_STATE
    g.request(wire.OP_SET_STATUS, dev=0, status=1)
    assert g.request(wire.OP_SET_FEATURES, dev=0, features=v1)["error"] == wire.CTL_ERR_BAD_STATE
    g.request(wire.OP_SET_STATUS, dev=0, status=3)
    offered = wire.DEVICE_FEATURES
    unoffered = next(1 << b for b in range(64) if not offered >> b & 1)
    assert g.request(wire.OP_SET_FEATURES, dev=0, features=v1 | unoffered)["error"] == wire.CTL_ERR_BAD_FEATURES
    # a replaced set without VERSION_1 loses FEATURES_OK (CTL-STATUS-5): the last one counts
    assert g.request(wire.OP_SET_FEATURES, dev=0, features=v1)["ok"]
    assert g.request(wire.OP_SET_FEATURES, dev=0, features=0)["ok"]
    g.request(wire.OP_SET_STATUS, dev=0, status=11)
    assert not status(g) & wire.STATUS_FEATURES_OK
    g.request(wire.OP_SET_STATUS, dev=0, status=0)
    to_features_ok(g)
    assert g.request(wire.OP_SET_FEATURES, dev=0, features=v1)["error"] == wire.CTL_ERR_BAD_STATE


def test_ctl_status_1_get_status_is_the_status_byte_in_every_status(backend):
    g = Guest(backend)
    hello(g)
    assert status(g) == 0
    for s in (1, 3):
        g.request(wire.OP_SET_STATUS, dev=0, status=s)
        assert status(g) == s
    g.request(wire.OP_SET_FEATURES, dev=0, features=wire.DEVICE_FEATURES)
    g.request(wire.OP_SET_STATUS, dev=0, status=11)
    assert status(g) == 11 and status(g, dev=1) == 0


def test_ctl_status_2_writing_0_resets_in_every_status(backend):
    g = Guest(backend)
    g.init()
    hdr, _ = g.call(cmd(wire.CMD_CTX_CREATE, (0, b"c"), extra=b""))
    assert g.request(wire.OP_SET_STATUS, dev=0, status=0)["ok"]
    assert status(g) == 0
    assert vring(g)["error"] == wire.CTL_ERR_BAD_STATE  # the queue setup is gone
    for s in (1, 3):
        g.request(wire.OP_SET_STATUS, dev=0, status=s)
        assert g.request(wire.OP_SET_STATUS, dev=0, status=0)["ok"] and status(g) == 0


def test_ctl_status_3_status_bits_are_only_added(backend):
    g = Guest(backend)
    hello(g)
    g.request(wire.OP_SET_STATUS, dev=0, status=3)
    assert g.request(wire.OP_SET_STATUS, dev=0, status=2)["error"] == wire.CTL_ERR_BAD_STATE
    assert g.request(wire.OP_SET_STATUS, dev=0, status=3 | wire.STATUS_DEVICE_NEEDS_RESET)["error"] \
        == wire.CTL_ERR_BAD_STATE
    defined = (wire.STATUS_ACKNOWLEDGE | wire.STATUS_DRIVER | wire.STATUS_FEATURES_OK
               | wire.STATUS_DRIVER_OK | wire.STATUS_DEVICE_NEEDS_RESET | wire.STATUS_FAILED)
    undefined = next(1 << b for b in range(8) if not defined >> b & 1)
    assert g.request(wire.OP_SET_STATUS, dev=0, status=3 | undefined)["error"] == wire.CTL_ERR_BAD_STATE
    assert status(g) == 3


def test_ctl_status_4_driver_ok_needs_every_init_condition(backend):
    g = Guest(backend)
    hello(g)
    g.request(wire.OP_SET_STATUS, dev=0, status=3)
    assert g.request(wire.OP_SET_STATUS, dev=0, status=7)["error"] == wire.CTL_ERR_BAD_STATE  # no FEATURES_OK
    g.request(wire.OP_SET_FEATURES, dev=0, features=wire.DEVICE_FEATURES)
    g.request(wire.OP_SET_STATUS, dev=0, status=11)
    assert g.request(wire.OP_SET_STATUS, dev=0, status=15)["error"] == wire.CTL_ERR_BAD_STATE  # no queue
    assert vring(g)["ok"]
    assert g.request(wire.OP_SET_STATUS, dev=0, status=15)["error"] == wire.CTL_ERR_BAD_STATE  # not enabled
    assert status(g) == 11
    assert g.request(wire.OP_ENABLE_VRING, dev=0, queue=0, enable=True)["ok"]
    assert g.request(wire.OP_SET_STATUS, dev=0, status=15)["ok"]
    assert g.request(wire.OP_SET_STATUS, dev=0, status=15)["ok"] and status(g) == 15  # a no-op


def test_ctl_status_5_features_ok_is_not_kept_for_a_bad_feature_set(backend):
    g = Guest(backend)
    hello(g)
    g.request(wire.OP_SET_STATUS, dev=0, status=3)
    assert g.request(wire.OP_SET_FEATURES, dev=0, features=1 << wire.VIRTIO_F_EVENT_IDX)["ok"]
    assert g.request(wire.OP_SET_STATUS, dev=0, status=11 | wire.STATUS_FAILED)["ok"]
    assert status(g) == 3 | wire.STATUS_FAILED


def test_ctl_config_1_get_config_is_64_bytes_in_every_status(backend):
    g = Guest(backend)
    hello(g)
    for s in (0, 1, 3):
        if s:
            g.request(wire.OP_SET_STATUS, dev=0, status=s)
        config = g.request(wire.OP_GET_CONFIG, dev=1)["config"]
        assert isinstance(config, bytes) and len(config) == wire.CONFIG_SIZE == 64
        fields = struct.unpack(wire.CONFIG_FORMAT, config)
        assert fields[0] == backend.kmds[1].vram_size


@pytest.fixture
def shared_guest(backend):
    """A shared-model session whose memory table is set: (guest, its memory)."""
    g = Guest(backend)
    challenge = hello(g, memory=wire.MEMORY_SHARED)["mem_challenge"]
    with SharedGuestMemory.create(MEM) as mem:
        mem.write(wire.MEM_CHALLENGE_GPA, challenge)
        regions = [{"gpa": 0, "size": MEM, "name": mem.name}]
        assert g.request(wire.OP_SET_MEM_TABLE, regions=regions)["ok"]
        yield g, mem


def test_ctl_memtable_1_set_mem_table_is_bad_state_inline_and_the_second_time(backend, shared_guest):
    g = Guest(backend, b"inline")
    hello(g)
    r = g.request(wire.OP_SET_MEM_TABLE, regions=[{"gpa": 0, "size": MEM, "name": "/x"}])
    assert r["error"] == wire.CTL_ERR_BAD_STATE
    s, mem = shared_guest
    r = s.request(wire.OP_SET_MEM_TABLE, regions=[{"gpa": 0, "size": MEM, "name": mem.name}])
    assert r["error"] == wire.CTL_ERR_BAD_STATE


# --- vrings (§2.8) ---

def test_ctl_vring_1_queues_beyond_the_negotiated_ones_are_bad_queue(backend):
    g = Guest(backend)
    hello(g)
    to_features_ok(g, features=wire.DEVICE_FEATURES & ~(1 << wire.PVGPU_F_EVENTQ))
    layout = VirtqLayout.at(1 << 16, 64)
    for queue in (wire.EVENTQ, wire.NUM_QUEUES, 1000):
        assert vring(g, queue=queue, desc=layout.desc, avail=layout.avail,
                     used=layout.used)["error"] == wire.CTL_ERR_BAD_QUEUE
        assert g.request(wire.OP_ENABLE_VRING, dev=0, queue=queue, enable=True)["error"] \
            == wire.CTL_ERR_BAD_QUEUE
    h = Guest(backend, b"h")
    hello(h)
    to_features_ok(h)
    assert vring(h, queue=wire.EVENTQ, desc=layout.desc, avail=layout.avail, used=layout.used)["ok"]


def test_ctl_vring_2_set_vring_only_between_features_ok_and_driver_ok(backend):
    g = Guest(backend)
    hello(g)
    for s in (0, 1, 3):
        if s:
            g.request(wire.OP_SET_STATUS, dev=0, status=s)
        assert vring(g)["error"] == wire.CTL_ERR_BAD_STATE
    g.request(wire.OP_SET_FEATURES, dev=0, features=wire.DEVICE_FEATURES)
    g.request(wire.OP_SET_STATUS, dev=0, status=11)
    assert vring(g)["ok"] and g.request(wire.OP_ENABLE_VRING, dev=0, queue=0, enable=True)["ok"]
    g.request(wire.OP_SET_STATUS, dev=0, status=15)
    assert vring(g)["error"] == wire.CTL_ERR_BAD_STATE


def test_ctl_vring_3_queue_size_is_a_power_of_two_up_to_the_maximum(backend):
    g = Guest(backend)
    hello(g)
    to_features_ok(g)
    for size in (0, 3, 100, wire.MAX_QUEUE_SIZE * 2):
        assert vring(g, size=size, desc=0, avail=1 << 16, used=1 << 17)["error"] == wire.CTL_ERR_BAD_MEMORY
    for size in (1, 2, wire.MAX_QUEUE_SIZE):
        assert vring(g, size=size)["ok"], size


def test_ctl_vring_4_ring_parts_are_aligned_and_inside_guest_memory(backend):
    g = Guest(backend)
    hello(g)
    to_features_ok(g)
    q = 64
    good = VirtqLayout.at(0, q)
    bad = [dict(desc=good.desc + 8), dict(avail=good.avail + 1), dict(used=good.used + 2),
           dict(desc=MEM - wire.virtq_desc_table_size(q) + 16),
           dict(avail=MEM - wire.virtq_avail_size(q) + 2),
           dict(used=MEM - wire.virtq_used_size(q) + 4), dict(used=1 << 40)]
    for over in bad:
        assert vring(g, size=q, **over)["error"] == wire.CTL_ERR_BAD_MEMORY, over
    edge = dict(desc=MEM - wire.virtq_desc_table_size(q), avail=MEM - 8192 - wire.virtq_avail_size(q),
                used=MEM - 4096 - wire.virtq_used_size(q) & ~3)
    assert vring(g, size=q, **edge)["ok"]


def test_ctl_vring_6_enable_needs_a_configured_queue_and_disabling_stops_processing(backend):
    g = Guest(backend)
    hello(g)
    to_features_ok(g)
    assert g.request(wire.OP_ENABLE_VRING, dev=0, queue=0, enable=True)["error"] == wire.CTL_ERR_BAD_STATE
    assert g.request(wire.OP_ENABLE_VRING, dev=0, queue=0, enable=False)["ok"]
    g = Guest(backend, b"h")
    g.init()
    assert g.request(wire.OP_ENABLE_VRING, dev=0, queue=0, enable=False)["ok"]
    head, _ = g.submit(cmd(wire.CMD_NOP))
    assert g.queue.pop_used() == []  # a disabled queue is not processed
    assert g.request(wire.OP_ENABLE_VRING, dev=0, queue=0, enable=True)["ok"]
    assert g.complete(head) == wire.CTRL_HDR_SIZE  # processing resumes where it stopped


# --- kicks and calls (§2.9, §2.10) ---

def _kick(backend, g, patches, frames, dev=0, queue=0):
    return send(backend, g.peer, {"op": "kick", "dev": dev, "queue": queue, "patches": patches}, frames)


def test_ctl_kick_1_kicks_for_no_device_or_queue_are_dropped_and_counted(backend):
    g = Guest(backend)
    g.init()
    for dev, queue in ((2, 0), (0, wire.NUM_QUEUES), (1 << 33, 0)):
        before = backend.stats["bad_kicks"]
        assert _kick(backend, g, [[4096 * 600, 0]], [b"abc"], dev, queue) == []
        assert backend.stats["bad_kicks"] == before + 1
        assert g.mem.read(4096 * 600, 3) == bytes(3)
        (session,) = backend.sessions.values()
        assert session.mem.read(4096 * 600, 3) == bytes(3)


def test_ctl_kick_2_a_shared_model_kick_with_patches_is_dropped(backend, shared_guest):
    g, mem = shared_guest
    before = backend.stats["bad_kicks"]
    assert _kick(backend, g, [[1 << 20, 0]], [b"zz"]) == []
    assert backend.stats["bad_kicks"] == before + 1 and mem.read(1 << 20, 2) == bytes(2)
    assert _kick(backend, g, [], []) == []  # an empty list is no patch
    assert backend.stats["bad_kicks"] == before + 1


def test_ctl_kick_3_patches_apply_in_list_order_before_the_queue_is_processed(backend):
    g = Guest(backend)
    g.init()
    (session,) = backend.sessions.values()
    at = 1 << 20
    _kick(backend, g, [[at, 0], [at + 2, 1], [at + 8, 0]], [b"aaaa", b"BB"])
    assert session.mem.read(at, 12) == b"aaBB\0\0\0\0aaaa"
    # the chain a kick's own patches publish is processed by that kick
    command = cmd(wire.CMD_NOP)
    g.mem.write(at, command)
    head = g.queue.add_chain([(at, len(command))], [(at + 4096, wire.MIN_RESPONSE_SIZE)])
    dirty = g.mem.take_dirty()
    g._deliver(backend.handle(g.peer, codec.encode(
        {"op": "kick", "dev": 0, "queue": 0, "patches": [[a, i] for i, (a, _n) in enumerate(dirty)]},
        [g.mem.read(a, n) for a, n in dirty]), 0.0))
    assert g.queue.pop_used() == [(head, wire.CTRL_HDR_SIZE)]


def test_ctl_kick_4_a_kick_with_an_invalid_patch_applies_nothing(backend):
    g = Guest(backend)
    g.init()
    (session,) = backend.sessions.values()
    command = cmd(wire.CMD_NOP)
    g.mem.write(1 << 20, command)
    g.queue.add_chain([(1 << 20, len(command))], [(1 << 21, wire.MIN_RESPONSE_SIZE)])
    dirty = g.mem.take_dirty()
    patches = [[a, i] for i, (a, _n) in enumerate(dirty)] + [[MEM - 1, 0]]  # the last one overruns
    out = _kick(backend, g, patches, [g.mem.read(a, n) for a, n in dirty])
    assert session.mem.read(1 << 20, len(command)) == bytes(len(command))  # none applied
    assert status(g) & wire.STATUS_DEVICE_NEEDS_RESET
    assert [m["op"] for m in out] == [wire.OP_CONFIG_CHANGED]  # and no used entry: no call
    # a frame_index naming no frame: malformed, dropped before any device sees it
    h = Guest(backend, b"h")
    h.init()
    before = backend.stats["bad_messages"]
    assert _kick(backend, h, [[1 << 20, 0], [1 << 20, 1]], [b"x"]) == []
    assert backend.stats["bad_messages"] == before + 1 and status(h) == 15


def test_ctl_kick_6_spurious_kicks_are_harmless(backend):
    g = Guest(backend)
    g.init()
    for _ in range(3):
        assert send(backend, g.peer, {"op": "kick", "dev": 0, "queue": 0}) == []
    assert status(g) == 15
    hdr, _ = g.call(cmd(wire.CMD_NOP))
    assert hdr[0] == wire.RESP_OK_NODATA


def test_ctl_call_2_inline_calls_carry_every_device_write(backend):
    # [MEM-INLINE-3] after the calls the driver's memory equals the mirror where the device wrote
    g = Guest(backend)
    g.init()
    (session,) = backend.sessions.values()
    head, resp = g.submit(cmd(wire.CMD_NOP))
    g.complete(head)
    calls = [m for m in g.notifications if m["op"] == wire.OP_CALL]
    assert calls and calls[-1]["notify"] is True
    # after the calls are applied the driver's memory equals the mirror where the device wrote
    layout = g.queue.layout
    for gpa, n in ((resp, wire.CTRL_HDR_SIZE), (layout.used, wire.virtq_used_size(64))):
        assert g.mem.read(gpa, n) == session.mem.read(gpa, n)


def test_ctl_cfgchg_1_needs_reset_is_announced_each_time_it_is_set(backend):
    g = Guest(backend)
    g.init()
    out = _kick(backend, g, [[MEM - 1, 0]], [b"ab"])
    assert out == [{"op": wire.OP_CONFIG_CHANGED, "dev": 0}]
    g.request(wire.OP_SET_STATUS, dev=0, status=0)
    reinit(g)
    out = _kick(backend, g, [[MEM - 1, 0]], [b"ab"])
    assert out == [{"op": wire.OP_CONFIG_CHANGED, "dev": 0}]


# --- ping, bye (§2.11, §2.12) ---

def test_ctl_ping_1_ping_is_an_ok_reply_without_fields(backend):
    g = Guest(backend)
    hello(g)
    assert g.request(wire.OP_PING) == {"op": wire.OP_REPLY, "seq": g.seq, "ok": True}


def test_ctl_bye_1_bye_replies_then_the_session_is_gone(backend):
    g = Guest(backend)
    g.init()
    g.submit(cmd(wire.CMD_NOP))
    g.notifications.clear()
    assert g.request(wire.OP_BYE)["ok"]
    assert not backend.sessions and g.notifications == []
    assert backend.run_completions() == []  # nothing more for the session
    assert g.request(wire.OP_GET_STATUS, dev=0)["error"] == wire.CTL_ERR_NO_SESSION
    assert hello(g)["ok"]


def _shared_nop_round(backend, g, queue, mem, at):
    """Publish a NOP in shared memory, kick, run until it is used: -> the messages sent."""
    command = cmd(wire.CMD_NOP)
    mem.write(at, command)
    head = queue.add_chain([(at, len(command))], [(at + 4096, wire.MIN_RESPONSE_SIZE)])
    sent = send(backend, g.peer, {"op": "kick", "dev": 0, "queue": 0})
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        used = queue.pop_used()
        sent += [codec.decode(f)[0] for _p, f in backend.run_completions()]
        if used:
            assert used == [(head, wire.CTRL_HDR_SIZE)]
            return sent
        time.sleep(0.001)
    raise TimeoutError("the NOP was never used")


@pytest.mark.parametrize("event_idx", [True, False])
def test_ctl_call_1_shared_calls_notify_unless_suppressed(backend, shared_guest, event_idx):
    # [MEM-SHARED-2] calls of the shared model carry no patches
    g, mem = shared_guest
    features = wire.DEVICE_FEATURES & ~(0 if event_idx else 1 << wire.VIRTIO_F_EVENT_IDX)
    to_features_ok(g, features=features)
    layout = VirtqLayout.at(1 << 16, 64)
    queue = DriverQueue(mem, layout, event_idx=event_idx, indirect=True)
    assert vring(g, desc=layout.desc, avail=layout.avail, used=layout.used)["ok"]
    assert g.request(wire.OP_ENABLE_VRING, dev=0, queue=0, enable=True)["ok"]
    assert g.request(wire.OP_SET_STATUS, dev=0, status=15)["ok"]
    sent = _shared_nop_round(backend, g, queue, mem, 1 << 20)
    assert {"op": wire.OP_CALL, "dev": 0, "queue": 0, "notify": True} in sent
    assert all("patches" not in m for m in sent)
    queue.disable_interrupts()
    sent = _shared_nop_round(backend, g, queue, mem, 2 << 20)
    assert [m for m in sent if m["op"] == wire.OP_CALL] == []


def test_ctl_call_3_inline_patches_come_before_what_refers_to_them(backend):
    # [VQ-USED-1] the used element is sent no later than the idx that publishes it
    g = Guest(backend)
    g.init()
    layout = g.queue.layout
    idx_at, ring_at = layout.used + 2, layout.used + 4
    command, at = cmd(wire.CMD_NOP), 1 << 20
    g.mem.write(at, command)
    g.queue.add_chain([(at, len(command))], [(at + 4096, wire.MIN_RESPONSE_SIZE)])
    dirty = g.mem.take_dirty()
    out = backend.handle(g.peer, codec.encode(
        {"op": "kick", "dev": 0, "queue": 0, "patches": [[a, k] for k, (a, _n) in enumerate(dirty)]},
        [g.mem.read(a, n) for a, n in dirty]), 0.0)
    deadline = time.monotonic() + 5
    while not any(codec.decode(f)[0].get("notify") for _p, f in out) and time.monotonic() < deadline:
        time.sleep(0.001)
        out += backend.run_completions()
    writes = []  # (gpa, end, the call that carries it)
    for n, (_peer, frames) in enumerate(out):
        msg, extra = codec.decode(frames)
        for gpa, k in msg.get("patches", []) if msg["op"] == wire.OP_CALL else []:
            writes.append((gpa, gpa + len(extra[k]), n))

    def first(lo, hi):
        return min(pos for gpa, end, pos in writes if gpa < hi and lo < end)
    # bytes of the response, then the used element that returns the buffer, then the idx:
    # each in an earlier call than what refers to it, or in the same one
    resp = at + 4096
    assert first(resp, resp + wire.CTRL_HDR_SIZE) <= first(ring_at, ring_at + 8) <= first(idx_at, idx_at + 2)
