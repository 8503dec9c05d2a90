"""pvgpu.guest.api.pinned without a host: the pinned allocator over a session heap, PinnedArray
(views, slices, derived arrays, free, garbage collection), recognising pinned memory in
any view (`extent`), blocks kept while requests use them; and the bounce-chunk pool
(guest/api/copy.py) when `Device.staging_chunk` changes."""

import gc
import pickle
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from pvgpu.guest.api import copy, lifetime, pinned
from pvgpu.guest.api.device import Device
from pvgpu.guest.api.pinned import PinnedArray, PinnedMemoryError
from pvgpu.guest.frontend.heap import GuestHeap, OutOfGuestMemory
from pvgpu.transport.memory import GuestMemory, InlineGuestMemory

MEM = 4 << 20
HEAP_BASE = 64 << 10


def fake_conn(inline=False, mem_size=MEM):
    mem = InlineGuestMemory(mem_size) if inline else GuestMemory(mem_size)
    session = SimpleNamespace(mem=mem, heap=GuestHeap(HEAP_BASE, mem_size - HEAP_BASE, align=4096),
                              closed=False, inline=inline, mem_size=mem_size, devices=[object()])
    conn = SimpleNamespace(session=session, _conn_lock=threading.RLock())
    conn._pinned = pinned.PinnedAllocator(conn)
    conn._releases = lifetime.Releases(conn)
    return conn


@pytest.fixture
def conn():
    return fake_conn()


def test_empty_is_an_ndarray_in_guest_memory(conn):
    free0 = conn.session.heap.free_bytes
    p = conn._pinned.empty((3, 5), np.float32)
    assert isinstance(p, np.ndarray) and isinstance(p, PinnedArray)
    assert p.shape == (3, 5) and p.dtype == np.float32 and p.flags.c_contiguous and p.flags.writeable
    assert p.pinned and not p.freed
    assert p.gpa % 4096 == 0 and HEAP_BASE <= p.gpa < MEM
    p[:] = np.arange(15, dtype=np.float32).reshape(3, 5)
    # the array *is* guest memory at its gpa
    assert conn.session.mem.read(p.gpa, 60) == np.arange(15, dtype=np.float32).tobytes()
    assert conn.session.heap.free_bytes == free0 - 4096
    assert conn._pinned.live == 1 and conn._pinned.live_bytes == 60


def test_views_slices_and_derived_arrays(conn):
    p = conn._pinned.empty(100, np.float32)
    p[:] = 1
    s = p[10:20]
    assert type(s) is PinnedArray and s.pinned and s.gpa == p.gpa + 40
    assert p.view(np.uint8).pinned and p.reshape(10, 10).pinned
    # new memory is not pinned: copies, arithmetic results (plain ndarrays), reductions
    assert not p.copy().pinned
    assert type(p + 1) is np.ndarray and type(np.sqrt(p)) is np.ndarray
    r = np.sum(p)
    assert np.isscalar(r) and r == 100
    np.add(p, 1, out=p)  # in place stays pinned
    assert type(p) is PinnedArray and p.pinned and p[0] == 2
    # pickles as an ordinary array
    q = pickle.loads(pickle.dumps(p))
    assert type(q) is np.ndarray and np.array_equal(q, p)


def test_extent_finds_the_block_from_any_view(conn):
    p = conn._pinned.empty(1000, np.float32)
    blk, gpa, n = pinned.extent(p, conn)
    assert (gpa, n) == (p.gpa, 4000)
    for view, off, size in [(p[10:20], 40, 40), (np.asarray(p)[5:], 20, 3980),
                            (np.ascontiguousarray(p), 0, 4000), (p.reshape(-1).view(np.uint8)[3:7], 3, 4),
                            (np.asarray(p).reshape(10, 100)[2], 800, 400)]:
        b2, g2, n2 = pinned.extent(view, conn)
        assert b2 is blk and g2 == p.gpa + off and n2 == size
    # not pinned: ordinary arrays, copies, non-contiguous views, non-arrays, other connections
    assert pinned.extent(np.zeros(10), conn) is None
    assert pinned.extent(p.copy(), conn) is None
    assert pinned.extent(p[::2], conn) is None
    assert pinned.extent([1, 2, 3], conn) is None
    assert pinned.extent(p, fake_conn()) is None


def test_free_returns_the_heap_block_and_later_copies_fail(conn):
    heap = conn.session.heap
    free0 = heap.free_bytes
    p = conn._pinned.empty(10_000, np.uint8)
    view = np.asarray(p)[100:200]
    p.free()
    assert heap.free_bytes == free0 and conn._pinned.live == 0
    assert p.freed and not p.pinned and not p.flags.writeable
    with pytest.raises(ValueError):
        p[0] = 1  # the freed array object itself is read-only
    for v in (p, view, p[3:9]):
        with pytest.raises(PinnedMemoryError, match="freed"):
            pinned.extent(v, conn)
    p.free()  # twice: nothing more
    assert heap.free_bytes == free0
    with conn._pinned.empty(5, np.int64) as q:
        assert q.pinned
    assert q.freed and heap.free_bytes == free0


def test_zero_size_and_bad_shapes(conn):
    z = conn._pinned.empty(0, np.float32)
    assert z.shape == (0,) and z.nbytes == 0
    assert pinned.extent(z, conn)[2] == 0
    z.free()
    with pytest.raises(ValueError):
        conn._pinned.empty((-1, 3), np.float32)


def test_out_of_guest_memory_names_mem_size():
    c = fake_conn(mem_size=1 << 20)
    with pytest.raises(OutOfGuestMemory, match="mem_size"):
        c._pinned.empty(2 << 20, np.uint8)


def test_closed_connection_refuses(conn):
    conn.session.closed = True
    with pytest.raises(PinnedMemoryError):
        conn._pinned.empty(10, np.uint8)


def test_garbage_collected_arrays_give_their_block_back(conn):
    heap = conn.session.heap
    free0 = heap.free_bytes
    p = conn._pinned.empty(50_000, np.uint8)
    view = np.asarray(p)[10:]  # a plain view keeps the block alive
    del p
    gc.collect()
    conn._pinned.empty(1, np.uint8).free()
    assert conn._pinned.live == 1 and heap.free_bytes < free0
    view[:] = 7  # still valid memory
    del view
    gc.collect()
    conn._pinned.empty(1, np.uint8).free()  # the next allocation (or free) collects it
    assert conn._pinned.live == 0 and conn._pinned.live_bytes == 0 and heap.free_bytes == free0


def test_a_busy_block_goes_back_when_its_requests_complete(conn):
    heap = conn.session.heap
    free0 = heap.free_bytes
    p = conn._pinned.empty(8192, np.uint8)
    blk = pinned.extent(p, conn)[0]
    blk.busy = 2  # two requests on the device
    p.free()
    assert heap.free_bytes < free0  # still in use by the device
    dev = SimpleNamespace(driver=SimpleNamespace(needs_reset=False))
    conn._pinned._done(blk, dev, SimpleNamespace(failed=None))
    assert heap.free_bytes < free0
    conn._pinned._done(blk, dev, SimpleNamespace(failed=None))
    assert heap.free_bytes == free0 and conn._pinned.live == 0


def test_a_block_of_a_request_lost_to_a_reset_waits_for_the_reset(conn):
    heap = conn.session.heap
    free0 = heap.free_bytes
    p = conn._pinned.empty(8192, np.uint8)
    blk = pinned.extent(p, conn)[0]
    quarantined = []
    dev = SimpleNamespace(driver=SimpleNamespace(needs_reset=True),
                          _staging=SimpleNamespace(quarantine=quarantined.extend))
    blk.busy = 1
    conn._pinned._done(blk, dev, SimpleNamespace(failed=RuntimeError("needs reset")))
    p.free()
    # the device may still write into it: the device's reset() frees it, not this free()
    assert quarantined == [blk.gpa] and heap.free_bytes < free0


def test_inline_memory_works_the_same():
    c = fake_conn(inline=True)
    p = c._pinned.empty(64, np.uint8)
    p[:] = 5
    assert c.session.mem.read(p.gpa, 64) == b"\5" * 64
    p.free()
    assert c._pinned.live == 0


# ---------------------------------------------------------------- Device.staging_chunk

def fake_device():
    conn = fake_conn(mem_size=64 << 20)
    return Device(conn, SimpleNamespace(index=0)), conn.session.heap


def test_staging_chunk_setter_frees_the_idle_pool():
    dev, heap = fake_device()
    free0 = heap.free_bytes
    pool = dev._staging
    a, b = pool.take(), pool.take()
    pool.give(a)
    pool.give(b)
    assert dev.copy_stats["staging_chunks"] == 2 and heap.free_bytes == free0 - 2 * dev.staging_chunk
    dev.staging_chunk = 1 << 20
    assert dev.staging_chunk == 1 << 20 and heap.free_bytes == free0 and pool.count == 0
    c = pool.take()
    assert heap.free_bytes == free0 - (1 << 20)
    pool.give(c)
    for bad in (0, 1000, 4097):
        with pytest.raises(ValueError):
            dev.staging_chunk = bad


def test_chunks_lent_across_a_size_change_are_freed_when_they_return():
    dev, heap = fake_device()
    free0 = heap.free_bytes
    old = dev.staging_chunk
    pool = dev._staging
    lent = pool.lend()
    dev.staging_chunk = 256 << 10
    assert heap.free_bytes == free0 - old  # still on the device
    pool.give_back(lent)
    assert heap.free_bytes == free0 and pool.free == [] and pool.count == 0
    fresh = pool.lend()
    pool.give_back(fresh)
    assert pool.free == [fresh]  # a chunk of the current size goes back to the pool


def test_device_defaults():
    dev, _heap = fake_device()
    assert dev.staging_depth == 4 and dev.small_h2d_max == 216
    assert dev.pinned_request == copy.PINNED_REQUEST_SHARED and dev.pinned_depth == copy.PINNED_DEPTH
    inline_dev = Device(fake_conn(inline=True), SimpleNamespace(index=0))
    assert inline_dev.pinned_request == copy.PINNED_REQUEST_INLINE


def test_bench_copies_command_line():
    from pvgpu.cli import build_parser
    a = build_parser().parse_args(["bench", "copies", "--quick", "--json", "x.json"])
    assert (a.which, a.quick, a.json) == ("copies", True, "x.json")
