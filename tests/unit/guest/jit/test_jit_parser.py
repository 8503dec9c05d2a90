"""The PTX parser: module directives, variables, functions, bodies and error lines."""

import pytest

from pvgpu.guest.jit.errors import PtxSyntaxError, PtxUnsupportedError
from pvgpu.guest.jit.ptx import ast, parse

HEAD = ".version 8.0\n.target sm_80\n.address_size 64\n"


def body(text):
    m = parse(HEAD + ".visible .entry k()\n{\n" + text + "\n}\n")
    return m.items[0].body.stmts


def test_module_directives():
    m = parse(".version 9.0\n.target sm_90, texmode_independent\n.address_size 64\n")
    assert (m.version, m.target, m.address_size) == ("9.0", "sm_90,texmode_independent", 64)


def test_missing_version_is_an_error():
    with pytest.raises(PtxSyntaxError):
        parse(".target sm_80\n")


def test_variables_with_alignment_arrays_and_initializers():
    m = parse(HEAD + """
.global .align 4 .b8 lut[8] = {3, 0, 0, 0, 1, 0, 0, 0};
.global .align 4 .f32 scale = 0f3FC00000;
.const .align 8 .f64 c[2] = {0d3FF0000000000000, -1.5};
.global .u32 a, b = 7;
.extern .shared .align 16 .b8 dyn[];
.global .align 8 .u64 p = generic(lut)+4;
.global .s32 m[2][3] = {{1, 2, 3}, {4, 5, 6}};
""")
    lut, scale, c, a, b, dyn, p, mat = m.items
    assert (lut.space, lut.align, lut.type, lut.dims) == ("global", 4, "b8", (8,))
    assert lut.init == [3, 0, 0, 0, 1, 0, 0, 0]
    assert scale.init.literal.bits == 0x3FC00000
    assert c.init[1].negative and c.init[1].literal.value == 1.5
    assert (a.name, a.init, b.name, b.init) == ("a", None, "b", 7)
    assert dyn.linkage == "extern" and dyn.dims == (None,)
    assert p.init == ("addr", "lut", 4, True)
    assert mat.init == [[1, 2, 3], [4, 5, 6]]


def test_entry_and_func_signatures():
    m = parse(HEAD + """
.func (.param .b32 func_retval0) f(.param .b32 f_param_0, .param .align 8 .b8 f_param_1[16]);
.visible .entry k(.param .u64 .ptr .global .align 16 k_param_0, .param .f32 k_param_1)
.maxntid 256, 1, 1
.minnctapersm 2
{ ret; }
.func (.param .b32 func_retval0) f(.param .b32 f_param_0, .param .align 8 .b8 f_param_1[16])
{ ret; }
""")
    proto, k, f = m.items
    assert proto.body is None and f.body is not None
    assert [p.name for p in proto.params] == ["f_param_0", "f_param_1"]
    assert proto.params[1].align == 8 and proto.params[1].dims == (16,)
    assert proto.rets[0].name == "func_retval0"
    # `.align` after `.ptr` is the pointee's alignment, not the parameter's
    assert k.params[0].ptr and k.params[0].ptr_align == 16 and k.params[0].align == 0
    assert k.params[0].type == "u64"
    assert k.maxntid == (256, 1, 1)


def test_body_statements():
    stmts = body("""
    .reg .pred %p<3>;
    .reg .v4 .f32 %v;
    .local .align 8 .b8 __local_depot0[16];
    .pragma "nounroll";
    .loc 1 2 3, function_name $L__info_string0, inlined_at 1 4 5
$L__BB0_1:
    @!%p1 bra.uni $L__BB0_1;
    { .reg .b32 %t; mov.u32 %t, %tid.x; }
    setp.lt.s32 %p1|%p2, %r1, -5;
    ld.global.v2.f32 {%f1, _}, [%rd1+-8];
    shfl.sync.down.b32 %r1|%p1, %r2, 1, 31, -1;
""")
    regs, vec, local, label, bra, blk, setp, ld, shfl = stmts
    assert regs.names == [("%p", 3)] and vec.vector == 4
    assert local.space == "local" and local.dims == (16,)
    assert isinstance(label, ast.Label) and label.name == "$L__BB0_1"
    assert bra.guard == (ast.Reg("%p1"), True) and bra.mods == ("uni",)
    assert isinstance(blk, ast.Block) and blk.stmts[1].operands[1] == ast.Reg("%tid", "x")
    assert setp.operands[0] == ast.Pair(ast.Reg("%p1"), ast.Reg("%p2"))
    assert setp.operands[2] == ast.Imm(-5)
    assert ld.operands[0] == ast.Vec((ast.Reg("%f1"), ast.Sink()))
    assert ld.operands[1] == ast.Addr(ast.Reg("%rd1"), -8)
    assert shfl.operands[0] == ast.Pair(ast.Reg("%r1"), ast.Reg("%p1"))


def test_call_forms():
    stmts = body("""
    call.uni (retval0), _Z3fooi, (param0, param1);
    call _Z3bar;
    call (retval0), %rd5, (param0), prototype_1;
""")
    c1, c2, c3 = stmts
    assert c1.uni and c1.target == "_Z3fooi" and c1.rets == [ast.Sym("retval0")]
    assert c1.args == [ast.Sym("param0"), ast.Sym("param1")]
    assert c2.target == "_Z3bar" and not c2.args
    assert c3.indirect and c3.prototype == "prototype_1"


def test_section_directive_is_skipped():
    m = parse(HEAD + ".section .debug_abbrev { .b8 17 .b8 1 }\n.global .u32 x;\n")
    assert [i.name for i in m.items] == ["x"]


@pytest.mark.parametrize("text, line", [
    ("mov.u32 %r1, 1;\nmov.u32 %r2 %r3;", 7),
    ("mov.u32 %r1, 1\nadd.s32 %r1, %r1, 1;", 6),
    ("ld.global.f32 %f1, [%rd1+];", 6),
])
def test_syntax_errors_name_the_line(text, line):
    with pytest.raises(PtxSyntaxError) as e:
        body(text)
    assert e.value.line == line
    assert f"PTX line {line}" in str(e.value)


def test_unterminated_block_names_its_opening_line():
    with pytest.raises(PtxSyntaxError) as e:
        parse(HEAD + ".visible .entry k()\n{\n ret;\n")
    assert e.value.line == 5


def test_texture_references_are_refused_with_their_section():
    with pytest.raises(PtxUnsupportedError) as e:
        parse(HEAD + ".global .texref tex0;\n")
    assert e.value.line == 4 and "Texture" in e.value.section
