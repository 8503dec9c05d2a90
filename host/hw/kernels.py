"""The compute engine's built-in kernel library (spec/pvgpu.md §7, spec.wire BUILTIN_KERNELS).

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
  burn        busy for `microseconds` of wall time (sleeps in <= 1 ms steps; stoppable)

threads = gx*gy*gz*bx*by*bz (Python ints, no overflow). Elementwise kernels split their
index range over the engine's compute units (compute_units.py) when it is large. reduce_sum, gemm and softmax
process their whole problem regardless of the launch shape.

Memory access (KernelMemory): each kernel first translates *every* argument range
(READ for inputs, WRITE for outputs, READ|WRITE for saxpy's y) and only then computes, so
a page fault (MmuFault) leaves memory untouched. A range that is one extent is used as
a view in place; a range of several extents is gathered into a copy (inputs) or computed
into a temporary that commit() scatters (outputs). Aliasing: numpy ufuncs with out=
handle overlapping operands; gemm and softmax use a temporary when the output may share
memory with an input. Floating-point exceptions (overflow to inf, NaN) are not errors.
"""

from __future__ import annotations

import math
import struct
import time

import numpy as np

from host.hw.compute_units import SERIAL, ComputeUnits
from spec.wire import (ACCESS_READ, ACCESS_WRITE, ARG_F32, ARG_PTR, ARG_U32,
                       BUILTIN_KERNELS, KERNEL_BURN, KERNEL_FILL, KERNEL_GEMM, KERNEL_REDUCE_SUM,
                       KERNEL_RELU, KERNEL_SAXPY, KERNEL_SCALE, KERNEL_SOFTMAX, KERNEL_VECTOR_ADD)

F32 = np.dtype("<f4")
BURN_CHECK_INTERVAL = 0.001  # seconds between stop-flag checks in burn


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

    def elementwise(self, count: int, fn, outputs=(), inputs=()) -> None:
        """fn(lo, hi) over [0, count), split across the compute units. Split only when
        no output partially overlaps an input: exact aliasing (out is in) is safe piece
        by piece, a shifted overlap is not (numpy buffers it only for a whole call)."""
        for o in outputs:
            for x in inputs:
                if np.may_share_memory(o, x) and not (
                        o.__array_interface__["data"][0] == x.__array_interface__["data"][0]
                        and o.nbytes == x.nbytes):
                    fn(0, count)
                    return
        self.cus.run(count, fn)

    def _translate(self, va: int, count: int, dtype, access: int):
        dtype = np.dtype(dtype)
        nbytes = count * dtype.itemsize
        return dtype, nbytes, self.mmu.translate(self.vmid, va, nbytes, access)

    def input(self, va: int, count: int, dtype=F32) -> np.ndarray:
        dtype, nbytes, ext = self._translate(va, count, dtype, ACCESS_READ)
        return _gather(ext).view(dtype)

    def output(self, va: int, count: int, dtype=F32):
        """-> (array, commit): write the results into array, then call commit()."""
        dtype, nbytes, ext = self._translate(va, count, dtype, ACCESS_WRITE)
        if len(ext) <= 1:
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
    mem.elementwise(count, lambda lo, hi: out[lo:hi].fill(value))
    commit()


def vector_add(mem, ctl, threads, a, b, c, n):
    count = min(n, threads)
    x = mem.input(a, count)
    y = mem.input(b, count)
    out, commit = mem.output(c, count)
    mem.elementwise(count, lambda lo, hi: np.add(x[lo:hi], y[lo:hi], out=out[lo:hi]),
                    outputs=(out,), inputs=(x, y))
    commit()


def saxpy(mem, ctl, threads, alpha, x, y, n):
    count = min(n, threads)
    xs = mem.input(x, count)
    ys, commit = mem.inout(y, count)

    def piece(lo, hi):
        t = np.multiply(xs[lo:hi], alpha)  # a temporary: x may overlap y
        np.add(t, ys[lo:hi], out=ys[lo:hi])
    mem.elementwise(count, piece, outputs=(ys,), inputs=(xs,))
    commit()


def scale(mem, ctl, threads, dst, src, alpha, n):
    count = min(n, threads)
    xs = mem.input(src, count)
    out, commit = mem.output(dst, count)
    mem.elementwise(count, lambda lo, hi: np.multiply(xs[lo:hi], alpha, out=out[lo:hi]),
                    outputs=(out,), inputs=(xs,))
    commit()


def relu(mem, ctl, threads, dst, src, n):
    count = min(n, threads)
    xs = mem.input(src, count)
    out, commit = mem.output(dst, count)
    mem.elementwise(count, lambda lo, hi: np.maximum(xs[lo:hi], np.float32(0), out=out[lo:hi]),
                    outputs=(out,), inputs=(xs,))
    commit()


def reduce_sum(mem, ctl, threads, src, dst, n):
    xs = mem.input(src, n)
    out, commit = mem.output(dst, 1)
    out[0] = np.float32(np.add.reduce(xs, dtype=np.float64))
    commit()


def gemm(mem, ctl, threads, a, b, c, m, n, k):
    am = mem.input(a, m * k).reshape(m, k)
    bm = mem.input(b, k * n).reshape(k, n)
    out, commit = mem.output(c, m * n)
    cm = out.reshape(m, n)
    if np.may_share_memory(cm, am) or np.may_share_memory(cm, bm):
        np.copyto(cm, np.matmul(am, bm))
    else:
        np.matmul(am, bm, out=cm)
    commit()


def softmax(mem, ctl, threads, dst, src, rows, cols):
    x = mem.input(src, rows * cols).reshape(rows, cols)
    out, commit = mem.output(dst, rows * cols)
    if rows and cols:
        y = out.reshape(rows, cols)
        work = np.empty_like(y) if np.may_share_memory(y, x) else y
        np.subtract(x, x.max(axis=1, keepdims=True), out=work)
        np.exp(work, out=work)
        np.divide(work, work.sum(axis=1, keepdims=True), out=work)
        if work is not y:
            np.copyto(y, work)
    commit()


def burn(mem, ctl, threads, microseconds):
    deadline = time.perf_counter() + microseconds * 1e-6
    while not ctl.stopped():
        left = deadline - time.perf_counter()
        if left <= 0:
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
assert all(KERNEL_IMPLS[k].__name__ == s.name for k, s in BUILTIN_KERNELS.items())


def decode_args(signature, raw_args) -> list:
    out = []
    for (_, kind), raw in zip(signature.args, raw_args):
        if kind == ARG_PTR:
            out.append(raw & 0xFFFFFFFFFFFFFFFF)
        elif kind == ARG_U32:
            out.append(raw & 0xFFFFFFFF)
        elif kind == ARG_F32:
            out.append(np.float32(struct.unpack("<f", struct.pack("<I", raw & 0xFFFFFFFF))[0]))
        else:  # pragma: no cover - spec.wire defines only these kinds
            raise InvalidLaunch(f"unknown argument kind {kind!r}")
    return out


def launch(kernel_id: int, grid, block, raw_args, mem: KernelMemory,
           ctl: StopToken = NEVER_STOP) -> None:
    """Run a built-in kernel. Raises InvalidLaunch, or MmuFault before writing anything."""
    sig = BUILTIN_KERNELS.get(kernel_id)
    if sig is None:
        raise InvalidLaunch(f"unknown kernel id {kernel_id}")
    if len(raw_args) != len(sig.args):
        raise InvalidLaunch(f"{sig.name} takes {len(sig.args)} arguments, got {len(raw_args)}")
    threads = math.prod(grid) * math.prod(block)
    with np.errstate(all="ignore"):
        KERNEL_IMPLS[kernel_id](mem, ctl, threads, *decode_args(sig, raw_args))
