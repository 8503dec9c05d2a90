"""IEEE 754 rounding for the SMs' float instructions, vectorised with numpy.

numpy computes f16/f32/f64 +, -, *, /, sqrt rounded to nearest even, which is the ISA's
default (ISA-MOD-2). The other modes, and operations numpy lacks, are built from exact
error terms in float64:

  two_sum(a, b)    -> (s, e): s = fl(a + b), a + b = s + e exactly (Knuth)
  two_prod(a, b)   -> (p, e): p = fl(a * b), a * b = p + e exactly (Dekker/Veltkamp)
  round_pair(hi, lo, dtype, mode)
                   rounds x = hi + lo (exact, hi = fl64(x)) to dtype with mode: to f64
                   by moving hi one ulp toward x when the mode asks; to f32/f16 by
                   rounding to odd in f64 first and then to nearest in the target (exact
                   because 53 >= p + 2, Boldo & Melquiond), then one ulp toward x for the
                   directed modes, knowing the sign of x - r exactly.
  fma64(a, b, c)   a*b + c with one rounding: Boldo & Melquiond's emulated FMA,
                   RN(th + RO(tl + ul)) with uh + ul = a*b and th + tl = c + uh.

The error-free transforms need no overflow in the Veltkamp split and no underflow of the
error terms. Lanes outside that range (huge or tiny operands), and f64 fma with a directed
rounding, are computed exactly with Python fractions (exact_lanes), which is slow but
rare. Float exceptions are not errors (ISA-OP-3): callers run under np.errstate(all=
"ignore").
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from pvgpu.host.hw.sm import stopping
from pvgpu.spec import isa

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
RN, RZ, RM, RP = isa.RND_RN, isa.RND_RZ, isa.RND_RM, isa.RND_RP
_SPLIT = 134217729.0  # 2**27 + 1
_BIG = 2.0 ** 995  # above this an operand of two_prod may overflow the split
_TINY = 2.0 ** -968  # below this a product's error term may underflow
_HUGE = 2.0 ** 1020  # above this the split halves' product may overflow
_INF = np.inf


def rounding(mode: int) -> int:
    """RND_DEFAULT -> RND_RN; the integral modes of cvt map to their float modes."""
    if mode in (isa.RND_DEFAULT, isa.RND_RN, isa.RND_RNI):
        return RN
    return {isa.RND_RZ: RZ, isa.RND_RZI: RZ, isa.RND_RM: RM, isa.RND_RMI: RM,
            isa.RND_RP: RP, isa.RND_RPI: RP}[mode]


def two_sum(a, b):
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, np.where(np.isfinite(s), e, 0.0)


def _split(a):
    c = _SPLIT * a
    hi = c - (c - a)
    return hi, a - hi


def two_prod(a, b):
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, np.where(np.isfinite(p), e, 0.0)


def _prod_ok(a, b, p):
    """Lanes where two_prod(a, b) is exact."""
    return ((np.abs(a) < _BIG) & (np.abs(b) < _BIG) & (np.abs(p) < _HUGE)
            & ((np.abs(p) > _TINY) | (a == 0) | (b == 0)))


def round_odd(hi, lo):
    """hi moved to its odd neighbour toward hi + lo when lo != 0 and hi is even."""
    even = (np.asarray(hi).view(np.int64) & 1) == 0
    fix = (lo != 0) & even & np.isfinite(hi)
    if not np.any(fix):
        return hi
    return np.where(fix, np.nextafter(hi, np.where(lo > 0, _INF, -_INF)), hi)


def _toward(r, sign, mode):
    """r (the value rounded to nearest) moved one ulp where the mode asks, given the sign
    of x - r (sign > 0: x above r)."""
    if mode == RP:
        move = sign > 0
        target = _INF
    elif mode == RM:
        move = sign < 0
        target = -_INF
    else:  # RZ: toward zero when |r| > |x|
        move = ((r > 0) & (sign < 0)) | ((r < 0) & (sign > 0))
        target = 0.0
    if not np.any(move):
        return r
    return np.where(move, np.nextafter(r, r.dtype.type(target)), r)


def round_pair(hi, lo, dtype, mode: int, overflow=None):
    """Round x = hi + lo (f64, exact, hi = RN64(x)) to dtype with mode.

    overflow: lanes where x overflowed f64 (hi = +-inf for a finite x)."""
    hi = np.asarray(hi, F64)
    lo = np.asarray(lo, F64)
    if dtype == F64:
        if mode == RN:
            return hi
        r = _toward(hi, np.sign(lo), mode)
        if overflow is not None and np.any(overflow):
            r = np.where(overflow, _toward(hi, -np.sign(hi), mode), r)
        return r
    r = round_odd(hi, lo).astype(dtype)
    if mode == RN:
        return r
    with np.errstate(all="ignore"):
        d = (hi - r.astype(F64)) + lo
    d = np.where(np.isnan(d), 0.0, d)
    return _toward(r, np.sign(d), mode)


def narrow(x, dtype, mode: int):
    """f64 (or wider-than-dtype) values x rounded to dtype with mode (cvt)."""
    x = np.asarray(x, F64)
    if dtype == F64:
        return x
    r = x.astype(dtype)
    if mode == RN:
        return r
    with np.errstate(all="ignore"):
        d = x - r.astype(F64)
    d = np.where(np.isnan(d), 0.0, d)
    return _toward(r, np.sign(d), mode)


# ------------------------------------------------------------------ exact fallback
def round_fraction(x: Fraction, dtype, mode: int):
    """An exact rational rounded to dtype with mode (one value)."""
    try:
        hi = float(x)  # correctly rounded to nearest
    except OverflowError:
        hi = math.inf if x > 0 else -math.inf
    if math.isinf(hi):
        lo = 0.0
        over = True
    else:
        over = False
        rest = x - Fraction(hi)  # only its sign matters; as a float it may underflow to 0
        lo = 0.0 if rest == 0 else math.copysign(5e-324, rest)
    return round_pair(np.array([hi]), np.array([lo]), dtype, mode,
                      np.array([over]))[0]


def exact_lanes(fn, dtype, mode, *operands):
    """Per lane: round fn(*Fractions) (None for a non-finite operand: the caller's lanes
    are all finite) -> array of dtype."""
    n = max(np.size(o) for o in operands)
    ops = [np.broadcast_to(np.asarray(o, F64), (n,)) for o in operands]
    out = np.empty(n, dtype)
    for i in range(n):
        if i % stopping.CHECK_EVERY == stopping.CHECK_EVERY - 1:
            stopping.check()
        out[i] = round_fraction(fn(*(Fraction(float(o[i])) for o in ops)), dtype, mode)
    return out


def _patch(result, bad, fn, dtype, mode, *operands):
    """result with the lanes `bad` recomputed exactly."""
    if not np.any(bad):
        return result
    result = np.array(result, dtype, copy=True)
    flat = result.reshape(-1)  # (a 0-d result stays 0-d)
    idx = np.flatnonzero(np.broadcast_to(bad, result.shape))
    ops = [np.broadcast_to(np.asarray(o, F64), result.shape).reshape(-1)[idx] for o in operands]
    flat[idx] = exact_lanes(fn, dtype, mode, *ops)
    return result


# ------------------------------------------------------------------ operations
def ftz(x):
    """Flush f32 subnormals to sign-preserving zero."""
    tiny = np.abs(x) < np.float32(np.finfo(np.float32).tiny)
    if not np.any(tiny & (x != 0)):
        return x
    return np.where(tiny, np.copysign(np.float32(0), x), x)


def saturate(x):
    """Clamp to [0, 1], NaN -> 0."""
    one = x.dtype.type(1) if hasattr(x, "dtype") else 1.0
    return np.where(x > 0, np.minimum(x, one), x.dtype.type(0))


def add(a, b, dtype, mode):
    if mode == RN and dtype != F16:
        return np.add(a, b, dtype=dtype)
    a64, b64 = np.asarray(a, F64), np.asarray(b, F64)
    hi, lo = two_sum(a64, b64)  # (exact for f16: lo == 0)
    over = np.isinf(hi) & np.isfinite(a64) & np.isfinite(b64) if dtype == F64 else None
    return round_pair(hi, lo, dtype, mode, over)


def mul(a, b, dtype, mode):
    if mode == RN and dtype != F16:
        return np.multiply(a, b, dtype=dtype)
    a64, b64 = np.asarray(a, F64), np.asarray(b, F64)
    if dtype != F64:  # the product of two f32 (f16) is exact in f64
        return round_pair(a64 * b64, 0.0, dtype, mode)
    p, e = two_prod(a64, b64)
    over = np.isinf(p) & np.isfinite(a64) & np.isfinite(b64)
    r = round_pair(p, e, dtype, mode, over)
    nonzero = np.isfinite(a64) & np.isfinite(b64) & (a64 != 0) & (b64 != 0)
    return _patch(r, ~_prod_ok(a64, b64, p) & nonzero, lambda x, y: x * y, dtype, mode, a64, b64)


_LOW = {F32: (np.int64((1 << 29) - 1), np.int64(1 << 28)),  # f64 bits below the f32/f16
        F16: (np.int64((1 << 42) - 1), np.int64(1 << 41))}  # mantissa, and its halfway point


def fma(a, b, c, dtype, mode):
    if dtype == F64:
        return fma64(*(np.asarray(v, F64) for v in (a, b, c)), mode)
    if mode == RN:
        # a*b is exact in f64 and s = fl64(a*b + c) rounds to the right f32 (f16) unless s
        # lies exactly halfway between two of them (the first rounding may have made it
        # so), or is out of the target's normal range: only such lanes go the exact way
        s = np.asarray(np.add(np.multiply(a, b, dtype=F64), c, dtype=F64))
        r = s.astype(dtype)
        low, half = _LOW[dtype]
        check = (s.view(np.int64) & low) == half  # (also covers the overflow threshold)
        check |= np.abs(s) < float(np.finfo(dtype).tiny) * 2  # subnormal: other midpoints
        if not check.any():
            return r
        if r.ndim == 0:
            return _fma_exact(a, b, c, dtype, mode)
        idx = np.flatnonzero(check)
        r[idx] = _fma_exact(*(np.broadcast_to(v, r.shape)[idx] for v in (a, b, c)), dtype, mode)
        return r
    return _fma_exact(a, b, c, dtype, mode)


def _fma_exact(a, b, c, dtype, mode):
    p = np.multiply(a, b, dtype=F64)  # exact
    hi, lo = two_sum(p, np.asarray(c, F64))
    return round_pair(hi, lo, dtype, mode)


def fma64(a, b, c, mode=RN):
    with np.errstate(all="ignore"):
        uh, ul = two_prod(a, b)
        th, tl = two_sum(c, uh)
        v = round_odd(*two_sum(tl, ul))
        z = th + v
        plain = a * b + c
    # a zero product or a special value: a*b + c has one rounding already
    easy = ~(np.isfinite(a) & np.isfinite(b) & np.isfinite(c)) | (a == 0) | (b == 0)
    z = np.where(easy, plain, z)
    if mode == RN:
        ok = (_prod_ok(a, b, uh) & (np.abs(c) < _BIG) & (np.abs(z) > _TINY)
              & np.isfinite(z))
        bad = ~easy & ~ok
    else:
        bad = ~easy
    return _patch(z, bad, lambda x, y, w: x * y + w, F64, mode, a, b, c)


def div(a, b, dtype, mode):
    if mode == RN:
        if dtype == F16:
            return (np.asarray(a, F64) / np.asarray(b, F64)).astype(F16)
        return np.divide(a, b, dtype=dtype)
    a64, b64 = np.asarray(a, F64), np.asarray(b, F64)
    q = np.divide(a, b, dtype=dtype)
    q64 = q.astype(F64)
    finite = np.isfinite(a64) & np.isfinite(b64) & (b64 != 0)
    if dtype != F64:
        with np.errstate(all="ignore"):
            res = a64 - q64 * b64  # exact: q*b fits f64, and is within a factor 2 of a
        sign = np.sign(res) * np.sign(b64)
        sign = np.where(np.isinf(q64) & finite, -np.sign(q64), sign)
        sign = np.where(finite, np.nan_to_num(sign), 0.0)
        return _toward(q, sign, mode)
    p, e = two_prod(q64, b64)
    with np.errstate(all="ignore"):
        sign = np.sign((a64 - p) - e) * np.sign(b64)
    sign = np.where(np.isinf(q64) & finite, -np.sign(q64), sign)
    sign = np.where(finite, np.nan_to_num(sign), 0.0)
    r = _toward(q, sign, mode)
    return _patch(r, finite & ~_prod_ok(q64, b64, p) & (a64 != 0), lambda x, y: x / y,
                  dtype, mode, a64, b64)


def sqrt(a, dtype, mode):
    q = np.sqrt(a, dtype=dtype)
    if mode == RN:
        return q
    a64, q64 = np.asarray(a, F64), q.astype(F64)
    finite = np.isfinite(q64) & (a64 > 0)
    if dtype != F64:
        with np.errstate(all="ignore"):
            sign = np.sign(a64 - q64 * q64)
        return _toward(q, np.where(finite, sign, 0.0), mode)
    p, e = two_prod(q64, q64)
    with np.errstate(all="ignore"):
        sign = np.sign((a64 - p) - e)
    r = _toward(q, np.where(finite, np.nan_to_num(sign), 0.0), mode)
    return _patch(r, finite & ~_prod_ok(q64, q64, p),
                  lambda x: _sqrt_fraction(x), dtype, mode, a64)


def _sqrt_fraction(x: Fraction) -> Fraction:
    """sqrt(x) to about 120 significant bits, rounded to odd in the last place: rounds to
    f64 in any mode exactly as sqrt(x) does."""
    s = 120 - (x.numerator.bit_length() - x.denominator.bit_length()) // 2
    n, d = x.numerator, x.denominator
    if s >= 0:
        n <<= 2 * s
    else:
        d <<= -2 * s
    r = math.isqrt(n // d)  # floor(sqrt(x) * 2**s)
    num = 2 * r + (0 if r * r * d == n else 1)
    return Fraction(num, 1 << (s + 1)) if s + 1 >= 0 else Fraction(num << -(s + 1))


def minimum(a, b):
    """PTX min: NaN loses to a number; equal values give b."""
    r = np.where(a < b, a, b)
    r = np.where(np.isnan(a), b, r)
    return np.where(np.isnan(b), a, r)


def maximum(a, b):
    r = np.where(a > b, a, b)
    r = np.where(np.isnan(a), b, r)
    return np.where(np.isnan(b), a, r)
