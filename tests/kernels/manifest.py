"""How to run every kernel of the corpus and check it against numpy (machine-readable).

A `Case` names a PTX file of this directory and one of its entries, the launch (grid,
block, dynamic shared memory), and `build(rng)`, which returns the kernel's arguments in
the order of the entry's parameters:

- `In(array)`, `Out(array)`, `InOut(array)`: a device array allocated with the array's
  dtype and shape and initialised from it; the kernel gets its device address (a u64
  parameter). `Out`/`InOut` arrays are read back after the launch.
- `Scalar(value)`: a numpy scalar of exactly the parameter's type (np.int32, np.float32,
  ...).
- `ByValue(data)`: the bytes of a struct passed by value (the parameter is a byte array of
  that size).
- `NumbaArray(arg)`: a numba-cuda array argument (an In/Out/InOut of a 1-D array): seven
  parameters, in order meminfo (u64 0), parent (u64 0), nitems (i64), itemsize (i64),
  data (u64 device address), shape[0] (i64), strides[0] (i64, bytes).

`expected(args)` returns the expected contents of the read-back arrays, keyed by argument
index; outputs are compared with `np.testing.assert_allclose(got, want, rtol, atol)`
(exactly for integer results: rtol = atol = 0). `check(args, got)`, when given, is called
instead with the read-back arrays (keyed the same way) for results that depend on the
order of atomics or on device time. `globals_before` gives module variables (`.global`,
`.const`: cuModuleGetGlobal) to write before the launch, `globals_after(args)` their
expected contents afterwards (compared with the case's tolerances).

Cases are deterministic: `case.make()` builds the arguments from `np.random.default_rng(
case.seed)`. `CASES` lists them all; several PTX files (the variants of one kernel compiled
for other targets or by another producer) share a kernel's case.
"""

from __future__ import annotations

import ctypes
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

import numpy as np

HERE = Path(__file__).resolve().parent
M32 = 0xFFFFFFFF
M64 = 0xFFFFFFFFFFFFFFFF


@dataclass
class In:
    value: np.ndarray


@dataclass
class Out:
    value: np.ndarray  # the initial contents


@dataclass
class InOut:
    value: np.ndarray


@dataclass
class Scalar:
    value: np.generic


@dataclass
class ByValue:
    value: bytes


@dataclass
class NumbaArray:
    arg: object  # In, Out or InOut of a 1-D array


@dataclass(frozen=True)
class Case:
    name: str
    ptx: str
    entry: str
    grid: tuple
    block: tuple
    build: Callable
    expected: Optional[Callable] = None
    check: Optional[Callable] = None
    shared_mem: int = 0
    rtol: float = 0.0
    atol: float = 0.0
    globals_before: dict = field(default_factory=dict)
    globals_after: Optional[Callable] = None
    seed: int = 0

    @property
    def path(self) -> Path:
        return HERE / self.ptx

    def make(self) -> list:
        return self.build(np.random.default_rng(self.seed))


def blocks(n: int, block: int) -> int:
    return (n + block - 1) // block


def s32(x) -> int:
    x &= M32
    return x - (1 << 32) if x >> 31 else x


def s64(x) -> int:
    x &= M64
    return x - (1 << 64) if x >> 63 else x


def ctrunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def crem(a: int, b: int) -> int:
    return a - ctrunc_div(a, b) * b


def f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def round_toward_zero_f32(x: np.ndarray) -> np.ndarray:
    """float64 values -> float32 rounded toward zero."""
    r = x.astype(np.float32)
    over = np.abs(r.astype(np.float64)) > np.abs(x)
    r[over] = np.nextafter(r[over], np.float32(0))
    return r


CASES: list = []


def case(**kw) -> Case:
    c = Case(**kw)
    CASES.append(c)
    return c


def variants(base: Case, *ptx_files: str) -> None:
    """The same kernel compiled for another target or by another producer."""
    for p in ptx_files:
        CASES.append(replace(base, name=f"{base.name}[{p}]", ptx=p))


# --------------------------------------------------------------------------- basics
def _vector_add(rng):
    n = 10_000
    return [In(f32(rng.standard_normal(n))), In(f32(rng.standard_normal(n))),
            Out(np.zeros(n, np.float32)), Scalar(np.int32(n))]


vector_add = case(name="vector_add", ptx="vector_add.ptx", entry="vector_add", grid=(8,),
                  block=(256,), build=_vector_add,
                  expected=lambda a: {2: a[0].value + a[1].value})
variants(vector_add, "vector_add.sm75.ptx", "vector_add.sm90.ptx", "vector_add.O0.ptx",
         "vector_add.nvrtc.ptx")


def _saxpy(rng):
    n = 5000
    return [Scalar(np.float32(2.5)), In(f32(rng.standard_normal(n))),
            InOut(f32(rng.standard_normal(n))), Scalar(np.int32(n))]


case(name="saxpy", ptx="saxpy.ptx", entry="saxpy", grid=(blocks(5000, 128),), block=(128,),
     build=_saxpy, rtol=1e-6, atol=1e-6,
     expected=lambda a: {2: (np.float64(a[0].value) * a[1].value + a[2].value).astype(np.float32)})


def _f64_math(rng):
    n = 700
    x = rng.uniform(0, 10, n)
    x[:4] = [0.0, 0.5, 1.0, 7.25]
    return [In(x), Out(np.zeros(4 * n)), Scalar(np.int32(n))]


def _f64_math_expect(a):
    v = a[0].value
    out = np.empty((len(v), 4))
    out[:, 0] = np.sqrt(v) + v / (1.0 + v) + (v * 0.5 - 0.25)
    out[:, 1] = np.exp(v * 0.125)
    out[:, 2] = np.log(v + 1.0)
    out[:, 3] = np.fmin(v, 3.5) * np.fmax(v, 0.25) - np.floor(v) + np.ceil(v * 0.5)
    return {1: out.ravel()}


f64_math = case(name="f64_math", ptx="f64_math.ptx", entry="f64_math", grid=(blocks(700, 128),),
                block=(128,), build=_f64_math, expected=_f64_math_expect, rtol=1e-13, atol=1e-13)
variants(f64_math, "f64_math.sm90.ptx")


def _early_exit(rng):
    n = 600
    v = rng.integers(-5, 60, n).astype(np.int32)
    return [In(v), InOut(np.full(n, 777, np.int32)), Scalar(np.int32(n))]


def _early_exit_expect(a):
    out = a[1].value.copy()
    for i, v in enumerate(a[0].value.tolist()):
        if v < 0:
            out[i] = -1
        elif v == 0:
            continue
        elif v > 41:
            out[i] = 1041
        else:
            out[i] = sum(k * k for k in range(v))
    return {1: out}


early_exit = case(name="early_exit", ptx="early_exit.ptx", entry="early_exit",
                  grid=(blocks(600, 64),), block=(64,), build=_early_exit,
                  expected=_early_exit_expect)
variants(early_exit, "early_exit.O0.ptx")


def _collatz(rng):
    n = 1000
    v = rng.integers(1, 20000, n).astype(np.uint32)
    v[:3] = [1, 27, 97]
    return [In(v), Out(np.zeros(n, np.uint32)), Scalar(np.int32(n))]


def _collatz_expect(a):
    out = []
    for x in a[0].value.tolist():
        s = 0
        while x != 1 and s < 500:
            s += 1
            x = (3 * x + 1) & M32 if x & 1 else x >> 1
        out.append(s)
    return {1: np.array(out, np.uint32)}


collatz = case(name="collatz", ptx="divergent_loop.ptx", entry="collatz",
               grid=(blocks(1000, 128),), block=(128,), build=_collatz,
               expected=_collatz_expect)
variants(collatz, "divergent_loop.O0.ptx")


# --------------------------------------------------------------------------- shared memory
GEMM_M, GEMM_N, GEMM_K = 50, 40, 37


def _gemm(rng):
    return [In(f32(rng.standard_normal((GEMM_M, GEMM_K)))),
            In(f32(rng.standard_normal((GEMM_K, GEMM_N)))),
            Out(np.zeros((GEMM_M, GEMM_N), np.float32)), Scalar(np.int32(GEMM_M)),
            Scalar(np.int32(GEMM_N)), Scalar(np.int32(GEMM_K))]


gemm = case(name="gemm_tiled", ptx="gemm_tiled.ptx", entry="gemm_tiled",
            grid=(blocks(GEMM_N, 16), blocks(GEMM_M, 16)), block=(16, 16), build=_gemm,
            expected=lambda a: {2: (a[0].value.astype(np.float64) @ a[1].value).astype(np.float32)},
            rtol=1e-5, atol=1e-5)
variants(gemm, "gemm_tiled.sm75.ptx", "gemm_tiled.sm90.ptx", "gemm_tiled.O0.ptx",
         "gemm_tiled.nvrtc.ptx")


def _reduce_shfl(rng):
    n = 10_000
    return [In(f32(rng.uniform(-1, 1, n))), InOut(np.zeros(1, np.float32)), Scalar(np.int32(n))]


reduce_shfl = case(name="reduce_shfl", ptx="reduce_shfl.ptx", entry="reduce_shfl", grid=(8,),
                   block=(256,), build=_reduce_shfl,
                   expected=lambda a: {1: np.array([a[0].value.astype(np.float64).sum()],
                                                   np.float32)},
                   rtol=1e-4, atol=1e-3)
variants(reduce_shfl, "reduce_shfl.sm75.ptx", "reduce_shfl.sm90.ptx", "reduce_shfl.nvrtc.ptx")


def _reduce_shared(rng):
    n = 3000
    return [In(rng.integers(-1000, 1000, n).astype(np.int32)),
            Out(np.zeros(blocks(n, 512), np.int32)), Scalar(np.int32(n))]


def _reduce_shared_expect(a):
    v = a[0].value
    return {1: np.array([v[i:i + 512].sum() for i in range(0, len(v), 512)], np.int32)}


case(name="reduce_shared", ptx="reduce_shared.ptx", entry="reduce_shared",
     grid=(blocks(3000, 512),), block=(256,), build=_reduce_shared, expected=_reduce_shared_expect)


def _histogram(rng):
    n = 20_000
    return [In(rng.integers(0, 256, n).astype(np.uint8)), InOut(np.zeros(256, np.uint32)),
            Scalar(np.int32(n))]


histogram = case(name="histogram", ptx="histogram.ptx", entry="histogram", grid=(16,),
                 block=(128,), build=_histogram,
                 expected=lambda a: {1: np.bincount(a[0].value, minlength=256).astype(np.uint32)})
variants(histogram, "histogram.sm75.ptx", "histogram.sm90.ptx")


def _block_scan(rng):
    n = 1000
    return [In(rng.integers(-100, 100, n).astype(np.int32)), Out(np.zeros(n, np.int32)),
            Scalar(np.int32(n))]


def _block_scan_expect(a):
    v = a[0].value
    return {1: np.concatenate([np.cumsum(v[i:i + 128]) for i in range(0, len(v), 128)])
            .astype(np.int32)}


case(name="block_scan", ptx="block_scan.ptx", entry="block_scan", grid=(blocks(1000, 128),),
     block=(128,), build=_block_scan, expected=_block_scan_expect)

TW, TH = 70, 45


def _transpose(rng):
    return [In(f32(rng.standard_normal((TH, TW)))), Out(np.zeros((TW, TH), np.float32)),
            Scalar(np.int32(TW)), Scalar(np.int32(TH))]


case(name="transpose", ptx="transpose.ptx", entry="transpose", grid=(blocks(TW, 32), blocks(TH, 32)),
     block=(32, 8), build=_transpose, expected=lambda a: {1: a[0].value.T.copy()})


def _stencil(rng):
    n = 1000
    return [In(f32(rng.standard_normal(n))), Out(np.zeros(n, np.float32)), Scalar(np.int32(n))]


def _stencil_expect(a):
    v = a[0].value.astype(np.float64)
    p = np.concatenate([np.zeros(3), v, np.zeros(3)])
    out = sum(p[3 + k:3 + k + len(v)] * (4 - abs(k)) for k in range(-3, 4))
    return {1: out.astype(np.float32)}


case(name="stencil1d", ptx="stencil1d.ptx", entry="stencil1d", grid=(blocks(1000, 128),),
     block=(128,), build=_stencil, expected=_stencil_expect, rtol=1e-5, atol=1e-5)

SM_ROWS, SM_COLS = 6, 300


def _softmax(rng):
    return [In(f32(rng.standard_normal((SM_ROWS, SM_COLS)) * 3)),
            Out(np.zeros((SM_ROWS, SM_COLS), np.float32)), Scalar(np.int32(SM_COLS))]


def _softmax_expect(a):
    x = a[0].value.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return {1: (e / e.sum(axis=1, keepdims=True)).astype(np.float32)}


case(name="softmax_rows", ptx="softmax.ptx", entry="softmax_rows", grid=(SM_ROWS,), block=(128,),
     build=_softmax, expected=_softmax_expect, rtol=1e-5, atol=1e-7)


def _dynamic_reverse(rng):
    n = 200
    return [In(rng.standard_normal(n)), Out(np.zeros(n)), Scalar(np.int32(n))]


def _dynamic_reverse_expect(a):
    v = a[0].value
    out = np.concatenate([v[i:i + 64][::-1] for i in range(0, len(v), 64)])
    return {1: out}


case(name="dynamic_reverse", ptx="dynamic_shared.ptx", entry="dynamic_reverse",
     grid=(blocks(200, 64),), block=(64,), shared_mem=64 * 8, build=_dynamic_reverse,
     expected=_dynamic_reverse_expect)


def _shared_atomics(rng):
    n = 1000
    x = f32(rng.uniform(-1, 1, n))
    return [In(x), InOut(np.zeros(4, np.uint64)), InOut(f32([0.0, -1e30])), Scalar(np.int32(n))]


def _shared_atomics_expect(a):
    x = a[0].value
    k = (x > 0).astype(int) + 2 * (x > 0.5)
    return {1: np.bincount(k, minlength=4).astype(np.uint64),
            2: f32([x.astype(np.float64).sum(), x.max()])}


case(name="shared_atomics", ptx="shared_atomics.ptx", entry="shared_atomics",
     grid=(blocks(1000, 128),), block=(128,), build=_shared_atomics,
     expected=_shared_atomics_expect, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- calls, structs, globals
def _device_calls(rng):
    n = 300
    return [In(rng.integers(-1000, 1000, 8 * n).astype(np.int32)), Out(np.zeros(n, np.int32)),
            Out(np.zeros(n, np.int32)), Scalar(np.int32(n))]


def _device_calls_expect(a):
    v = a[0].value.tolist()
    med, chk = [], []
    for t in range(len(v) // 8):
        vals = sorted(v[8 * t + ((k * 5 + t) & 7)] for k in range(8))
        med.append(ctrunc_div(vals[3] + vals[4], 2))
        c = 0
        for x in vals:
            c = s32((c * 31) ^ (x + 7))
        chk.append(c)
    return {1: np.array(med, np.int32), 2: np.array(chk, np.int32)}


device_calls = case(name="device_calls", ptx="device_calls.ptx", entry="device_calls",
                    grid=(blocks(300, 64),), block=(64,), build=_device_calls,
                    expected=_device_calls_expect)
variants(device_calls, "device_calls.sm90.ptx", "device_calls.O0.ptx")


class Affine(ctypes.Structure):
    """struct Affine of struct_param.cu (32 bytes, 4-byte aligned)."""

    _fields_ = [("m", (ctypes.c_float * 2) * 2), ("shift", ctypes.c_float * 2),
                ("count", ctypes.c_int32), ("flip", ctypes.c_uint8)]


def _struct_param(flip: int):
    def build(rng):
        n = 500
        t = Affine()
        m = [[1.5, -0.25], [0.75, 2.0]]
        for r in range(2):
            for c in range(2):
                t.m[r][c] = m[r][c]
        t.shift[0], t.shift[1] = 0.5, -3.0
        t.count, t.flip = n, flip
        data = bytes(t)
        assert len(data) == 32
        return [ByValue(data), In(f32(rng.standard_normal((n, 2)))), Out(np.zeros((n, 2), np.float32))]
    return build


def _struct_param_expect(a):
    t = Affine.from_buffer_copy(a[0].value)
    p = a[1].value.astype(np.float64)
    x = t.m[0][0] * p[:, 0] + t.m[0][1] * p[:, 1] + t.shift[0]
    y = t.m[1][0] * p[:, 0] + t.m[1][1] * p[:, 1] + t.shift[1]
    out = np.stack([y, x] if t.flip else [x, y], axis=1)
    return {2: out.astype(np.float32)}


for flip in (0, 1):
    sp = case(name=f"struct_param_flip{flip}", ptx="struct_param.ptx", entry="struct_param",
              grid=(blocks(500, 128),), block=(128,), build=_struct_param(flip),
              expected=_struct_param_expect, rtol=1e-5, atol=1e-5)
    variants(sp, "struct_param.O0.ptx")

POLY = f32([0.5, -1.0, 0.25, 2.0, -0.125, 0.0625, 0.0, 0.0])


def _constant_poly(rng):
    n = 800
    return [In(f32(rng.uniform(-2, 2, n))), Out(np.zeros(n, np.float32)), Scalar(np.int32(n))]


def _constant_poly_expect(a):
    v = a[0].value.astype(np.float64)
    acc = np.zeros_like(v)
    for k in range(5, -1, -1):
        acc = acc * v + POLY[k]
    return {1: acc.astype(np.float32)}


case(name="constant_poly", ptx="constant_poly.ptx", entry="constant_poly",
     grid=(blocks(800, 128),), block=(128,), build=_constant_poly, expected=_constant_poly_expect,
     rtol=1e-5, atol=1e-5,
     globals_before={"coeffs": POLY, "degree": np.array([5], np.int32)})

LUT = np.array([3, 1, 4, 1, 5, 9, 2, 6], np.int32)


def _globals(rng):
    n = 500
    return [In(rng.integers(0, 1000, n).astype(np.int32)), Out(np.zeros(n, np.float32)),
            Scalar(np.int32(n))]


def _globals_expect(a):
    i = np.arange(len(a[0].value))
    off = np.where(i & 1, -0.5, 0.25)
    return {1: (LUT[a[0].value & 7] * np.float32(1.5) + off).astype(np.float32)}


case(name="globals", ptx="globals.ptx", entry="globals", grid=(blocks(500, 128),), block=(128,),
     build=_globals, expected=_globals_expect,
     globals_after=lambda a: {"counter": np.array([len(a[0].value)], np.uint32),
                              "lut": LUT, "scale": f32([1.5]),
                              "offsets": np.array([0.25, -0.5])})


def _templates(dtype, factor, bias):
    def build(rng):
        n = 300
        data = (rng.standard_normal(n) * 100).astype(dtype)
        return [InOut(data), Scalar(dtype(factor)), Scalar(dtype(bias)), Scalar(np.int32(n))]
    return build


def _templates_expect(a):
    d, f, b = a[0].value, a[1].value, a[2].value
    if d.dtype == np.int32:
        return {0: ((d.astype(np.int64) * int(f) + int(b)) & M32).astype(np.uint32).view(np.int32)}
    return {0: (d.astype(np.float64) * f + b).astype(d.dtype)}


for mangled, dtype, factor, bias in (("_Z9scale_addIfEvPT_S0_S0_i", np.float32, 1.5, -2.0),
                                     ("_Z9scale_addIdEvPT_S0_S0_i", np.float64, -0.75, 3.25),
                                     ("_Z9scale_addIiEvPT_S0_S0_i", np.int32, 7, -3)):
    case(name=f"scale_add_{np.dtype(dtype).name}", ptx="templates.ptx", entry=mangled,
         grid=(blocks(300, 128),), block=(128,), build=_templates(dtype, factor, bias),
         expected=_templates_expect,
         rtol=0 if dtype == np.int32 else 1e-6, atol=0 if dtype == np.int32 else 1e-5)


# --------------------------------------------------------------------------- grids and warps
G3, B3, N3 = (2, 3, 2), (4, 2, 3), (7, 5, 5)


def _grid3d(rng):
    nx, ny, nz = N3
    return [Out(np.full(nx * ny * nz, 0xDEADBEEF, np.uint32)), Scalar(np.int32(nx)),
            Scalar(np.int32(ny)), Scalar(np.int32(nz))]


def _grid3d_expect(a):
    nx, ny, nz = N3
    bx, by, bz = B3
    z, y, x = np.meshgrid(np.arange(nz), np.arange(ny), np.arange(nx), indexing="ij")
    lin = (x % bx) + bx * ((y % by) + by * (z % bz))
    code = (x << 20) ^ (y << 10) ^ z ^ (lin << 24) ^ math.prod(G3)
    return {0: (code.ravel() & M32).astype(np.uint32)}


case(name="grid3d", ptx="grid3d.ptx", entry="grid3d", grid=G3, block=B3, build=_grid3d,
     expected=_grid3d_expect)


def _warps(values: np.ndarray, total: int) -> np.ndarray:
    """Values per launched thread (0 beyond the data), as rows of 32 lanes."""
    v = np.zeros(total, values.dtype)
    v[:len(values)] = values
    return v.reshape(-1, 32)


def _ballot(rng):
    n = 300
    return [In(rng.integers(-5, 5, n).astype(np.int32)), Out(np.zeros(n, np.int32)),
            Out(np.zeros(n, np.int32)), Scalar(np.int32(n))]


def _ballot_expect(a):
    n = len(a[0].value)
    w = _warps(a[0].value, 3 * 128) > 0
    count = np.repeat(w.sum(axis=1), 32)[:n]
    before = np.cumsum(w, axis=1) - w
    rank = np.where(w, before, -1).ravel()[:n]
    return {1: count.astype(np.int32), 2: rank.astype(np.int32)}


case(name="ballot_popc", ptx="ballot_popc.ptx", entry="ballot_popc", grid=(3,), block=(128,),
     build=_ballot, expected=_ballot_expect)


def _vote(rng):
    n = 200
    v = rng.integers(1, 200, n).astype(np.int32)
    v[32:64] = np.abs(v[32:64]) % 90 + 1  # a warp where every value is positive and small
    v[64:96] -= 150  # a warp with negative values
    return [In(v), Out(np.zeros(3 * n, np.int32)), Scalar(np.int32(n))]


def _vote_expect(a):
    n = len(a[0].value)
    w = _warps(a[0].value, 4 * 64)
    all_pos = np.repeat((w > 0).all(axis=1), 32)
    any_big = np.repeat((w > 100).any(axis=1), 32)
    odd = (w & 1).astype(bool)
    masks = (odd * (1 << np.arange(32, dtype=np.int64))).sum(axis=1)
    active = np.where(odd.ravel(), np.repeat(masks, 32), 0)
    out = np.stack([all_pos, any_big, active], axis=1)[:n].ravel()
    return {1: (out.astype(np.int64) & M32).astype(np.uint32).view(np.int32)}


case(name="vote_any_all", ptx="vote_any_all.ptx", entry="vote_any_all", grid=(4,), block=(64,),
     build=_vote, expected=_vote_expect)


def _shfl(rng):
    return [In(rng.integers(-10**6, 10**6, 128).astype(np.int32)), Out(np.zeros(6 * 128, np.int32))]


def _shfl_expect(a):
    v = a[0].value.reshape(-1, 32)
    lane = np.arange(32)
    tid = np.arange(128) % 64
    out = np.zeros((4, 32, 6), np.int32)
    for w in range(4):
        x = v[w]
        seg = (lane // 8) * 8
        out[w, :, 0] = np.where(lane >= 3, x[np.maximum(lane - 3, 0)], x)
        out[w, :, 1] = np.where(lane + 5 < 32, x[np.minimum(lane + 5, 31)], x)
        out[w, :, 2] = x[lane ^ 9]
        out[w, :, 3] = x[(tid[32 * w:32 * w + 32] * 7) & 31]
        out[w, :, 4] = np.where(lane % 8 >= 2, x[np.maximum(lane - 2, 0)], x)
        out[w, :, 5] = x[seg + 5]
    return {1: out.ravel()}


case(name="shfl_variants", ptx="shfl_variants.ptx", entry="shfl_variants", grid=(2,),
     block=(64,), build=_shfl, expected=_shfl_expect)


def _matvec(rng):
    rows, cols = 37, 100
    return [In(f32(rng.standard_normal((rows, cols)))), In(f32(rng.standard_normal(cols))),
            Out(np.zeros(rows, np.float32)), Scalar(np.int32(rows)), Scalar(np.int32(cols))]


case(name="matvec_warp", ptx="matvec_warp.ptx", entry="matvec_warp", grid=(blocks(37 * 32, 128),),
     block=(128,), build=_matvec,
     expected=lambda a: {2: (a[0].value.astype(np.float64) @ a[1].value).astype(np.float32)},
     rtol=1e-5, atol=1e-5)


def _bar_red(rng):
    v = rng.integers(-50, 50, 4 * 96).astype(np.int32)
    v[96:192] = np.abs(v[96:192]) + 1  # block 1: every value positive
    v[200] = -500  # block 2: one value fails the "and"
    v[300] = 5000  # block 3: one value passes the "or"
    return [In(v), Out(np.zeros(12, np.int32))]


def _bar_red_expect(a):
    v = a[0].value.reshape(4, 96)
    out = np.stack([(v > 0).sum(axis=1), (v > -100).all(axis=1), (v > 1000).any(axis=1)], axis=1)
    return {1: out.ravel().astype(np.int32)}


bar_red = case(name="bar_red", ptx="bar_red.ptx", entry="bar_red", grid=(4,), block=(96,),
               build=_bar_red, expected=_bar_red_expect)
variants(bar_red, "bar_red.O0.ptx")


# --------------------------------------------------------------------------- integers and bits
def _popc(x: int) -> int:
    return bin(x).count("1")


def _brev(x: int, bits: int) -> int:
    return int(format(x, f"0{bits}b")[::-1], 2)


def _bit_tricks(rng):
    n = 500
    x = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    x[:4] = [0, 1, 0x80000000, 0xFFFFFFFF]
    return [In(x), Out(np.zeros(12 * n, np.uint32)), Scalar(np.int32(n))]


def _byte_perm(x: int, y: int, s: int) -> int:
    src = (y << 32) | x
    return sum(((src >> (8 * ((s >> (4 * k)) & 7))) & 0xFF) << (8 * k) for k in range(4))


def _bit_tricks_expect(a):
    out = []
    for i, x in enumerate(a[0].value.tolist()):
        w = (x << 32) | (x ^ 0x9E3779B9)
        out += [_popc(x), 32 - x.bit_length(), (x & -x).bit_length(), _brev(x, 32),
                ((x << 7) | (x >> 25)) & M32, _byte_perm(x, 0x01234567, 0x6152),
                (x >> 5) & 0x3FF, (x & ~(0xFF << 12) & M32) | ((i & 0xFF) << 12),
                _popc(w) + 64 - w.bit_length(), (_brev(w, 64) >> 16) & M32, x & (x - 1) & M32,
                ((((x * 3) & M32) << 32 | x) >> (i & 31)) & M32]
    return {1: np.array(out, np.uint32)}


bit_tricks = case(name="bit_tricks", ptx="bit_tricks.ptx", entry="bit_tricks",
                  grid=(blocks(500, 128),), block=(128,), build=_bit_tricks,
                  expected=_bit_tricks_expect)
variants(bit_tricks, "bit_tricks.sm75.ptx", "bit_tricks.sm90.ptx", "bit_tricks.O0.ptx")


def _int64(rng):
    n = 400
    a = rng.integers(-(1 << 62), 1 << 62, n, dtype=np.int64)
    b = rng.integers(-(1 << 40), 1 << 40, n, dtype=np.int64)
    b[::7] = 0
    b[1::7] = rng.integers(-100, 100, len(b[1::7]))
    a[:3] = [5, -5, 123456789]
    b[:3] = [3, 3, -1000]
    return [In(a), In(b), Out(np.zeros(8 * n, np.int64)), Scalar(np.int32(n))]


def _int64_expect(a):
    out = []
    for x, y in zip(a[0].value.tolist(), a[1].value.tolist()):
        ux, uy = x & M64, y & M64
        o6 = s64((x >> (y & 63)) ^ (ux >> (uy & 63)) ^ ((ux << (y & 31)) & M64))
        o7 = s64(abs(x - y)) if x < y else s64(min(x, y) + max(x, y))
        out += [s64(x * y), s64((ux * uy) >> 64), s64((x * y) >> 64),
                ctrunc_div(x, y) if y else 0, crem(x, y) if y else 0,
                s64(ux // uy) if uy else 0, o6, o7]
    return {2: np.array(out, np.int64)}


case(name="int64_ops", ptx="int64_ops.ptx", entry="int64_ops", grid=(blocks(400, 128),),
     block=(128,), build=_int64, expected=_int64_expect)


def _int_div(rng):
    n = 400
    lim = (1 << 23) - 1
    a = rng.integers(-lim, lim, n).astype(np.int32)
    b = rng.integers(-lim, lim, n).astype(np.int32)
    b[::5] = 0
    b[1::5] = rng.integers(-20, 20, len(b[1::5]))
    return [In(a), In(b), Out(np.zeros(8 * n, np.int32)), Scalar(np.int32(n))]


def _sext24(v: int) -> int:
    v &= 0xFFFFFF
    return v - (1 << 24) if v >> 23 else v


def _int_div_expect(a):
    out = []
    for x, y in zip(a[0].value.tolist(), a[1].value.tolist()):
        ux, uy = x & M32, y & M32
        o7 = s32(abs(x) + min(x, y) - max(x, y) + ((x * y) >> 32) + _sext24(x) * _sext24(y))
        out += [ctrunc_div(x, y) if y else 0, crem(x, y) if y else 0,
                s32(ux // uy) if uy else 0, s32(ux % uy) if uy else 0,
                ctrunc_div(x, 7), crem(x, 10), s32(ux // 1000), o7]
    return {2: np.array(out, np.int32)}


case(name="int_div", ptx="int_div.ptx", entry="int_div", grid=(blocks(400, 128),), block=(128,),
     build=_int_div, expected=_int_div_expect)


def _local_array(rng):
    n, ln = 200, 20
    return [In(rng.integers(0, 100, n * ln).astype(np.int32)), Out(np.zeros(2 * n, np.int32)),
            Scalar(np.int32(n)), Scalar(np.int32(ln))]


def _local_array_expect(a):
    ln = int(a[3].value)
    v = a[0].value.reshape(-1, ln)
    out = []
    for row in v.tolist():
        counts = [0] * 16
        for k, x in enumerate(row):
            counts[x & 15] += k + 1
        best = 0
        for k in range(1, 16):
            if counts[k] > counts[best]:
                best = k
        out += [best, counts[best]]
    return {1: np.array(out, np.int32)}


local_array = case(name="local_array", ptx="local_array.ptx", entry="local_array",
                   grid=(blocks(200, 64),), block=(64,), build=_local_array,
                   expected=_local_array_expect)
variants(local_array, "local_array.O0.ptx")


def _atomics(rng):
    n = 1000
    return [In(rng.integers(-50, 50, n).astype(np.int32)),
            InOut(np.array([0, -100000, 100000, -1, 0, 0, 0], np.int32)),
            InOut(np.zeros(4, np.uint32)), InOut(f32([0.0])), InOut(np.zeros(1)),
            InOut(np.array([0, 5], np.uint64)), Scalar(np.int32(n))]


def _atomics_expect(a):
    v = a[0].value.tolist()
    n = len(v)
    xor = 0
    for x in v:
        xor ^= x
    ints = [sum(v), max(-100000, max(v)), min(100000, min(v)), 0, -1, xor, 2 * n]
    uints = [n, 1000000 - (n - 1), n, 7]
    u0 = sum(((x & 0xFF) << 33) for x in v) & M64
    return {1: np.array(ints, np.int32), 2: np.array(uints, np.uint32), 3: f32([0.5 * n]),
            4: np.array([0.25 * n]), 5: np.array([u0, max(5, n - 1)], np.uint64)}


atomics = case(name="atomics_global", ptx="atomics_global.ptx", entry="atomics_global",
               grid=(blocks(1000, 128),), block=(128,), build=_atomics, expected=_atomics_expect)
variants(atomics, "atomics_global.sm90.ptx", "atomics_global.O0.ptx")


# --------------------------------------------------------------------------- floats
def _clamp(rng):
    n = 500
    x = f32(rng.uniform(-2, 2, n))
    x[:5] = [np.nan, 0.25, -0.0, 1.0, 2.0]
    k = rng.integers(-3000, 3000, n).astype(np.int32)
    k[:3] = [-1, 0, 1001]
    return [In(x), In(k), Out(np.zeros(3 * n, np.float32)), Out(np.zeros(3 * n, np.int32)),
            Scalar(np.int32(n))]


def _clamp_expect(a):
    v, k = a[0].value, a[1].value.astype(np.int64)
    nan = np.isnan(v)
    sat = np.where(nan, 0, np.clip(v, 0, 1))
    sel = np.where(v > 0.25, v * 2, -v)
    clamp = np.fmin(np.fmax(v, -1), 1) + np.where(nan, 100, 0)
    out = np.stack([sat, sel, clamp], axis=1).astype(np.float32)
    i1 = ((k & M32) > 1000).astype(np.int32)
    i2 = np.where(((k > 0) & (v < 0)) | ((k < 0) & (v > 0)), 7, -7)
    iout = np.stack([np.clip(k, -50, 50), i1, i2], axis=1).astype(np.int32)
    return {2: out.ravel(), 3: iout.ravel()}


clamp = case(name="clamp_select", ptx="clamp_select.ptx", entry="clamp_select",
             grid=(blocks(500, 128),), block=(128,), build=_clamp, expected=_clamp_expect)
variants(clamp, "clamp_select.O0.ptx")


def _float_math(rng):
    n = 600
    x = f32(rng.uniform(-3, 3, n))
    x[:4] = [0.0, 0.5, -2.5, 3.0]
    return [In(x), Out(np.zeros(12 * n, np.float32)), Scalar(np.int32(n))]


def _float_math_expect(a):
    v = a[0].value.astype(np.float64)
    av = np.abs(v)
    cols = [np.sin(v), np.cos(v), np.exp(v), np.log(av + 1), np.tanh(v), np.sqrt(av),
            1 / np.sqrt(av + 1), np.fmin(v, 0.5) + np.fmax(v, -0.5),
            np.floor(v) + np.ceil(v) + np.sign(v) * np.floor(av + 0.5) + np.trunc(v),
            np.copysign(2.0, v) / (v * v + 1), np.exp(v) + np.sin(v) + np.log(av + 2),
            (av + 0.5) ** 1.5]
    return {1: np.stack(cols, axis=1).astype(np.float32).ravel()}


float_math = case(name="float_math", ptx="float_math.ptx", entry="float_math",
                  grid=(blocks(600, 128),), block=(128,), build=_float_math,
                  expected=_float_math_expect, rtol=2e-5, atol=2e-5)
variants(float_math, "float_math.sm75.ptx", "float_math.O0.ptx")


def _f16(rng):
    n = 500
    x = f32(rng.uniform(-1000, 1000, n))
    x[:4] = [0.0, 1.0, 65504.0 / 4, 1e-5]
    return [In(x), Out(np.zeros(n, np.uint16)), Out(np.zeros(2 * n, np.float32)),
            Scalar(np.int32(n))]


def _f16_expect(a):
    x = a[0].value
    h = x.astype(np.float16)
    tripled = (x * np.float32(3)).astype(np.float64)
    rz = tripled.astype(np.float16)
    over = np.abs(rz.astype(np.float64)) > np.abs(tripled)
    rz[over] = np.nextafter(rz[over], np.float16(0))
    back = np.stack([h.astype(np.float32), rz.astype(np.float32)], axis=1).ravel()
    return {1: h.view(np.uint16), 2: back}


f16 = case(name="f16_convert", ptx="f16_convert.ptx", entry="f16_convert",
           grid=(blocks(500, 128),), block=(128,), build=_f16, expected=_f16_expect)
variants(f16, "f16_convert.sm90.ptx", "f16_convert.O0.ptx")


def _type_convert(rng):
    n = 300
    f = f32(rng.uniform(-1000, 1000, n))
    f[:6] = [0.5, 1.5, -0.5, -2.5, 2.5, -1000.75]
    return [In(rng.integers(-128, 128, n).astype(np.int8)),
            In(rng.integers(0, 65536, n).astype(np.uint16)), In(f),
            Out(np.zeros(8 * n, np.int32)), Out(np.zeros(2 * n, np.float32)),
            Out(np.zeros(n)), Out(np.zeros(n, np.uint8)), Scalar(np.int32(n))]


def _type_convert_expect(a):
    s8, u16, v = a[0].value, a[1].value, a[2].value
    n = len(v)
    rn = np.rint(v).astype(np.int64)
    big = (v * np.float32(1e6)).astype(np.float32).astype(np.float64)
    o7 = (np.trunc(big).astype(np.int64) & M32).astype(np.uint32).view(np.int32)
    iout = np.stack([s8, u16, rn, np.trunc(v), np.floor(v), np.ceil(v), np.rint(np.abs(v)),
                     o7.astype(np.int64)], axis=1).astype(np.int64).astype(np.int32)
    f0 = s8.astype(np.float32) * np.float32(0.5) + u16.astype(np.float32)
    urz = round_toward_zero_f32((0xFFFFFFF0 - np.arange(n)).astype(np.float64))
    f1 = (rn * 3).astype(np.float32) + urz
    fout = np.stack([f0, f1], axis=1).ravel()
    dout = v.astype(np.float64) * 1.0000001 + u16.astype(np.float64)
    u8 = ((s8.astype(np.int64) + 3) & 0xFF).astype(np.uint8)
    return {3: iout.ravel(), 4: fout.astype(np.float32), 5: dout, 6: u8}


case(name="type_convert", ptx="type_convert.ptx", entry="type_convert", grid=(blocks(300, 128),),
     block=(128,), build=_type_convert, expected=_type_convert_expect, rtol=1e-7, atol=0)

MB_W, MB_H, MB_ITER = 64, 48, 200


def _mandelbrot(rng):
    return [Out(np.zeros(MB_H * MB_W, np.int32)), Scalar(np.int32(MB_W)), Scalar(np.int32(MB_H)),
            Scalar(np.int32(MB_ITER))]


def _mandelbrot_reference() -> np.ndarray:
    py, px = np.meshgrid(np.arange(MB_H), np.arange(MB_W), indexing="ij")
    cr = (np.float32(-2.0) + np.float32(2.5) * px.astype(np.float32) / np.float32(MB_W))
    ci = (np.float32(-1.25) + np.float32(2.5) * py.astype(np.float32) / np.float32(MB_H))
    zr = np.zeros_like(cr)
    zi = np.zeros_like(ci)
    it = np.zeros(cr.shape, np.int32)
    for _ in range(MB_ITER):
        live = zr * zr + zi * zi <= 4
        if not live.any():
            break
        t = zr * zr - zi * zi + cr
        zi = np.where(live, np.float32(2) * zr * zi + ci, zi)
        zr = np.where(live, t, zr)
        it += live
    return it.ravel()


def _mandelbrot_check(args, got):
    """Float contraction (fma) may move a point on the set's boundary by an iteration or
    more; all but a few pixels must match exactly, and the count of points inside too."""
    want = _mandelbrot_reference()
    out = got[0]
    assert out.shape == want.shape and out.min() >= 0 and out.max() <= MB_ITER
    assert np.mean(out == want) >= 0.97
    assert abs(int((out == MB_ITER).sum()) - int((want == MB_ITER).sum())) <= 0.01 * out.size


case(name="mandelbrot", ptx="mandelbrot.ptx", entry="mandelbrot",
     grid=(blocks(MB_W, 16), blocks(MB_H, 16)), block=(16, 16), build=_mandelbrot,
     check=_mandelbrot_check)


def _clock(rng):
    n = 256
    return [Out(np.zeros(2 * n, np.int64)), Out(np.zeros(2 * n, np.uint64)),
            Out(np.zeros(n, np.float32)), Scalar(np.int32(50))]


def _clock_check(args, got):
    c = got[0].reshape(-1, 2)
    t = got[1].reshape(-1, 2)
    assert (c[:, 1] >= c[:, 0]).all() and (c[:, 0] >= 0).all()
    assert (t[:, 1] >= t[:, 0]).all() and (t[:, 0] > 0).all()
    acc = np.arange(len(got[2]), dtype=np.float64)
    for _ in range(int(args[3].value)):
        acc = acc * np.float32(0.999) + 1.0
    np.testing.assert_allclose(got[2], acc.astype(np.float32), rtol=1e-5)


case(name="clock_timer", ptx="clock_timer.ptx", entry="clock_timer", grid=(2,), block=(128,),
     build=_clock, check=_clock_check)


# --------------------------------------------------------------------------- NVRTC
def _fast_math(rng):
    n = 400
    return [In(f32(rng.uniform(-3, 3, n))), Out(np.zeros(6 * n, np.float32)), Scalar(np.int32(n))]


def _fast_math_expect(a):
    v = a[0].value.astype(np.float64)
    av = np.abs(v)
    cols = [np.sin(v) * np.cos(v), np.exp(v * 0.5), np.log(v * v + 1), v / (av + 1),
            np.sqrt(av) + 1 / np.sqrt(av + 1), np.tanh(v) + (av + 1) ** 0.75]
    return {1: np.stack(cols, axis=1).astype(np.float32).ravel()}


case(name="nvrtc_fast_math", ptx="nvrtc_fast_math.nvrtc.ptx", entry="fast_math",
     grid=(blocks(400, 128),), block=(128,), build=_fast_math, expected=_fast_math_expect,
     rtol=1e-4, atol=1e-4)


def _timed_reduction(rng):
    return [In(f32(rng.uniform(-100, 100, 256))), Out(np.zeros(4, np.float32)),
            Out(np.zeros(8, np.int64))]


def _timed_reduction_check(args, got):
    np.testing.assert_array_equal(got[1], np.full(4, args[0].value.min(), np.float32))
    timer = got[2]
    assert (timer[4:] >= timer[:4]).all()


case(name="nvrtc_timed_reduction", ptx="nvrtc_clock_reduce.nvrtc.ptx", entry="timed_reduction",
     grid=(4,), block=(128,), shared_mem=2 * 128 * 4, build=_timed_reduction,
     check=_timed_reduction_check)


def _system_atomics(rng):
    data = np.array([0, -1, -5, 1000, 0, -1, 0, 0], np.int32)
    return [InOut(data), InOut(np.zeros(2, np.uint32)), Scalar(np.int32(100))]


def _system_atomics_check(args, got):
    n = int(args[2].value)
    data, udata = got[0], got[1]
    and_all, xor_all = -1, 0
    for i in range(n):
        and_all &= 2 * i + 7
        xor_all ^= i
    assert data[0] == 10 * n
    assert 0 <= data[1] < n
    assert data[2] == n - 1 and data[3] == 0
    assert 0 <= data[4] < n  # a chain of compare-and-swaps: how far it gets depends on order
    assert data[5] == and_all and data[6] == -1 and data[7] == xor_all
    assert udata[0] == n % 18 and udata[1] == 138 - n


case(name="nvrtc_system_atomics", ptx="nvrtc_system_atomics.nvrtc.ptx", entry="system_atomics",
     grid=(1,), block=(128,), build=_system_atomics, check=_system_atomics_check)


# --------------------------------------------------------------------------- numba-cuda
def numba_entry(ptx: str) -> str:
    """A numba PTX file's only entry name (numba mangles it with types and a hash)."""
    return re.search(r"\.entry\s+([\w$]+)", (HERE / ptx).read_text()).group(1)


def _axpb(rng):
    n = 1000
    return [NumbaArray(In(f32(rng.standard_normal(n)))), NumbaArray(In(f32(rng.standard_normal(n)))),
            NumbaArray(Out(np.zeros(n, np.float32))), Scalar(np.float32(1.25))]


case(name="numba_axpb", ptx="numba_axpb.numba.ptx", entry=numba_entry("numba_axpb.numba.ptx"),
     grid=(blocks(1000, 128),), block=(128,), build=_axpb,
     expected=lambda a: {2: (1.25 * a[0].arg.value.astype(np.float64) + a[1].arg.value - 1.0)
                         .astype(np.float32)}, rtol=1e-6, atol=1e-6)


def _block_sum(rng):
    n = 1000
    return [NumbaArray(In(f32(rng.standard_normal(n)))),
            NumbaArray(Out(np.zeros(blocks(n, 128), np.float32)))]


def _block_sum_expect(a):
    v = a[0].arg.value.astype(np.float64)
    return {1: np.array([v[i:i + 128].sum() for i in range(0, len(v), 128)], np.float32)}


case(name="numba_block_sum", ptx="numba_block_sum.numba.ptx",
     entry=numba_entry("numba_block_sum.numba.ptx"), grid=(blocks(1000, 128),), block=(128,),
     build=_block_sum, expected=_block_sum_expect, rtol=1e-5, atol=1e-5)


def _count_positive(rng):
    n = 3000
    return [NumbaArray(In(f32(rng.standard_normal(n)))), NumbaArray(InOut(np.zeros(1, np.int32)))]


case(name="numba_count_positive", ptx="numba_count_positive.numba.ptx",
     entry=numba_entry("numba_count_positive.numba.ptx"), grid=(blocks(3000, 256),), block=(256,),
     build=_count_positive,
     expected=lambda a: {1: np.array([(a[0].arg.value > 0).sum()], np.int32)})


def _wave(rng):
    n = 500
    x = rng.uniform(-4, 4, n)
    x[:6] = [0.0, 1e-3, 1e5, 1e15, -3e9, 123456789.5]  # large ones take the Payne-Hanek path
    return [NumbaArray(In(x)), NumbaArray(Out(np.zeros(n)))]


case(name="numba_wave", ptx="numba_wave.numba.ptx", entry=numba_entry("numba_wave.numba.ptx"),
     grid=(blocks(500, 128),), block=(128,), build=_wave,
     expected=lambda a: {1: np.sin(a[0].arg.value) + np.exp(-a[0].arg.value ** 2)
                         + np.sqrt(np.abs(a[0].arg.value))}, rtol=1e-13, atol=1e-13)


CASES_BY_NAME = {c.name: c for c in CASES}
assert len(CASES_BY_NAME) == len(CASES), "case names must be unique"
