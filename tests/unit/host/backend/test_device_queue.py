"""How the device takes chains from the control queue (spec §4.4, §4.7, clauses VQ-*):
when it takes them, what it never writes, and what an invalid chain does to that device
and to nothing else. Sans-IO through Backend.handle, inline model."""

import struct
import time

import pytest

from pvgpu.spec import wire

from pvgpu.conformance.burns import with_longer_burns
from test_backend import MEM, Guest, _backend, cmd
from pvgpu.transport import codec
from pvgpu.transport.virtqueue import DriverQueue, VirtqLayout

DESC = struct.Struct("<QIHH")


@pytest.fixture
def backend():
    yield from _backend()


def status(g, dev=0):
    return g.request(wire.OP_GET_STATUS, dev=dev)["status"]


def publish(g, command, at):
    """Add a chain for `command` at gpa `at` without kicking: -> its head."""
    g.mem.write(at, command)
    return g.queue.add_chain([(at, len(command))], [(at + 4096, wire.MIN_RESPONSE_SIZE)])


def kick(backend, g):
    """Kick with the patches of everything written since the last kick: -> messages sent."""
    dirty = g.mem.take_dirty()
    out = backend.handle(g.peer, codec.encode(
        {"op": wire.OP_KICK, "dev": g.dev, "queue": 0,
         "patches": [[a, i] for i, (a, _n) in enumerate(dirty)]},
        [g.mem.read(a, n) for a, n in dirty]), 0.0)
    g._deliver(out)
    return [codec.decode(f)[0] for _p, f in out]


def corrupt(g, head):
    """Point the head descriptor of a published chain outside guest memory."""
    at = g.queue.layout.desc + DESC.size * head
    addr, n, flags, nxt = DESC.unpack(g.mem.read(at, DESC.size))
    g.mem.write(at, DESC.pack(MEM + 4096, n, flags, nxt))


def settle(backend, g, seconds=0.2):
    """Let the device finish what it can: -> used entries seen meanwhile."""
    used = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        g._deliver(backend.run_completions())
        used += g.queue.pop_used()
        time.sleep(0.005)
    return used


def test_vq_order_2_no_chain_is_taken_before_driver_ok(backend):
    g = Guest(backend)
    g.init()
    assert g.request(wire.OP_SET_STATUS, dev=0, status=0)["ok"]
    for s in (1, 3):
        g.request(wire.OP_SET_STATUS, dev=0, status=s)
    g.request(wire.OP_SET_FEATURES, dev=0, features=wire.DEVICE_FEATURES)
    g.request(wire.OP_SET_STATUS, dev=0, status=11)
    layout = g.queue.layout
    g.mem.write(layout.desc, bytes(layout.end - layout.desc))
    g.queue = DriverQueue(g.mem, layout, event_idx=True, indirect=True)
    assert g.request(wire.OP_SET_VRING, dev=0, queue=0, size=layout.size, desc=layout.desc,
                     avail=layout.avail, used=layout.used)["ok"]
    assert g.request(wire.OP_ENABLE_VRING, dev=0, queue=0, enable=True)["ok"]
    head = publish(g, cmd(wire.CMD_NOP), 1 << 20)
    assert [m for m in kick(backend, g) if m["op"] == wire.OP_CALL and m.get("notify")] == []
    assert g.queue.pop_used() == []  # [DEV-INIT-2] no buffer taken, no call, before DRIVER_OK
    assert g.request(wire.OP_SET_STATUS, dev=0, status=15)["ok"]
    kick(backend, g)
    assert g.complete(head) == wire.CTRL_HDR_SIZE


def test_vq_order_2_no_chain_is_taken_with_needs_reset_or_failed(backend):
    g = Guest(backend)
    g.init()
    corrupt(g, publish(g, cmd(wire.CMD_NOP), 1 << 20))
    kick(backend, g)
    assert status(g) & wire.STATUS_DEVICE_NEEDS_RESET
    publish(g, cmd(wire.CMD_NOP), 2 << 20)
    kick(backend, g)
    assert settle(backend, g) == []
    h = Guest(backend, b"h")
    h.init()
    assert h.request(wire.OP_SET_STATUS, dev=0, status=15 | wire.STATUS_FAILED)["ok"]
    publish(h, cmd(wire.CMD_NOP), 1 << 20)
    kick(backend, h)
    assert settle(backend, h) == []  # [DEV-STATUS-2]


def test_vq_desc_4_the_device_writes_only_writable_buffers_and_the_used_ring(backend):
    g = Guest(backend)
    g.init()
    (session,) = backend.sessions.values()
    layout = g.queue.layout
    heads = [publish(g, cmd(wire.CMD_NOP), (1 << 20) + 8192 * i) for i in range(3)]
    readonly = [(layout.desc, layout.used)] + [((1 << 20) + 8192 * i, (1 << 20) + 8192 * i + 4096)
                                                for i in range(3)]
    sent = [g.mem.read(lo, hi - lo) for lo, hi in readonly]  # what the kick carries
    kick(backend, g)
    used = g.queue.pop_used()
    deadline = time.monotonic() + 10
    while len(used) < len(heads) and time.monotonic() < deadline:
        used += settle(backend, g, 0.02)
    assert sorted(h for h, _n in used) == sorted(heads)
    # descriptor table, avail ring and readable buffers: still what the driver sent
    assert [session.mem.read(lo, hi - lo) for lo, hi in readonly] == sent


def test_vq_invalid_1_2_an_invalid_chain_stops_that_device_and_is_announced(backend):
    g = Guest(backend)
    g.init()
    first = publish(g, cmd(wire.CMD_NOP), 1 << 20)
    bad = publish(g, cmd(wire.CMD_NOP), (1 << 20) + 8192)
    publish(g, cmd(wire.CMD_NOP), (1 << 20) + 16384)
    corrupt(g, bad)
    sent = kick(backend, g)
    assert {"op": wire.OP_CONFIG_CHANGED, "dev": 0} in sent  # [VQ-INVALID-1]
    assert status(g) & wire.STATUS_DEVICE_NEEDS_RESET
    assert not status(g, dev=1) & wire.STATUS_DEVICE_NEEDS_RESET
    used = g.queue.pop_used() + settle(backend, g)
    assert [h for h, _n in used] == [first]  # [VQ-INVALID-2] the bad one and what follows: never
    later = publish(g, cmd(wire.CMD_NOP), (1 << 20) + 24576)
    kick(backend, g)
    assert later not in [h for h, _n in settle(backend, g)]
    assert g.request(wire.OP_SET_STATUS, dev=0, status=0)["ok"] and status(g) == 0


def test_vq_invalid_3_held_chains_are_dropped(backend):
    def attempt(burn_us):
        g = Guest(backend, f"g{burn_us}".encode())
        g.init()
        g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
        g.call(cmd(wire.CMD_LAUNCH, (wire.KERNEL_BURN, 1, 1, 1, 1, 1, 1, 1), ctx_id=1,
                   extra=struct.pack("<Q", burn_us)))
        burn = backend.sessions[g.peer].devices[0].compute.contexts[1].timeline(0).last_fence
        held = publish(g, cmd(wire.CMD_NOP, ctx_id=1, flags=wire.FLAG_FENCE, fence_id=7), 1 << 20)
        kick(backend, g)
        corrupt(g, publish(g, cmd(wire.CMD_NOP), 2 << 20))
        kick(backend, g)
        if burn.signaled:  # over before the invalid chain came: the NOP may have been answered
            return False
        deadline = time.monotonic() + 30
        while not burn.signaled and time.monotonic() < deadline:
            time.sleep(0.01)
        assert burn.signaled
        assert held not in [h for h, _n in g.queue.pop_used() + settle(backend, g)]
        return True
    with_longer_burns(attempt)


def test_vq_invalid_4_other_devices_and_sessions_carry_on(backend):
    # [DEV-ISOLATE-3] an invalid chain affects only its device
    g, other = Guest(backend, b"g"), Guest(backend, b"other")
    g.init()
    other.init()
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    corrupt(g, publish(g, cmd(wire.CMD_NOP), 1 << 20))
    kick(backend, g)
    assert status(g) & wire.STATUS_DEVICE_NEEDS_RESET
    assert status(g, dev=1) == 0 and status(other) == 15
    hdr, _ = other.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    assert hdr[0] == wire.RESP_OK_NODATA
    # the session's other device is set up and used as if nothing had happened
    h = Guest(backend, b"g")
    h.peer, h.mem, h.seq = g.peer, g.mem, g.seq
    for st in (1, 3):
        assert h.request(wire.OP_SET_STATUS, dev=1, status=st)["ok"]
    assert h.request(wire.OP_SET_FEATURES, dev=1, features=wire.DEVICE_FEATURES)["ok"]
    assert h.request(wire.OP_SET_STATUS, dev=1, status=11)["ok"]
    layout = VirtqLayout.at(3 << 20, 64)
    h.queue = DriverQueue(h.mem, layout, event_idx=True, indirect=True)
    assert h.request(wire.OP_SET_VRING, dev=1, queue=0, size=64, desc=layout.desc,
                     avail=layout.avail, used=layout.used)["ok"]
    assert h.request(wire.OP_ENABLE_VRING, dev=1, queue=0, enable=True)["ok"]
    assert h.request(wire.OP_SET_STATUS, dev=1, status=15)["ok"]
    h.dev = 1
    hdr, _ = h.call(cmd(wire.CMD_NOP))
    assert hdr[0] == wire.RESP_OK_NODATA
