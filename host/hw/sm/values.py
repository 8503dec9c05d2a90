"""Register values of a batch of threads, and the typed views instructions compute on.

A batch (executor.py) runs N threads: nb blocks of T threads, thread `i` of the batch is
thread t = i mod T of block q = i div T. A register of a batch holds, for all N threads,
one of three things:

  ndarray   the register file's dtype (R32: uint32, R64: uint64, PRED: bool), shape (N,),
            owned by that register alone (so a partial write may change it in place);
  int/bool  one value for every thread (uniform): a parameter, %ntid, a constant, or any
            result computed only from uniform values (Python int: the register's bits);
  Lin       an integer affine in the thread's position: (c0 + ct*t + cq*q) mod 2**bits,
            such as %tid.x, %ctaid.x*%ntid.x + %tid.x, or an address computed from them.
            Lin lets a load or store of consecutive addresses become one slice of memory
            (memory.py) instead of a gather, and costs nothing until it is needed as an
            array (materialize, cached);
  Span      a predicate true for a contiguous run of the batch's lanes, as a bounds check
            `i < n` of an affine i gives: a guard on it costs nothing.

Lin arithmetic is exact modulo 2**bits for add, sub, multiplication by a uniform value
and shifts left; widening (zero or sign extension) stays affine only when the range of the
value over the batch cannot wrap, which lin_widen checks.

Typed views: an instruction of type T reads its operands as numpy values of T's dtype
(typed, TYPE_DTYPES: b32/u32 uint32, s32 int32, f32 float32, f16 float16, bf16 the uint16
bits, ...) and returns a typed result, which bits() turns back into the register file's
representation: values narrower than 32 bits are zero-extended (unsigned, bit and float
types) or sign-extended (signed types), ISA-TYPE-1.
"""

from __future__ import annotations

import numpy as np

from pvgpu.spec import isa

M32 = 0xFFFF_FFFF
M64 = 0xFFFF_FFFF_FFFF_FFFF

TYPE_DTYPES = {
    isa.TYPE_B8: np.dtype(np.uint8), isa.TYPE_U8: np.dtype(np.uint8),
    isa.TYPE_S8: np.dtype(np.int8), isa.TYPE_B16: np.dtype(np.uint16),
    isa.TYPE_U16: np.dtype(np.uint16), isa.TYPE_S16: np.dtype(np.int16),
    isa.TYPE_F16: np.dtype(np.float16), isa.TYPE_BF16: np.dtype(np.uint16),
    isa.TYPE_B32: np.dtype(np.uint32), isa.TYPE_U32: np.dtype(np.uint32),
    isa.TYPE_S32: np.dtype(np.int32), isa.TYPE_F32: np.dtype(np.float32),
    isa.TYPE_B64: np.dtype(np.uint64), isa.TYPE_U64: np.dtype(np.uint64),
    isa.TYPE_S64: np.dtype(np.int64), isa.TYPE_F64: np.dtype(np.float64),
    isa.TYPE_PRED: np.dtype(np.bool_),
}
FILE_DTYPES = {isa.OPND_R32: np.dtype(np.uint32), isa.OPND_R64: np.dtype(np.uint64),
               isa.OPND_PRED: np.dtype(np.bool_)}
_UNSIGNED_OF = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32),
                8: np.dtype(np.uint64)}


def type_bits(t: int) -> int:
    return isa.TYPE_BITS[t]


def is_signed(t: int) -> bool:
    return t in isa.SIGNED_TYPES


def mask_of(bits: int) -> int:
    return (1 << bits) - 1


def to_signed(v: int, bits: int) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


class Lazy:
    """A register value kept in a compact form: materialize(geo) -> the (N,) array (cached,
    not to be modified), at(geo, idx) -> the values of lanes idx."""

    __slots__ = ()


class Span(Lazy):
    """A predicate true exactly for the batch's lanes lo <= i < hi (0 < hi - lo < N):
    what `i < n` gives for the thread index i of a contiguous batch."""

    __slots__ = ("lo", "hi", "_arr")

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, hi
        self._arr = None

    def __repr__(self):
        return f"Span({self.lo}, {self.hi})"

    def materialize(self, geo) -> np.ndarray:
        if self._arr is None:
            a = np.zeros(geo.N, dtype=bool)
            a[self.lo:self.hi] = True
            self._arr = a
        return self._arr

    def at(self, geo, idx) -> np.ndarray:
        if idx is None:
            return self.materialize(geo)
        return (idx >= self.lo) & (idx < self.hi)


def make_span(lo: int, hi: int, n: int):
    """Lanes [lo, hi) of n as a predicate value: a bool when uniform, else a Span."""
    lo, hi = max(lo, 0), min(hi, n)
    if hi <= lo:
        return False
    if lo == 0 and hi == n:
        return True
    return Span(lo, hi)


class Lin(Lazy):
    """(c0 + ct*t + cq*q) mod 2**bits over the threads of a batch (see the module doc)."""

    __slots__ = ("c0", "ct", "cq", "bits", "_arr")

    def __init__(self, c0: int, ct: int, cq: int, bits: int):
        m = (1 << bits) - 1
        self.c0, self.ct, self.cq, self.bits = c0 & m, ct & m, cq & m, bits
        self._arr = None

    def __repr__(self):
        return f"Lin({self.c0:#x} + {self.ct}*t + {self.cq}*q mod 2**{self.bits})"

    def stride(self, T: int):
        """-> the byte stride s if the value is c0 + s*i over the batch (i = q*T + t)."""
        m = (1 << self.bits) - 1
        return self.ct if (self.ct * T) & m == self.cq else None

    def materialize(self, geo) -> np.ndarray:
        """The (N,) array of values (cached; callers must not modify it)."""
        if self._arr is None:
            self._arr = self.at(geo, None)
        return self._arr

    def at(self, geo, idx) -> np.ndarray:
        """Values of the threads idx (None: all), in the register file's dtype."""
        dt = np.uint32 if self.bits == 32 else np.uint64
        s = self.stride(geo.T)
        if s is not None:
            i = geo.lanes(dt) if idx is None else idx.astype(dt)
            r = i * dt(s)
            r += dt(self.c0)
            return r
        t, q = geo.tq(dt)
        if idx is not None:
            t, q = t[idx], q[idx]
        r = t * dt(self.ct)
        r += q * dt(self.cq)
        r += dt(self.c0)
        return r

    def range(self, geo, signed: bool):
        """(lo, hi) of the value over the batch, as exact integers, reading c0 as signed or
        unsigned and ct, cq as signed (see lin_widen)."""
        c0 = to_signed(self.c0, self.bits) if signed else self.c0
        ct, cq = to_signed(self.ct, self.bits), to_signed(self.cq, self.bits)
        lo = hi = c0
        for c, n in ((ct, geo.T - 1), (cq, geo.nb - 1)):
            lo += min(0, c * n)
            hi += max(0, c * n)
        return lo, hi


def make_lin(c0: int, ct: int, cq: int, bits: int):
    """A Lin, or a plain int when it does not depend on the thread."""
    m = (1 << bits) - 1
    if ct & m == 0 and cq & m == 0:
        return c0 & m
    return Lin(c0, ct, cq, bits)


def _parts(v):
    return (v.c0, v.ct, v.cq) if isinstance(v, Lin) else (v, 0, 0)


def lin_add(x, y, bits):
    a = (x.c0, x.ct, x.cq) if isinstance(x, Lin) else (x, 0, 0)  # (_parts, inline)
    b = (y.c0, y.ct, y.cq) if isinstance(y, Lin) else (y, 0, 0)
    return make_lin(a[0] + b[0], a[1] + b[1], a[2] + b[2], bits)


def lin_sub(x, y, bits):
    a, b = _parts(x), _parts(y)
    return make_lin(a[0] - b[0], a[1] - b[1], a[2] - b[2], bits)


def lin_mul(x, s: int, bits):
    if isinstance(x, Lin):
        return make_lin(x.c0 * s, x.ct * s, x.cq * s, bits)
    return (x * s) & ((1 << bits) - 1)


def lin_widen(geo, x, signed: bool, src_bits: int, dst_bits: int):
    """Zero/sign-extend an affine value; None when the batch's values might wrap."""
    if not isinstance(x, Lin):
        v = to_signed(x, src_bits) if signed else x & mask_of(src_bits)
        return v & mask_of(dst_bits)
    lo, hi = x.range(geo, signed)
    if signed:
        ok = -(1 << (src_bits - 1)) <= lo and hi < (1 << (src_bits - 1))
        c0 = to_signed(x.c0, src_bits)
    else:
        ok = 0 <= lo and hi < (1 << src_bits)
        c0 = x.c0
    if not ok:
        return None
    return make_lin(c0, to_signed(x.ct, src_bits), to_signed(x.cq, src_bits), dst_bits)


def lin_narrow(x, bits):
    a = _parts(x)
    return make_lin(a[0], a[1], a[2], bits)


# ------------------------------------------------------------------ typed views
def scalar(bits_value, t: int):
    """A uniform register value (int bits, or bool) as a numpy scalar of type t."""
    key = (bits_value, t)
    v = _SCALARS.get(key)
    if v is None:
        dt = TYPE_DTYPES[t]
        if t == isa.TYPE_PRED:
            v = np.bool_(bits_value)
        else:
            u = _UNSIGNED_OF[dt.itemsize]
            v = u.type(int(bits_value) & mask_of(8 * dt.itemsize)).view(dt)
        if len(_SCALARS) >= SCALARS_KEPT:
            _SCALARS.clear()
        _SCALARS[key] = v
    return v


SCALARS_KEPT = 4096  # recent uniform values as numpy scalars (immutable: shared freely)
_SCALARS: dict = {}


def typed(arr: np.ndarray, t: int) -> np.ndarray:
    """A register file array (uint32/uint64/bool) read as type t (a view when the widths
    match, else the low bits converted)."""
    dt = TYPE_DTYPES[t]
    if dt.itemsize == arr.dtype.itemsize:
        return arr if dt == arr.dtype else arr.view(dt)
    u = _UNSIGNED_OF[dt.itemsize]
    low = arr.astype(u)
    return low if u == dt else low.view(dt)


def bits(res, t: int, file_dtype: np.dtype):
    """A typed result (array, numpy scalar or 0-d array) -> the register representation:
    a fresh-or-owned array of file_dtype, or an int/bool for a scalar."""
    if type(res) is not np.ndarray:
        res = np.asarray(res)
    dt = TYPE_DTYPES[t]
    if res.dtype != dt:
        res = res.astype(dt)
    if t == isa.TYPE_PRED:
        return bool(res) if res.ndim == 0 else res
    if dt.itemsize == file_dtype.itemsize:
        out = res.view(file_dtype)
    elif dt.kind == "i":
        out = res.astype(np.int32 if file_dtype.itemsize == 4 else np.int64).view(file_dtype)
    else:
        out = res.view(_UNSIGNED_OF[dt.itemsize]).astype(file_dtype)
    return int(out) if out.ndim == 0 else out
