"""pvgpu.guest.api.copy without a host: CopyPipeline in both directions, synchronous and
asynchronous, through bounce chunks of the device's StagingPool, through pinned memory and
in the command's descriptor, against a fake driver whose device completes requests in
order only when the guest waits (so what is in flight at any time is known)."""

import collections
import struct
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from pvgpu.guest.api import copy, lifetime, pinned
from pvgpu.guest.api.context import Context
from pvgpu.guest.api.copy import D2H, H2D, CopyPipeline
from pvgpu.guest.api.device import Device
from pvgpu.guest.frontend.driver import DeviceResponseError
from pvgpu.guest.frontend.heap import GuestHeap
from pvgpu.transport.memory import GuestMemory
from pvgpu.spec import wire

MEM = 8 << 20
HEAP_BASE = 64 << 10
VRAM = 1 << 20
_HDR = struct.Struct(wire.CTRL_HDR_FORMAT)


class FakeRequest:
    def __init__(self, type_, body, extra, readable, writable):
        self.type, self.body, self.extra = type_, body, extra
        self.readable, self.writable = list(readable), list(writable)
        self.done = False
        self.failed = None
        self.on_done = None
        self.bounce = None

    def response(self):
        if self.failed is not None:
            raise self.failed
        return wire.RESP_OK_NODATA, b""


class FakeDriver:
    """The driver and the device in one: requests queue up and the device carries them out
    in order, one whenever the session waits, on a VRAM of its own."""

    def __init__(self, mem):
        self.index = 0
        self.mem = mem
        self.vram = bytearray(VRAM)
        self.queue = collections.deque()
        self.requests = []
        self.max_in_flight = 0
        self.faulting = set()  # device addresses whose copies fail
        self.needs_reset = False
        self.session = None
        self.wait_kinds = []  # the `kind` of each wait (FrontendSession.wait_for)

    def submit(self, cmd, readable=(), writable=(), kick=True):
        type_, _flags, _fence, _ctx, _ring = _HDR.unpack_from(cmd)
        fmt = struct.Struct(wire.CMD_BODY_FORMATS[type_])
        body = fmt.unpack_from(cmd, _HDR.size)
        req = FakeRequest(type_, body, cmd[_HDR.size + fmt.size:], readable, writable)
        self.queue.append(req)
        self.requests.append(req)
        self.max_in_flight = max(self.max_in_flight, len(self.queue))
        return req

    def send_fenced(self, ctx_id, ring_idx):
        return None  # no launch batches here: a synchronize sends its own sync command

    def call(self, cmd, readable=(), writable=()):
        req = self.submit(cmd, readable, writable)
        self.session.wait_for(lambda: req.done)
        return req.response()

    def complete_one(self) -> None:
        req = self.queue.popleft()
        if req.type in (wire.CMD_COPY_H2D, wire.CMD_COPY_D2H):
            va, n = req.body
            if va in self.faulting:
                req.failed = DeviceResponseError(wire.RESP_ERR_PAGE_FAULT, "fault", info0=va)
            elif req.type == wire.CMD_COPY_H2D:
                data = req.extra or b"".join(self.mem.read(g, s) for g, s in req.readable)
                self.vram[va:va + n] = data
            else:
                (gpa, size), = req.writable
                self.mem.write(gpa, bytes(self.vram[va:va + n]))
        req.done = True
        if req.on_done is not None:
            req.on_done(req)

    def copies(self, type_) -> list:
        return [r for r in self.requests if r.type == type_]


def make_context():
    mem = GuestMemory(MEM)
    drv = FakeDriver(mem)

    def wait_for(cond, timeout=None, kind=None):
        drv.wait_kinds.append(kind)
        while not cond():
            assert drv.queue, "waiting for a request the device does not have"
            drv.complete_one()

    session = SimpleNamespace(mem=mem, heap=GuestHeap(HEAP_BASE, MEM - HEAP_BASE, align=4096),
                              closed=False, host_lost=False, inline=False, mem_size=MEM,
                              devices=[drv], wait_for=wait_for)
    drv.session = session
    conn = SimpleNamespace(session=session, _conn_lock=threading.RLock())
    conn._pinned = pinned.PinnedAllocator(conn)
    conn._releases = lifetime.Releases(conn)
    dev = Device(conn, drv)
    dev.staging_chunk = 16 << 10
    return Context(dev, 1), drv


def data(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.mark.parametrize("pipeline, depth", [(True, copy.STAGING_DEPTH), (False, 1)])
def test_synchronous_copies_keep_the_depth_in_flight(pipeline, depth):
    ctx, drv = make_context()
    dev, pool = ctx.device, ctx.device._staging
    src = data(100 << 10)  # 7 chunks of 16 KiB
    ctx.copy_h2d(0x1000, src, pipeline=pipeline)
    assert drv.vram[0x1000:0x1000 + src.nbytes] == src.tobytes()
    assert len(drv.copies(wire.CMD_COPY_H2D)) == 7 and drv.max_in_flight == depth
    out = np.zeros_like(src)
    assert ctx.copy_d2h(0x1000, out, pipeline=pipeline) is out
    np.testing.assert_array_equal(out, src)
    assert drv.max_in_flight == depth and not drv.queue
    # every chunk is back in the pool, and the pool never grew past what was in flight
    assert pool.count == depth and sorted(pool.free) == sorted(set(pool.free))
    assert len(pool.free) == depth and dev.copy_stats["staging_chunks"] == 14


def test_asynchronous_copies_return_before_the_device_and_land_on_completion():
    ctx, drv = make_context()
    pool = ctx.device._staging
    src = data(40 << 10, seed=1)
    expect = src.copy()
    ctx.copy_h2d_async(0x2000, src)
    src[:] = 0  # staged already: the copy is not changed
    assert len(drv.queue) == 3 and len(pool.lent) == 3
    out = np.zeros_like(src)
    assert ctx.copy_d2h_async(0x2000, out) is out
    assert not out.any()  # nothing landed yet
    ctx.default_stream.synchronize()
    np.testing.assert_array_equal(out, expect)
    assert not pool.lent and len(pool.free) == pool.count


def test_a_synchronous_copy_settles_every_piece_then_raises_the_first_error():
    ctx, drv = make_context()
    pool = ctx.device._staging
    drv.faulting = {0x4000 + (16 << 10), 0x4000 + (48 << 10)}  # pieces 1 and 3
    with pytest.raises(Exception) as err:
        ctx.copy_h2d(0x4000, data(80 << 10))
    assert err.value.info0 == 0x4000 + (16 << 10)
    assert not drv.queue and len(drv.copies(wire.CMD_COPY_H2D)) == 5
    assert len(pool.free) == pool.count and not pool.quarantined


def test_an_asynchronous_error_waits_for_the_streams_next_synchronize():
    ctx, drv = make_context()
    s = ctx.create_stream()
    drv.faulting = {0x8000}
    out = np.zeros(32 << 10, np.uint8)
    ctx.copy_d2h_async(0x8000, out, s)
    ctx.device.connection.session.wait_for(lambda: not drv.queue)
    with pytest.raises(Exception) as err:
        s.synchronize()
    assert err.value.info0 == 0x8000
    s.synchronize()  # raised once
    assert not ctx.device._staging.lent


def test_a_failed_wait_quarantines_the_chunks_in_flight_until_the_reset():
    ctx, drv = make_context()
    pool = ctx.device._staging
    session = ctx.device.connection.session

    def host_lost(cond, timeout=None):
        raise ConnectionError("host lost")
    session.wait_for = host_lost
    with pytest.raises(Exception):
        ctx.copy_h2d(0, data(64 << 10))
    assert len(pool.quarantined) == copy.STAGING_DEPTH and not pool.free
    free0 = session.heap.free_bytes
    pool.reset()
    assert session.heap.free_bytes == free0 + copy.STAGING_DEPTH * pool.chunk


def test_a_small_h2d_travels_in_the_descriptor():
    ctx, drv = make_context()
    dev = ctx.device
    src = data(dev.small_h2d_max, seed=2)
    ctx.copy_h2d(0x100, src)
    ctx.copy_h2d_async(0x300, src[:8])
    ctx.default_stream.synchronize()
    reqs = drv.copies(wire.CMD_COPY_H2D)
    assert [len(r.extra) for r in reqs] == [src.nbytes, 8] and not any(r.readable for r in reqs)
    assert drv.vram[0x100:0x100 + src.nbytes] == src.tobytes()
    assert drv.vram[0x300:0x308] == src[:8].tobytes()
    assert dev.copy_stats["small_copies"] == 2 and dev.copy_stats["staging_chunks"] == 0


def test_pinned_memory_is_its_own_descriptor():
    ctx, drv = make_context()
    dev = ctx.device
    dev.pinned_request = 12 << 10
    p = dev.connection._pinned.empty(50 << 10, np.uint8)
    p[:] = data(p.nbytes, seed=3)
    ctx.copy_h2d(0x10000, p)
    reqs = drv.copies(wire.CMD_COPY_H2D)
    assert [r.readable for r in reqs] == [[(p.gpa + off, min(12 << 10, p.nbytes - off))]
                                          for off in range(0, p.nbytes, 12 << 10)]
    assert drv.max_in_flight == copy.PINNED_DEPTH
    q = dev.connection._pinned.empty(50 << 10, np.uint8)
    ctx.copy_d2h_async(0x10000, q)
    block = pinned.extent(q, dev.connection)[0]
    assert block.busy == 5
    ctx.default_stream.synchronize()
    np.testing.assert_array_equal(q, p)
    assert block.busy == 0 and dev.copy_stats["staging_chunks"] == 0
    assert dev.copy_stats["pinned_requests"] == 10
    assert dev.copy_stats["pinned_bytes"] == 2 * p.nbytes


def test_each_wait_of_a_synchronous_copy_names_its_kind_and_size_class():
    # the session expects a wait to take as long as earlier ones of its kind did
    ctx, drv = make_context()
    dev = ctx.device
    dev.pinned_request = 12 << 10
    p = dev.connection._pinned.empty(24 << 10, np.uint8)
    ctx.copy_h2d(0x10000, p)
    ctx.copy_d2h(0x10000, p)
    ctx.copy_h2d(0x10000, data(16 << 10))  # one bounce chunk of 16 KiB
    pinned_kinds = [((H2D, "pinned"), (12 << 10).bit_length())] * 2 + \
        [((D2H, "pinned"), (12 << 10).bit_length())] * 2
    assert drv.wait_kinds == pinned_kinds + [((H2D, "bounce"), (16 << 10).bit_length())]


def test_the_direction_is_checked_and_a_d2h_needs_a_writable_destination():
    ctx, _drv = make_context()
    with pytest.raises(ValueError, match="direction"):
        CopyPipeline(ctx, ctx.default_stream, "d2d", True)
    ro = np.zeros(8192, np.uint8)
    ro.flags.writeable = False
    for sync in (True, False):
        with pytest.raises(ValueError, match="writable C-contiguous"):
            CopyPipeline(ctx, ctx.default_stream, D2H, sync).run(0, ro)
    CopyPipeline(ctx, ctx.default_stream, H2D, True).run(0, np.zeros(0, np.uint8))  # nothing
