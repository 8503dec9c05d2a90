"""Integer and bit instructions against Python references (ISA-OP-2, ISA-OP-4, ISA-OP-5):
wrap-around, high/wide products, division and remainder by zero and of the minimum by -1,
saturation, shifts past the width, PTX's bfe/bfi/prmt/bfind/brev/clz/popc semantics, every
comparison; each with all lanes active, with some lanes active (guarded), and with a
uniform operand."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from smtest import DTYPES, Env, elementwise

BITS = {"u16": 16, "s16": 16, "u32": 32, "s32": 32, "u64": 64, "s64": 64, "b16": 16,
        "b32": 32, "b64": 64}
SETTINGS = settings(max_examples=12, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


@pytest.fixture(scope="module")
def env():
    return Env(256 << 20)


def wrap(v, bits, signed):
    v &= (1 << bits) - 1
    return v - (1 << bits) if signed and v >> (bits - 1) else v


def signed(t):
    return t.startswith("s")


def edges(t):
    bits = BITS[t]
    if signed(t):
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        return [0, 1, -1, 2, -2, 7, -7, lo, lo + 1, hi, hi - 1, 3, 1 << (bits - 2)]
    return [0, 1, 2, 3, 7, (1 << bits) - 1, (1 << bits) - 2, 1 << (bits - 1),
            (1 << (bits - 1)) - 1, 1 << (bits - 2)]


def values(t):
    bits = BITS[t]
    lo = -(1 << (bits - 1)) if signed(t) else 0
    hi = (1 << (bits - 1)) - 1 if signed(t) else (1 << bits) - 1
    return st.integers(lo, hi) | st.sampled_from(edges(t))


def pairs(t, rng_seed=0):
    e = edges(t)
    a = [x for x in e for _ in e]
    b = [y for _ in e for y in e]
    rng = np.random.default_rng(rng_seed)
    bits = BITS[t]
    for _ in range(64):
        a.append(wrap(int(rng.integers(0, 1 << 62)) * 7 + int(rng.integers(0, 1 << 62)), bits,
                      signed(t)))
        b.append(wrap(int(rng.integers(0, 1 << 62)) * 5 + int(rng.integers(0, 1 << 62)), bits,
                      signed(t)))
    return a, b


def arr(vals, t):
    return np.array([int(v) for v in vals], dtype=object).astype(DTYPES[t]) if not signed(t) \
        else np.array(vals, dtype=DTYPES[t])


def tdiv(a, b):
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def ref_binary(op, t, a, b):
    bits, s = BITS[t], signed(t)
    if op == "add":
        return wrap(a + b, bits, s)
    if op == "sub":
        return wrap(a - b, bits, s)
    if op == "mul.lo":
        return wrap(a * b, bits, s)
    if op == "mul.hi":
        return wrap((a * b) >> bits, bits, s)
    if op == "div":
        if b == 0:
            return -1 if s else (1 << bits) - 1
        return wrap(tdiv(a, b), bits, s)
    if op == "rem":
        return a if b == 0 else wrap(a - tdiv(a, b) * b, bits, s)
    if op == "min":
        return min(a, b)
    if op == "max":
        return max(a, b)
    raise AssertionError(op)


def run_binary(env, op, t, a, b, active=None):
    n = len(a)
    (d,) = elementwise(env, f"{op}.{t} {{d}}, {{a}}, {{b}}", [(t, arr(a, t)), (t, arr(b, t))],
                       [t], n, active=active)
    want = [ref_binary(op, t, x, y) for x, y in zip(a, b)]
    if active is not None:
        want = [w if m else 0 for w, m in zip(want, active)]
    return [int(v) for v in d], want


BINARY = [(op, t) for op in ("add", "sub", "mul.lo", "mul.hi", "div", "rem", "min", "max")
          for t in ("u16", "s16", "u32", "s32", "u64", "s64")]


@pytest.mark.parametrize("op,t", BINARY)
def test_binary_on_edges(env, op, t):
    a, b = pairs(t)
    got, want = run_binary(env, op, t, a, b)
    assert got == want


@pytest.mark.parametrize("op,t", [("div", "s32"), ("rem", "s64"), ("mul.hi", "u64"),
                                  ("add", "s16"), ("max", "u32")])
def test_binary_with_some_lanes_active(env, op, t):
    a, b = pairs(t, 1)
    active = [(i * 7) % 3 == 0 for i in range(len(a))]
    got, want = run_binary(env, op, t, a, b, active)
    assert got == want
    sparse = [i % 17 == 0 for i in range(len(a))]  # few lanes: the sparse path
    got, want = run_binary(env, op, t, a, b, sparse)
    assert got == want


@SETTINGS
@given(st.data())
def test_binary_property(env, data):
    op, t = data.draw(st.sampled_from(BINARY))
    a = data.draw(st.lists(values(t), min_size=1, max_size=80))
    b = data.draw(st.lists(values(t), min_size=len(a), max_size=len(a)))
    got, want = run_binary(env, op, t, a, b)
    assert got == want


@pytest.mark.parametrize("t", ["u16", "s16", "u32", "s32"])
def test_mul_and_mad_wide(env, t):
    a, b = pairs(t)
    bits, s = BITS[t], signed(t)
    wt = {"u16": "u32", "s16": "s32", "u32": "u64", "s32": "s64"}[t]
    c = [wrap(x * 3 + 1, 2 * bits, s) for x in a]
    d, e = elementwise(env, "mul.wide.{0} {{d}}, {{a}}, {{b}}\nmad.wide.{0} {{d2}}, {{a}}, {{b}}, {{c}}"
                       .format(t), [(t, arr(a, t)), (t, arr(b, t)), (wt, arr(c, wt))], [wt, wt],
                       len(a))
    assert [int(v) for v in d] == [x * y for x, y in zip(a, b)]
    assert [int(v) for v in e] == [wrap(x * y + z, 2 * bits, s) for x, y, z in zip(a, b, c)]


@pytest.mark.parametrize("t", ["u32", "s32", "u64", "s64", "u16"])
def test_mad_lo_and_hi(env, t):
    a, b = pairs(t)
    bits, s = BITS[t], signed(t)
    c = [wrap(x - 5, bits, s) for x in b]
    lo, hi = elementwise(env, f"mad.lo.{t} {{d}}, {{a}}, {{b}}, {{c}}\nmad.hi.{t} {{d2}}, {{a}}, {{b}}, {{c}}",
                         [(t, arr(a, t)), (t, arr(b, t)), (t, arr(c, t))], [t, t], len(a))
    assert [int(v) for v in lo] == [wrap(x * y + z, bits, s) for x, y, z in zip(a, b, c)]
    assert [int(v) for v in hi] == [wrap(((x * y) >> bits) + z, bits, s) for x, y, z in zip(a, b, c)]


def test_saturating_s32(env):
    a, b = pairs("s32")
    c = [x // 3 for x in b]
    clamp = lambda v: max(-(1 << 31), min((1 << 31) - 1, v))  # noqa: E731
    d, d2, f = elementwise(env, "add.sat.s32 {d}, {a}, {b}\nsub.sat.s32 {d2}, {a}, {b}\n"
                           "mad.hi.sat.s32 {f}, {a}, {b}, {c}",
                           [("s32", arr(a, "s32")), ("s32", arr(b, "s32")), ("s32", arr(c, "s32"))],
                           ["s32", "s32", "s32"], len(a))
    assert [int(v) for v in d] == [clamp(x + y) for x, y in zip(a, b)]
    assert [int(v) for v in d2] == [clamp(x - y) for x, y in zip(a, b)]
    assert [int(v) for v in f] == [clamp(((x * y) >> 32) + z) for x, y, z in zip(a, b, c)]


@pytest.mark.parametrize("t", ["s16", "s32", "s64"])
def test_abs_and_neg_wrap(env, t):
    a = edges(t)
    d, d2 = elementwise(env, f"abs.{t} {{d}}, {{a}}\nneg.{t} {{d2}}, {{a}}", [(t, arr(a, t))],
                        [t, t], len(a))
    bits = BITS[t]
    assert [int(v) for v in d] == [wrap(abs(x), bits, True) for x in a]
    assert [int(v) for v in d2] == [wrap(-x, bits, True) for x in a]


def test_uniform_and_immediate_operands(env):
    a = list(range(-40, 40))
    d, d2, f = elementwise(env, "add.s32 {d}, {a}, -5\nmul.lo.s32 {d2}, {a}, imm:100000000\n"
                           "sub.s32 {f}, 7, {a}", [("s32", arr(a, "s32"))],
                           ["s32", "s32", "s32"], len(a))
    assert [int(v) for v in d] == [x - 5 for x in a]
    assert [int(v) for v in d2] == [wrap(x * 100000000, 32, True) for x in a]
    assert [int(v) for v in f] == [7 - x for x in a]


# ------------------------------------------------------------------ bits
def ref_shift(op, t, a, n):
    bits, s = BITS[t], signed(t)
    if op == "shl":
        return 0 if n >= bits else wrap(a << n, bits, s)
    if n >= bits:
        return -1 if s and a < 0 else 0
    return a >> n if s else (a & ((1 << bits) - 1)) >> n


@SETTINGS
@given(st.data())
def test_shifts(env, data):
    op, t = data.draw(st.sampled_from([("shl", "b16"), ("shl", "b32"), ("shl", "b64"),
                                       ("shr", "u16"), ("shr", "s16"), ("shr", "u32"),
                                       ("shr", "s32"), ("shr", "u64"), ("shr", "s64"),
                                       ("shr", "b32")]))
    vt = t.replace("b", "u")
    a = data.draw(st.lists(values(vt), min_size=1, max_size=60))
    n = data.draw(st.lists(st.integers(0, 70) | st.sampled_from([0xFFFFFFFF, 1 << 31]),
                           min_size=len(a), max_size=len(a)))
    (d,) = elementwise(env, f"{op}.{t} {{d}}, {{a}}, {{b}}", [(t, arr(a, vt)), ("u32", arr(n, "u32"))],
                       [t], len(a))
    want = [ref_shift(op, vt, x, k) for x, k in zip(a, n)]
    assert [wrap(int(v), BITS[t], signed(vt)) for v in d] == want


def test_logic(env):
    a, b = pairs("u32")
    d, d2, f = elementwise(env, "and.b32 {d}, {a}, {b}\nxor.b32 {d2}, {a}, {b}\nnot.b32 {f}, {a}",
                           [("u32", arr(a, "u32")), ("u32", arr(b, "u32"))], ["u32"] * 3, len(a))
    assert [int(v) for v in d] == [x & y for x, y in zip(a, b)]
    assert [int(v) for v in d2] == [x ^ y for x, y in zip(a, b)]
    assert [int(v) for v in f] == [~x & 0xFFFFFFFF for x in a]
    p = [bool(x & 1) for x in a]
    q = [bool(y & 2) for y in b]
    d, d2, f = elementwise(env, "or.pred {d}, {a}, {b}\nxor.pred {d2}, {a}, {b}\nnot.pred {f}, {a}",
                           [("pred", p), ("pred", q)], ["pred"] * 3, len(a))
    assert list(d) == [x | y for x, y in zip(p, q)] and list(d2) == [x ^ y for x, y in zip(p, q)]
    assert list(f) == [not x for x in p]


def ref_bfe(t, a, pos, ln):
    bits = 32 if t.endswith("32") else 64
    msb = bits - 1
    pos, ln = pos & 0xFF, ln & 0xFF
    ua = a & ((1 << bits) - 1)
    sbit = 0 if (not signed(t) or ln == 0) else (ua >> min(pos + ln - 1, msb)) & 1
    d = 0
    for i in range(bits):
        bit = (ua >> (pos + i)) & 1 if (i < ln and pos + i <= msb) else sbit
        d |= bit << i
    return wrap(d, bits, signed(t))


def ref_bfi(bits, a, b, pos, ln):
    pos, ln = pos & 0xFF, ln & 0xFF
    f = b
    for i in range(ln):
        if pos + i > bits - 1:
            break
        bit = (a >> i) & 1
        f = (f & ~(1 << (pos + i))) | (bit << (pos + i))
    return f & ((1 << bits) - 1)


@SETTINGS
@given(st.data())
def test_bfe(env, data):
    t = data.draw(st.sampled_from(["u32", "s32", "u64", "s64"]))
    a = data.draw(st.lists(values(t), min_size=1, max_size=60))
    pos = data.draw(st.lists(st.integers(0, 70) | st.integers(0, (1 << 32) - 1), min_size=len(a),
                             max_size=len(a)))
    ln = data.draw(st.lists(st.integers(0, 70) | st.integers(0, (1 << 32) - 1), min_size=len(a),
                            max_size=len(a)))
    (d,) = elementwise(env, f"bfe.{t} {{d}}, {{a}}, {{b}}, {{c}}",
                       [(t, arr(a, t)), ("u32", arr(pos, "u32")), ("u32", arr(ln, "u32"))], [t],
                       len(a))
    assert [int(v) for v in d] == [ref_bfe(t, x, p, n) for x, p, n in zip(a, pos, ln)]


@SETTINGS
@given(st.data())
def test_bfi(env, data):
    t = data.draw(st.sampled_from(["b32", "b64"]))
    ut = t.replace("b", "u")
    bits = BITS[t]
    a = data.draw(st.lists(values(ut), min_size=1, max_size=60))
    b = data.draw(st.lists(values(ut), min_size=len(a), max_size=len(a)))
    pos = data.draw(st.lists(st.integers(0, 70) | st.integers(0, (1 << 32) - 1), min_size=len(a),
                             max_size=len(a)))
    ln = data.draw(st.lists(st.integers(0, 70), min_size=len(a), max_size=len(a)))
    (d,) = elementwise(env, f"bfi.{t} {{d}}, {{a}}, {{b}}, {{c}}, {{e}}",
                       [(ut, arr(a, ut)), (ut, arr(b, ut)), ("u32", arr(pos, "u32")),
                        ("u32", arr(ln, "u32"))], [ut], len(a))
    assert [int(v) for v in d] == [ref_bfi(bits, *x) for x in zip(a, b, pos, ln)]


def ref_prmt(a, b, c, mode):
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    if mode == "":
        for i in range(4):
            n = (c >> (4 * i)) & 0xF
            v = src[n & 7]
            if n & 8:
                v = 0xFF if v & 0x80 else 0
            out |= v << (8 * i)
        return out
    sel = c & 3
    table = {  # PTX's tables, d.b3 d.b2 d.b1 d.b0
        "f4e": [(3, 2, 1, 0), (4, 3, 2, 1), (5, 4, 3, 2), (6, 5, 4, 3)],
        "b4e": [(5, 6, 7, 0), (6, 7, 0, 1), (7, 0, 1, 2), (0, 1, 2, 3)],
        "rc8": [(0, 0, 0, 0), (1, 1, 1, 1), (2, 2, 2, 2), (3, 3, 3, 3)],
        "ecl": [(3, 2, 1, 0), (3, 2, 1, 1), (3, 2, 2, 2), (3, 3, 3, 3)],
        "ecr": [(0, 0, 0, 0), (1, 1, 1, 0), (2, 2, 1, 0), (3, 2, 1, 0)],
        "rc16": [(1, 0, 1, 0), (3, 2, 3, 2), (1, 0, 1, 0), (3, 2, 3, 2)],
    }[mode][sel]
    for i, k in enumerate(reversed(table)):
        out |= src[k] << (8 * i)
    return out


@SETTINGS
@given(st.data())
def test_prmt(env, data):
    mode = data.draw(st.sampled_from(["", "f4e", "b4e", "rc8", "ecl", "ecr", "rc16"]))
    a = data.draw(st.lists(values("u32"), min_size=1, max_size=60))
    b = data.draw(st.lists(values("u32"), min_size=len(a), max_size=len(a)))
    c = data.draw(st.lists(values("u32"), min_size=len(a), max_size=len(a)))
    m = f".{mode}" if mode else ""
    (d,) = elementwise(env, f"prmt.b32{m} {{d}}, {{a}}, {{b}}, {{c}}",
                       [("u32", arr(a, "u32")), ("u32", arr(b, "u32")), ("u32", arr(c, "u32"))],
                       ["u32"], len(a))
    assert [int(v) for v in d] == [ref_prmt(*x, mode) for x in zip(a, b, c)]


def ref_bfind(t, a, shiftamt):
    bits = BITS[t]
    ua = a & ((1 << bits) - 1)
    if signed(t) and ua >> (bits - 1):
        ua = ~ua & ((1 << bits) - 1)
    d = ua.bit_length() - 1 if ua else 0xFFFFFFFF
    if shiftamt and d != 0xFFFFFFFF:
        d = bits - 1 - d
    return d


@pytest.mark.parametrize("t", ["b32", "b64"])
def test_popc_clz_brev(env, t):
    ut = t.replace("b", "u")
    bits = BITS[t]
    a = edges(ut) + [0x12345678, 0x80000001, 0xF0F0_0F0F & ((1 << bits) - 1)]
    d, d2, f = elementwise(env, f"popc.{t} {{d}}, {{a}}\nclz.{t} {{d2}}, {{a}}\nbrev.{t} {{f}}, {{a}}",
                           [(ut, arr(a, ut))], ["u32", "u32", ut], len(a))
    assert [int(v) for v in d] == [bin(x).count("1") for x in a]
    assert [int(v) for v in d2] == [bits - x.bit_length() for x in a]
    assert [int(v) for v in f] == [int(format(x, f"0{bits}b")[::-1], 2) for x in a]


@pytest.mark.parametrize("t", ["u32", "s32", "u64", "s64"])
def test_bfind(env, t):
    a = edges(t) + [5, 1 << 20]
    d, d2 = elementwise(env, f"bfind.{t} {{d}}, {{a}}\nbfind.shiftamt.{t} {{d2}}, {{a}}",
                        [(t, arr(a, t))], ["u32", "u32"], len(a))
    assert [int(v) for v in d] == [ref_bfind(t, x, False) for x in a]
    assert [int(v) for v in d2] == [ref_bfind(t, x, True) for x in a]


# ------------------------------------------------------------------ comparisons
CMPS = {"eq": lambda x, y: x == y, "ne": lambda x, y: x != y, "lt": lambda x, y: x < y,
        "le": lambda x, y: x <= y, "gt": lambda x, y: x > y, "ge": lambda x, y: x >= y}
UCMPS = {"lo": "lt", "ls": "le", "hi": "gt", "hs": "ge"}


@SETTINGS
@given(st.data())
def test_setp_integer(env, data):
    t = data.draw(st.sampled_from(["u16", "s16", "u32", "s32", "u64", "s64", "b32"]))
    cmp = data.draw(st.sampled_from(list(CMPS) + list(UCMPS)))
    boolop = data.draw(st.sampled_from(["", "and", "or", "xor"]))
    neg = data.draw(st.booleans())
    vt = t.replace("b", "u")
    a = data.draw(st.lists(values(vt), min_size=1, max_size=60))
    b = data.draw(st.lists(values(vt), min_size=len(a), max_size=len(a)) | st.just(a))
    p = data.draw(st.lists(st.booleans(), min_size=len(a), max_size=len(a)))
    bits = BITS[vt]
    if cmp in UCMPS or t.startswith("b"):
        fa = [x & ((1 << bits) - 1) for x in a]
        fb = [y & ((1 << bits) - 1) for y in b]
    else:
        fa, fb = a, b
    base = CMPS[UCMPS.get(cmp, cmp)]
    r = [base(x, y) for x, y in zip(fa, fb)]
    if boolop:
        c = [q != neg for q in p]
        comb = {"and": lambda u, v: u and v, "or": lambda u, v: u or v,
                "xor": lambda u, v: u != v}[boolop]
        want_d = [comb(x, y) for x, y in zip(r, c)]
        want_d2 = [comb(not x, y) for x, y in zip(r, c)]
        body = f"setp.{cmp}.{boolop}.{t} {{d}}|{{d2}}, {{a}}, {{b}}, {'!' if neg else ''}{{c}}"
        ins = [(vt, arr(a, vt)), (vt, arr(b, vt)), ("pred", p)]
    else:
        want_d, want_d2 = r, [not x for x in r]
        body = f"setp.{cmp}.{t} {{d}}|{{d2}}, {{a}}, {{b}}"
        ins = [(vt, arr(a, vt)), (vt, arr(b, vt))]
    d, d2 = elementwise(env, body, ins, ["pred", "pred"], len(a))
    assert [bool(v) for v in d] == want_d and [bool(v) for v in d2] == want_d2


def test_selp_slct_and_set(env):
    a, b = pairs("s32")
    p = [bool(i % 3) for i in range(len(a))]
    c = [(-1) ** i * i for i in range(len(a))]
    d, d2, f = elementwise(env, "selp.s32 {d}, {a}, {b}, !{c}\nslct.s32.s32 {d2}, {a}, {b}, {e}\n"
                           "set.lt.u32.s32 {f}, {a}, {b}",
                           [("s32", arr(a, "s32")), ("s32", arr(b, "s32")), ("pred", p),
                            ("s32", arr(c, "s32"))], ["s32", "s32", "u32"], len(a))
    assert [int(v) for v in d] == [y if q else x for x, y, q in zip(a, b, p)]
    assert [int(v) for v in d2] == [x if z >= 0 else y for x, y, z in zip(a, b, c)]
    assert [int(v) for v in f] == [0xFFFFFFFF if x < y else 0 for x, y in zip(a, b)]


GRID = [0, 1, 2, 5, 15, 16, 17, 30, 31, 32, 33, 47, 63, 64, 65, 255, 256, 257]


@pytest.mark.parametrize("t", ["u32", "s32", "u64", "s64"])
def test_bfe_grid(env, t):
    base = [x for x in edges(t) if x] + [0x5A5A5A5A5A5A5A5A if BITS[t] == 64 else 0x5A5A5A5A]
    base = [wrap(x, BITS[t], signed(t)) for x in base]
    a = [x for x in base for _ in GRID for _ in GRID]
    pos = [p for _ in base for p in GRID for _ in GRID]
    ln = [n for _ in base for _ in GRID for n in GRID]
    (d,) = elementwise(env, f"bfe.{t} {{d}}, {{a}}, {{b}}, {{c}}",
                       [(t, arr(a, t)), ("u32", arr(pos, "u32")), ("u32", arr(ln, "u32"))], [t],
                       len(a))
    assert [int(v) for v in d] == [ref_bfe(t, x, p, n) for x, p, n in zip(a, pos, ln)]


@pytest.mark.parametrize("t", ["b32", "b64"])
def test_bfi_grid(env, t):
    ut = t.replace("b", "u")
    bits = BITS[t]
    src = [(1 << bits) - 1, 0x1234_5678_9ABC_DEF0 & ((1 << bits) - 1)]
    dst = [0, 0x0F0F_0F0F_0F0F_0F0F & ((1 << bits) - 1)]
    combos = [(x, y, p, n) for x in src for y in dst for p in GRID for n in GRID]
    a, b, pos, ln = (list(c) for c in zip(*combos))
    (d,) = elementwise(env, f"bfi.{t} {{d}}, {{a}}, {{b}}, {{c}}, {{e}}",
                       [(ut, arr(a, ut)), (ut, arr(b, ut)), ("u32", arr(pos, "u32")),
                        ("u32", arr(ln, "u32"))], [ut], len(a))
    assert [int(v) for v in d] == [ref_bfi(bits, *x) for x in combos]
