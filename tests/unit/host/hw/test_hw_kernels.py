"""host/hw/kernels.py: every built-in kernel against numpy, on contiguous and scattered
memory, with aliasing, launch-shape limits, argument decoding and faults."""

import math
import struct
import threading
import time

import numpy as np
import pytest
from hwtest import RO, PageTables

from pvgpu.host.hw import kernels
from pvgpu.host.hw.kernels import InvalidLaunch, KernelMemory, StopToken
from pvgpu.host.hw.mmu import Mmu, MmuFault
from pvgpu.host.hw.regs import PAGE_SIZE
from pvgpu.host.hw.sysmem import SystemMemory
from pvgpu.host.hw.vram import Vram
from pvgpu.spec.kernels import (ACCESS_READ, ACCESS_WRITE, BURN_FOREVER, KERNEL_BURN, KERNEL_FILL,
                          KERNEL_GEMM, KERNEL_REDUCE_SUM, KERNEL_RELU, KERNEL_SAXPY, KERNEL_SCALE,
                          KERNEL_SOFTMAX, KERNEL_VECTOR_ADD, KERNELS_BY_NAME)

VMID = 5
CONTIG = 1 << 32  # 4 MiB of VA on contiguous VRAM
SCATTER = 1 << 33  # 4 MiB of VA on pages in a shuffled order: one extent per page
NPAGES = 1024
ONE_D = (1, 1, 1)


class Env:
    def __init__(self):
        self.vram = Vram(32 << 20)
        self.mmu = Mmu(self.vram, SystemMemory())
        pt = PageTables(self.vram, 1 << 20)
        self.mmu.set_root(VMID, pt.root)
        pt.map(CONTIG, 4 << 20, NPAGES)
        order = np.random.default_rng(0).permutation(NPAGES)
        pt.map_pages(SCATTER, [(16 << 20) + int(i) * PAGE_SIZE for i in order])
        self.pt = pt
        self.mem = KernelMemory(self.mmu, VMID)

    def put(self, va, arr):
        data = np.ascontiguousarray(arr, dtype=np.float32).view(np.uint8).reshape(-1)
        off = 0
        for e in self.mmu.translate(VMID, va, data.shape[0], ACCESS_WRITE):
            e[:] = data[off:off + e.shape[0]]
            off += e.shape[0]

    def get(self, va, n):
        ext = self.mmu.translate(VMID, va, 4 * n, ACCESS_READ)
        return np.concatenate(ext).view(np.float32).copy() if ext else np.empty(0, np.float32)

    def launch(self, name, *args, grid=(1 << 20, 1, 1), block=ONE_D, ctl=kernels.NEVER_STOP):
        sig = KERNELS_BY_NAME[name]
        raw = [f32(a) if kind == "f32" else int(a) for a, (_, kind) in zip(args, sig.args)]
        kernels.launch(sig.kernel_id, grid, block, raw, self.mem, ctl)


def f32(x) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


@pytest.fixture
def env():
    return Env()


def rand(n, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


@pytest.fixture(params=[CONTIG, SCATTER], ids=["contig", "scatter"])
def base(request):
    return request.param


def test_scatter_region_really_is_scattered(env):
    assert len(env.mmu.translate(VMID, SCATTER + 100, 3 * PAGE_SIZE, ACCESS_READ)) >= 3


def test_fill(env, base):
    env.put(base, np.full(3000, -1, np.float32))
    env.launch("fill", base + 4, 2.5, 2000)
    got = env.get(base, 3000)
    assert got[0] == -1 and (got[1:2001] == 2.5).all() and (got[2001:] == -1).all()


def test_elementwise_kernels_stop_at_the_thread_count(env):
    env.put(CONTIG, np.zeros(1000, np.float32))
    env.launch("fill", CONTIG, 1.0, 1000, grid=(2, 3, 1), block=(4, 5, 1))  # 120 threads
    got = env.get(CONTIG, 1000)
    assert (got[:120] == 1).all() and (got[120:] == 0).all()
    env.launch("fill", CONTIG, 3.0, 1000, grid=(0, 1, 1))
    assert env.get(CONTIG, 1) == 1


def test_vector_add(env, base):
    a, b = rand(5000, 1), rand(5000, 2)
    env.put(base, a)
    env.put(base + 40000, b)
    env.launch("vector_add", base, base + 40000, base + 80000, 5000)
    assert np.array_equal(env.get(base + 80000, 5000), a + b)


def test_vector_add_aliasing(env, base):
    a, b = rand(3000, 1), rand(3000, 2)
    env.put(base, a)
    env.put(base + 20000, b)
    env.launch("vector_add", base, base + 20000, base, 3000)  # c == a
    assert np.array_equal(env.get(base, 3000), a + b)
    # partial overlap: c = a shifted by one element; results as if all reads came first
    a = env.get(base, 3000)
    env.launch("vector_add", base, base + 20000, base + 4, 3000)
    assert np.array_equal(env.get(base + 4, 3000), a + b)


def test_saxpy(env, base):
    x, y = rand(4000, 1), rand(4000, 2)
    env.put(base, x)
    env.put(base + 30000, y)
    env.launch("saxpy", 1.5, base, base + 30000, 4000)
    assert np.array_equal(env.get(base + 30000, 4000), np.float32(1.5) * x + y)
    env.launch("saxpy", -2.0, base, base, 4000)  # x == y
    assert np.array_equal(env.get(base, 4000), np.float32(-2.0) * x + x)


def test_scale_and_relu(env, base):
    x = rand(2500, 3)
    env.put(base, x)
    env.launch("scale", base + 20000, base, 0.25, 2500)
    assert np.array_equal(env.get(base + 20000, 2500), x * np.float32(0.25))
    env.launch("relu", base, base, 2500)  # in place
    assert np.array_equal(env.get(base, 2500), np.maximum(x, 0))


def test_reduce_sum(env, base):
    x = rand(100000, 4) + 3
    env.put(base, x)
    env.launch("reduce_sum", base, base + 500000, 100000, grid=ONE_D)
    expect = np.float32(x.astype(np.float64).sum())
    assert env.get(base + 500000, 1)[0] == pytest.approx(expect, rel=1e-6)
    env.launch("reduce_sum", base, base + 500000, 0)
    assert env.get(base + 500000, 1)[0] == 0


def matmul_within_bound(got, a, b):
    """-> bool matrix: |got - A·B| <= k·eps32·(|A|·|B|) elementwise, A·B exact to float64.

    A float32 dot product of length k is within gamma_k·(|A|·|B|) of the exact one, gamma_k
    ~ k·eps32/2, whatever the summation order, blocking or use of FMA (Higham, Accuracy and
    Stability of Numerical Algorithms, 3.5); BLAS picks kernels by CPU and by shape, so
    blocked and whole products may differ by that much but not by more."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    bound = a.shape[1] * np.finfo(np.float32).eps * (np.abs(a64) @ np.abs(b64))
    return np.abs(got.astype(np.float64) - a64 @ b64) <= bound


def assert_matmul(got, a, b):
    ok = matmul_within_bound(got, a, b)
    assert ok.all(), f"{np.count_nonzero(~ok)} elements of {ok.size} beyond the rounding bound"


def row_block_mistakes(c, rows):
    """c as a gemm that got its row blocks of `rows` wrong would leave it."""
    skipped = c.copy()
    skipped[-rows:] = 0
    repeated = c.copy()
    repeated[-rows:] = c[-2 * rows:-rows]
    offset = c.copy()
    offset[rows:] = c[rows - 1:-1]  # every block after the first one row down
    return {"skipped": skipped, "repeated": repeated, "offset": offset}


def test_gemm(env, base):
    m, n, k = 37, 29, 53
    a = rand(m * k, 5).reshape(m, k)
    b = rand(k * n, 6).reshape(k, n)
    env.put(base, a)
    env.put(base + 100000, b)
    env.launch("gemm", base, base + 100000, base + 200000, m, n, k, grid=ONE_D)
    assert_matmul(env.get(base + 200000, m * n).reshape(m, n), a, b)


def test_gemm_into_an_input(env, base):
    m = 40
    a = rand(m * m, 7).reshape(m, m)
    b = rand(m * m, 8).reshape(m, m)
    env.put(base, a)
    env.put(base + 100000, b)
    env.launch("gemm", base, base + 100000, base, m, m, m)  # C == A
    assert_matmul(env.get(base, m * m).reshape(m, m), a, b)


def test_softmax(env, base):
    rows, cols = 17, 300
    x = rand(rows * cols, 9).reshape(rows, cols) * 50
    x[3] += 1000  # would overflow exp without the max subtraction
    env.put(base, x)
    env.launch("softmax", base + 40000, base, rows, cols)
    got = env.get(base + 40000, rows * cols).reshape(rows, cols)
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=1e-4, atol=1e-7)
    assert np.isfinite(got).all()
    env.launch("softmax", base, base, rows, cols)  # in place
    np.testing.assert_allclose(env.get(base, rows * cols).reshape(rows, cols), got, rtol=1e-6)


def test_burn_takes_its_time_and_stops_when_asked():
    mem = None
    t = time.perf_counter()
    kernels.launch(KERNEL_BURN, ONE_D, ONE_D, [20000], mem)
    assert time.perf_counter() - t >= 0.02
    stop = threading.Event()
    done = threading.Event()
    ctl = StopToken(stop.is_set, stop)
    th = threading.Thread(target=lambda: (kernels.launch(KERNEL_BURN, ONE_D, ONE_D,
                                                         [10_000_000], mem, ctl), done.set()))
    th.start()
    stop.set()
    assert done.wait(5.0)  # stopped: the burn alone would take 10 s
    th.join()


def test_f32_arguments_use_the_low_32_bits(env):
    env.launch("fill", CONTIG, 0.0, 4)
    kernels.launch(KERNEL_FILL, ONE_D, (4, 1, 1), [CONTIG, (0xDEAD << 32) | f32(-3.5), 4], env.mem)
    assert (env.get(CONTIG, 4) == -3.5).all()
    kernels.launch(KERNEL_FILL, ONE_D, (8, 1, 1), [CONTIG, f32(1.0), (7 << 32) | 2], env.mem)
    assert list(env.get(CONTIG, 3)) == [1, 1, -3.5]


def test_invalid_launches():
    with pytest.raises(InvalidLaunch):
        kernels.launch(999, ONE_D, ONE_D, [], None)
    with pytest.raises(InvalidLaunch):
        kernels.launch(KERNEL_VECTOR_ADD, ONE_D, ONE_D, [1, 2, 3], None)


def test_a_fault_leaves_memory_untouched(env):
    x = rand(3000, 1)
    env.put(CONTIG, x)
    env.put(CONTIG + 20000, x)
    dst = CONTIG + NPAGES * PAGE_SIZE - 2 * PAGE_SIZE  # 2 mapped pages, then unmapped
    env.put(dst, np.zeros(2048, np.float32))
    for name, args in [("vector_add", (CONTIG, CONTIG + 20000, dst, 3000)),
                       ("scale", (dst, CONTIG, 2.0, 3000)),
                       ("saxpy", (2.0, CONTIG, dst, 3000)),
                       ("gemm", (CONTIG, CONTIG, dst, 50, 60, 1))]:
        with pytest.raises(MmuFault) as e:
            env.launch(name, *args)
        assert e.value.address == CONTIG + NPAGES * PAGE_SIZE and e.value.vmid == VMID
        assert (env.get(dst, 2048) == 0).all()
    # an unmapped input is found before the output is written
    with pytest.raises(MmuFault) as e:
        env.launch("vector_add", CONTIG, dst, CONTIG + 20000, 3000)
    assert e.value.access == ACCESS_READ
    assert np.array_equal(env.get(CONTIG + 20000, 3000), x)


def test_write_to_read_only_output_faults(env):
    env.pt.map(CONTIG, 4 << 20, 1, RO)
    env.mmu.flush(VMID)
    with pytest.raises(MmuFault) as e:
        env.launch("fill", CONTIG, 1.0, 10)
    assert e.value.access == ACCESS_WRITE
    with pytest.raises(MmuFault) as e:
        env.launch("saxpy", 1.0, CONTIG + PAGE_SIZE, CONTIG, 10)
    assert e.value.access == ACCESS_WRITE


def test_huge_counts_fault_instead_of_allocating(env):
    with pytest.raises(MmuFault):
        env.launch("vector_add", CONTIG, CONTIG, CONTIG, 0xFFFFFFFF,
                   grid=(0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), block=(1024, 1024, 64))
    with pytest.raises(MmuFault):
        env.launch("gemm", CONTIG, CONTIG, CONTIG, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF)


def test_every_builtin_kernel_has_an_implementation():
    assert set(kernels.KERNEL_IMPLS) == {KERNEL_FILL, KERNEL_VECTOR_ADD, KERNEL_SAXPY,
                                         KERNEL_SCALE, KERNEL_REDUCE_SUM, KERNEL_GEMM,
                                         KERNEL_RELU, KERNEL_SOFTMAX, KERNEL_BURN}


# ------------------------------------------------------- stopping and chunked kernels

class StopAfter:
    """A stop token that reports stopped from the (k+1)-th check on."""

    def __init__(self, k):
        self.k = k
        self.checks = 0

    def stopped(self):
        self.checks += 1
        return self.checks > self.k

    def sleep(self, seconds):
        return self.stopped()


def test_burn_forever_runs_until_stopped():
    assert kernels.BURN_FOREVER == BURN_FOREVER == 0xFFFFFFFF
    ctl = StopAfter(50)
    kernels.launch(KERNEL_BURN, ONE_D, ONE_D, [BURN_FOREVER], None, ctl)
    assert ctl.checks == 51  # it only ended because it was stopped
    stop = threading.Event()
    done = threading.Event()
    ctl = StopToken(stop.is_set, stop)
    th = threading.Thread(target=lambda: (kernels.launch(KERNEL_BURN, ONE_D, ONE_D,
                                                         [BURN_FOREVER], None, ctl), done.set()))
    th.start()
    assert not done.wait(0.05)  # still burning
    stop.set()
    assert done.wait(5.0)
    th.join()


def test_burn_sleeps_instead_of_spinning():
    cpu = time.thread_time()
    kernels.launch(KERNEL_BURN, ONE_D, ONE_D, [100_000], None)
    assert time.thread_time() - cpu < 0.05  # 100 ms of device time, little host CPU


def test_elementwise_kernel_stops_between_chunks(env, monkeypatch):
    monkeypatch.setattr(kernels, "ELEMENTWISE_CHUNK", 1000)
    env.put(CONTIG, np.zeros(10000, np.float32))
    env.launch("fill", CONTIG, 2.0, 10000, ctl=StopAfter(3))
    got = env.get(CONTIG, 10000)
    assert (got[:3000] == 2).all() and (got[3000:] == 0).all()  # partially written


def test_scattered_output_of_a_stopped_kernel_is_not_written(env, monkeypatch):
    monkeypatch.setattr(kernels, "ELEMENTWISE_CHUNK", 1000)
    env.put(SCATTER, np.zeros(10000, np.float32))
    env.launch("fill", SCATTER, 2.0, 10000, ctl=StopAfter(3))
    assert (env.get(SCATTER, 10000) == 0).all()  # computed into a temporary, never committed


def test_gemm_stops_between_row_blocks(env, monkeypatch):
    m, n, k = 64, 20, 30
    monkeypatch.setattr(kernels, "GEMM_BLOCK_MACS", 16 * n * k)  # 16-row blocks
    a, b = rand(m * k, 1).reshape(m, k), rand(k * n, 2).reshape(k, n)
    env.put(CONTIG, a)
    env.put(CONTIG + 100000, b)
    env.launch("gemm", CONTIG, CONTIG + 100000, CONTIG + 200000, m, n, k, ctl=StopAfter(2))
    got = env.get(CONTIG + 200000, m * n).reshape(m, n)
    assert_matmul(got[:32], a[:32], b)  # the first two blocks, up to rounding
    assert (got[32:] == 0).all()  # the later blocks never ran


def test_softmax_stops_between_row_blocks(env, monkeypatch):
    rows, cols = 40, 100
    monkeypatch.setattr(kernels, "SOFTMAX_BLOCK", 10 * cols)  # 10-row blocks
    env.put(CONTIG, rand(rows * cols, 3))
    env.launch("softmax", CONTIG + 100000, CONTIG, rows, cols, ctl=StopAfter(1))
    got = env.get(CONTIG + 100000, rows * cols).reshape(rows, cols)
    np.testing.assert_allclose(got[:10].sum(axis=1), 1, rtol=1e-5)
    assert (got[10:] == 0).all()


def test_reduce_sum_stops_between_blocks_without_writing(env, monkeypatch):
    monkeypatch.setattr(kernels, "REDUCE_BLOCK", 1000)
    env.put(CONTIG, np.ones(10000, np.float32))
    env.put(CONTIG + 100000, np.full(1, -1, np.float32))
    ctl = StopAfter(4)
    env.launch("reduce_sum", CONTIG, CONTIG + 100000, 10000, ctl=ctl)
    assert env.get(CONTIG + 100000, 1)[0] == -1 and ctl.checks == 5


class Physical:
    """Kernels in VMID 0 (VRAM physical addresses) on a larger VRAM."""

    def __init__(self, size):
        self.vram = Vram(size)
        self.f = self.vram.mem.view(np.float32)
        self.mem = KernelMemory(Mmu(self.vram, SystemMemory()), 0)

    def launch(self, kernel, *args):
        kernels.launch(kernel, ONE_D, ONE_D, list(args), self.mem)


def _softmax_whole(x):
    """The pre-chunking implementation: one whole-matrix pass."""
    work = np.empty_like(x)
    np.subtract(x, x.max(axis=1, keepdims=True), out=work)
    np.exp(work, out=work)
    np.divide(work, work.sum(axis=1, keepdims=True), out=work)
    return work


@pytest.mark.parametrize("macs", [None, "small"])
def test_blocked_gemm_equals_one_whole_matmul(monkeypatch, macs):
    """Blocking gives the matrix one whole np.matmul gives, up to float32 rounding (KRN-SEM-5:
    gemm may differ by rounding; BLAS rounds 1050- and 2100-row products differently)."""
    m, n, k = 2100, 512, 512  # > GEMM_BLOCK_MACS: two blocks of 1050 rows by default
    assert m * n * k > kernels.GEMM_BLOCK_MACS
    rows = 1050
    if macs == "small":
        monkeypatch.setattr(kernels, "GEMM_BLOCK_MACS", 1)  # GEMM_MIN_ROWS-row blocks
        rows = kernels.GEMM_MIN_ROWS
    p = Physical(16 << 20)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    whole = np.matmul(a, b)
    assert_matmul(whole, a, b)
    for mistake, wrong in row_block_mistakes(whole, rows).items():
        assert not matmul_within_bound(wrong, a, b).all(), mistake  # the bound would see it
    A, B, C = 0, 4 * m * k, 4 * (m * k + k * n)
    p.f[:m * k], p.f[m * k:m * k + k * n] = a.ravel(), b.ravel()
    p.launch(KERNEL_GEMM, A, B, C, m, n, k)
    assert_matmul(p.f[C // 4:C // 4 + m * n].reshape(m, n), a, b)
    p.launch(KERNEL_GEMM, A, B, A, m, n, k)  # C == A: through the temporary
    assert_matmul(p.f[:m * n].reshape(m, n), a, b)


SOFTMAX_ULPS = 4  # exp and the row sums may round differently on other code paths


def ulps(got, want):
    """Elementwise distance in float32 units in the last place."""
    return np.testing.assert_array_max_ulp(got, want, maxulp=np.inf, dtype=np.float32)


@pytest.mark.parametrize("block", [None, 1])
def test_blocked_softmax_equals_the_whole_matrix_pass(monkeypatch, block):
    """Blocking gives the matrix one whole-matrix pass gives, up to a few ulps (KRN-SEM-5:
    softmax may differ by rounding; numpy does not promise exp and sums bit for bit
    across array shapes)."""
    rows, cols = 700, 3001  # > SOFTMAX_BLOCK elements: several row blocks
    assert rows * cols > kernels.SOFTMAX_BLOCK
    if block:
        monkeypatch.setattr(kernels, "SOFTMAX_BLOCK", block)  # one row per block
    p = Physical(32 << 20)
    x = (np.random.default_rng(1).standard_normal((rows, cols)) * 20).astype(np.float32)
    whole = _softmax_whole(x)
    shifted = np.concatenate([whole[:1], whole[:-1]])  # rows one off, as a mis-blocked pass
    assert (ulps(shifted, whole).max(axis=1) > 1000)[1:].all()  # the bound would see it
    n = rows * cols
    p.f[:n] = x.ravel()
    p.launch(KERNEL_SOFTMAX, 4 * n, 0, rows, cols)
    assert ulps(p.f[n:2 * n].reshape(rows, cols), whole).max() <= SOFTMAX_ULPS
    p.launch(KERNEL_SOFTMAX, 0, 0, rows, cols)  # in place
    assert ulps(p.f[:n].reshape(rows, cols), whole).max() <= SOFTMAX_ULPS
    p.f[:n] = x.ravel()
    p.launch(KERNEL_SOFTMAX, 4 * cols, 0, rows - 1, cols)  # dst = src one row further
    assert ulps(p.f[cols:n].reshape(rows - 1, cols), whole[:-1]).max() <= SOFTMAX_ULPS


def test_blocked_reduce_sum_accumulates_in_float64():
    """A float64 sum of the blocks, in whatever order (KRN-SEM-3), is within a tiny
    fraction of a float32 ulp of the exact sum, so the stored result is the float32
    nearest to the exact sum (the float32 sum of these data is 0.63 ulp off)."""
    n = 3 * kernels.REDUCE_BLOCK + 12345
    p = Physical(64 << 20)
    x = (np.random.default_rng(2).standard_normal(n) + 0.25).astype(np.float32)
    p.f[:n] = x
    p.launch(KERNEL_REDUCE_SUM, 0, 4 * n, n)
    exact = math.fsum(x.astype(np.float64))
    half_ulp = float(np.spacing(np.float32(exact))) / 2
    assert abs(float(p.f[n]) - exact) <= half_ulp * (1 + 1e-3)
