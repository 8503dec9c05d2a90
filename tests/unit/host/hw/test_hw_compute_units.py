"""host/hw/compute_units.py and the elementwise kernels split across compute units."""

import threading

import numpy as np
import pytest

from pvgpu.host.hw import kernels
from pvgpu.host.hw.compute_units import ALIGN, MIN_SPLIT, ComputeUnits
from pvgpu.host.hw.mmu import Mmu
from pvgpu.host.hw.sysmem import SystemMemory
from pvgpu.host.hw.vram import Vram
from pvgpu.spec import kernels as abi

N = MIN_SPLIT * 3 + 1234  # large enough to split, not a multiple of anything


@pytest.fixture
def cus():
    c = ComputeUnits(4, "test")
    try:
        yield c
    finally:
        c.shutdown()


def test_ranges_cover_everything_once_aligned(cus):
    pieces = cus.ranges(N)
    assert len(pieces) == 4
    assert pieces[0][0] == 0 and pieces[-1][1] == N
    for (lo, hi), (lo2, _) in zip(pieces, pieces[1:]):
        assert hi == lo2 and hi % ALIGN == 0
    assert cus.ranges(1000) == [(0, 1000)]
    assert ComputeUnits(1).ranges(N) == [(0, N)]


def test_run_uses_every_piece(cus):
    seen = np.zeros(N, np.int8)

    def mark(lo, hi):
        seen[lo:hi] += 1
    cus.run(N, mark)
    assert np.all(seen == 1) and cus.split_launches == 1


def _vram_kernel_memory(cus, nbytes):
    vram = Vram(-(-nbytes // 4096) * 4096)
    return vram, kernels.KernelMemory(Mmu(vram, SystemMemory()), 0, cus)  # VMID 0: physical


def _run(kernel, mem, *args):
    sig = abi.BUILTIN_KERNELS[kernel]
    raw = [struct_arg(kind, v) for (_, kind), v in zip(sig.args, args)]
    kernels.launch(kernel, (N // 256 + 1, 1, 1), (256, 1, 1), raw, mem)


def struct_arg(kind, v):
    if kind == abi.ARG_F32:
        return int(np.array(v, np.float32).view(np.uint32))
    return int(v)


def test_split_vector_add_matches_numpy_and_handles_aliasing(cus):
    vram, mem = _vram_kernel_memory(cus, 16 * N + (1 << 20))
    f = vram.mem.view(np.float32)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    A, B, C = 0, 4 * N, 8 * N
    f[:N], f[N:2 * N] = a, b
    _run(abi.KERNEL_VECTOR_ADD, mem, A, B, C, N)
    np.testing.assert_array_equal(f[2 * N:3 * N], a + b)
    assert cus.split_launches == 1
    _run(abi.KERNEL_VECTOR_ADD, mem, A, B, A, N)  # exact aliasing: still split, still right
    np.testing.assert_array_equal(f[:N], a + b)
    assert cus.split_launches == 2


def test_shifted_overlap_copies_the_input_then_splits_like_numpy(cus):
    vram, mem = _vram_kernel_memory(cus, 16 * N + (1 << 20))
    f = vram.mem.view(np.float32)
    x = np.arange(N + 1, dtype=np.float32)
    f[:N + 1] = x
    _run(abi.KERNEL_SCALE, mem, 4, 0, 2.0, N)  # dst = src shifted by one element
    expected = x.copy()
    np.multiply(expected[:N], np.float32(2.0), out=expected[1:N + 1])
    np.testing.assert_array_equal(f[:N + 1], expected)
    assert cus.split_launches == 1


class StopAfter:
    """A stop token that reports stopped from the (k+1)-th check on (thread-safe)."""

    def __init__(self, k):
        self.k = k
        self.checks = 0
        self._lock = threading.Lock()

    def stopped(self):
        with self._lock:
            self.checks += 1
            return self.checks > self.k

    def sleep(self, seconds):
        return self.stopped()


def test_split_elementwise_kernel_checks_for_a_stop_before_every_chunk(cus, monkeypatch):
    monkeypatch.setattr(kernels, "ELEMENTWISE_CHUNK", ALIGN)
    vram, mem = _vram_kernel_memory(cus, 16 * N + (1 << 20))
    f = vram.mem.view(np.float32)
    ctl = StopAfter(5)
    sig = abi.BUILTIN_KERNELS[abi.KERNEL_FILL]
    raw = [struct_arg(kind, v) for (_, kind), v in zip(sig.args, (0, 1.0, N))]
    kernels.launch(abi.KERNEL_FILL, (N // 256 + 1, 1, 1), (256, 1, 1), raw, mem, ctl)
    assert cus.split_launches == 1
    done = f[:N] == 1
    assert done.sum() == 5 * ALIGN  # five chunks, spread over the pieces, then every CU stopped
    # chunks are whole: each ALIGN-sized chunk is either all done or untouched
    per_chunk = done[:N // ALIGN * ALIGN].reshape(-1, ALIGN)
    assert np.all(per_chunk.all(axis=1) | ~per_chunk.any(axis=1))
    # every CU checked once more after the stop and gave up (the fill wrote in place: no
    # temporary to commit, so no check after them)
    assert ctl.checks == 5 + cus.count


def test_split_fill_relu_saxpy(cus):
    vram, mem = _vram_kernel_memory(cus, 16 * N + (1 << 20))
    f = vram.mem.view(np.float32)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    f[:N], f[N:2 * N] = x, y
    _run(abi.KERNEL_SAXPY, mem, 1.5, 0, 4 * N, N)
    np.testing.assert_array_equal(f[N:2 * N], np.float32(1.5) * x + y)
    _run(abi.KERNEL_RELU, mem, 8 * N, 0, N)
    np.testing.assert_array_equal(f[2 * N:3 * N], np.maximum(x, 0))
    _run(abi.KERNEL_FILL, mem, 8 * N, 7.0, N)
    assert np.all(f[2 * N:3 * N] == 7)
    assert cus.split_launches == 3


# ------------------------------------------------------------------ share (the DMA lanes)
def test_share_does_every_piece_once_in_pieces_of_at_most_piece(cus):
    count, piece = 10 * ALIGN + 7, 3 * ALIGN
    seen = np.zeros(count, np.int8)
    calls = []
    lock = threading.Lock()

    def mark(lo, hi):
        with lock:
            calls.append((lo, hi))
        seen[lo:hi] += 1
    cus.share(count, mark, piece)
    assert np.all(seen == 1) and cus.split_launches == 1
    assert sorted(calls) == [(lo, min(lo + piece, count)) for lo in range(0, count, piece)]


def test_share_of_one_piece_runs_on_the_caller(cus):
    callers = []
    cus.share(ALIGN, lambda lo, hi: callers.append((threading.current_thread(), lo, hi)), ALIGN)
    assert callers == [(threading.current_thread(), 0, ALIGN)] and cus.split_launches == 0


def test_share_does_not_wait_for_a_unit_that_never_started():
    """A unit without a CPU (here: busy with other work) leaves its pieces to the caller:
    the call returns without it, and the unit's share is cancelled, not run later."""
    cus = ComputeUnits(2, "test")
    release = threading.Event()
    try:
        busy = cus._executor().submit(release.wait, 20)  # the only other unit is taken
        seen = np.zeros(8 * ALIGN, np.int8)
        callers = set()

        def mark(lo, hi):
            callers.add(threading.current_thread())
            seen[lo:hi] += 1
        cus.share(seen.size, mark, ALIGN)
        assert np.all(seen == 1) and callers == {threading.current_thread()}
        assert not busy.done()
    finally:
        release.set()
        cus.shutdown()
