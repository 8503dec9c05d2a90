"""The compiler: operand legalization, memory layout, calls, control flow, registers."""

import struct

import pytest

from pvgpu.guest.jit import compile_ptx
from pvgpu.guest.jit.errors import PtxCompileError, PtxUnsupportedError
from pvgpu.spec import isa

from jit_helpers import build, kernel, listing, module


def test_small_integers_are_simm_and_large_ones_imm():
    code = listing(kernel("add.s32 %r1, %r2, -5;\nadd.s32 %r1, %r2, 0x12345678;\n"
                          "add.s64 %rd1, %rd2, 4294967295;\nand.b32 %r1, %r2, -16;"))
    assert code[:4] == ["add.s32 r1, r2, -5", "add.s32 r1, r2, 0x12345678",
                        "add.s64 rd1, rd2, 0xffffffff", "and.b32 r1, r2, -16"]


def test_a_second_immediate_goes_through_a_scratch_register():
    code = listing(kernel("selp.f32 %f1, 0f3F800000, 0f40000000, %p1;"))
    assert code[:2] == ["mov.f32 r40, 2.0f", "selp.f32 r17, 1.0f, r40, p1"]


def test_memory_offsets_and_stored_immediates():
    code = listing(kernel("st.global.u32 [%rd1+4], 7;\nst.global.f32 [%rd1+8], 0f3F800000;\n"
                          "st.global.f32 [%rd1], 0f3F800000;\nld.global.u32 %r1, [%rd1+-12];"))
    assert code[:5] == ["st.global.u32 [rd1+4], 7", "mov.f32 r40, 1.0f",
                        "st.global.f32 [rd1+8], r40", "st.global.f32 [rd1], 1.0f",
                        "ld.global.u32 r1, [rd1-12]"]


def test_vector_loads_and_stores_are_split():
    code = listing(kernel("ld.global.v4.f32 {%f1, %f2, _, %f4}, [%rd1+16];\n"
                          "st.shared.v2.u64 [%rd2], {%rd3, 5};"))
    assert code[:5] == ["ld.global.f32 r17, [rd1+16]", "ld.global.f32 r18, [rd1+20]",
                        "ld.global.f32 r20, [rd1+28]", "st.shared.u64 [rd2], rd3",
                        "st.shared.u64 [rd2+8], 5"]


def test_a_vector_load_into_its_own_address_register_reads_the_address_first():
    code = listing(kernel("ld.global.v2.u64 {%rd1, %rd2}, [%rd1];"))
    assert code[:3] == ["mov.u64 rd24, rd1", "ld.global.u64 rd1, [rd24]",
                        "ld.global.u64 rd2, [rd24+8]"]


def test_pack_and_unpack():
    code = listing(kernel("mov.b64 %rd1, {%r1, %r2};\nmov.b64 {%r3, %r4}, %rd1;\n"
                          "mov.b32 {%rs1, %rs2}, %r5;"))
    assert code == [
        "cvt.u64.u32 rd24, r1", "cvt.u64.u32 rd25, r2", "shl.b64 rd25, rd25, 32",
        "or.b64 rd25, rd25, rd24", "mov.b64 rd1, rd25",
        "shr.b64 rd24, rd1, 32", "cvt.u32.u64 r4, rd24", "cvt.u32.u64 r3, rd1",
        "shr.b32 r40, r5, 16", "cvt.u16.u32 r34, r40", "cvt.u16.u32 r33, r5", "exit"]


def test_kernel_parameter_layout():
    blob = compile_ptx(kernel("ret;", params=".param .u8 k_a, .param .u64 k_b, "
                              ".param .align 16 .b8 k_s[20], .param .f32 k_c"))
    e = build(kernel("ret;", params=".param .u8 k_a, .param .u64 k_b, "
                     ".param .align 16 .b8 k_s[20], .param .f32 k_c")).entry("k")
    assert [(p.offset, p.size, p.align, p.type) for p in e.params] == [
        (0, 1, 1, isa.TYPE_U8), (8, 8, 8, isa.TYPE_U64), (16, 20, 16, isa.TYPE_B8),
        (36, 4, 4, isa.TYPE_F32)]
    assert e.param_size == 40 and blob


def test_parameters_are_read_from_the_parameter_buffer():
    code = listing(kernel("ld.param.u64 %rd1, [k_p1];\nld.param.v2.u32 {%r1, %r2}, [k_s+8];\n"
                          "mov.u64 %rd2, k_s;",
                          params=".param .u32 k_p0, .param .u64 k_p1, .param .align 8 .b8 k_s[16]"))
    assert code[:4] == ["ld.param.u64 rd1, [8]", "ld.param.u32 r1, [24]",
                        "ld.param.u32 r2, [28]", "mov.u64 rd2, 16"]


def test_shared_layout_static_then_dynamic():
    pre = (".shared .align 4 .b8 unused[64];\n.shared .align 8 .b8 a[12];\n"
           ".shared .align 4 .f32 b[3];\n.extern .shared .align 16 .b8 dyn[];\n")
    text = kernel("ld.shared.f32 %f1, [b+4];\nld.u32 %r1, [a];\nmov.u64 %rd1, dyn;\n"
                  "cvta.shared.u64 %rd2, a;", pre=pre)
    e = build(text).entry("k")
    code = listing(text)
    assert code[:4] == ["ld.shared.f32 r17, [16]", "ld.shared.u32 r1, [0]", "mov.u64 rd1, 32",
                        "cvta.shared.u64 rd2, 0"]
    assert e.shared_size == 32  # a at 0, b at 12, dynamic memory at 32


def test_globals_consts_and_symbols():
    pre = (".global .align 4 .b8 lut[8] = {1, 2, 3, 4};\n.global .align 8 .f64 d = 0d4000000000000000;\n"
           ".global .align 4 .u32 counter;\n.const .align 4 .f32 c[4] = {0f3F800000, -2.0};\n")
    text = kernel("mov.u64 %rd1, counter;\nld.global.u32 %r1, [lut+4];\nld.const.f32 %f1, [c+4];\n"
                  "atom.global.add.u32 %r2, [counter], 1;", pre=pre)
    obj = build(text)
    assert [(s.name, s.space, s.offset, s.size) for s in obj.symbols] == [
        ("lut", isa.SPACE_GLOBAL, 0, 8), ("d", isa.SPACE_GLOBAL, 8, 8),
        ("counter", isa.SPACE_GLOBAL, 16, 4), ("c", isa.SPACE_CONST, 0, 16)]
    assert obj.data_size == 24 and obj.data_init == bytes([1, 2, 3, 4, 0, 0, 0, 0]) + \
        struct.pack("<d", 2.0)
    assert obj.const_init == struct.pack("<ffff", 1.0, -2.0, 0, 0)
    code = listing(text)
    assert code[:4] == ["mov.u64 rd1, data+0x10", "ld.global.u32 r1, [data+0x0+4]",
                        "ld.const.f32 r17, [const+0x0+4]",
                        "atom.global.add.u32 r2, [data+0x10], 1"]


def test_address_initializers_are_refused():
    with pytest.raises(PtxUnsupportedError, match="relocations") as e:
        compile_ptx(kernel("ret;", pre=".global .u32 x;\n.global .u64 p = generic(x);\n"))
    assert e.value.line == 5


CALLEE = """
.func (.param .b32 func_retval0) twice(.param .b32 twice_param_0)
{
.reg .b32 %t<3>;
ld.param.u32 %t1, [twice_param_0];
add.s32 %t2, %t1, %t1;
st.param.b32 [func_retval0+0], %t2;
ret;
}
"""


def test_calls_are_inlined_with_parameters_in_registers():
    code = listing(kernel("{ .param .b32 param0; st.param.b32 [param0+0], %r1;\n"
                          ".param .b32 retval0;\ncall.uni (retval0), twice, (param0);\n"
                          "ld.param.b32 %r2, [retval0+0]; }\nret;", pre=CALLEE))
    # param0 -> r40, retval0 -> r41, the callee's %t0..%t2 -> r42..r44
    assert code == ["mov.b32 r40, r1", "mov.u32 r43, r40", "add.s32 r44, r43, r43",
                    "mov.b32 r41, r44", "mov.b32 r2, r41", "exit"]


STRUCT_CALLEE = """
.func (.param .b32 func_retval0) sum2(.param .align 4 .b8 sum2_param_0[8])
{
.reg .b32 %t<4>;
ld.param.u32 %t1, [sum2_param_0];
ld.param.u32 %t2, [sum2_param_0+4];
add.s32 %t3, %t1, %t2;
st.param.b32 [func_retval0+0], %t3;
ret;
}
"""


def test_byte_array_parameters_of_calls_live_in_local_memory():
    text = kernel("{ .param .align 4 .b8 param0[8]; st.param.v2.u32 [param0+0], {%r1, %r2};\n"
                  ".param .b32 retval0;\ncall.uni (retval0), sum2, (param0);\n"
                  "ld.param.b32 %r3, [retval0+0]; }\nret;", pre=STRUCT_CALLEE)
    code = listing(text)
    assert code[:4] == ["st.local.u32 [0], r1", "st.local.u32 [4], r2",
                        "ld.local.u32 r42, [0]", "ld.local.u32 r43, [4]"]
    assert build(text).entry("k").local_size == 8


def test_a_guarded_call_is_skipped_when_its_guard_fails():
    code = listing(kernel("{ .param .b32 param0; st.param.b32 [param0+0], %r1;\n"
                          ".param .b32 retval0;\n@%p1 call.uni (retval0), twice, (param0);\n"
                          "ld.param.b32 %r2, [retval0+0]; }\nret;", pre=CALLEE))
    assert code[1] == "@!p1 bra 5"


@pytest.mark.parametrize("funcs, line", [
    (".func f()\n{\ncall.uni f;\nret;\n}\n", 6),
    (".func g();\n.func f()\n{\ncall.uni g;\nret;\n}\n.func g()\n{\ncall.uni f;\nret;\n}\n", 12),
])
def test_recursion_is_refused(funcs, line):
    with pytest.raises(PtxCompileError, match="recursion") as e:
        compile_ptx(kernel("call.uni f;\nret;", pre=funcs))
    assert e.value.line == line


def test_calls_to_functions_without_a_body_are_refused():
    pre = ".extern .func (.param .b32 func_retval0) vprintf(.param .b64 a, .param .b64 b);\n"
    with pytest.raises(PtxUnsupportedError, match="vprintf") as e:
        compile_ptx(kernel("{ .param .b64 p0; .param .b64 p1; .param .b32 r0;\n"
                           "call.uni (r0), vprintf, (p0, p1); }\nret;", pre=pre))
    assert e.value.line == 14 and "call" in e.value.section


def test_unsupported_instructions_name_line_instruction_and_section():
    with pytest.raises(PtxUnsupportedError) as e:
        compile_ptx(kernel("mov.u32 %r1, 0;\ntex.1d.v4.f32.s32 {%f1, %f2, %f3, %f4}, [t, {%r1}];"))
    err = e.value
    assert err.line == 13 and "tex.1d.v4.f32.s32" in str(err)
    assert err.section == "Instruction Set › Texture Instructions › tex"
    assert "PTX line 13" in str(err)


def test_unsupported_modifiers_are_refused():
    with pytest.raises(PtxUnsupportedError, match=r"\.relu"):
        compile_ptx(kernel("max.relu.s32 %r1, %r2, %r3;"))
    with pytest.raises(PtxUnsupportedError, match="f16x2"):
        compile_ptx(kernel("add.rn.f16x2 %r1, %r2, %r3;"))


def test_integer_literals_are_not_floats():
    with pytest.raises(PtxCompileError, match="float literal"):
        compile_ptx(kernel("add.f32 %f1, %f2, 3;"))


def test_control_flow_and_the_last_instruction_rule():
    code = listing(kernel("@%p1 bra $L1;\nmov.u32 %r1, 1;\n$L1:\nret;"))
    assert code == ["@p1 bra 2", "mov.u32 r1, 1", "exit"]
    code = listing(kernel("$L0:\nadd.s32 %r1, %r1, 1;\n@%p1 bra $L0;"))
    assert code == ["add.s32 r1, r1, 1", "@p1 bra 0", "exit"]
    code = listing(kernel("@%p1 bra $L1;\nexit;\n$L1:"))
    assert code == ["@p1 bra 2", "exit", "exit"]


def test_guards_apply_to_every_instruction_of_an_expansion():
    code = listing(kernel("@!%p2 st.global.v2.f32 [%rd1], {%f1, %f2};"))
    assert code[:2] == ["@!p2 st.global.f32 [rd1], r17", "@!p2 st.global.f32 [rd1+4], r18"]


def test_special_registers():
    code = listing(kernel("mov.u32 %r1, %tid.y;\nmov.u64 %rd1, %clock64;\n"
                          "cvt.u64.u32 %rd2, %ctaid.z;\nmov.u32 %r2, %laneid;"))
    assert code[0] == "mov.u32 r1, %tid.y"
    assert code[1] == "mov.u64 rd1, %clock64"
    assert code[2].startswith("mov.u32 r") and code[2].endswith("%ctaid.z")
    assert code[3].startswith("cvt.u64.u32 rd2, r")
    assert code[4] == "mov.u32 r2, %laneid"


def test_narrow_loads_into_wide_registers_are_extended():
    code = listing(kernel("ld.global.s8 %rd1, [%rd2];\nld.global.u16 %r1, [%rd2];"))
    s = code[0].split()[1].rstrip(",")
    assert code[:3] == [f"ld.global.s8 {s}, [rd2]", f"cvt.s64.s8 rd1, {s}",
                        "ld.global.u16 r1, [rd2]"]


def test_block_scoped_registers_are_reused():
    text = kernel("{ .reg .b32 %a; mov.u32 %a, 1; }\n{ .reg .b32 %b; mov.u32 %b, 2; }",
                  regs=".reg .b32 %r<2>;\n")
    assert listing(text)[:2] == ["mov.u32 r2, 1", "mov.u32 r2, 2"]
    assert build(text).entry("k").n_r32 == 3


def test_bar_red_and_vote_forms():
    code = listing(kernel("bar.red.and.pred %p1, 0, %p2;\nbar.red.popc.u32 %r1, 0, !%p2;\n"
                          "bar.sync 1, 64;\nvote.sync.ballot.b32 %r2, !%p3, -1;\n"
                          "shfl.sync.bfly.b32 %r3|%p4, %r4, 1, 31, -1;\nbar.warp.sync -1;"))
    assert code[:6] == ["bar.red.and.pred p1, 0, p2", "bar.red.popc.u32 r1, 0, !p2",
                        "bar.sync 1, 64", "vote.ballot.b32 r2, p3".replace("p3", "p3"),
                        "shfl.bfly.b32 r3, p4, r4, 1, 31", "membar"]


def test_max_threads_and_local_frames():
    text = module(".visible .entry k()\n.maxntid 128, 2, 1\n{\n"
                  ".local .align 8 .b8 __local_depot0[24];\n.reg .b64 %SP, %SPL;\n"
                  "mov.u64 %SPL, __local_depot0;\ncvta.local.u64 %SP, %SPL;\nret;\n}\n")
    e = build(text).entry("k")
    assert e.max_threads == 256 and e.local_size == 24
    assert listing(text)[:2] == ["mov.u64 rd1, 0", "cvta.local.u64 rd0, rd1"]


def test_carry_chains_compile_to_valid_code():
    code = listing(kernel("add.cc.u32 %r1, %r2, %r3;\naddc.cc.u32 %r4, %r5, %r6;\n"
                          "addc.u32 %r7, 0, 0;\nsub.cc.u32 %r1, %r1, 1;\nsubc.u32 %r2, %r2, 0;"))
    assert code[0].startswith("add.u32") and "setp.lo.u32" in code[1]
    assert any(c.startswith("selp.u32") for c in code)


def test_extern_variables_are_refused_where_used():
    text = kernel("ld.global.u32 %r1, [ext];", pre=".extern .global .align 4 .u32 ext;\n")
    with pytest.raises(PtxUnsupportedError, match="ext is an .extern variable") as e:
        compile_ptx(text)
    assert e.value.line == 13
    build(kernel("ret;", pre=".extern .global .align 4 .u32 ext;\n"))  # declared, unused: fine


def test_registers_named_without_percent_and_vector_aliasing():
    code = listing(kernel("{ .reg .u64 a0; .reg .u32 lo, hi;\nmov.b64 {lo, hi}, %rd1;\n"
                          "mov.u64 a0, %rd2;\nld.global.v2.u64 {a0, %rd3}, [a0]; }"))
    assert code[:3] == ["shr.b64 rd25, rd1, 32", "cvt.u32.u64 r41, rd25", "cvt.u32.u64 r40, rd1"]
    assert code[4:7] == ["mov.u64 rd25, rd24", "ld.global.u64 rd24, [rd25]",
                         "ld.global.u64 rd3, [rd25+8]"]


def test_bytes_that_are_not_utf8_are_a_syntax_error():
    from pvgpu.guest.jit.errors import PtxSyntaxError
    text = kernel("ret;").encode() + b"\n// \xff\xfe\n"
    with pytest.raises(PtxSyntaxError, match="UTF-8") as e:
        compile_ptx(text)
    assert e.value.line == 15
    assert compile_ptx(kernel("ret;").encode())


def test_pointer_parameters_keep_their_natural_alignment():
    e = build(kernel("ret;", params=".param .u32 k_n, .param .u64 .ptr .global .align 16 k_p, "
                     ".param .u32 k_m")).entry("k")
    assert [(p.offset, p.size, p.align) for p in e.params] == [(0, 4, 4), (8, 8, 8), (16, 4, 4)]
