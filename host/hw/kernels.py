"""The compute engine's built-in kernel library (spec/pvgpu.md §8, pvgpu.spec.kernels BUILTIN_KERNELS).

Kernels run with numpy on views of translated memory. Every argument is one u64 slot:
ARG_PTR is a GPU virtual address of the launching VMID, ARG_U32 the low 32 bits, ARG_F32
an IEEE binary32 in the low 32 bits. Data are float32, little-endian, row-major.

  fill        dst[i] = value                       i < min(n, threads)
  vector_add  c[i] = a[i] + b[i]                   i < min(n, threads)
  saxpy       y[i] = alpha * x[i] + y[i]           i < min(n, threads)
  scale       dst[i] = alpha * src[i]              i < min(n, threads)
  relu        dst[i] = max(src[i], 0)              i < min(n, threads)
  reduce_sum  dst[0] = sum(src[0:n])               accumulated in float64, stored as float32
  gemm        C[m,n] = A[m,k] @ B[k,n]             np.matmul (float32 BLAS)
  softmax     dst[r,:] = softmax(src[r,:])         rows x cols, max-subtracted (stable)
  burn        busy for `microseconds` of wall time; BURN_FOREVER: until reset/shutdown

threads = gx*gy*gz*bx*by*bz (Python ints, no overflow). Elementwise kernels split their
index range over the engine's compute units (compute_units.py) when it is large.
reduce_sum, gemm and softmax process their whole problem regardless of the launch shape.

burn models *device* time, not host CPU work: it sleeps (in steps of at most
BURN_CHECK_INTERVAL, waking early on a reset) while its engine stays busy, so a burning
engine costs the host no CPU. `microseconds` == pvgpu.spec.kernels.BURN_FOREVER (0xFFFFFFFF)
never ends by itself: the engine stays busy until RB_RESET or shutdown (a TDR test hang).

Stopping (RB_RESET, shutdown): every kernel checks ctl.stopped() between chunks of work
sized to take a few ms at most, and returns early when it is set:
  elementwise kernels  before every ELEMENTWISE_CHUNK elements, on every compute unit
  gemm                 between row blocks of C of at most GEMM_BLOCK_MACS multiply-adds,
                       equal-sized, except that blocks never go below 8 rows (unless C
                       has fewer): BLAS computes 1-3 row products by other code paths
  softmax              between row blocks of at most SOFTMAX_BLOCK elements (>= 1 row)
  reduce_sum           between REDUCE_BLOCK-element blocks of the input (float64 partial
                       sums added in float64: the summation order is unspecified, KRN-SEM-3)
  burn                 at least every BURN_CHECK_INTERVAL
Only the numpy call of the chunk already running finishes first. A stopped kernel leaves
its outputs partially written (the chunks done so far; an output computed into a
temporary, below, is not written at all). Chunking changes no elementwise result and no
softmax row; a gemm row block may round differently from one whole-matrix product, since
BLAS picks its kernels by shape and CPU (KRN-SEM-5 allows gemm to differ by rounding).
Gathering a scattered input (a memory copy) is not interrupted.

Memory access (KernelMemory): each kernel first translates *every* argument range
(READ for inputs, WRITE for outputs, READ|WRITE for saxpy's y) and only then computes, so
a page fault (MmuFault) leaves memory untouched. A range that is one extent is used as
a view in place; a range of several extents is gathered into a copy (inputs) or computed
into a temporary that commit() scatters (outputs). Aliasing: results are as if every
input was read before any output was written. An output that *is* an input (same range)
is computed in place; an input that partially overlaps an output is copied first
(KernelMemory.unshare; elementwise kernels, softmax); gemm computes into a temporary
when C may share memory with A or B. Floating-point exceptions (overflow to inf, NaN)
are not errors.
"""

from __future__ import annotations

import math
import struct
import time

import numpy as np

from pvgpu.host.hw.compute_units import MIN_SPLIT, SERIAL, ComputeUnits
from pvgpu.spec.kernels import (ACCESS_READ, ACCESS_WRITE, ARG_F32, ARG_PTR, ARG_U32, BUILTIN_KERNELS,
                          BURN_FOREVER, KERNEL_BURN, KERNEL_FILL, KERNEL_GEMM, KERNEL_REDUCE_SUM,
                          KERNEL_RELU, KERNEL_SAXPY, KERNEL_SCALE, KERNEL_SOFTMAX,
                          KERNEL_VECTOR_ADD)

F32 = np.dtype("<f4")
BURN_CHECK_INTERVAL = 0.001  # seconds between stop-flag checks in burn
ELEMENTWISE_CHUNK = 1 << 20  # elements per stop check of an elementwise kernel (per CU)
GEMM_BLOCK_MACS = 1 << 29  # multiply-adds per gemm row block (~6 ms at ~90 GMAC/s fp32)
GEMM_MIN_ROWS = 16  # gemm blocks aim at >= this many rows (balanced: >= 8 rows)
SOFTMAX_BLOCK = 1 << 20  # elements per softmax row block (~1.5 ms)
REDUCE_BLOCK = 1 << 22  # input elements per reduce_sum block (~1.5 ms)


class InvalidLaunch(Exception):
    """Unknown kernel id or wrong argument count (the engine raises IRQ_ILLEGAL_PACKET)."""


class StopToken:
    """Lets long work notice an engine reset or shutdown.

    stopped() -> bool; sleep(seconds) waits at most `seconds` (returning early when the
    engine's wake event is set) and returns stopped()."""

    def __init__(self, stopped=None, wake=None):
        self._stopped = stopped
        self._wake = wake

    def stopped(self) -> bool:
        return self._stopped is not None and self._stopped()

    def sleep(self, seconds: float) -> bool:
        if self._wake is not None:
            self._wake.wait(seconds)
        else:
            time.sleep(seconds)
        return self.stopped()


NEVER_STOP = StopToken()


def _noop():
    pass


class KernelMemory:
    """Views of a kernel's arguments in one VMID (see the module docstring)."""

    def __init__(self, mmu, vmid: int, cus: ComputeUnits = SERIAL):
        self.mmu = mmu
        self.vmid = vmid
        self.cus = cus

    def elementwise(self, ctl: "StopToken", count: int, fn) -> None:
        """fn(lo, hi) over [0, count), split across the compute units; each CU runs its
        piece in chunks of at most ELEMENTWISE_CHUNK elements and checks ctl.stopped()
        before each chunk (a stopped kernel returns with later chunks not done). Piece by
        piece is only right when no output partially overlaps an input: pass the inputs
        through unshare() first."""
        chunk = ELEMENTWISE_CHUNK
        if count <= chunk and count < MIN_SPLIT:  # one piece of one chunk: on this thread
            if count and not ctl.stopped():
                fn(0, count)
            return

        def piece(lo, hi):
            for start in range(lo, hi, chunk):
                if ctl.stopped():
                    return
                fn(start, min(start + chunk, hi))
        self.cus.run(count, piece)

    @staticmethod
    def unshare(outputs, *inputs):
        """-> inputs, each one that partially overlaps an output replaced by a copy, so
        that the results are as if all reads came first (numpy's rule for one call).
        Exact aliasing (the output *is* the input) is left alone: it is safe element by
        element."""
        out = []
        for x in inputs:
            for o in outputs:
                if np.may_share_memory(o, x) and not _same_memory(o, x):
                    x = x.copy()
                    break
            out.append(x)
        return out if len(out) != 1 else out[0]

    def _translate(self, va: int, count: int, dtype, access: int):
        dtype = np.dtype(dtype)
        nbytes = count * dtype.itemsize
        return dtype, nbytes, self.mmu.translate(self.vmid, va, nbytes, access)

    def input(self, va: int, count: int, dtype=F32) -> np.ndarray:
        dtype, nbytes, ext = self._translate(va, count, dtype, ACCESS_READ)
        return (ext[0] if len(ext) == 1 else _gather(ext)).view(dtype)

    def output(self, va: int, count: int, dtype=F32):
        """-> (array, commit): write the results into array, then call commit()."""
        dtype, nbytes, ext = self._translate(va, count, dtype, ACCESS_WRITE)
        if len(ext) == 1:  # in place
            return ext[0].view(dtype), _noop
        if not ext:
            return _gather(ext).view(dtype), _noop
        tmp = np.empty(nbytes, dtype=np.uint8)
        return tmp.view(dtype), lambda: _scatter(tmp, ext)

    def inout(self, va: int, count: int, dtype=F32):
        """Like output, but the array starts with the current contents."""
        dtype, nbytes, ext = self._translate(va, count, dtype, ACCESS_READ | ACCESS_WRITE)
        if len(ext) <= 1:
            return _gather(ext).view(dtype), _noop
        tmp = np.concatenate(ext)
        return tmp.view(dtype), lambda: _scatter(tmp, ext)


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            and a.nbytes == b.nbytes)


def _finish(ctl, commit) -> None:
    """Scatter a temporary output unless the kernel was stopped (then it stays unwritten)."""
    if commit is not _noop and not ctl.stopped():
        commit()


def _block_rows(rows: int, per_row: int, budget: int, min_rows: int = 1) -> int:
    """Rows per block so a block costs at most `budget` (at least min_rows), balanced."""
    if rows <= 0:
        return 1
    step = max(min_rows, budget // max(1, per_row))
    nblocks = -(-rows // step)
    return -(-rows // nblocks)


def _gather(ext: list) -> np.ndarray:
    if len(ext) == 1:
        return ext[0]
    if not ext:
        return np.empty(0, dtype=np.uint8)
    return np.concatenate(ext)


def _scatter(tmp: np.ndarray, ext: list) -> None:
    off = 0
    for e in ext:
        n = e.shape[0]
        np.copyto(e, tmp[off:off + n])
        off += n


# ------------------------------------------------------------------- the kernels
# Each takes (mem, ctl, threads, *decoded args).

def fill(mem, ctl, threads, dst, value, n):
    count = min(n, threads)
    out, commit = mem.output(dst, count)
    mem.elementwise(ctl, count, lambda lo, hi: out[lo:hi].fill(value))
    _finish(ctl, commit)


def vector_add(mem, ctl, threads, a, b, c, n):
    count = min(n, threads)
    x = mem.input(a, count)
    y = mem.input(b, count)
    out, commit = mem.output(c, count)
    x, y = mem.unshare((out,), x, y)
    mem.elementwise(ctl, count, lambda lo, hi: np.add(x[lo:hi], y[lo:hi], out=out[lo:hi]))
    _finish(ctl, commit)


def saxpy(mem, ctl, threads, alpha, x, y, n):
    count = min(n, threads)
    xs = mem.input(x, count)
    ys, commit = mem.inout(y, count)
    xs = mem.unshare((ys,), xs)

    def piece(lo, hi):
        t = np.multiply(xs[lo:hi], alpha)  # a temporary: x may be y
        np.add(t, ys[lo:hi], out=ys[lo:hi])
    mem.elementwise(ctl, count, piece)
    _finish(ctl, commit)


def scale(mem, ctl, threads, dst, src, alpha, n):
    count = min(n, threads)
    xs = mem.input(src, count)
    out, commit = mem.output(dst, count)
    xs = mem.unshare((out,), xs)
    mem.elementwise(ctl, count, lambda lo, hi: np.multiply(xs[lo:hi], alpha, out=out[lo:hi]))
    _finish(ctl, commit)


def relu(mem, ctl, threads, dst, src, n):
    count = min(n, threads)
    xs = mem.input(src, count)
    out, commit = mem.output(dst, count)
    xs = mem.unshare((out,), xs)
    mem.elementwise(ctl, count,
                    lambda lo, hi: np.maximum(xs[lo:hi], np.float32(0), out=out[lo:hi]))
    _finish(ctl, commit)


def reduce_sum(mem, ctl, threads, src, dst, n):
    xs = mem.input(src, n)
    out, commit = mem.output(dst, 1)
    total = 0.0  # float64
    for lo in range(0, n, REDUCE_BLOCK):
        if ctl.stopped():
            return  # dst is not written
        total += float(np.add.reduce(xs[lo:lo + REDUCE_BLOCK], dtype=np.float64))
    out[0] = np.float32(total)
    _finish(ctl, commit)


def gemm(mem, ctl, threads, a, b, c, m, n, k):
    am = mem.input(a, m * k).reshape(m, k)
    bm = mem.input(b, k * n).reshape(k, n)
    out, commit = mem.output(c, m * n)
    cm = out.reshape(m, n)
    # C may share memory with an input: compute into a temporary, copy when complete
    work = np.empty_like(cm) if np.may_share_memory(cm, am) or np.may_share_memory(cm, bm) else cm
    rows = _block_rows(m, n * k, GEMM_BLOCK_MACS, GEMM_MIN_ROWS)
    for lo in range(0, m, rows):
        if ctl.stopped():
            return
        np.matmul(am[lo:lo + rows], bm, out=work[lo:lo + rows])
    if work is not cm:
        np.copyto(cm, work)
    _finish(ctl, commit)


def softmax(mem, ctl, threads, dst, src, rows, cols):
    x = mem.input(src, rows * cols).reshape(rows, cols)
    out, commit = mem.output(dst, rows * cols)
    if rows and cols:
        y = out.reshape(rows, cols)
        x = mem.unshare((y,), x)  # in place (y is x) works row block by row block
        step = _block_rows(rows, cols, SOFTMAX_BLOCK)
        for lo in range(0, rows, step):
            if ctl.stopped():
                return
            xb, yb = x[lo:lo + step], y[lo:lo + step]
            np.subtract(xb, xb.max(axis=1, keepdims=True), out=yb)
            np.exp(yb, out=yb)
            np.divide(yb, yb.sum(axis=1, keepdims=True), out=yb)
    _finish(ctl, commit)


def burn(mem, ctl, threads, microseconds):
    if microseconds == BURN_FOREVER:
        while not ctl.sleep(BURN_CHECK_INTERVAL):
            pass
        return
    deadline = time.perf_counter() + microseconds * 1e-6
    while True:
        left = deadline - time.perf_counter()
        if left <= 0 or ctl.stopped():
            return
        ctl.sleep(min(left, BURN_CHECK_INTERVAL))


KERNEL_IMPLS = {
    KERNEL_FILL: fill,
    KERNEL_VECTOR_ADD: vector_add,
    KERNEL_SAXPY: saxpy,
    KERNEL_SCALE: scale,
    KERNEL_REDUCE_SUM: reduce_sum,
    KERNEL_GEMM: gemm,
    KERNEL_RELU: relu,
    KERNEL_SOFTMAX: softmax,
    KERNEL_BURN: burn,
}
assert set(KERNEL_IMPLS) == set(BUILTIN_KERNELS)
_NO_ARITHMETIC = frozenset({KERNEL_FILL, KERNEL_BURN})  # they only store or wait
assert all(KERNEL_IMPLS[k].__name__ == s.name for k, s in BUILTIN_KERNELS.items())


# A LAUNCH's argument slots, decoded by one struct per kernel: u64 for ARG_PTR, the low 32
# bits for ARG_U32 and ARG_F32 (as a float, made np.float32), padding for the high ones
_SLOT_FORMAT = {ARG_PTR: "Q", ARG_U32: "I4x", ARG_F32: "f4x"}
_ARG_STRUCTS = {k: struct.Struct("<" + "".join(_SLOT_FORMAT[kind] for _, kind in s.args))
                for k, s in BUILTIN_KERNELS.items()}
_F32_SLOTS = {k: tuple(i for i, (_, kind) in enumerate(s.args) if kind == ARG_F32)
              for k, s in BUILTIN_KERNELS.items()}


def _bad_slots(kernel_id: int, slots) -> InvalidLaunch:
    """Why a LAUNCH's argument slots do not fit its kernel."""
    sig = BUILTIN_KERNELS.get(kernel_id)
    if sig is None:
        return InvalidLaunch(f"unknown kernel id {kernel_id}")
    return InvalidLaunch(f"{sig.name} takes {len(sig.args)} arguments, got {len(slots) // 8}")


def launch(kernel_id: int, grid, block, raw_args, mem: KernelMemory,
           ctl: StopToken = NEVER_STOP) -> None:
    """Run a built-in kernel (raw_args: the u64 argument slots). Raises InvalidLaunch, or
    MmuFault before writing anything."""
    slots = struct.pack(f"<{len(raw_args)}Q", *[a & 0xFFFFFFFFFFFFFFFF for a in raw_args])
    launch_slots(kernel_id, grid, block, slots, mem, ctl)


def launch_slots(kernel_id: int, grid, block, slots, mem: KernelMemory,
                 ctl: StopToken = NEVER_STOP) -> None:
    """launch() with the argument slots as a LAUNCH packet carries them (bytes, little-
    endian u64s), decoded into the kernel's arguments by its struct; raises InvalidLaunch
    for an unknown kernel or a wrong argument count."""
    fmt = _ARG_STRUCTS.get(kernel_id)
    if fmt is None or len(slots) != fmt.size:
        raise _bad_slots(kernel_id, slots)
    args = fmt.unpack(slots)
    f32 = _F32_SLOTS[kernel_id]
    if f32:
        args = list(args)
        for i in f32:
            args[i] = np.float32(args[i])
    threads = math.prod(grid) * math.prod(block)
    if kernel_id in _NO_ARITHMETIC:  # no floating-point state to set up
        KERNEL_IMPLS[kernel_id](mem, ctl, threads, *args)
        return
    with np.errstate(all="ignore"):
        KERNEL_IMPLS[kernel_id](mem, ctl, threads, *args)
