"""The event queue (spec §5.7) through the real backend, KMD and GPU, with a sans-IO guest
(test_backend.Guest) that sets up queue 1 by hand and reads the entries as raw bytes."""

import struct
import time

import pytest

from pvgpu.spec import wire
from pvgpu.transport import codec
from pvgpu.transport.virtqueue import DriverQueue, VirtqLayout

from test_backend import HDR, Guest, _backend, cmd

BODY = struct.Struct(wire.EVTQ_BODY_FORMAT)
EVQ_AT = 3 << 20  # ring and buffers of queue 1 in the guest's memory
BUFS_AT = EVQ_AT + (64 << 10)
BAD_VA = 0x3000_0000_0000


@pytest.fixture
def backend():
    yield from _backend()


@pytest.fixture
def backend_tdr():
    yield from _backend(job_timeout_ns=200_000_000)


class EventGuest(Guest):
    """A Guest that configures queue 1 before DRIVER_OK (spec EVTQ-SETUP-1)."""

    def init(self, dev=0, features=wire.DEVICE_FEATURES, qsize=64, evq_size=8, post=4):
        plain = self.request

        def request(op, now=0.0, **fields):
            if op == wire.OP_SET_STATUS and fields.get("status") == 15:
                self._setup_eventq(dev, features, evq_size, post)
            return plain(op, now, **fields)
        self.request = request
        try:
            super().init(dev, features, qsize)
        finally:
            self.request = plain

    def _setup_eventq(self, dev, features, size, post):
        layout = VirtqLayout.at(EVQ_AT, size)
        self.evq = DriverQueue(self.mem, layout,
                               event_idx=bool(features & (1 << wire.VIRTIO_F_EVENT_IDX)))
        self.evq.enable_interrupts()
        self.bufs = {}
        self.next_buf = 0
        for _ in range(post):
            self.post_buffer()
        assert self.request(wire.OP_SET_VRING, dev=dev, queue=wire.EVENTQ, size=size,
                            desc=layout.desc, avail=layout.avail, used=layout.used)["ok"]
        assert self.request(wire.OP_ENABLE_VRING, dev=dev, queue=wire.EVENTQ, enable=True)["ok"]

    def post_buffer(self, readable=(), size=wire.EVTQ_ENTRY_SIZE):
        gpa = BUFS_AT + 64 * (self.next_buf % 512)
        self.next_buf += 1
        self.mem.write(gpa, b"\xEE" * wire.EVTQ_ENTRY_SIZE)
        head = self.evq.add_chain(list(readable), [(gpa, size)])
        self.bufs[head] = gpa
        return head

    def kick_eventq(self):
        dirty = self.mem.take_dirty()
        msg = {"op": wire.OP_KICK, "dev": self.dev, "queue": wire.EVENTQ,
               "patches": [[g, i] for i, (g, _n) in enumerate(dirty)]}
        self._deliver(self.backend.handle(self.peer, codec.encode(
            msg, [self.mem.read(g, n) for g, n in dirty]), 0.0))

    def events(self, run=True):
        """-> [(used_len, header, body, raw)] of the entries returned since the last call;
        `run`: let the backend run its completions first."""
        if run:
            self._deliver(self.backend.run_completions())
        out = []
        for head, n in self.evq.pop_used():
            raw = self.mem.read(self.bufs.pop(head), wire.EVTQ_ENTRY_SIZE)
            out.append((n, HDR.unpack_from(raw), BODY.unpack_from(raw, HDR.size), raw))
        return out


def launch_fault(g, ctx_id, ring_idx=0):
    """An unfenced fill kernel that writes at an unmapped VA."""
    hdr, _ = g.call(cmd(wire.CMD_LAUNCH, (wire.KERNEL_FILL, 1, 1, 1, 64, 1, 1, 3), ctx_id=ctx_id,
                        ring_idx=ring_idx, extra=struct.pack("<QQQ", BAD_VA, 0, 64)))
    assert hdr[0] == wire.RESP_OK_NODATA


def sync(g, ctx_id, ring_idx=0):
    hdr, _ = g.call(cmd(wire.CMD_NOP, ctx_id=ctx_id, ring_idx=ring_idx, flags=wire.FLAG_FENCE,
                        fence_id=1))
    return hdr[0]


def test_a_fault_is_posted_before_the_response_that_reports_it(backend):
    g = EventGuest(backend)
    g.init()
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=7))
    launch_fault(g, 7, ring_idx=3)
    assert sync(g, 7, ring_idx=3) == wire.RESP_ERR_PAGE_FAULT
    (n, hdr, body, _raw), = g.events(run=False)  # EVTQ-EVENT-1: already there
    assert n == wire.EVTQ_ENTRY_SIZE
    assert hdr == (wire.EVTQ_PAGE_FAULT, 0, 0, 7, 3)
    seq, ts, address, vmid, access, engine, missed, reserved = body
    assert (address, access, engine) == (BAD_VA, wire.ACCESS_WRITE, 0)
    assert seq == 1 and ts > 0 and vmid > 0 and missed == 0 and reserved == 0
    assert any(m["op"] == wire.OP_CALL and m["queue"] == wire.EVENTQ for m in g.notifications)
    # the context keeps working (CMD-FAULT-4); the next fault has the next seq
    launch_fault(g, 7)
    assert sync(g, 7) == wire.RESP_ERR_PAGE_FAULT
    (_, hdr, body, _), = g.events()
    assert hdr[3:] == (7, 0) and body[0] == 2


def test_a_copy_fault_names_the_copy_engine(backend):
    g = EventGuest(backend)
    g.init()
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    hdr, _ = g.call(cmd(wire.CMD_COPY_D2D, (BAD_VA, wire.VA_USER_BASE, 256), ctx_id=1,
                        flags=wire.FLAG_FENCE, fence_id=1))
    assert hdr[0] == wire.RESP_ERR_PAGE_FAULT
    (_, hdr, body, _), = g.events()
    assert hdr[0] == wire.EVTQ_PAGE_FAULT and body[5] == 1  # copy0
    assert body[2] in (BAD_VA, wire.VA_USER_BASE)  # whichever side the engine checked first


def test_events_wait_for_buffers_and_overflow_is_counted(backend):
    g = EventGuest(backend)
    g.init(evq_size=128, post=0)
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    total = wire.MAX_PENDING_EVENTS + 5
    for _ in range(total):
        launch_fault(g, 1)
    assert sync(g, 1) == wire.RESP_ERR_PAGE_FAULT
    assert g.events() == []  # no buffer posted: the device keeps them
    for _ in range(3):
        g.post_buffer()
    g.kick_eventq()
    got = g.events()
    assert [b[0] for _, _, b, _ in got] == [6, 7, 8]  # the 5 oldest were dropped
    assert got[0][1][1] == wire.EVTQ_FLAG_MISSED and got[0][2][6] == 5
    assert [h[1] for _, h, _, _ in got[1:]] == [0, 0] and [b[6] for _, _, b, _ in got[1:]] == [0, 0]
    for _ in range(100):
        g.post_buffer()
    g.kick_eventq()
    assert [b[0] for _, _, b, _ in g.events()] == list(range(9, total + 1))
    assert g.events() == []


def test_a_buffer_with_a_readable_part_or_too_short_is_returned_empty(backend):
    g = EventGuest(backend)
    g.init(post=0)
    bad1 = g.post_buffer(readable=[(BUFS_AT + 60_000, 16)])
    bad2 = g.post_buffer(size=wire.EVTQ_ENTRY_SIZE - 1)
    g.post_buffer()
    g.kick_eventq()
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    assert g.events() == []  # buffers are taken only when there is an event to post
    launch_fault(g, 1)
    sync(g, 1)
    got = g.events()
    assert [n for n, *_ in got] == [0, 0, wire.EVTQ_ENTRY_SIZE]  # EVTQ-BUF-1
    assert got[0][3] == b"\xEE" * 64 and got[1][3] == b"\xEE" * 64  # nothing written
    assert got[2][1][0] == wire.EVTQ_PAGE_FAULT
    assert bad1 != bad2


def test_the_event_queue_needs_its_feature(backend):
    g = Guest(backend)
    g.init(features=wire.DEVICE_FEATURES & ~(1 << wire.PVGPU_F_EVENTQ))
    for op, fields in ((wire.OP_SET_VRING, dict(size=8, desc=EVQ_AT, avail=EVQ_AT + 128,
                                                 used=EVQ_AT + 256)),
                       (wire.OP_ENABLE_VRING, dict(enable=True))):
        r = g.request(op, dev=0, queue=wire.EVENTQ, **fields)
        assert not r["ok"] and r["error"] == wire.CTL_ERR_BAD_QUEUE
    # faults are still answered on the control queue, and nothing else is sent
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    launch_fault(g, 1)
    assert sync(g, 1) == wire.RESP_ERR_PAGE_FAULT
    assert not any(m.get("queue") == wire.EVENTQ for m in g.notifications)


def test_events_go_only_to_the_session_of_the_context(backend):
    a, b = EventGuest(backend, b"a"), EventGuest(backend, b"b")
    a.init()
    b.init()
    a.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    b.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    launch_fault(a, 1)
    assert sync(a, 1) == wire.RESP_ERR_PAGE_FAULT
    assert sync(b, 1) == wire.RESP_OK_NODATA
    assert len(a.events()) == 1 and b.events() == []


def test_reset_drops_pending_events_and_restarts_seq(backend):
    g = EventGuest(backend)
    g.init(post=0)
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    launch_fault(g, 1)
    sync(g, 1)
    g._deliver(backend.run_completions())
    assert backend.sessions[g.peer].devices[0].events  # pending, no buffer
    assert g.request(wire.OP_SET_STATUS, dev=0, status=0)["ok"]
    dev = backend.sessions[g.peer].devices[0]
    assert not dev.events and dev.event_seq == 0 and dev.eventq is None  # EVTQ-EVENT-3


def test_a_context_lost_to_a_hang_is_posted(backend_tdr):
    g = EventGuest(backend_tdr)
    g.init()
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=2))
    hdr, _ = g.call(cmd(wire.CMD_LAUNCH, (wire.KERNEL_BURN, 1, 1, 1, 1, 1, 1, 1), ctx_id=2,
                        ring_idx=5, extra=struct.pack("<Q", wire.BURN_FOREVER)))
    assert hdr[0] == wire.RESP_OK_NODATA
    deadline = time.monotonic() + 10
    got = []
    while not got and time.monotonic() < deadline:
        got = g.events()
        time.sleep(0.01)
    (_, hdr, body, _), = got
    assert hdr[0] == wire.EVTQ_CONTEXT_LOST and hdr[3:] == (2, 5)
    assert body[2] == 0 and body[4] == 0 and body[5] == 0  # no address; compute engine
