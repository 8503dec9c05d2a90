"""The PTX lexer: literals of every base, float bit literals, comments and line numbers."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvgpu.guest.jit.errors import PtxSyntaxError
from pvgpu.guest.jit.ptx.lexer import FloatLiteral, parse_int, tokenize


def kinds(text):
    return [(t.kind, t.value) for t in tokenize(text)]


def test_instruction_tokens():
    toks = tokenize("@!%p1 ld.global.nc.L2::128B.v4.f32 {%f1, _}, [%rd1+-16];")
    assert [t.kind for t in toks] == [
        "punct", "punct", "ident", "ident", "dot", "dot", "dot", "dot", "dot", "punct", "ident",
        "punct", "punct", "punct", "punct", "punct", "ident", "punct", "punct", "int", "punct",
        "punct"]
    assert toks[6].value == ".L2::128B"


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_integer_literals_in_every_base(v):
    for text in (str(v), hex(v), "0" + oct(v)[2:] if v else "0", "0b" + bin(v)[2:]):
        toks = tokenize(text)
        assert [(t.kind, t.value) for t in toks] == [("int", v)], text
    assert tokenize(f"{v}U")[0].value == v


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_f32_bit_literals(bits):
    (tok,) = tokenize(f"0f{bits:08X}")
    assert tok.kind == "float" and tok.value == FloatLiteral(32, bits)


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_f64_bit_literals(bits):
    (tok,) = tokenize(f"0d{bits:016x}")
    assert tok.value == FloatLiteral(64, bits)


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=0))
def test_decimal_float_literals(x):
    (tok,) = tokenize(repr(x) if "e" in repr(x) or "." in repr(x) else repr(x) + ".0")
    assert tok.kind == "float" and tok.value.width == 0
    assert tok.value.value == x
    assert tok.value.bits == struct.unpack("<Q", struct.pack("<d", x))[0]


def test_parse_int_suffix_and_octal():
    assert parse_int("0x10U") == 16
    assert parse_int("017") == 15
    assert parse_int("0") == 0


def test_comments_and_line_numbers():
    toks = tokenize("a // one\n/* two\nthree */ b\n\nc")
    assert [(t.value, t.line) for t in toks] == [("a", 1), ("b", 3), ("c", 5)]


def test_bad_character_names_its_line():
    with pytest.raises(PtxSyntaxError) as e:
        tokenize("mov.u32 %r1, 1;\nmov.u32 %r2, #;\n")
    assert e.value.line == 2
    assert "line 2" in str(e.value) and "#" in str(e.value)


def test_identifier_forms():
    assert kinds("$L__BB0_2 %SP __local_depot0 _Z3fooi %tid") == [
        ("ident", "$L__BB0_2"), ("ident", "%SP"), ("ident", "__local_depot0"),
        ("ident", "_Z3fooi"), ("ident", "%tid")]
