"""host/backend events, CTX_SYNC and GET_STATS (spec §6.5.11–§6.5.18, §7.6, §7.7).

Most tests drive `ComputeDevice` directly with a fake KMD that records every submission,
so that the dependency lists (`wait=`) the backend hands the KMD can be checked exactly
and fences are signalled by the test; the last ones go through the real backend, KMD and
GPU with the sans-IO guest of test_backend."""

import struct

import msgpack
import pytest

from pvgpu.host.backend import commands, protocol
from pvgpu.host.backend.commands import ComputeDevice
from pvgpu.host.backend.protocol import Pending, Response
from pvgpu.host.backend.errors import CommandError
from pvgpu.host.backend.events import EventExports
from pvgpu.host.kmd.bo import GpuFault
from pvgpu.host.kmd.errors import ContextLost, JobTimedOut
from pvgpu.spec import wire

from pvgpu.conformance.burns import with_longer_burns
from test_backend import Guest, _backend, cmd, timeline_fence

FEATURES = (1 << wire.PVGPU_F_COMPUTE) | (1 << wire.PVGPU_F_CONTEXT_INIT)


# ------------------------------------------------------------------ a fake KMD
class FakeFence:
    def __init__(self, name):
        self.name = name
        self.signaled = False
        self.error = None
        self.timestamp = None
        self._callbacks = []

    def add_done_callback(self, fn):
        if self.signaled:
            fn(self)
        else:
            self._callbacks.append(fn)

    def signal(self, error=None, timestamp=None):
        self.error, self.timestamp, self.signaled = error, timestamp, True
        for fn in self._callbacks:
            fn(self)
        self._callbacks = []

    def __repr__(self):
        return f"<fence {self.name}>"


class FakeContext:
    def __init__(self, kmd):
        self.kmd = kmd

    def map_system(self, *a, **k):
        pass

    def pending_fences(self):
        return []

    def _job(self, kind, wait, **kw):
        if self.kmd.lost:
            raise ContextLost("context lost")
        f = FakeFence(f"{kind}{len(self.kmd.jobs)}")
        self.kmd.jobs.append({"kind": kind, "wait": list(wait), "fence": f, **kw})
        return f

    def submit_launch(self, kernel_id, grid, block, args, wait=(), *, timeline=0):
        return self._job("launch", wait, timeline=timeline)

    def submit_copy(self, src, dst, size, wait=(), *, direction="d2d", timeline=0):
        return self._job("copy", wait, timeline=timeline, direction=direction)

    def submit_copies(self, copies, wait=(), *, direction="h2d", timeline=0):
        return self._job("copy", wait, timeline=timeline, direction=direction)


class FakeKmd:
    name = "fake"
    vram_size = 1 << 30
    index = 0

    def __init__(self):
        self.jobs = []
        self.now = 1_000
        self.lost = False

    def clock_ns(self):
        return self.now

    def create_context(self, name, *, vgpu=None, client=None, priority=None, limits=None):
        return FakeContext(self)

    def destroy_context(self, kctx, cancel=False):
        pass

    def sched_stats(self):
        return {"policy": "fifo", "engines": {"compute": {"utilisation": 0.25}}}


class FakeChain:
    def __init__(self, readable=b"", writable_len=wire.MIN_RESPONSE_SIZE):
        self.raw = readable
        self.readable_len = len(readable)
        self.writable_len = writable_len

    def read(self, mem, off, n):
        return self.raw[off:off + n]

    def readable_extents(self, off, n):
        return [(off, n)]


def _dev(kmd=None, exports=None, owner=None):
    return ComputeDevice(kmd or FakeKmd(), None, 1 << 20, FEATURES, exports=exports, owner=owner)


def run(dev, type_, body=(), *, ctx=0, ring=0, fenced=False, extra=b"", writable=wire.MIN_RESPONSE_SIZE):
    """Execute one command; -> Response | Pending; raises CommandError."""
    hdr = wire.pack_ctrl_hdr(type_, wire.FLAG_FENCE if fenced else 0, 7 if fenced else 0, ctx, ring)
    chain = FakeChain(hdr + struct.pack(wire.CMD_BODY_FORMATS[type_], *body) + extra, writable)
    cmd = dev.decode(protocol.Reader(chain, None))
    return dev.execute(cmd, protocol.Writer(chain, None))


def create(dev, ctx):
    assert isinstance(run(dev, wire.CMD_CTX_CREATE, (0, b""), ctx=ctx), Response)


def burn(dev, ctx, ring=0, fenced=False):
    """An unfenced (or fenced) launch on (ctx, ring); -> the KMD fence of the job."""
    res = run(dev, wire.CMD_LAUNCH, (wire.KERNEL_BURN, 1, 1, 1, 1, 1, 1, 1), ctx=ctx, ring=ring,
              fenced=fenced, extra=struct.pack("<Q", 10))
    assert isinstance(res, (Response, Pending))
    return dev.kmd.jobs[-1]["fence"]


def query(dev, event_id, fenced=False):
    res = run(dev, wire.CMD_EVENT_QUERY, (event_id,), fenced=fenced)
    if isinstance(res, Pending):
        return res
    assert res.type == wire.RESP_OK_EVENT
    return struct.unpack(wire.RESP_EVENT_FORMAT, res.body)


def error_of(fn, *a, **k) -> int:
    with pytest.raises(CommandError) as ei:
        fn(*a, **k)
    return ei.value.resp


# ------------------------------------------------------------------ record / wait
def test_event_wait_makes_the_next_job_depend_on_the_events_fences():
    # [SCHED-ORDER-2] the host holds the job until the event completes
    dev = _dev()
    create(dev, 1)
    create(dev, 2)
    a = burn(dev, 1, ring=0)
    run(dev, wire.CMD_EVENT_RECORD, (5,), ctx=1, ring=0)
    # another context, another timeline: EVENT_WAIT, then a job
    b0 = burn(dev, 2, ring=3)
    assert isinstance(run(dev, wire.CMD_EVENT_WAIT, (5,), ctx=2, ring=3), Response)  # at once
    b1 = burn(dev, 2, ring=3)
    job = dev.kmd.jobs[-1]
    assert job["timeline"] == 3 and set(job["wait"]) == {b0, a}
    # the wait was consumed: later jobs depend on the event only through the timeline
    burn(dev, 2, ring=3)
    assert dev.kmd.jobs[-1]["wait"] == [b1]
    # other timelines are not affected
    burn(dev, 2, ring=4)
    assert dev.kmd.jobs[-1]["wait"] == []


def test_wait_on_a_completed_event_adds_no_dependency():
    dev = _dev()
    create(dev, 1)
    a = burn(dev, 1)
    run(dev, wire.CMD_EVENT_RECORD, (1,), ctx=1)
    a.signal()
    run(dev, wire.CMD_EVENT_WAIT, (1,), ctx=1, ring=2)
    burn(dev, 1, ring=2)
    assert dev.kmd.jobs[-1]["wait"] == []


def test_copies_carry_direction_and_timeline():
    dev = _dev()
    create(dev, 1)
    run(dev, wire.CMD_COPY_D2D, (wire.VA_USER_BASE, wire.VA_USER_BASE + 4096, 64), ctx=1, ring=9)
    assert dev.kmd.jobs[-1]["direction"] == "d2d" and dev.kmd.jobs[-1]["timeline"] == 9


def test_without_context_init_every_ring_is_timeline_0():
    dev = ComputeDevice(FakeKmd(), None, 1 << 20, 1 << wire.PVGPU_F_COMPUTE)
    create(dev, 1)
    a = burn(dev, 1, ring=5)
    assert dev.kmd.jobs[-1]["timeline"] == 0
    burn(dev, 1, ring=6)
    assert dev.kmd.jobs[-1]["wait"] == [a]


def test_record_on_an_idle_timeline_completes_at_once_at_record_time():
    dev = _dev()
    create(dev, 1)
    dev.kmd.now = 5_000
    run(dev, wire.CMD_EVENT_RECORD, (3,), ctx=1, ring=1)
    assert query(dev, 3) == (wire.EVENT_STATUS_COMPLETE, 0, 5_000, 0, 0)
    # a fenced query of a complete event is answered at once
    assert query(dev, 3, fenced=True)[0] == wire.EVENT_STATUS_COMPLETE


def test_record_captures_pending_waits_and_the_latest_completion_time():
    dev = _dev()
    create(dev, 1)
    a = burn(dev, 1, ring=0)
    run(dev, wire.CMD_EVENT_RECORD, (1,), ctx=1, ring=0)
    run(dev, wire.CMD_EVENT_WAIT, (1,), ctx=1, ring=2)  # ring 2: no job yet, only a wait
    dev.kmd.now = 2_000
    run(dev, wire.CMD_EVENT_RECORD, (2,), ctx=1, ring=2)
    assert query(dev, 2)[0] == wire.EVENT_STATUS_PENDING
    held = query(dev, 2, fenced=True)
    assert isinstance(held, Pending) and held.fences == [a]
    a.signal(timestamp=9_000)
    assert query(dev, 2) == (wire.EVENT_STATUS_COMPLETE, 0, 9_000, 0, 0)
    body = held.finish()
    assert struct.unpack(wire.RESP_EVENT_FORMAT, body.body)[:3] == (wire.EVENT_STATUS_COMPLETE, 0, 9_000)


def test_timestamp_falls_back_to_the_clock_when_the_fence_has_none():
    dev = _dev()
    create(dev, 1)
    a = burn(dev, 1)
    run(dev, wire.CMD_EVENT_RECORD, (1,), ctx=1)
    dev.kmd.now = 4_321  # when completion is observed
    a.signal()  # no timestamp from the KMD
    dev.kmd.now = 99_999
    assert query(dev, 1)[2] == 4_321


def test_rerecord_replaces_the_recording():
    dev = _dev()
    create(dev, 1)
    a = burn(dev, 1)
    run(dev, wire.CMD_EVENT_RECORD, (1,), ctx=1)
    a.signal(timestamp=1_500)
    b = burn(dev, 1)
    run(dev, wire.CMD_EVENT_RECORD, (1,), ctx=1)
    assert query(dev, 1)[0] == wire.EVENT_STATUS_PENDING
    b.signal(timestamp=3_000)
    assert query(dev, 1)[:3] == (wire.EVENT_STATUS_COMPLETE, 0, 3_000)


def test_event_error_is_its_own_timelines_not_a_waited_ones():
    dev = _dev()
    create(dev, 1)
    bad = burn(dev, 1, ring=0)
    run(dev, wire.CMD_EVENT_RECORD, (1,), ctx=1, ring=0)
    run(dev, wire.CMD_EVENT_WAIT, (1,), ctx=1, ring=1)
    ok = burn(dev, 1, ring=1)
    run(dev, wire.CMD_EVENT_RECORD, (2,), ctx=1, ring=1)
    bad.signal(error=GpuFault(1, 0xABC000, wire.ACCESS_WRITE, 1), timestamp=2_000)
    ok.signal(timestamp=3_000)
    assert query(dev, 1) == (wire.EVENT_STATUS_ERROR, wire.RESP_ERR_PAGE_FAULT, 2_000, 0xABC000,
                             wire.ACCESS_WRITE)
    assert query(dev, 2) == (wire.EVENT_STATUS_COMPLETE, 0, 3_000, 0, 0)
    # the query reported nothing: the timeline's next sync point still does
    assert error_of(lambda: run(dev, wire.CMD_NOP, ctx=1, ring=0, fenced=True).finish()) == \
        wire.RESP_ERR_PAGE_FAULT


def test_events_outlive_their_context():
    dev = _dev()
    create(dev, 1)
    a = burn(dev, 1)
    run(dev, wire.CMD_EVENT_RECORD, (1,), ctx=1)
    run(dev, wire.CMD_CTX_DESTROY, ctx=1)
    a.signal(timestamp=5_000)
    assert query(dev, 1)[:3] == (wire.EVENT_STATUS_COMPLETE, 0, 5_000)


# ------------------------------------------------------------------ bad ids
def test_bad_event_ids_are_refused_and_change_nothing():
    dev = _dev()
    create(dev, 1)
    a = burn(dev, 1)
    run(dev, wire.CMD_EVENT_RECORD, (1,), ctx=1)
    run(dev, wire.CMD_EVENT_WAIT, (1,), ctx=1, ring=2)
    waits = list(dev.contexts[1].timeline(2).waits)
    for type_ in (wire.CMD_EVENT_WAIT, wire.CMD_EVENT_QUERY, wire.CMD_EVENT_DESTROY,
                  wire.CMD_EVENT_EXPORT):
        for bad in (0, 99):
            assert error_of(run, dev, type_, (bad,), ctx=1, ring=2) == wire.RESP_ERR_INVALID_EVENT
    assert error_of(run, dev, wire.CMD_EVENT_RECORD, (0,), ctx=1) == wire.RESP_ERR_INVALID_EVENT
    assert error_of(run, dev, wire.CMD_EVENT_IMPORT, (0, 1, 1)) == wire.RESP_ERR_INVALID_EVENT
    # record and wait need a live context
    assert error_of(run, dev, wire.CMD_EVENT_RECORD, (2,), ctx=9) == wire.RESP_ERR_INVALID_CONTEXT_ID
    assert error_of(run, dev, wire.CMD_EVENT_WAIT, (1,), ctx=9) == wire.RESP_ERR_INVALID_CONTEXT_ID
    assert set(dev.events) == {1} and dev.contexts[1].timeline(2).waits == waits == [a]
    assert query(dev, 1)[0] == wire.EVENT_STATUS_PENDING


def test_destroyed_event_id_is_unknown_and_reusable():
    dev = _dev()
    create(dev, 1)
    run(dev, wire.CMD_EVENT_RECORD, (4,), ctx=1)
    run(dev, wire.CMD_EVENT_DESTROY, (4,))
    assert error_of(run, dev, wire.CMD_EVENT_QUERY, (4,)) == wire.RESP_ERR_INVALID_EVENT
    run(dev, wire.CMD_EVENT_RECORD, (4,), ctx=1)
    assert query(dev, 4)[0] == wire.EVENT_STATUS_COMPLETE


def test_event_limit(monkeypatch):
    monkeypatch.setattr(wire, "MAX_EVENTS", 3)
    dev = _dev()
    create(dev, 1)
    for i in (1, 2, 3):
        run(dev, wire.CMD_EVENT_RECORD, (i,), ctx=1)
    assert error_of(run, dev, wire.CMD_EVENT_RECORD, (4,), ctx=1) == wire.RESP_ERR_LIMIT
    run(dev, wire.CMD_EVENT_RECORD, (3,), ctx=1)  # re-recording is not a new event
    run(dev, wire.CMD_EVENT_DESTROY, (1,))
    run(dev, wire.CMD_EVENT_RECORD, (4,), ctx=1)


# ------------------------------------------------------------------ export / import
def _handle(res):
    assert res.type == wire.RESP_OK_EVENT_HANDLE
    return struct.unpack(wire.RESP_EVENT_HANDLE_FORMAT, res.body)


def test_export_import_across_sessions_binds_the_same_snapshot():
    exports = EventExports()
    kmd = FakeKmd()
    mine, theirs = _dev(kmd, exports, owner="s1"), _dev(kmd, exports, owner="s2")
    create(mine, 1)
    create(theirs, 1)
    a = burn(mine, 1)
    run(mine, wire.CMD_EVENT_RECORD, (1,), ctx=1)
    h, token = _handle(run(mine, wire.CMD_EVENT_EXPORT, (1,)))
    assert token != 0 and _handle(run(mine, wire.CMD_EVENT_EXPORT, (1,))) == (h, token)  # same
    run(theirs, wire.CMD_EVENT_IMPORT, (8, h, token))
    assert query(theirs, 8)[0] == wire.EVENT_STATUS_PENDING
    run(theirs, wire.CMD_EVENT_WAIT, (8,), ctx=1, ring=1)
    burn(theirs, 1, ring=1)
    assert kmd.jobs[-1]["wait"] == [a]  # the other session's job depends on mine
    # re-recording does not change the export; exporting again gives a new handle
    b = burn(mine, 1)
    run(mine, wire.CMD_EVENT_RECORD, (1,), ctx=1)
    h2, t2 = _handle(run(mine, wire.CMD_EVENT_EXPORT, (1,)))
    assert h2 != h
    run(theirs, wire.CMD_EVENT_IMPORT, (9, h, token))
    assert theirs.events[9].snapshot.fences == (a,)
    run(theirs, wire.CMD_EVENT_IMPORT, (10, h2, t2))
    assert theirs.events[10].snapshot.fences == (a, b)  # a: not reported yet, still captured
    a.signal(timestamp=1_234)
    assert query(theirs, 8)[:3] == (wire.EVENT_STATUS_COMPLETE, 0, 1_234)


def test_wrong_token_or_handle_is_refused_and_creates_nothing():
    exports = EventExports()
    mine, theirs = _dev(exports=exports, owner="s1"), _dev(exports=exports, owner="s2")
    create(mine, 1)
    run(mine, wire.CMD_EVENT_RECORD, (1,), ctx=1)
    h, token = _handle(run(mine, wire.CMD_EVENT_EXPORT, (1,)))
    for bad_h, bad_t in ((h, token ^ 1), (h + 100, token), (h, 0)):
        assert error_of(run, theirs, wire.CMD_EVENT_IMPORT, (3, bad_h, bad_t)) == \
            wire.RESP_ERR_INVALID_EVENT
    assert theirs.events == {}
    run(theirs, wire.CMD_EVENT_IMPORT, (3, h, token))  # the right one still works
    assert set(theirs.events) == {3}


def test_exports_are_withdrawn_with_their_event_and_session_importers_keep_theirs():
    exports = EventExports()
    mine, theirs = _dev(exports=exports, owner="s1"), _dev(exports=exports, owner="s2")
    create(mine, 1)
    a = burn(mine, 1)
    run(mine, wire.CMD_EVENT_RECORD, (1,), ctx=1)
    run(mine, wire.CMD_EVENT_RECORD, (2,), ctx=1)
    h1, t1 = _handle(run(mine, wire.CMD_EVENT_EXPORT, (1,)))
    h2, t2 = _handle(run(mine, wire.CMD_EVENT_EXPORT, (2,)))
    run(theirs, wire.CMD_EVENT_IMPORT, (1, h1, t1))
    run(mine, wire.CMD_EVENT_DESTROY, (1,))  # withdraws export h1
    assert error_of(run, theirs, wire.CMD_EVENT_IMPORT, (5, h1, t1)) == wire.RESP_ERR_INVALID_EVENT
    mine.reset()  # device reset / session reclaim: every export of it goes
    assert error_of(run, theirs, wire.CMD_EVENT_IMPORT, (5, h2, t2)) == wire.RESP_ERR_INVALID_EVENT
    assert len(exports) == 0
    a.signal(timestamp=7_700)
    assert query(theirs, 1)[:3] == (wire.EVENT_STATUS_COMPLETE, 0, 7_700)  # the importer's copy


def test_exports_per_session_are_bounded_oldest_first():
    exports = EventExports(max_per_owner=2)
    dev = _dev(exports=exports, owner="s1")
    other = _dev(exports=exports, owner="s2")
    create(dev, 1)
    handles = []
    for i in (1, 2, 3):
        run(dev, wire.CMD_EVENT_RECORD, (i,), ctx=1)
        handles.append(_handle(run(dev, wire.CMD_EVENT_EXPORT, (i,))))
    assert error_of(run, other, wire.CMD_EVENT_IMPORT, (1, *handles[0])) == wire.RESP_ERR_INVALID_EVENT
    run(other, wire.CMD_EVENT_IMPORT, (2, *handles[1]))
    run(other, wire.CMD_EVENT_IMPORT, (3, *handles[2]))
    assert exports.count("s1") == 2
    # re-exporting the withdrawn event's (unchanged) recording publishes it again
    h, t = _handle(run(dev, wire.CMD_EVENT_EXPORT, (1,)))
    assert (h, t) != handles[0]
    run(other, wire.CMD_EVENT_IMPORT, (1, h, t))


# ------------------------------------------------------------------ CTX_SYNC
def test_ctx_sync_waits_for_every_timeline_and_reports_the_first_error():
    dev = _dev()
    create(dev, 1)
    create(dev, 2)
    f0 = burn(dev, 1, ring=0)
    f2 = burn(dev, 1, ring=2)
    g = burn(dev, 2, ring=0)  # another context: not waited for
    held = run(dev, wire.CMD_CTX_SYNC, ctx=1)
    assert isinstance(held, Pending) and set(held.fences) == {f0, f2} and g not in held.fences
    f0.signal()
    f2.signal(error=GpuFault(1, 0x5000, wire.ACCESS_READ, 1))
    e = error_of(held.finish)
    assert e == wire.RESP_ERR_PAGE_FAULT
    # every timeline's remembered error was reported: the next sync points are clean
    assert run(dev, wire.CMD_NOP, ctx=1, ring=2, fenced=True).type == wire.RESP_OK_NODATA
    assert run(dev, wire.CMD_CTX_SYNC, ctx=1).type == wire.RESP_OK_NODATA
    assert error_of(run, dev, wire.CMD_CTX_SYNC, ctx=3) == wire.RESP_ERR_INVALID_CONTEXT_ID


def test_ctx_sync_reports_the_lowest_ring_first_and_waits_for_pending_event_waits():
    dev = _dev()
    create(dev, 1)
    create(dev, 2)
    other = burn(dev, 2)
    run(dev, wire.CMD_EVENT_RECORD, (1,), ctx=2)
    f5 = burn(dev, 1, ring=5)
    f1 = burn(dev, 1, ring=1)
    run(dev, wire.CMD_EVENT_WAIT, (1,), ctx=1, ring=7)  # no job behind it yet
    held = run(dev, wire.CMD_CTX_SYNC, ctx=1)
    assert set(held.fences) == {f5, f1, other}
    f5.signal(error=JobTimedOut("too long"))
    f1.signal(error=ContextLost("lost"))
    other.signal()
    assert error_of(held.finish) == wire.RESP_ERR_CONTEXT_LOST  # ring 1 before ring 5


def test_nop_sync_point_waits_for_the_timelines_event_waits():
    dev = _dev()
    create(dev, 1)
    a = burn(dev, 1, ring=0)
    run(dev, wire.CMD_EVENT_RECORD, (1,), ctx=1, ring=0)
    run(dev, wire.CMD_EVENT_WAIT, (1,), ctx=1, ring=1)
    held = run(dev, wire.CMD_NOP, ctx=1, ring=1, fenced=True)
    assert isinstance(held, Pending) and held.fences == [a]


# ------------------------------------------------------------------ lost contexts
def test_lost_context_and_timeouts_map_to_their_codes():
    # [FENCE-LOST-2] work of a lost context fails with RESP_ERR_CONTEXT_LOST
    assert commands.fault_to_error(JobTimedOut("x")).resp == wire.RESP_ERR_JOB_TIMEOUT
    assert commands.fault_to_error(ContextLost("x")).resp == wire.RESP_ERR_CONTEXT_LOST
    assert commands.fault_to_error("illegal packet").resp == wire.RESP_ERR_UNSPEC
    assert commands.kmd_to_error(ContextLost("x")).resp == wire.RESP_ERR_CONTEXT_LOST
    dev = _dev()
    create(dev, 1)
    a = burn(dev, 1)
    run(dev, wire.CMD_EVENT_RECORD, (1,), ctx=1)
    run(dev, wire.CMD_EVENT_WAIT, (1,), ctx=1, ring=1)
    dev.kmd.lost = True
    assert error_of(burn, dev, 1, ring=1) == wire.RESP_ERR_CONTEXT_LOST
    assert dev.contexts[1].timeline(1).waits == [a]  # not submitted: the wait stays
    a.signal(error=JobTimedOut("stopped"))
    assert query(dev, 1)[:2] == (wire.EVENT_STATUS_ERROR, wire.RESP_ERR_JOB_TIMEOUT)


# ------------------------------------------------------------------ GET_STATS
def test_get_stats_needs_room_and_carries_the_map():
    dev = _dev()
    with pytest.raises(CommandError) as ei:
        run(dev, wire.CMD_GET_STATS, writable=wire.MIN_RESPONSE_SIZE // 8)
    e = ei.value
    assert e.resp == wire.RESP_ERR_INVALID_PARAMETER and e.info0 > wire.MIN_RESPONSE_SIZE // 8
    res = run(dev, wire.CMD_GET_STATS, writable=e.info0)
    assert res.type == wire.RESP_OK_STATS
    (length,) = struct.unpack_from(wire.RESP_STATS_FORMAT, res.body)
    assert wire.CTRL_HDR_SIZE + len(res.body) == e.info0
    stats = msgpack.unpackb(res.body[wire.RESP_STATS_SIZE:], raw=False)
    assert len(res.body) == wire.RESP_STATS_SIZE + length
    assert stats["device"] == 0 and stats["policy"] == "fifo"


def test_get_stats_of_a_kmd_without_statistics_still_names_the_device():
    kmd = FakeKmd()
    kmd.sched_stats = None
    dev = ComputeDevice(kmd, None, 1 << 20, FEATURES, device_index=1)
    res = run(dev, wire.CMD_GET_STATS, writable=4096)
    assert msgpack.unpackb(res.body[wire.RESP_STATS_SIZE:], raw=False) == {"device": 1}


# ------------------------------------------------------------------ through the real backend
@pytest.fixture
def backend():
    yield from _backend()


def test_real_backend_event_query_is_held_until_the_burn_completes(backend):
    g = Guest(backend)
    g.init()
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))

    def attempt(burn_us):
        g.call(cmd(wire.CMD_LAUNCH, (wire.KERNEL_BURN, 1, 1, 1, 1, 1, 1, 1), ctx_id=1, ring_idx=2,
                   extra=struct.pack("<Q", burn_us)))
        burn = timeline_fence(backend, g, 1, 2)
        hdr, _ = g.call(cmd(wire.CMD_EVENT_RECORD, (11,), ctx_id=1, ring_idx=2))
        assert hdr[0] == wire.RESP_OK_NODATA
        hdr, body = g.call(cmd(wire.CMD_EVENT_QUERY, (11,)))
        assert hdr[0] == wire.RESP_OK_EVENT
        status = struct.unpack(wire.RESP_EVENT_FORMAT, body[:32])[0]
        head, resp = g.submit(cmd(wire.CMD_EVENT_QUERY, (11,), flags=wire.FLAG_FENCE, fence_id=3))
        answered = g.queue.pop_used()
        running = not burn.signaled  # still, after the held query was handled
        if running:
            assert status == wire.EVENT_STATUS_PENDING and answered == []  # held
        n = answered[0][1] if answered else g.complete(head)
        raw = g.mem.read(resp, n)
        assert n == wire.CTRL_HDR_SIZE + struct.calcsize(wire.RESP_EVENT_FORMAT)
        assert struct.unpack_from(wire.CTRL_HDR_FORMAT, raw) == (wire.RESP_OK_EVENT,
                                                                  wire.FLAG_FENCE, 3, 0, 0)
        status, err, ts, _i0, _i1 = struct.unpack_from(wire.RESP_EVENT_FORMAT, raw,
                                                       wire.CTRL_HDR_SIZE)
        assert (status, err) == (wire.EVENT_STATUS_COMPLETE, 0) and ts > 0
        return running
    with_longer_burns(attempt)


def test_real_backend_export_between_sessions_and_stats(backend):
    g1, g2 = Guest(backend, b"g1"), Guest(backend, b"g2")
    g1.init()
    g2.init()
    for g in (g1, g2):
        g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    g1.call(cmd(wire.CMD_EVENT_RECORD, (1,), ctx_id=1))
    hdr, body = g1.call(cmd(wire.CMD_EVENT_EXPORT, (1,)))
    assert hdr[0] == wire.RESP_OK_EVENT_HANDLE
    h, token = struct.unpack_from(wire.RESP_EVENT_HANDLE_FORMAT, body)
    assert g2.call(cmd(wire.CMD_EVENT_IMPORT, (1, h, token ^ 0xFF)))[0][0] == wire.RESP_ERR_INVALID_EVENT
    assert g2.call(cmd(wire.CMD_EVENT_IMPORT, (1, h, token)))[0][0] == wire.RESP_OK_NODATA
    assert g2.call(cmd(wire.CMD_EVENT_QUERY, (1,)))[0][0] == wire.RESP_OK_EVENT
    # the exporting session goes away: its exports go, the importer's event stays
    assert g1.request(wire.OP_BYE)["ok"]
    assert len(backend.event_exports) == 0
    assert g2.call(cmd(wire.CMD_EVENT_QUERY, (1,)))[0][0] == wire.RESP_OK_EVENT
    hdr, body = g2.call(cmd(wire.CMD_GET_STATS), writable=64 << 10)
    assert hdr[0] == wire.RESP_OK_STATS
    (length,) = struct.unpack_from(wire.RESP_STATS_FORMAT, body)
    assert msgpack.unpackb(body[wire.RESP_STATS_SIZE:wire.RESP_STATS_SIZE + length], raw=False)["device"] == 0
    hdr, body = g2.call(cmd(wire.CMD_GET_STATS), writable=wire.MIN_RESPONSE_SIZE)
    if hdr[0] != wire.RESP_OK_STATS:  # a host whose map does not fit 240 bytes
        assert hdr[0] == wire.RESP_ERR_INVALID_PARAMETER
        assert struct.unpack_from(wire.RESP_ERROR_FORMAT, body)[0] > wire.MIN_RESPONSE_SIZE
