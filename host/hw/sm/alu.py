"""What the arithmetic, bit, comparison and conversion instructions compute (ISA-OP-1..5).

make(op, type, type2, mod) -> Alu: the compute function `fn` over typed numpy values
(values.py: arrays of the operands' dtypes, or numpy scalars, broadcast together), the
types fn reads for each source slot and the type of its result, and, for the integer
operations that keep affine values affine (add, sub, mul.lo, mul.wide, mad, shl, mov,
integer cvt, cvta), `lin`: the same operation on uniform ints and values.Lin, returning
None when the result would not stay affine.

Integers wrap modulo 2**width (numpy's integer arithmetic does); division by zero, the
high half of 64-bit products, saturation and PTX's bit-field semantics (bfe, bfi, prmt,
bfind) are spelled out below. Floats round as fpmath.py explains.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pvgpu.host.hw.sm import fpmath as fp
from pvgpu.host.hw.sm import values as V
from pvgpu.spec import isa
from pvgpu.spec.isa import TYPE_BF16, TYPE_F16, TYPE_F32, TYPE_F64, TYPE_PRED, TYPE_U32, TYPE_U64

U32, U64, I32, I64 = np.uint32, np.uint64, np.int32, np.int64
F32 = np.float32


@dataclass
class Alu:
    fn: object  # fn(*typed sources) -> typed result
    src_types: tuple  # per source slot used (in the order fn takes them)
    dst_type: int
    lin: object = None  # lin(geo, *uniform-or-Lin values) -> value or None


class Unsupported(Exception):
    """No semantics for this signature (isa_check rejects it first)."""


def _bits(t):
    return isa.TYPE_BITS[t]


def _dt(t):
    return V.TYPE_DTYPES[t]


def _wide(t):
    return {isa.TYPE_U16: isa.TYPE_U32, isa.TYPE_S16: isa.TYPE_S32,
            isa.TYPE_U32: isa.TYPE_U64, isa.TYPE_S32: isa.TYPE_S64}[t]


def _is_float(t):
    return t in isa.FLOAT_TYPES


def _lin_ok(t):
    return t in isa.INT_TYPES and _bits(t) in (32, 64)


# ------------------------------------------------------------------ floats in general
def _to_compute(t):
    """The numpy dtype a float type computes in (bf16 only converts: through f32)."""
    return {TYPE_F16: np.dtype(np.float16), TYPE_F32: np.dtype(F32),
            TYPE_F64: np.dtype(np.float64)}[t]


def bf16_to_f32(bits16):
    return (np.asarray(bits16).astype(U32) << U32(16)).view(F32)


def f32_to_bf16(x, mode=fp.RN):
    """f32 values -> bf16 bits (uint16), rounded with mode; NaN stays NaN."""
    x = np.asarray(x, F32)
    b = x.view(U32).astype(U64)
    if mode == fp.RN:
        r = (b + U64(0x7FFF) + ((b >> U64(16)) & U64(1))) >> U64(16)
    else:
        low = (b & U64(0xFFFF)) != 0
        neg = (b >> U64(31)) != 0
        trunc = b >> U64(16)
        if mode == fp.RZ:
            up = np.zeros_like(low)
        elif mode == fp.RP:
            up = low & ~neg
        else:
            up = low & neg
        r = trunc + up.astype(U64)
    nan = np.isnan(x)
    r = np.where(nan, (b >> U64(16)) | U64(0x40), r)
    return r.astype(np.uint16)


def _flush_in(mod, t, *xs):
    if mod & isa.MOD_FTZ and t == TYPE_F32:
        return tuple(fp.ftz(x) for x in xs)
    return xs


def _post(mod, t, r):
    if mod & isa.MOD_FTZ and t == TYPE_F32:
        r = fp.ftz(r)
    if mod & isa.MOD_SAT:
        r = fp.saturate(r)
    return r


def _float_binary(op, t, mod):
    dt = _to_compute(t)
    mode = fp.rounding(mod & isa.MOD_ROUND_MASK)
    approx = mod & isa.MOD_APPROX

    def impl(a, b):
        a, b = _flush_in(mod, t, a, b)
        if op == isa.OP_ADD:
            r = fp.add(a, b, dt, mode)
        elif op == isa.OP_SUB:
            r = fp.add(a, -b, dt, mode)
        elif op == isa.OP_MUL:
            r = fp.mul(a, b, dt, mode)
        elif op == isa.OP_DIV:
            r = np.divide(a, b, dtype=dt) if approx else fp.div(a, b, dt, mode)
        elif op == isa.OP_MIN:
            r = fp.minimum(a, b)
        elif op == isa.OP_MAX:
            r = fp.maximum(a, b)
        elif op == isa.OP_COPYSIGN:  # magnitude of b, sign of a (PTX operand order)
            r = np.copysign(b, a)
        else:
            raise Unsupported(op)
        return _post(mod, t, np.asarray(r, dt))
    return impl


def _float_unary(op, t, mod):
    dt = _to_compute(t)
    mode = fp.rounding(mod & isa.MOD_ROUND_MASK)
    approx = mod & isa.MOD_APPROX
    f64 = np.float64

    def impl(a):
        (a,) = _flush_in(mod, t, a)
        if op == isa.OP_ABS:
            r = np.abs(a)
        elif op == isa.OP_NEG:
            r = np.negative(a)
        elif op == isa.OP_SQRT:
            r = np.sqrt(a, dtype=dt) if approx else fp.sqrt(a, dt, mode)
        elif op == isa.OP_RCP:
            r = np.divide(dt.type(1), a, dtype=dt) if approx else fp.div(dt.type(1), a, dt, mode)
        elif op == isa.OP_RSQRT:
            r = (1.0 / np.sqrt(np.asarray(a, f64))).astype(dt)
        elif op == isa.OP_EX2:
            r = np.exp2(np.asarray(a, f64)).astype(dt)
        elif op == isa.OP_LG2:
            r = np.log2(np.asarray(a, f64)).astype(dt)
        elif op == isa.OP_SIN:
            r = np.sin(np.asarray(a, f64)).astype(dt)
        elif op == isa.OP_COS:
            r = np.cos(np.asarray(a, f64)).astype(dt)
        elif op == isa.OP_TANH:
            r = np.tanh(np.asarray(a, f64)).astype(dt)
        else:
            raise Unsupported(op)
        return _post(mod, t, np.asarray(r, dt))
    return impl


def _float_fma(t, mod):
    dt = _to_compute(t)
    mode = fp.rounding(mod & isa.MOD_ROUND_MASK)

    def impl(a, b, c):
        a, b, c = _flush_in(mod, t, a, b, c)
        return _post(mod, t, np.asarray(fp.fma(a, b, c, dt, mode), dt))
    return impl


# ------------------------------------------------------------------ integers
def _sat32(x):
    return np.clip(x, -(1 << 31), (1 << 31) - 1).astype(I32)


def _mulhi_u64(a, b):
    a = np.asarray(a, U64)
    b = np.asarray(b, U64)
    m = U64(0xFFFFFFFF)
    s = U64(32)
    al, ah, bl, bh = a & m, a >> s, b & m, b >> s
    ll = al * bl
    lh = al * bh
    hl = ah * bl
    hh = ah * bh
    mid = (ll >> s) + (lh & m) + (hl & m)
    return hh + (lh >> s) + (hl >> s) + (mid >> s)


def _mulhi_s64(a, b):
    a = np.asarray(a, I64)
    b = np.asarray(b, I64)
    au, bu = a.astype(U64), b.astype(U64)
    hi = _mulhi_u64(au, bu)
    hi = hi - np.where(a < 0, bu, U64(0)) - np.where(b < 0, au, U64(0))
    return np.asarray(hi, U64).view(I64)


def _mul(t, var):
    """-> fn(a, b) for mul with variant var (the product's low/high half or the wide one)."""
    dt = _dt(t)
    bits = _bits(t)
    signed = V.is_signed(t)
    if var in (0, isa.VAR_LO):
        return lambda a, b: np.multiply(a, b, dtype=dt)
    if var == isa.VAR_WIDE:
        wd = _dt(_wide(t))
        return lambda a, b: np.multiply(np.asarray(a, wd), np.asarray(b, wd), dtype=wd)
    # VAR_HI
    if bits == 64:
        return _mulhi_s64 if signed else lambda a, b: _mulhi_u64(a, b)
    big = np.dtype(np.int64) if signed else np.dtype(np.uint64)

    def hi(a, b):
        p = np.multiply(np.asarray(a, big), np.asarray(b, big), dtype=big)
        return (p >> big.type(bits)).astype(dt)
    return hi


def _div(t):
    """Division toward zero; by zero: all ones (unsigned) or -1 (signed), ISA-OP-2."""
    dt = _dt(t)
    bits = _bits(t)
    ut = np.dtype(f"uint{bits}")
    signed = V.is_signed(t)

    def div(a, b):
        a, b = np.asarray(a, dt), np.asarray(b, dt)
        z = b == 0
        if signed:
            ua = np.where(a < 0, ut.type(0) - a.astype(ut), a.astype(ut))
            ub = np.where(b < 0, ut.type(0) - b.astype(ut), b.astype(ut))
        else:
            ua, ub = a, b
        q = np.floor_divide(ua, np.where(z, ut.type(1), ub))
        if signed:
            q = np.where((a < 0) != (b < 0), ut.type(0) - q, q)
        q = np.where(z, ut.type((1 << bits) - 1), q)
        return np.asarray(q, ut).view(dt)
    return div


def _rem(t):
    dt = _dt(t)
    d = _div(t)

    def rem(a, b):
        a, b = np.asarray(a, dt), np.asarray(b, dt)
        q = d(a, np.where(b == 0, dt.type(1), b))
        r = (a - np.multiply(q, b, dtype=dt)).astype(dt)
        return np.where(b == 0, a, r).astype(dt)
    return rem


def _shift(op, t):
    dt = _dt(t)
    bits = _bits(t)
    signed = V.is_signed(t)

    def shift(a, b):
        a = np.asarray(a, dt)
        n = np.asarray(b, U32)
        big = n >= bits
        s = np.where(big, 0, n).astype(dt)
        if op == isa.OP_SHL:
            return np.where(big, dt.type(0), np.left_shift(a, s)).astype(dt)
        r = np.right_shift(a, s)
        if signed:
            fill = np.where(a < 0, dt.type(-1), dt.type(0))
        else:
            fill = dt.type(0)
        return np.where(big, fill, r).astype(dt)
    return shift


def popc(a, bits):
    a = np.asarray(a).astype(U64 if bits == 64 else U32)
    return np.bitwise_count(a).astype(U32)


def clz(a, bits):
    mask = U64((1 << bits) - 1)
    x = np.asarray(a).astype(U64) & mask
    zero = x == 0
    n = np.zeros(x.shape, dtype=U32)
    for s in (32, 16, 8, 4, 2, 1):
        if s >= bits:
            continue
        top = (x >> U64(bits - s)) == 0
        n = np.where(top, n + U32(s), n)
        x = np.where(top, x << U64(s), x) & mask
    return np.where(zero, U32(bits), n).astype(U32)


def brev(a, bits):
    a = np.asarray(a, U64 if bits == 64 else U32)
    dt = a.dtype.type
    x = a
    masks64 = (0x5555555555555555, 0x3333333333333333, 0x0F0F0F0F0F0F0F0F, 0x00FF00FF00FF00FF,
               0x0000FFFF0000FFFF, 0x00000000FFFFFFFF)
    for i, s in enumerate((1, 2, 4, 8, 16, 32)):
        if s >= bits:
            break
        m = dt(masks64[i] & ((1 << bits) - 1))
        x = ((x >> dt(s)) & m) | ((x & m) << dt(s))
    return x


def bfe(a, b, c, t):
    bits = _bits(t)
    dt = _dt(t)
    ut = U64
    msb = bits - 1
    a = np.asarray(a, dt).astype(ut) & ut((1 << bits) - 1)
    pos = np.asarray(b, U32).astype(np.int64) & 0xFF
    ln = np.asarray(c, U32).astype(np.int64) & 0xFF
    eff = np.clip(np.minimum(ln, msb + 1 - pos), 0, None)  # bits taken from a
    shifted = np.where(pos > msb, ut(0), a >> np.minimum(pos, 63).astype(ut))
    low = np.where(eff >= 64, ut(0xFFFF_FFFF_FFFF_FFFF),
                   (ut(1) << np.minimum(eff, 63).astype(ut)) - ut(1))
    field = shifted & low
    if V.is_signed(t):
        sbit_pos = np.minimum(pos + ln - 1, msb)
        sbit = np.where(ln == 0, ut(0), (a >> np.clip(sbit_pos, 0, 63).astype(ut)) & ut(1))
        fill = ~low & ut((1 << bits) - 1)
        field = np.where(sbit == 1, field | fill, field)
    return (field & ut((1 << bits) - 1)).astype(np.dtype(f"uint{bits}")).view(dt)


def bfi(a, b, c, d2, t):
    bits = _bits(t)
    ut = np.dtype(f"uint{bits}")
    a = np.asarray(a).astype(U64)
    b = np.asarray(b).astype(U64)
    pos = np.asarray(c, U32).astype(np.int64) & 0xFF
    ln = np.asarray(d2, U32).astype(np.int64) & 0xFF
    eff = np.clip(np.minimum(ln, bits - pos), 0, None)
    low = np.where(eff >= 64, U64(0xFFFF_FFFF_FFFF_FFFF),
                   (U64(1) << np.minimum(eff, 63).astype(U64)) - U64(1))
    sh = np.minimum(pos, 63).astype(U64)
    m = np.where(pos >= bits, U64(0), low << sh)
    r = (b & ~m) | ((a << sh) & m)
    return (r & U64((1 << bits) - 1)).astype(ut)


def prmt(a, b, c, mode):
    a = np.asarray(a, U32).astype(U64)
    b = np.asarray(b, U32).astype(U64)
    c = np.asarray(c, U32)
    src = a | (b << U64(32))  # bytes 0-3 from a, 4-7 from b
    out = np.zeros(np.broadcast(a, b, c).shape, dtype=U64)

    def byte(k):
        return (src >> (U64(8) * np.asarray(k, U64))) & U64(0xFF)

    if mode == 0:
        for i in range(4):
            n = (c >> U32(4 * i)) & U32(0xF)
            v = byte(n & U32(7))
            v = np.where((n & U32(8)) != 0, np.where(v & U64(0x80), U64(0xFF), U64(0)), v)
            out |= v << U64(8 * i)
        return out.astype(U32)
    sel = (c & U32(3)).astype(np.int64)
    for i in range(4):
        if mode == isa.VAR_PRMT_F4E:
            k = sel + i
        elif mode == isa.VAR_PRMT_B4E:
            k = (sel - i) & 7
        elif mode == isa.VAR_PRMT_RC8:
            k = sel
        elif mode == isa.VAR_PRMT_ECL:
            k = np.maximum(i, sel)
        elif mode == isa.VAR_PRMT_ECR:
            k = np.minimum(i, sel)
        else:  # RC16
            k = (sel & 1) * 2 + (i & 1)
        out |= byte(k) << U64(8 * i)
    return out.astype(U32)


def bfind(a, t, shiftamt):
    bits = _bits(t)
    ut = np.dtype(f"uint{bits}")
    a = np.asarray(a, _dt(t))
    u = a.view(ut)
    if V.is_signed(t):
        u = np.where(a < 0, ~u, u).astype(ut)
    n = clz(u, bits).astype(np.int64)
    d = np.where(n == bits, 0xFFFFFFFF, bits - 1 - n)
    if shiftamt:
        d = np.where(d == 0xFFFFFFFF, d, bits - 1 - d)
    return d.astype(U32)


# ------------------------------------------------------------------ comparisons
def compare(cmp, t, a, b, ftz=False):
    if t == TYPE_BF16:
        a, b, t = bf16_to_f32(a), bf16_to_f32(b), TYPE_F32
    if ftz and t == TYPE_F32:
        a, b = fp.ftz(a), fp.ftz(b)
    if _is_float(t):
        nan = np.isnan(a) | np.isnan(b)
        base = {isa.CMP_EQ: np.equal, isa.CMP_NE: np.not_equal, isa.CMP_LT: np.less,
                isa.CMP_LE: np.less_equal, isa.CMP_GT: np.greater,
                isa.CMP_GE: np.greater_equal}
        if cmp in base:
            r = base[cmp](a, b) & ~nan
        elif isa.CMP_EQU <= cmp <= isa.CMP_GEU:
            r = base[cmp - isa.CMP_EQU + isa.CMP_EQ](a, b) | nan
        elif cmp == isa.CMP_NUM:
            r = ~nan
        else:
            r = nan
        return np.asarray(r)
    if cmp in (isa.CMP_LO, isa.CMP_LS, isa.CMP_HI, isa.CMP_HS) or t in isa.BIT_TYPES:
        ut = np.dtype(f"uint{_bits(t)}")
        a, b = np.asarray(a).astype(ut), np.asarray(b).astype(ut)
        cmp = {isa.CMP_LO: isa.CMP_LT, isa.CMP_LS: isa.CMP_LE, isa.CMP_HI: isa.CMP_GT,
               isa.CMP_HS: isa.CMP_GE}.get(cmp, cmp)
    fn = {isa.CMP_EQ: np.equal, isa.CMP_NE: np.not_equal, isa.CMP_LT: np.less,
          isa.CMP_LE: np.less_equal, isa.CMP_GT: np.greater, isa.CMP_GE: np.greater_equal}
    return np.asarray(fn[cmp](a, b))


def combine(r, boolop, c):
    if boolop == isa.BOOL_AND:
        return r & c
    if boolop == isa.BOOL_OR:
        return r | c
    if boolop == isa.BOOL_XOR:
        return r ^ c
    return r


def testp(var, a):
    a = np.asarray(a)
    info = np.finfo(a.dtype)
    if var == isa.VAR_TESTP_FINITE:
        return np.isfinite(a)
    if var == isa.VAR_TESTP_INFINITE:
        return np.isinf(a)
    if var == isa.VAR_TESTP_NUMBER:
        return ~np.isnan(a)
    if var == isa.VAR_TESTP_NOTANUMBER:
        return np.isnan(a)
    mag = np.abs(a)
    if var == isa.VAR_TESTP_NORMAL:
        return np.isfinite(a) & (mag >= info.tiny)
    return (mag < info.tiny) & (mag != 0)


# ------------------------------------------------------------------ conversions
def _int_range(t):
    bits = _bits(t)
    if V.is_signed(t):
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def to_float64_exact(a, t):
    """Values of any non-pred type -> float64 (exact for every float and for integers of
    at most 53 bits; larger integers are handled by cvt_int_to_float)."""
    if t == TYPE_BF16:
        return bf16_to_f32(a).astype(np.float64)
    return np.asarray(a).astype(np.float64)


def cvt(a, dst, src, mod):
    """cvt: a (typed as src) -> typed dst (ISA-OP-1)."""
    rnd = mod & isa.MOD_ROUND_MASK
    sat = mod & isa.MOD_SAT
    a = np.asarray(a)
    if _is_float(src):
        if mod & isa.MOD_FTZ and src == TYPE_F32:
            a = fp.ftz(a)
        x = to_float64_exact(a, src)
        if not _is_float(dst):
            return _float_to_int(x, dst, rnd or isa.RND_RZI)
        if rnd in (isa.RND_RNI, isa.RND_RZI, isa.RND_RMI, isa.RND_RPI):
            x = _round_integral(x, rnd)
            mode = fp.RN
        else:
            mode = fp.rounding(rnd)
        r = _pair_to(x, np.zeros_like(x), dst, mode)
    elif _is_float(dst):
        r = _int_to_float(a, src, dst, fp.rounding(rnd))
    else:
        return _int_to_int(a, src, dst, sat)
    if dst == TYPE_BF16:
        return f32_to_bf16(fp.saturate(bf16_to_f32(r))) if sat else r
    if mod & isa.MOD_FTZ and dst == TYPE_F32:
        r = fp.ftz(r)
    return fp.saturate(r) if sat else r


def _round_integral(x, rnd):
    if rnd == isa.RND_RNI:
        return np.rint(x)
    if rnd == isa.RND_RZI:
        return np.trunc(x)
    if rnd == isa.RND_RMI:
        return np.floor(x)
    return np.ceil(x)


def _round_odd32(x32, d):
    """f32 values moved to their odd neighbour toward the exact value where it differs
    (d: the sign of exact - x32) and x32 is even."""
    even = (np.asarray(x32).view(U32) & U32(1)) == 0
    fix = (d != 0) & even & np.isfinite(x32)
    if not np.any(fix):
        return x32
    return np.where(fix, np.nextafter(x32, np.where(d > 0, F32(np.inf), F32(-np.inf))), x32)


def _pair_to(hi, lo, dst, mode):
    """x = hi + lo (f64, exact, hi = RN64(x)) -> float dst rounded with mode."""
    if dst != TYPE_BF16:
        return fp.round_pair(hi, lo, _to_compute(dst), mode)
    if mode != fp.RN:  # directed roundings compose: to f32, then to bf16
        return f32_to_bf16(fp.round_pair(hi, lo, np.dtype(F32), mode), mode)
    x32 = fp.round_odd(hi, lo).astype(F32)  # RN to f32; then to odd, exactly:
    with np.errstate(all="ignore"):
        d = (hi - x32.astype(np.float64)) + lo
    d = np.where(np.isnan(d), 0.0, d)
    return f32_to_bf16(_round_odd32(x32, np.sign(d)), fp.RN)


def _float_to_int(x, dst, rnd):
    """Float values (f64) -> integer dst: rounded by rnd, saturated, NaN -> 0."""
    lo, hi = _int_range(dst)
    r = _round_integral(x, rnd)
    r = np.where(np.isnan(r), 0.0, r)
    big = r >= float(hi)  # float(hi) rounds up to a power of two for 64-bit types
    small = r <= float(lo)
    mid = ~big & ~small
    conv = np.where(mid, r, 0.0).astype(U64 if dst == TYPE_U64 else np.int64)
    dt = _dt(dst)
    res = np.where(big, dt.type(hi), np.where(small, dt.type(lo), conv.astype(dt)))
    return np.asarray(res).astype(dt)


def _int_to_float(a, src, dst, mode):
    """Integer values -> float dst rounded with mode, exactly."""
    a = np.asarray(a)
    if _bits(src) <= 32:
        x = a.astype(np.float64)  # exact
        return _pair_to(x, np.zeros_like(x), dst, mode)
    # 64-bit: hi = RN64(a), and a - hi exactly (|a - hi| <= 2**10): the subtraction
    # wraps modulo 2**64, and hi converted back is right modulo 2**64 even at 2**63/2**64
    hi = a.astype(np.float64)
    if V.is_signed(src):
        with np.errstate(all="ignore"):
            back = np.where(hi >= 2.0 ** 63, -(2.0 ** 63), hi).astype(np.int64)
        diff = (a.astype(np.int64).astype(U64) - back.astype(U64)).view(np.int64)
    else:
        back = np.where(hi >= 2.0 ** 64, 0.0, hi).astype(U64)
        diff = np.asarray(a.astype(U64) - back).view(np.int64)
    return _pair_to(hi, np.asarray(diff).astype(np.float64), dst, mode)


def _int_to_int(a, src, dst, sat):
    a = np.asarray(a)
    sdt, ddt = _dt(src), _dt(dst)
    if sat:  # clamp to the values both types hold
        lo, hi = _int_range(dst)
        slo, shi = _int_range(src)
        if lo > slo or hi < shi:
            a = np.clip(a, sdt.type(max(lo, slo)), sdt.type(min(hi, shi)))
    if sdt.itemsize == ddt.itemsize:
        return np.asarray(a.astype(sdt)).view(ddt)
    if sdt.itemsize > ddt.itemsize:  # truncate
        return np.asarray(a.astype(np.dtype(f"uint{8 * ddt.itemsize}"))).view(ddt)
    return a.astype(ddt)  # extend by the source's signedness


# ------------------------------------------------------------------ affine forms
def _lin_binary(op, t):
    bits = _bits(t)
    if op == isa.OP_ADD:
        return lambda geo, a, b: V.lin_add(a, b, bits)
    if op == isa.OP_SUB:
        return lambda geo, a, b: V.lin_sub(a, b, bits)
    if op == isa.OP_MUL:
        def mul(geo, a, b):
            if isinstance(a, V.Lin) and isinstance(b, V.Lin):
                return None
            if isinstance(a, V.Lin):
                return V.lin_mul(a, b, bits)
            if isinstance(b, V.Lin):
                return V.lin_mul(b, a, bits)
            return (a * b) & V.mask_of(bits)
        return mul
    if op == isa.OP_SHL:
        def shl(geo, a, b):
            if isinstance(b, V.Lin):
                return None
            b &= V.M32
            return 0 if b >= bits else V.lin_mul(a, 1 << b, bits)
        return shl
    return None


def _lin_wide_mul(t):
    src_bits = _bits(t)
    dst_bits = 2 * src_bits
    signed = V.is_signed(t)

    def wide(geo, a, b):
        if isinstance(a, V.Lin) and isinstance(b, V.Lin):
            return None
        if isinstance(b, V.Lin):
            a, b = b, a
        wa = V.lin_widen(geo, a, signed, src_bits, dst_bits)
        if wa is None:
            return None
        s = V.to_signed(b, src_bits) if signed else b & V.mask_of(src_bits)
        return V.lin_mul(wa, s, dst_bits)
    return wide


def _lin_cvt(dst, src):
    sb, db = _bits(src), _bits(dst)

    def conv(geo, a):
        if db == sb:
            return a
        if db < sb:
            return V.lin_narrow(a, db)
        return V.lin_widen(geo, a, V.is_signed(src), sb, db)
    return conv


# ------------------------------------------------------------------ the table
def make(op, t, t2, mod) -> Alu:
    """The Alu of one instruction signature (ops with a single result; see decode.py for
    setp, selp, bfi and the others it builds itself)."""
    var = isa.mod_field(mod, isa.MOD_VARIANT_MASK)
    is_float = _is_float(t)
    if op in (isa.OP_ADD, isa.OP_SUB, isa.OP_MUL, isa.OP_DIV, isa.OP_MIN, isa.OP_MAX,
              isa.OP_COPYSIGN, isa.OP_REM):
        if is_float:
            return Alu(_float_binary(op, t, mod), (t, t), t)
        dt = _dt(t)
        sat = bool(mod & isa.MOD_SAT)
        lin = _lin_binary(op, t) if _lin_ok(t) and not sat and var in (0, isa.VAR_LO) else None
        if op in (isa.OP_ADD, isa.OP_SUB):
            if sat:
                f = np.add if op == isa.OP_ADD else np.subtract
                return Alu(lambda a, b: _sat32(f(np.asarray(a, I64), np.asarray(b, I64))),
                           (t, t), t)
            f = np.add if op == isa.OP_ADD else np.subtract
            return Alu(lambda a, b: f(a, b, dtype=dt), (t, t), t, lin)
        if op == isa.OP_MUL:
            if var == isa.VAR_WIDE:
                return Alu(_mul(t, var), (t, t), _wide(t),
                           _lin_wide_mul(t) if _bits(t) == 32 else None)
            return Alu(_mul(t, var), (t, t), t, lin)
        if op == isa.OP_DIV:
            return Alu(_div(t), (t, t), t)
        if op == isa.OP_REM:
            return Alu(_rem(t), (t, t), t)
        if op == isa.OP_MIN:
            return Alu(lambda a, b: np.minimum(a, b, dtype=dt), (t, t), t)
        if op == isa.OP_MAX:
            return Alu(lambda a, b: np.maximum(a, b, dtype=dt), (t, t), t)
    if op == isa.OP_MAD:
        if is_float:
            return Alu(_float_fma(t, mod), (t, t, t), t)
        wide = var == isa.VAR_WIDE
        ct = _wide(t) if wide else t
        cdt = _dt(ct)
        m = _mul(t, var)
        sat = bool(mod & isa.MOD_SAT)
        if sat:  # s32 mad.hi.sat
            return Alu(lambda a, b, c: _sat32(np.asarray(m(a, b), I64) + np.asarray(c, I64)),
                       (t, t, ct), ct)
        lin = None
        if _lin_ok(t) and var in (0, isa.VAR_LO):
            mul = _lin_binary(isa.OP_MUL, t)
            bits = _bits(t)

            def lin(geo, a, b, c):
                p = mul(geo, a, b)
                return None if p is None else V.lin_add(p, c, bits)
        elif wide and _bits(t) == 32:
            wm = _lin_wide_mul(t)

            def lin(geo, a, b, c):
                p = wm(geo, a, b)
                return None if p is None else V.lin_add(p, c, 64)
        return Alu(lambda a, b, c: np.add(m(a, b), c, dtype=cdt), (t, t, ct), ct, lin)
    if op == isa.OP_FMA:
        return Alu(_float_fma(t, mod), (t, t, t), t)
    if op in (isa.OP_ABS, isa.OP_NEG):
        if is_float:
            return Alu(_float_unary(op, t, mod), (t,), t)
        dt = _dt(t)
        if op == isa.OP_NEG:
            lin = (lambda geo, a: V.lin_sub(0, a, _bits(t))) if _lin_ok(t) else None
            return Alu(lambda a: np.negative(a, dtype=dt), (t,), t, lin)
        return Alu(lambda a: np.where(a < 0, np.negative(a, dtype=dt), a).astype(dt), (t,), t)
    if op in (isa.OP_SQRT, isa.OP_RSQRT, isa.OP_RCP, isa.OP_EX2, isa.OP_LG2, isa.OP_SIN,
              isa.OP_COS, isa.OP_TANH):
        return Alu(_float_unary(op, t, mod), (t,), t)
    if op in (isa.OP_AND, isa.OP_OR, isa.OP_XOR):
        f = {isa.OP_AND: np.bitwise_and, isa.OP_OR: np.bitwise_or,
             isa.OP_XOR: np.bitwise_xor}[op]
        if t == TYPE_PRED:
            f = {isa.OP_AND: np.logical_and, isa.OP_OR: np.logical_or,
                 isa.OP_XOR: np.logical_xor}[op]
        return Alu(lambda a, b: f(a, b), (t, t), t)
    if op == isa.OP_NOT:
        if t == TYPE_PRED:
            return Alu(np.logical_not, (t,), t)
        return Alu(np.invert, (t,), t)
    if op in (isa.OP_SHL, isa.OP_SHR):
        lin = _lin_binary(op, t) if op == isa.OP_SHL and _lin_ok(t) else None
        return Alu(_shift(op, t), (t, isa.TYPE_U32), t, lin)
    if op == isa.OP_POPC:
        return Alu(lambda a: popc(a, _bits(t)), (t,), TYPE_U32)
    if op == isa.OP_CLZ:
        return Alu(lambda a: clz(a, _bits(t)), (t,), TYPE_U32)
    if op == isa.OP_BREV:
        return Alu(lambda a: brev(a, _bits(t)), (t,), t)
    if op == isa.OP_BFE:
        return Alu(lambda a, b, c: bfe(a, b, c, t), (t, TYPE_U32, TYPE_U32), t)
    if op == isa.OP_PRMT:
        return Alu(lambda a, b, c: prmt(a, b, c, var), (t, t, TYPE_U32), t)
    if op == isa.OP_BFIND:
        return Alu(lambda a: bfind(a, t, var == isa.VAR_BFIND_SHIFTAMT), (t,), TYPE_U32)
    if op == isa.OP_CVT:
        lin = _lin_cvt(t, t2) if (_lin_ok(t) and _lin_ok(t2) and not mod & isa.MOD_SAT) else None
        return Alu(lambda a: cvt(a, t, t2, mod), (t2,), t, lin)
    if op == isa.OP_SLCT:
        ftz = bool(mod & isa.MOD_FTZ)

        def slct(a, b, c):
            if t2 == TYPE_F32 and ftz:
                c = fp.ftz(c)
            return np.where(c >= 0, a, b)
        return Alu(slct, (t, t, t2), t)
    if op == isa.OP_TESTP:
        return Alu(lambda a: testp(var, a), (t,), TYPE_PRED)
    if op == isa.OP_COPYSIGN:
        return Alu(_float_binary(op, t, mod), (t, t), t)
    raise Unsupported(f"opcode {op:#x}")

