"""The instructions the compiler builds out of several ISA instructions (funnel shifts,
lop3, mul24/mad24, sad, cnot, carry chains, f16 min/max, f16x2 conversion, vector movs,
isspacep) give PTX's results: small kernels run on the reference interpreter over many
inputs and are compared with Python's arithmetic."""

import numpy as np
import pytest

from pvgpu.guest.jit import compile_ptx, read_code_object
from jit_refsim import Launch, Memory

M32 = 0xFFFFFFFF
N = 64
HEAD = """.version 8.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 k_in, .param .u64 k_out)
{
.reg .b32 %r<20>;
.reg .b64 %rd<20>;
.reg .b16 %rs<8>;
.reg .f32 %f<8>;
.reg .pred %p<8>;
ld.param.u64 %rd1, [k_in];
ld.param.u64 %rd2, [k_out];
mov.u32 %r0, %tid.x;
mul.wide.u32 %rd3, %r0, 16;
add.s64 %rd4, %rd1, %rd3;
add.s64 %rd5, %rd2, %rd3;
ld.global.u32 %r1, [%rd4];
ld.global.u32 %r2, [%rd4+4];
ld.global.u32 %r3, [%rd4+8];
ld.global.u32 %r4, [%rd4+12];
"""
TAIL = """
st.global.u32 [%rd5], %r5;
st.global.u32 [%rd5+4], %r6;
st.global.u32 [%rd5+8], %r7;
st.global.u32 [%rd5+12], %r8;
ret;
}
"""


def run(body: str, inputs: np.ndarray) -> np.ndarray:
    """Run `body` for N threads; thread i reads inputs[i] as %r1..%r4 (u32) and its
    %r5..%r8 are returned."""
    obj = read_code_object(compile_ptx(HEAD + body + TAIL))
    mem = Memory()
    src = mem.alloc(inputs.nbytes, inputs.astype(np.uint32))
    dst = mem.alloc(inputs.nbytes)
    params = np.array([src, dst], np.uint64).tobytes()
    Launch(obj, obj.entry("k"), mem, 0, 0, params, (1,), (N,)).run()
    return np.frombuffer(mem.read(dst, inputs.nbytes), np.uint32).reshape(N, 4)


def words(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 1 << 32, (N, 4), dtype=np.uint64).astype(np.uint32)
    w[:8, 2] = [0, 1, 31, 32, 33, 63, 64, 0xFFFFFFFF]
    return w


def test_funnel_shifts():
    w = words(1)
    out = run("shf.l.wrap.b32 %r5, %r1, %r2, %r3;\nshf.r.wrap.b32 %r6, %r1, %r2, %r3;\n"
              "shf.l.clamp.b32 %r7, %r1, %r2, %r3;\nshf.r.clamp.b32 %r8, %r1, %r2, %r3;", w)
    for (a, b, c, _), got in zip(w.tolist(), out.tolist()):
        pair = (b << 32) | a
        n, m = c & 31, min(c, 32)
        assert got == [((pair << n) >> 32) & M32, (pair >> n) & M32,
                       ((pair << m) >> 32) & M32, (pair >> m) & M32]


def test_funnel_shift_by_constant():
    w = words(2)
    out = run("shf.l.wrap.b32 %r5, %r1, %r2, 37;\nshf.r.clamp.b32 %r6, %r1, %r2, 40;\n"
              "mov.u32 %r7, 0;\nmov.u32 %r8, 0;", w)
    for (a, b, _, _), got in zip(w.tolist(), out.tolist()):
        pair = (b << 32) | a
        assert got[:2] == [((pair << 5) >> 32) & M32, b]


@pytest.mark.parametrize("lut", [0x00, 0xFF, 0x96, 0xE8, 0xCA, 0x1B, 0x80, 0x7F])
def test_lop3(lut):
    w = words(lut)
    out = run(f"lop3.b32 %r5, %r1, %r2, %r3, {lut};\nmov.u32 %r6, 0;\nmov.u32 %r7, 0;\n"
              "mov.u32 %r8, 0;", w)
    for (a, b, c, _), got in zip(w.tolist(), out.tolist()):
        want = 0
        for bit in range(32):
            i = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)
            want |= ((lut >> i) & 1) << bit
        assert got[0] == want


def sext24(v):
    v &= 0xFFFFFF
    return v - (1 << 24) if v >> 23 else v


def s32(v):
    v &= M32
    return v - (1 << 32) if v >> 31 else v


def test_mul24_mad24_sad_cnot():
    w = words(3)
    w[:4, 0] = [0, 0x800000, 0xFF7FFFFF, 5]
    out = run("mul24.lo.s32 %r5, %r1, %r2;\nmul24.hi.u32 %r6, %r1, %r2;\n"
              "mad24.lo.u32 %r7, %r1, %r2, %r3;\nsad.s32 %r8, %r1, %r2, %r3;", w)
    for (a, b, c, _), got in zip(w.tolist(), out.tolist()):
        ua, ub = a & 0xFFFFFF, b & 0xFFFFFF
        assert got == [(sext24(a) * sext24(b)) & M32, ((ua * ub) >> 16) & M32,
                       (ua * ub + c) & M32, (abs(s32(a) - s32(b)) + c) & M32]
    out = run("cnot.b32 %r5, %r1;\nsad.u32 %r6, %r1, %r2, %r3;\nmul24.hi.s32 %r7, %r1, %r2;\n"
              "mov.u32 %r8, 0;", np.where(np.arange(N)[:, None] % 3 == 0, 0, w).astype(np.uint32))
    w2 = np.where(np.arange(N)[:, None] % 3 == 0, 0, w).astype(np.uint32)
    for (a, b, c, _), got in zip(w2.tolist(), out.tolist()):
        assert got[:3] == [int(a == 0), (abs(a - b) + c) & M32,
                           ((sext24(a) * sext24(b)) >> 16) & M32]


def test_carry_chains_add_sub_and_multiply_64_bits():
    w = words(4)
    w[:4] = [[M32, M32, 1, 0], [M32, 0, 1, 0], [0, 0, 1, 0], [5, 7, 9, M32]]
    body = """
add.cc.u32 %r5, %r1, %r3;
addc.u32 %r6, %r2, %r4;
sub.cc.u32 %r7, %r1, %r3;
subc.u32 %r8, %r2, %r4;
"""
    out = run(body, w)
    for (a, b, c, d), got in zip(w.tolist(), out.tolist()):
        x, y = (b << 32) | a, (d << 32) | c
        s, t = (x + y) & ((1 << 64) - 1), (x - y) & ((1 << 64) - 1)
        assert got == [s & M32, s >> 32, t & M32, t >> 32]
    body = """
mul.lo.u32 %r5, %r1, %r2;
mul.hi.u32 %r9, %r1, %r2;
mad.lo.cc.u32 %r6, %r1, %r3, %r9;
madc.hi.u32 %r7, %r1, %r3, 0;
mov.u32 %r8, 0;
"""
    out = run(body, w)
    for (a, b, c, _), got in zip(w.tolist(), out.tolist()):
        # a * (c:b) as a 96-bit number, limb by limb
        full = a * ((c << 32) | b)
        assert got[:3] == [full & M32, (full >> 32) & M32, (full >> 64) & M32]


def f16_bits(x):
    return int(np.array(x, np.float16).view(np.uint16))


def test_f16_min_max_and_f16x2_conversion():
    rng = np.random.default_rng(5)
    h = rng.standard_normal((N, 2)).astype(np.float16)
    f = rng.standard_normal((N, 2)).astype(np.float32) * 1000
    w = np.zeros((N, 4), np.uint32)
    w[:, 0] = h[:, 0].view(np.uint16)
    w[:, 1] = h[:, 1].view(np.uint16)
    w[:, 2] = f[:, 0].view(np.uint32)
    w[:, 3] = f[:, 1].view(np.uint32)
    body = """
cvt.u16.u32 %rs1, %r1;
cvt.u16.u32 %rs2, %r2;
min.f16 %rs3, %rs1, %rs2;
max.f16 %rs4, %rs1, %rs2;
cvt.u32.u16 %r5, %rs3;
cvt.u32.u16 %r6, %rs4;
mov.b32 %f1, %r3;
mov.b32 %f2, %r4;
cvt.rn.f16x2.f32 %r7, %f1, %f2;
mov.b32 {%rs5, %rs6}, %r7;
mov.b32 %r8, {%rs6, %rs5};
"""
    out = run(body, w)
    for i in range(N):
        a, b = h[i]
        hi, lo = f16_bits(f[i, 0]), f16_bits(f[i, 1])
        assert out[i].tolist() == [f16_bits(min(a, b)), f16_bits(max(a, b)),
                                   (hi << 16) | lo, (lo << 16) | hi]


def test_vector_movs_of_four_16_bit_parts():
    w = words(6)
    body = """
mov.b64 %rd6, {%r1, %r2};
mov.b64 {%rs1, %rs2, %rs3, %rs4}, %rd6;
mov.b64 %rd7, {%rs4, %rs3, %rs2, %rs1};
mov.b64 {%r5, %r6}, %rd7;
mov.b32 %r7, {%rs1, %rs1};
mov.b64 {_, %r8}, %rd6;
"""
    out = run(body, w)
    for (a, b, _, _), got in zip(w.tolist(), out.tolist()):
        parts = [a & 0xFFFF, a >> 16, b & 0xFFFF, b >> 16]
        rev = parts[3] | (parts[2] << 16) | (parts[1] << 32) | (parts[0] << 48)
        assert got == [rev & M32, rev >> 32, parts[0] | (parts[0] << 16), b]


def test_isspacep_on_generic_addresses():
    body = """
.shared .align 4 .b8 sm[16];
.local .align 4 .b8 lm[16];
mov.u64 %rd6, sm;
cvta.shared.u64 %rd6, %rd6;
mov.u64 %rd7, lm;
cvta.local.u64 %rd7, %rd7;
isspacep.shared %p1, %rd6;
isspacep.local %p2, %rd6;
isspacep.global %p3, %rd6;
isspacep.local %p4, %rd7;
isspacep.global %p5, %rd4;
isspacep.shared %p6, %rd4;
selp.u32 %r5, 1, 0, %p1;
selp.u32 %r6, 2, 0, %p2;
selp.u32 %r7, 4, 0, %p3;
add.u32 %r5, %r5, %r6;
add.u32 %r5, %r5, %r7;
selp.u32 %r6, 1, 0, %p4;
selp.u32 %r7, 1, 0, %p5;
selp.u32 %r8, 1, 0, %p6;
"""
    out = run(body, words(7))
    assert (out == [1, 1, 1, 0]).all()
