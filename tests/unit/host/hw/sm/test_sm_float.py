"""Float instructions against exact rational references (ISA-MOD-2, ISA-OP-3): add, sub,
mul, fma, div, sqrt, rcp in the four rounding modes for f32, f64 and f16, subnormals with and
without .ftz, .sat, min/max with NaN, abs/neg/copysign, testp, and the approximate
functions within tolerances."""

import math
from fractions import Fraction

import numpy as np
import pytest
from smtest import Env, elementwise

FMT = {"f16": (11, -14, 15, np.float16), "bf16": (8, -126, 127, None),
       "f32": (24, -126, 127, np.float32), "f64": (53, -1022, 1023, np.float64)}
MODES = ["rn", "rz", "rm", "rp"]


@pytest.fixture(scope="module")
def env():
    return Env(256 << 20)


def ref_round(x: Fraction, t: str, mode: str) -> float:
    """The exact rational x rounded to format t: an independent model of IEEE rounding."""
    p, emin, emax, _ = FMT[t]
    if x == 0:
        return 0.0
    sign = -1 if x < 0 else 1
    a = abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    e = max(e, emin)
    q = Fraction(2) ** (e - p + 1)
    n = a / q
    lo = n.numerator // n.denominator
    rem = n - lo
    up = {"rn": rem > Fraction(1, 2) or (rem == Fraction(1, 2) and lo % 2 == 1),
          "rz": False, "rm": sign < 0 and rem > 0, "rp": sign > 0 and rem > 0}[mode]
    m = (lo + up) * q
    biggest = (2 - Fraction(2) ** (1 - p)) * Fraction(2) ** emax
    if m > biggest:
        to_inf = {"rn": True, "rz": False, "rm": sign < 0, "rp": sign > 0}[mode]
        return sign * math.inf if to_inf else sign * float(biggest)
    return sign * float(m)


def rand_floats(t, n, seed):
    rng = np.random.default_rng(seed)
    p, emin, emax, dt = FMT[t]
    mant = rng.uniform(1, 2, n) * rng.choice([-1, 1], n)
    exp = rng.integers(emin - 8, emax // 4, n)
    vals = (mant * np.exp2(exp)).astype(dt)
    specials = np.array([0.0, -0.0, 1.0, -1.0, 1.5, 3.0, np.finfo(dt).tiny,
                         np.finfo(dt).tiny / 4, np.finfo(dt).max, 2.0 ** -20, 1e-3], dt)
    return np.concatenate([specials, vals])


def exact(v) -> Fraction:
    return Fraction(float(v))


def check(got, want, t):
    got = [float(x) for x in got]
    for i, (g, w) in enumerate(zip(got, want)):
        if math.isnan(w):
            assert math.isnan(g), (i, g, w)
        else:
            assert g == w and math.copysign(1, g) == math.copysign(1, w) or (g == w == 0), (i, g, w)


@pytest.mark.parametrize("t", ["f32", "f64", "f16"])
@pytest.mark.parametrize("mode", MODES)
def test_add_sub_mul_rounding(env, t, mode):
    a = rand_floats(t, 150, 1)
    b = np.roll(rand_floats(t, 150, 2), 3) * FMT[t][3](0.75)
    body = f"add.{mode}.{t} {{d}}, {{a}}, {{b}}\nsub.{mode}.{t} {{d2}}, {{a}}, {{b}}\nmul.{mode}.{t} {{f}}, {{a}}, {{b}}"
    d, d2, f = elementwise(env, body, [(t, a), (t, b)], [t, t, t], len(a))
    for got, fn in ((d, lambda x, y: x + y), (d2, lambda x, y: x - y), (f, lambda x, y: x * y)):
        want = []
        for x, y in zip(a, b):
            r = fn(exact(x), exact(y))
            w = ref_round(r, t, mode)
            if r == 0:  # exact zero: +0 except for rm (IEEE), or the product's sign
                w = math.copysign(0.0, float(fn(float(x), float(y)))) if fn(1, 1) == 1 else (
                    -0.0 if mode == "rm" else 0.0)
            want.append(w)
        nonzero = [i for i, w in enumerate(want) if w != 0]
        check([got[i] for i in nonzero], [want[i] for i in nonzero], t)


@pytest.mark.parametrize("t", ["f32", "f64"])
@pytest.mark.parametrize("mode", MODES)
def test_fma_div_sqrt_rcp_rounding(env, t, mode):
    n = 120 if t == "f32" or mode == "rn" else 40
    a = rand_floats(t, n, 3)
    b = np.roll(rand_floats(t, n, 4), 5)
    c = np.roll(rand_floats(t, n, 5), 7)
    body = (f"fma.{mode}.{t} {{d}}, {{a}}, {{b}}, {{c}}\ndiv.{mode}.{t} {{d2}}, {{a}}, {{b}}\n"
            f"sqrt.{mode}.{t} {{f}}, {{a}}")
    d, d2, f = elementwise(env, body, [(t, a), (t, b), (t, c)], [t, t, t], len(a))
    for i, (x, y, z) in enumerate(zip(a, b, c)):
        r = exact(x) * exact(y) + exact(z)
        if r != 0:
            check([d[i]], [ref_round(r, t, mode)], t)
        if y != 0 and x != 0:
            check([d2[i]], [ref_round(exact(x) / exact(y), t, mode)], t)
        if x > 0:
            want = _sqrt_ref(exact(x), t, mode)
            check([f[i]], [want], t)
    (r,) = elementwise(env, f"rcp.{mode}.{t} {{d}}, {{a}}", [(t, b)], [t], len(b))
    for i, y in enumerate(b):
        if y != 0:
            check([r[i]], [ref_round(1 / exact(y), t, mode)], t)


def _sqrt_ref(x: Fraction, t, mode) -> float:
    """sqrt(x) rounded: bracket the root between neighbours of the format."""
    p = FMT[t][0]
    # 3p bits of the root are plenty to decide the rounding (the root of a p-bit number
    # is never exactly halfway between two p-bit numbers)
    scale = 4 * p + 10 - (x.numerator.bit_length() - x.denominator.bit_length()) // 2
    n = x * Fraction(4) ** scale
    r = math.isqrt(n.numerator // n.denominator)
    exact_root = Fraction(r * r) == n
    approx = Fraction(2 * r + (0 if exact_root else 1), 2) / Fraction(2) ** scale
    return ref_round(approx, t, mode)


def test_special_values(env):
    inf, nan = np.inf, np.nan
    a = np.array([inf, -inf, nan, 0.0, -0.0, inf, 1.0, -1.0, 0.0], np.float32)
    b = np.array([-inf, -inf, 1.0, -0.0, -0.0, 0.0, 0.0, 0.0, nan], np.float32)
    d, d2, f = elementwise(env, "add.f32 {d}, {a}, {b}\nmul.f32 {d2}, {a}, {b}\ndiv.rn.f32 {f}, {a}, {b}",
                           [("f32", a), ("f32", b)], ["f32"] * 3, len(a))
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(d, a + b)
        np.testing.assert_array_equal(d2, a * b)
        np.testing.assert_array_equal(f, a / b)
    assert np.signbit(d[4]) and not np.signbit(d[3])


def test_ftz_and_sat(env):
    tiny = np.float32(np.finfo(np.float32).tiny)
    a = np.array([tiny / 4, -tiny / 4, tiny, 0.5, 2.0, -3.0, np.nan, 1.0], np.float32)
    b = np.array([tiny / 2, -0.0, 0, 0.25, 0, 0, 0, 0], np.float32)
    d, d2, f = elementwise(env, "add.ftz.f32 {d}, {a}, {b}\nadd.sat.f32 {d2}, {a}, {b}\n"
                           "mul.f32 {f}, {a}, 1.0", [("f32", a), ("f32", b)], ["f32"] * 3, len(a))
    assert d[0] == 0 and d[1] == 0 and np.signbit(d[1]) and d[2] == tiny and d[3] == 0.75
    assert list(d2[3:]) == [0.75, 1.0, 0.0, 0.0, 1.0]
    assert f[0] == tiny / 4  # no .ftz: subnormals survive


def test_min_max_abs_neg_copysign(env):
    a = np.array([1.0, np.nan, -0.0, 3.0, -np.inf, np.nan], np.float32)
    b = np.array([2.0, 5.0, 0.0, np.nan, 1.0, np.nan], np.float32)
    d, d2, f = elementwise(env, "min.f32 {d}, {a}, {b}\nmax.f32 {d2}, {a}, {b}\ncopysign.f32 {f}, {a}, {b}",
                           [("f32", a), ("f32", b)], ["f32"] * 3, len(a))
    assert list(d[:2]) == [1.0, 5.0] and d[3] == 3.0 and d[4] == -np.inf and np.isnan(d[5])
    assert list(d2[:2]) == [2.0, 5.0] and d2[3] == 3.0 and d2[4] == 1.0 and np.isnan(d2[5])
    assert f[0] == 2.0 and f[2] == 0.0 and np.signbit(f[2]) and f[4] == -1.0
    d, d2 = elementwise(env, "abs.f64 {d}, {a}\nneg.f64 {d2}, {a}", [("f64", a.astype(np.float64))],
                        ["f64", "f64"], len(a))
    assert d[2] == 0 and not np.signbit(d[2]) and d[4] == np.inf and np.signbit(d2[0])


def test_testp(env):
    tiny = np.finfo(np.float32).tiny
    a = np.array([1.0, np.inf, -np.inf, np.nan, 0.0, tiny / 2, tiny], np.float32)
    outs = elementwise(env, "testp.finite.f32 {d}, {a}\ntestp.infinite.f32 {d2}, {a}\n"
                       "testp.subnormal.f32 {f}, {a}", [("f32", a)], ["pred"] * 3, len(a))
    assert list(outs[0]) == [1, 0, 0, 0, 1, 1, 1]
    assert list(outs[1]) == [0, 1, 1, 0, 0, 0, 0]
    assert list(outs[2]) == [0, 0, 0, 0, 0, 1, 0]
    outs = elementwise(env, "testp.normal.f32 {d}, {a}\ntestp.notanumber.f32 {d2}, {a}\n"
                       "testp.number.f32 {f}, {a}", [("f32", a)], ["pred"] * 3, len(a))
    assert list(outs[0]) == [1, 0, 0, 0, 0, 0, 1]  # infinities are not normal
    assert list(outs[1]) == [0, 0, 0, 1, 0, 0, 0] and list(outs[2]) == [1, 1, 1, 0, 1, 1, 1]


@pytest.mark.parametrize("op,fn,tol", [
    ("ex2.approx.f32", np.exp2, 2e-7), ("lg2.approx.f32", np.log2, 2e-7),
    ("sin.approx.f32", np.sin, 1e-6), ("cos.approx.f32", np.cos, 1e-6),
    ("tanh.approx.f32", np.tanh, 1e-6), ("rsqrt.approx.f32", lambda x: 1 / np.sqrt(x), 2e-7),
    ("rcp.approx.f32", lambda x: 1 / x, 2e-7), ("sqrt.approx.f32", np.sqrt, 2e-7)])
def test_approximate_functions(env, op, fn, tol):
    a = np.linspace(0.1, 20, 200).astype(np.float32)
    (d,) = elementwise(env, f"{op} {{d}}, {{a}}", [("f32", a)], ["f32"], len(a))
    np.testing.assert_allclose(d, fn(a.astype(np.float64)), rtol=tol, atol=1e-7)


def test_half_precision_fma_and_ex2(env):
    a = rand_floats("f16", 100, 8)
    b = np.roll(a, 3)
    c = np.roll(a, 7)
    e = np.linspace(-3, 3, len(a)).astype(np.float16)
    d, d2 = elementwise(env, "fma.rn.f16 {d}, {a}, {b}, {c}\nex2.approx.f16 {d2}, {e}",
                        [("f16", a), ("f16", b), ("f16", c), ("f16", e)], ["f16", "f16"], len(a))
    for i, (x, y, z) in enumerate(zip(a, b, c)):
        r = exact(x) * exact(y) + exact(z)
        if r != 0:
            check([d[i]], [ref_round(r, "f16", "rn")], "f16")
    np.testing.assert_allclose(d2.astype(np.float64), np.exp2(e.astype(np.float64)), rtol=1e-3)


def test_fma_where_one_f64_rounding_lands_on_a_midpoint(env):
    """(1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 is halfway between two f32; + 2^-70 rounds to
    that midpoint in f64, and ties-to-even would then round the wrong way."""
    a = np.array([1 + 2.0 ** -12] * 2, np.float32)
    c = np.array([2.0 ** -70, -2.0 ** -70], np.float32)
    (d,) = elementwise(env, "fma.rn.f32 {d}, {a}, {a}, {b}", [("f32", a), ("f32", c)], ["f32"], 2)
    assert list(d) == [np.float32(1 + 2.0 ** -11 + 2.0 ** -23), np.float32(1 + 2.0 ** -11)]


def test_operations_on_uniform_values(env):
    """Every operand the same for all threads (parameters, constants): computed once."""
    a = np.zeros(4, np.float32)
    d, d2, f = elementwise(env, "mov.f32 {d}, 1.5\nmov.f32 {d2}, 0.25\n"
                           "fma.rn.f32 {d2}, {d}, {d2}, {d}\ncvt.f64.f32 {f}, {d}\n"
                           "fma.rz.f64 {f}, {f}, {f}, {f}\nsqrt.rn.f32 {d}, {d2}",
                           [("f32", a)], ["f32", "f32", "f64"], 4)
    assert list(d2) == [1.875] * 4 and list(f) == [3.75] * 4
    assert list(d) == [np.sqrt(np.float32(1.875))] * 4
    x = np.arange(4, dtype=np.float32)
    (d,) = elementwise(env, "mov.f32 {d}, 1.5\nfma.rn.f32 {d}, {d}, {d}, {a}", [("f32", x)],
                       ["f32"], 4)  # uniform * uniform + per thread
    assert list(d) == list(2.25 + x)
