"""Kernels written for numba-cuda; tests/kernels/regenerate.py compiles each with
`numba.cuda.compile_ptx` into `numba_<name>.numba.ptx`. A numba array argument becomes
seven kernel parameters (meminfo, parent, nitems, itemsize, data, shape, strides for a
1-D array); tests/kernels/manifest.py says how to fill them."""

import math

from numba import cuda, float32


def axpb(x, y, out, a):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i] - 1.0


def block_sum(x, out):
    s = cuda.shared.array(128, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    s[t] = x[i] if i < x.size else float32(0.0)
    cuda.syncthreads()
    stride = 64
    while stride > 0:
        if t < stride:
            s[t] += s[t + stride]
        cuda.syncthreads()
        stride //= 2
    if t == 0:
        out[cuda.blockIdx.x] = s[0]


def count_positive(x, counter):
    i = cuda.grid(1)
    if i < x.size and x[i] > 0:
        cuda.atomic.add(counter, 0, 1)


def wave(x, out):
    i = cuda.grid(1)
    if i < x.size:
        v = x[i]
        out[i] = math.sin(v) + math.exp(-v * v) + math.sqrt(abs(v))


KERNELS = {
    "axpb": (axpb, "float32[:], float32[:], float32[:], float32"),
    "block_sum": (block_sum, "float32[:], float32[:]"),
    "count_positive": (count_positive, "float32[:], int32[:]"),
    "wave": (wave, "float64[:], float64[:]"),
}
