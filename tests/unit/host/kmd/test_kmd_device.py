"""pvgpu.host.kmd.device against the real emulated GPU (pvgpu.host.hw.gpu): the driver end to end."""

import threading

import numpy as np
import pytest
from anymachine import python_calls

from pvgpu.host.hw import regs
from pvgpu.host.kmd import (GpuFault, InvalidAddress, InvalidArgument, InvalidContext, KmdError,
                      NoVmid, OutOfMemory)
from pvgpu.spec import wire

P = regs.PAGE_SIZE
W = wire.GUEST_WINDOW_VA


@pytest.fixture
def dev(make_dev):
    return make_dev()


class Window:
    """Host memory dma-mapped and mapped at GUEST_WINDOW_VA in a context."""

    def __init__(self, dev, ctx, size=4 << 20):
        self.buf = np.zeros(size, dtype=np.uint8)
        self.mapping = dev.dma_map(self.buf)
        ctx.map_system(self.mapping, W)

    def put(self, off, arr):
        """Write an array (or bytes) at `off`; -> its VA in the window."""
        raw = (np.frombuffer(arr, np.uint8) if isinstance(arr, (bytes, bytearray))
               else np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
        self.buf[off:off + raw.size] = raw
        return W + off

    def get(self, off, n, dtype=np.float32):
        return self.buf[off:off + n * np.dtype(dtype).itemsize].view(dtype).copy()


def upload(ctx, win, arr, off=0):
    bo = ctx.alloc(arr.nbytes)
    assert ctx.submit_copy(win.put(off, arr), bo.va, arr.nbytes).wait(5)
    return bo


def download(ctx, win, bo, n, off=0, wait=()):
    f = ctx.submit_copy(bo.va, W + off, 4 * n, wait=wait)
    assert f.wait(5) and f.error is None, f.error
    return win.get(off, n)


# ---------------------------------------------------------------------- basics
def test_probe_and_properties(dev):
    assert dev.index == 0 and dev.name
    assert dev.vram_size == 32 << 20
    assert 0 < dev.vram_free() < dev.vram_size
    assert dev.vram_size - dev.vram_free() == dev.kernel_vram
    gpu = dev.gpu
    assert gpu.mmio.read(regs.REG_IRQ_ENABLE) == 1
    for e, ring in enumerate(dev.rings):
        assert gpu.mmio.read(regs.REG_ENGINE(e, regs.RB_BASE)) == ring.base
        assert gpu.mmio.read(regs.REG_ENGINE(e, regs.RB_SIZE)) == ring.size


def test_copy_roundtrip_through_system_memory(dev):
    ctx = dev.create_context("copy")
    win = Window(dev, ctx)
    data = np.random.default_rng(1).random(100_000, dtype=np.float32)
    bo = upload(ctx, win, data)
    assert bo.size == -(-data.nbytes // P) * P and bo.va >= wire.VA_USER_BASE
    out = download(ctx, win, bo, data.size, off=1 << 20)
    assert np.array_equal(out, data)
    assert ctx.stats["jobs_completed"] == 2 and ctx.stats["copy_bytes"] == 2 * data.nbytes


def test_submit_copies_is_one_job(dev):
    ctx = dev.create_context()
    win = Window(dev, ctx)
    parts = [np.full(1000, i, np.float32) for i in range(4)]
    bo = ctx.alloc(16000)
    f = ctx.submit_copies([(win.put(8192 * i, p), bo.va + 4000 * i, 4000)
                           for i, p in enumerate(parts)])
    assert f.wait(5) and f.error is None
    assert ctx.stats["jobs_submitted"] == 1
    assert np.array_equal(download(ctx, win, bo, 4000, off=1 << 20), np.concatenate(parts))


def test_vector_add_and_gemm(dev):
    ctx = dev.create_context()
    win = Window(dev, ctx)
    rng = np.random.default_rng(2)
    n = 50_000
    a, b = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
    A, B = upload(ctx, win, a), upload(ctx, win, b, off=1 << 20)
    C = ctx.alloc(4 * n)
    f = ctx.submit_launch(wire.KERNEL_VECTOR_ADD, (n // 256 + 1,), (256,), [A.va, B.va, C.va, n])
    assert f.wait(5) and f.error is None
    assert np.allclose(download(ctx, win, C, n, off=2 << 20, wait=[f]), a + b)

    m, k, nn = 64, 48, 80
    x, y = rng.random((m, k), dtype=np.float32), rng.random((k, nn), dtype=np.float32)
    X, Y = upload(ctx, win, x), upload(ctx, win, y, off=1 << 20)
    Z = ctx.alloc(4 * m * nn)
    f = ctx.submit_launch(wire.KERNEL_GEMM, (1, 1, 1), (1, 1, 1), [X.va, Y.va, Z.va, m, nn, k])
    z = download(ctx, win, Z, m * nn, off=2 << 20, wait=[f]).reshape(m, nn)
    assert np.allclose(z, x @ y, rtol=1e-4)


def test_cross_engine_ordering(dev):
    """copy in -> kernel -> copy out, chained only by wait=[previous fence], no caller waits."""
    ctx = dev.create_context()
    win = Window(dev, ctx, size=20 << 20)
    n = 1 << 20
    a = np.arange(n, dtype=np.float32)
    win.put(0, a)
    A, C = ctx.alloc(4 * n), ctx.alloc(4 * n)
    fences = []
    for i in range(4):
        f1 = ctx.submit_copy(W, A.va, 4 * n)
        f2 = ctx.submit_launch(wire.KERNEL_SCALE, (n // 256,), (256,),
                               [C.va, A.va, int(np.float32(i + 1).view(np.uint32)), n], wait=[f1])
        f3 = ctx.submit_copy(C.va, W + (4 + 4 * i) * (1 << 20), 4 * n, wait=[f2])
        fences.append(f3)
    assert ctx.last_fence is fences[-1]
    for f in fences:
        assert f.wait(5) and f.error is None
    for i in range(4):
        assert np.array_equal(win.get((4 + 4 * i) * (1 << 20), n), a * (i + 1))
    # the scheduler held the kernels and copies back until their inputs were written
    assert sum(s.stats["dependencies"] for s in dev.schedulers) >= 8


# ---------------------------------------------------------------------- faults
def test_fault_marks_the_job_and_others_continue(dev):
    bad = dev.create_context("bad")
    good = dev.create_context("good")
    win = Window(dev, good)
    n = 4096
    a = np.arange(n, dtype=np.float32)
    A = upload(good, win, a)
    B = good.alloc(4 * n)
    X = bad.alloc(4 * n)
    unmapped = X.va + 64 * P
    f_bad = bad.submit_launch(wire.KERNEL_VECTOR_ADD, (n // 256,), (256,),
                              [X.va, unmapped, X.va, n])
    f_good = good.submit_launch(wire.KERNEL_VECTOR_ADD, (n // 256,), (256,), [A.va, A.va, B.va, n])
    assert f_bad.wait(5) and f_good.wait(5)
    assert isinstance(f_bad.error, GpuFault)
    assert f_bad.error.address == unmapped and f_bad.error.vmid == bad.vmid
    assert f_bad.error.access == wire.ACCESS_READ and f_bad.error.engine == regs.ENGINE_COMPUTE
    assert bad.faults == [f_bad.error] and bad.stats["faults"] == 1
    assert f_good.error is None
    assert np.array_equal(download(good, win, B, n, off=1 << 20), 2 * a)
    # the faulting context itself keeps working
    f = bad.submit_launch(wire.KERNEL_FILL, (n // 256,), (256,),
                          [X.va, int(np.float32(3).view(np.uint32)), n])
    assert f.wait(5) and f.error is None


def test_copy_fault_to_guard_page(dev):
    ctx = dev.create_context()
    bo = ctx.alloc(P)
    f = ctx.submit_copy(bo.va, bo.va + P, 8)  # the guard page after every BO
    assert f.wait(5)
    assert isinstance(f.error, GpuFault) and f.error.address == bo.va + P
    assert f.error.access == wire.ACCESS_WRITE and f.error.engine == regs.ENGINE_COPY


def test_illegal_packet_error(dev):
    ctx = dev.create_context()
    f = ctx.submit_launch(999, (1,), (1,), [])
    assert f.wait(5)
    assert isinstance(f.error, str) and "illegal packet" in f.error
    ok = ctx.submit_launch(wire.KERNEL_BURN, (1,), (1,), [10])
    assert ok.wait(5) and ok.error is None


def test_fence_callbacks_run_on_the_interrupt_thread(dev):
    ctx = dev.create_context()
    f = ctx.submit_launch(wire.KERNEL_BURN, (1,), (1,), [20_000])
    seen = []
    done = threading.Event()
    f.add_done_callback(
        lambda fence: (seen.append((fence, threading.current_thread())), done.set()))
    assert done.wait(5)
    assert seen[0][0] is f and seen[0][1] is not threading.current_thread()
    f.add_done_callback(lambda fence: seen.append((fence, threading.current_thread())))
    assert seen[1][1] is threading.current_thread() and len(seen) == 2


# ---------------------------------------------------------------------- memory
def test_alloc_until_oom_then_free_and_alloc_again(make_dev):
    dev = make_dev(vram_size=8 << 20)
    ctx = dev.create_context()
    bos = []
    with pytest.raises(OutOfMemory) as e:
        for _ in range(10_000):
            bos.append(ctx.alloc(256 << 10))
    assert e.value.code == "out_of_memory"
    assert len(bos) > 10
    with pytest.raises(OutOfMemory):
        ctx.alloc(dev.vram_size * 2)
    ctx.free(bos.pop())
    bos.append(ctx.alloc(256 << 10))
    for bo in bos:
        ctx.free(bo)
    with pytest.raises(InvalidArgument):
        ctx.free(bos[0])  # double free
    # everything but the context's page tables is back
    assert dev.vram_free() == dev.vram_size - dev.kernel_vram - P * ctx.vm.table_pages
    dev.destroy_context(ctx)
    assert dev.vram_free() == dev.vram_size - dev.kernel_vram


def test_alloc_is_zeroed_and_lookup(dev):
    ctx = dev.create_context()
    win = Window(dev, ctx)
    a = upload(ctx, win, np.full(1024, 7, np.float32))
    ctx.free(a)
    b = ctx.alloc(4096)
    assert np.all(download(ctx, win, b, 1024, off=1 << 20) == 0)
    assert ctx.lookup(b.va) is b and ctx.lookup(b.va + 4095) is b
    assert ctx.lookup(b.va + 4096) is None and ctx.lookup(0) is None
    assert ctx.lookup(W) is None  # system mappings are not buffer objects
    with pytest.raises(InvalidArgument):
        ctx.alloc(0)


def test_free_is_deferred_while_work_is_in_flight(dev):
    ctx = dev.create_context()
    bo = ctx.alloc(1 << 20)
    free_before = dev.vram_free()
    burn = ctx.submit_launch(wire.KERNEL_BURN, (1,), (1,), [200_000])
    ctx.free(bo)
    assert dev.vram_free() == free_before and dev.deferred_frees == 1
    assert ctx.lookup(bo.va) is None
    assert burn.wait(5)
    assert dev.vram_free() == free_before + (1 << 20)


def test_destroy_context_with_work_in_flight(dev):
    baseline = dev.vram_free()
    ctx = dev.create_context()
    win = Window(dev, ctx)
    bo = ctx.alloc(2 << 20)
    vmid = ctx.vmid
    burn = ctx.submit_launch(wire.KERNEL_BURN, (1,), (1,), [200_000])
    copy = ctx.submit_copy(bo.va, W, 1 << 20, wait=[burn])  # waits on the compute engine
    used = baseline - dev.vram_free()
    dev.destroy_context(ctx)
    assert dev.vram_free() == baseline - used  # nothing released yet
    assert dev.gpu.mmio.read(regs.REG_VM_PT_BASE(vmid)) == ctx.vm.root
    with pytest.raises(InvalidContext):
        ctx.alloc(P)
    with pytest.raises(InvalidContext):
        ctx.submit_copy(bo.va, W, 4)
    assert copy.wait(5) and copy.error is None and burn.error is None
    assert dev.vram_free() == baseline
    assert dev.gpu.mmio.read(regs.REG_VM_PT_BASE(vmid)) == 0
    assert dev.create_context().vmid == vmid
    dev.destroy_context(ctx)  # idempotent
    dev.dma_unmap(win.mapping)


def test_vmid_exhaustion(dev):
    ctxs = [dev.create_context(str(i)) for i in range(regs.NUM_VMIDS - 1)]
    assert sorted(c.vmid for c in ctxs) == list(range(1, regs.NUM_VMIDS))
    with pytest.raises(NoVmid) as e:
        dev.create_context()
    assert e.value.code == "no_vmid"
    dev.destroy_context(ctxs[10])
    assert dev.create_context().vmid == ctxs[10].vmid


def test_map_system_large_window_is_fast(dev):
    ctx = dev.create_context()
    buf = np.zeros(256 << 20, dtype=np.uint8)
    m = dev.dma_map(buf)
    pages = buf.size // P
    calls = python_calls(lambda: ctx.map_system(m, W))
    assert calls < pages // 4, f"{calls} calls for {pages} pages: per-page Python work"
    buf[-4096:] = 5
    bo = ctx.alloc(4096)
    f = ctx.submit_copy(W + (256 << 20) - 4096, bo.va, 4096)
    f2 = ctx.submit_copy(bo.va, W, 4096, wait=[f])
    assert f2.wait(5) and f2.error is None and np.all(buf[:4096] == 5)
    with pytest.raises(InvalidAddress):
        ctx.map_system(m, W + P)  # overlaps
    ctx.unmap_system(W)
    f = ctx.submit_copy(W, bo.va, 8)
    assert f.wait(5) and isinstance(f.error, GpuFault)
    dev.dma_unmap(m)


def test_map_system_read_only_and_in_user_range(dev):
    ctx = dev.create_context()
    buf = np.arange(8192, dtype=np.uint8)
    m = dev.dma_map(buf)
    va = wire.VA_USER_BASE + (1 << 30)
    ctx.map_system(m, va, writable=False)
    bo = ctx.alloc(8192)
    assert bo.va + bo.size + P <= va or bo.va >= va + 8192 + P
    f = ctx.submit_copy(va, bo.va, 8192)
    assert f.wait(5) and f.error is None
    f = ctx.submit_copy(bo.va, va, 8)
    assert f.wait(5) and isinstance(f.error, GpuFault) and f.error.access == wire.ACCESS_WRITE
    with pytest.raises(InvalidArgument):
        ctx.map_system(m, va + (1 << 20), size=3 * P)  # bigger than the buffer


def test_bad_submissions(dev):
    ctx = dev.create_context()
    with pytest.raises(InvalidArgument):
        ctx.submit_launch(wire.KERNEL_FILL, (1,), (1,), list(range(wire.MAX_KERNEL_ARGS + 1)))
    with pytest.raises(InvalidArgument):
        ctx.submit_launch(wire.KERNEL_FILL, (1, 1, 1, 1), (1,), [])
    with pytest.raises(InvalidArgument):
        ctx.submit_copy(-1, 0, 4)
    with pytest.raises(InvalidArgument):
        ctx.submit_copies([])
    with pytest.raises(InvalidArgument):
        ctx.submit_copy(0, 0, 4, wait=["not a fence"])


def test_many_jobs_wrap_the_ring_and_recycle_ib_space(make_dev):
    dev = make_dev(ring_size=4096, ib_pool_size=16 << 10)
    ctx = dev.create_context()
    src, dst = ctx.alloc(P), ctx.alloc(P)
    fences = [ctx.submit_copy(src.va, dst.va, 64) for _ in range(600)]
    assert fences[-1].wait(10)
    assert all(f.signaled and f.error is None for f in fences)
    assert dev.rings[regs.ENGINE_COPY].packets_committed == 600
    # the scheduler's submission limit keeps the ring and the IB pool from filling up
    assert dev.rings[regs.ENGINE_COPY].full_waits == 0 and dev.stats["ib_pool_full"] == 0
    assert dev.ib_pool.in_use == 0


def test_stop_fails_pending_fences(make_dev):
    dev = make_dev()
    ctx = dev.create_context()
    f = ctx.submit_launch(wire.KERNEL_BURN, (1,), (1,), [wire.BURN_FOREVER])
    dev.stop()
    assert f.signaled and f.error == "device stopped"
    with pytest.raises(KmdError):
        ctx.submit_launch(wire.KERNEL_BURN, (1,), (1,), [1])


def test_wait_on_a_fence_of_another_device(make_dev, gate):
    d0, d1 = make_dev(num_gpus=2)
    c0, c1 = d0.create_context(), d1.create_context()
    g = gate()
    burn = c0.submit_launch(wire.KERNEL_BURN, (1,), (1,), [50_000], wait=[g])
    f = c1.submit_launch(wire.KERNEL_BURN, (1,), (1,), [1], wait=[burn])
    # the caller did not wait: burn cannot have run, it waits for the gate
    assert not burn.signaled and not f.signaled
    g.signal()
    assert f.wait(5) and f.error is None  # the scheduler held the job back until then
    assert burn.signaled and f.timestamp >= burn.timestamp


def test_concurrent_submitters(make_dev):
    """Four host threads, one context each, chaining copy -> kernel -> copy at once."""
    dev = make_dev(ring_size=4096)
    errors = []

    def client(i):
        try:
            ctx = dev.create_context(f"client{i}")
            win = Window(dev, ctx, size=1 << 20)
            n = 4096
            a = np.arange(n, dtype=np.float32) + i
            win.put(0, a)
            A, B = ctx.alloc(4 * n), ctx.alloc(4 * n)
            for j in range(20):
                f1 = ctx.submit_copy(W, A.va, 4 * n)
                f2 = ctx.submit_launch(wire.KERNEL_SCALE, (n // 256,), (256,),
                                       [B.va, A.va, int(np.float32(j).view(np.uint32)), n],
                                       wait=[f1])
                f3 = ctx.submit_copy(B.va, W + (1 << 19), 4 * n, wait=[f2])
                assert f3.wait(5) and f3.error is None
                assert np.array_equal(win.get(1 << 19, n), a * j), (i, j)
            dev.destroy_context(ctx)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
    baseline = dev.vram_free()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert dev.vram_free() == baseline and dev.num_contexts == 0
