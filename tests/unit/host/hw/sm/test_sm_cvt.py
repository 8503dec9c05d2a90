"""cvt against exact references (ISA-OP-1): integer to integer (truncation, extension by
the source's signedness, .sat), float to integer (rni/rzi/rmi/rpi, saturation, NaN -> 0),
integer to float (rn/rz/rm/rp, 64-bit sources), float to float (f64/f32/f16/bf16 with
the four modes, integral rounding, .ftz, .sat); cvta to and from generic addresses."""

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from smtest import DTYPES, Env, elementwise
from test_sm_float import ref_round

from pvgpu.spec import isa

INTS = ["u8", "s8", "u16", "s16", "u32", "s32", "u64", "s64"]
SETTINGS = settings(max_examples=15, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


@pytest.fixture(scope="module")
def env():
    return Env(256 << 20)


def rng_of(t):
    bits = isa.TYPE_BITS[isa.TYPES_BY_NAME[t]]
    if t.startswith("s"):
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def wrap(v, t):
    lo, hi = rng_of(t)
    bits = isa.TYPE_BITS[isa.TYPES_BY_NAME[t]]
    v &= (1 << bits) - 1
    return v - (1 << bits) if lo < 0 and v > hi else v


@SETTINGS
@given(st.data())
def test_int_to_int(env, data):
    src = data.draw(st.sampled_from(INTS))
    dst = data.draw(st.sampled_from(INTS))
    lo, hi = rng_of(src)
    a = data.draw(st.lists(st.integers(lo, hi) | st.sampled_from([lo, hi, 0, -1 if lo else 1]),
                           min_size=1, max_size=60))
    a = [wrap(x, src) for x in a]
    d, d2 = elementwise(env, f"cvt.{dst}.{src} {{d}}, {{a}}\ncvt.sat.{dst}.{src} {{d2}}, {{a}}",
                        [(src, np.array(a, dtype=object).astype(DTYPES[src]))], [dst, dst], len(a))
    dlo, dhi = rng_of(dst)
    assert [int(v) for v in d] == [wrap(x, dst) for x in a]
    assert [int(v) for v in d2] == [max(dlo, min(dhi, x)) for x in a]


def round_int(x: Fraction, mode: str) -> int:
    fl = math.floor(x)
    if mode == "rzi":
        return math.trunc(x)
    if mode == "rmi":
        return fl
    if mode == "rpi":
        return math.ceil(x)
    rem = x - fl
    return fl + (1 if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and fl % 2) else 0)


def float_cases(t):
    dt = {"f16": np.float16, "f32": np.float32, "f64": np.float64}[t]
    vals = [0.0, -0.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 1e-30, -7.75, 255.5, 256.0,
            -128.5, 65535.7, 70000.0, 2.0 ** 31, -(2.0 ** 31), 2.0 ** 31 - 64, 4e9, 2.0 ** 63,
            -(2.0 ** 63), 1.8e19, 2.0 ** 64, 3e38, np.inf, -np.inf, np.nan, 123456.789]
    with np.errstate(over="ignore"):
        return np.array(vals, np.float64).astype(dt)


@pytest.mark.parametrize("src", ["f16", "f32", "f64"])
@pytest.mark.parametrize("mode", ["rni", "rzi", "rmi", "rpi"])
def test_float_to_int(env, src, mode):
    a = float_cases(src)
    body = "\n".join(f"cvt.{mode}.{dst}.{src} {{{r}}}, {{a}}"
                     for dst, r in zip(["s8", "u16", "s32"], ["d", "d2", "f"]))
    outs = elementwise(env, body, [(src, a)], ["s8", "u16", "s32"], len(a))
    outs += elementwise(env, f"cvt.{mode}.u64.{src} {{d}}, {{a}}\ncvt.{mode}.s64.{src} {{d2}}, {{a}}",
                        [(src, a)], ["u64", "s64"], len(a))
    for got, dst in zip(outs, ["s8", "u16", "s32", "u64", "s64"]):
        lo, hi = rng_of(dst)
        want = []
        for x in a:
            x = float(x)
            if math.isnan(x):
                want.append(0)
            elif math.isinf(x):
                want.append(hi if x > 0 else lo)
            else:
                want.append(max(lo, min(hi, round_int(Fraction(x), mode))))
        assert [int(v) for v in got] == want, dst


def test_default_float_to_int_truncates(env):
    a = np.array([1.7, -1.7, 2.5], np.float32)
    (d,) = elementwise(env, "cvt.s32.f32 {d}, {a}", [("f32", a)], ["s32"], 3)
    assert list(d) == [1, -1, 2]


@pytest.mark.parametrize("src", ["s32", "u32", "s64", "u64"])
@pytest.mark.parametrize("mode", ["rn", "rz", "rm", "rp"])
def test_int_to_float(env, src, mode):
    lo, hi = rng_of(src)
    vals = [0, 1, -1, lo, hi, hi - 1, 16777217, -16777217, (1 << 24) + 3, (1 << 53) + 1,
            (1 << 53) + 3, (1 << 62) + 12345, -(1 << 62) - 777, (1 << 63) - 1, 0x7FFF_FFFF,
            0x1_0000_0001, (1 << 64) - 1 - (1 << 11), 65519, 65520, 65504, 123456789]
    a = [v for v in vals if lo <= v <= hi]
    arr = np.array(a, dtype=object).astype(DTYPES[src])
    outs = elementwise(env, f"cvt.{mode}.f32.{src} {{d}}, {{a}}\ncvt.{mode}.f64.{src} {{d2}}, {{a}}\n"
                       f"cvt.{mode}.f16.{src} {{f}}, {{a}}", [(src, arr)], ["f32", "f64", "f16"],
                       len(a))
    for got, t in zip(outs, ["f32", "f64", "f16"]):
        want = [ref_round(Fraction(x), t, mode) for x in a]
        assert [float(v) for v in got] == want, t


@pytest.mark.parametrize("mode", ["rn", "rz", "rm", "rp"])
def test_float_to_float(env, mode):
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(60) * np.exp2(rng.integers(-140, 130, 60)),
                        [1e-40, -1e-45, 3.4e38, 3.5e38, -3.5e38, 65519.0, 65520.0, 1e-8, 0.1,
                         1.0 + 2.0 ** -24, 1.0 + 2.0 ** -9 + 2.0 ** -30]
                        + [s * (1 + k * 2.0 ** -e) for e in (8, 11, 24) for k in (1, 3)
                           for s in (1, -1)]])  # ties of bf16, f16, f32
    d, d2, f = elementwise(env, f"cvt.{mode}.f32.f64 {{d}}, {{a}}\ncvt.{mode}.f16.f64 {{d2}}, {{a}}\n"
                           f"cvt.{mode}.bf16.f64 {{f}}, {{a}}", [("f64", x)],
                           ["f32", "f16", "bf16"], len(x))
    bf = (d_bits := f.astype(np.uint32) << 16).view(np.float32)
    assert d_bits.dtype == np.uint32
    for got, t in ((d, "f32"), (d2, "f16"), (bf, "bf16")):
        want = [ref_round(Fraction(float(v)), t, mode) for v in x]
        assert [float(v) for v in got] == want, t


def test_float_to_float_special_and_widening(env):
    x = np.array([np.nan, np.inf, -np.inf, -0.0, 1.5, 1e-40, 3.0e38], np.float32)
    d, d2, f = elementwise(env, "cvt.f64.f32 {d}, {a}\ncvt.f16.f32 {d2}, {a}\ncvt.bf16.f32 {f}, {a}",
                           [("f32", x)], ["f64", "f16", "bf16"], len(x))
    np.testing.assert_array_equal(d, x.astype(np.float64))
    assert np.isnan(d2[0]) and d2[1] == np.inf and d2[2] == -np.inf and np.signbit(d2[3])
    bf = (f.astype(np.uint32) << 16).view(np.float32)
    assert np.isnan(bf[0]) and bf[1] == np.inf and bf[4] == 1.5 and np.signbit(bf[3])
    back, _ = elementwise(env, "cvt.f32.bf16 {d}, {a}\ncvt.f32.f16 {d2}, {b}",
                          [("bf16", f), ("f16", d2)], ["f32", "f32"], len(x))
    assert back[4] == 1.5 and back[1] == np.inf


def test_integral_rounding_ftz_and_sat(env):
    x = np.array([1.5, 2.5, -1.5, -0.4, 1e-40, 7.0, np.nan, -3.0], np.float32)
    outs = elementwise(env, "cvt.rni.f32.f32 {d}, {a}\ncvt.rmi.f32.f32 {d2}, {a}\n"
                       "cvt.ftz.sat.f32.f32 {f}, {a}", [("f32", x)], ["f32"] * 3, len(x))
    assert list(outs[0][:6]) == [2.0, 2.0, -2.0, -0.0, 0.0, 7.0]
    assert list(outs[1][:6]) == [1.0, 2.0, -2.0, -1.0, 0.0, 7.0]
    assert list(outs[2]) == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    (sat,) = elementwise(env, "cvt.rn.sat.f32.s32 {d}, {a}", [("s32", np.array([-5, 0, 1, 9], np.int32))],
                         ["f32"], 4)
    assert list(sat) == [0.0, 0.0, 1.0, 1.0]


def test_cvta(env):
    a = np.array([0, 16, 1 << 20], np.uint64)
    d, d2, f = elementwise(env, "cvta.shared.u64 {d}, {a}\ncvta.to.shared.u64 {d2}, {d}\n"
                           "cvta.local.u64 {f}, {a}", [("u64", a)], ["u64"] * 3, len(a))
    assert list(d) == [isa.GENERIC_SHARED_BASE + int(v) for v in a]
    assert list(d2) == list(a)
    assert list(f) == [isa.GENERIC_LOCAL_BASE + int(v) for v in a]
