"""Code objects: builder/reader round trip (COBJ-LAYOUT-*), malformed objects refused,
the disassembler's text."""

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pvgpu.guest.jit.codeobject import (CodeObjectBuilder, CodeObjectError, ParamInfo,
                                  disassemble, format_instruction, read_code_object)
from pvgpu.spec import isa

SCALARS = [t for t in isa.TYPE_BITS if t != isa.TYPE_PRED]


def exit_code(n: int = 1) -> bytes:
    return isa.encode_instruction(isa.OP_NOP) * (n - 1) + isa.encode_instruction(isa.OP_EXIT)


@st.composite
def params(draw):
    out, off = [], 0
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            t = draw(st.sampled_from(SCALARS))
            size = isa.TYPE_BITS[t] // 8
            align = size
        else:
            t, size = isa.TYPE_B8, draw(st.integers(1, 64))
            align = draw(st.sampled_from([1, 2, 4, 8, 16]))
        off = (off + align - 1) // align * align
        out.append(ParamInfo(off, size, align, t))
        off += size
    return out, off


names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(names, params(), st.integers(1, 5), st.integers(0, 2048)),
                min_size=1, max_size=4),
       st.lists(st.tuples(names, st.booleans(), st.integers(0, 56)), max_size=4),
       st.binary(max_size=40), st.binary(max_size=40))
def test_builder_reader_round_trip(entries, symbols, data_init, const_init):
    b = CodeObjectBuilder()
    for name, (ps, psize), n, shared in entries:
        code = isa.encode_instruction(isa.OP_BRA, imm=0) * (n - 1) + exit_code()
        b.add_entry(name, code, n_r32=3, n_r64=2, n_pred=1, params=ps, param_size=psize,
                    shared_size=shared, local_size=16, max_threads=128)
    data_size = len(data_init) + 64
    const_size = len(const_init) + 64
    for name, is_global, off in symbols:
        b.add_symbol(name, isa.SPACE_GLOBAL if is_global else isa.SPACE_CONST, off, 8)
    b.set_data(data_size, data_init)
    b.set_const(const_size, const_init)
    blob = b.build()
    obj = read_code_object(blob)
    assert obj.size == len(blob) and len(blob) % isa.COBJ_ALIGN == 0
    start = 0
    for e, (name, (ps, psize), n, shared) in zip(obj.entries, entries):
        assert (e.name, list(e.params), e.param_size, e.shared_size) == (name, ps, psize, shared)
        assert (e.code_start, e.code_count, e.n_r32, e.n_r64, e.n_pred) == (start, n, 3, 2, 1)
        assert (e.local_size, e.max_threads) == (16, 128)
        code = obj.entry_code(e)
        # branch targets are rebased to the entry's first instruction
        assert all(int(r["imm"]) == start for r in code[:-1])
        start += n
    assert [(s.name, s.space == isa.SPACE_GLOBAL, s.offset) for s in obj.symbols] == symbols
    assert (obj.data_init, obj.const_init) == (data_init, const_init)
    assert (obj.data_size, obj.const_size) == (data_size, const_size)
    assert obj.entry(entries[-1][0]).name == entries[-1][0]
    assert obj.entry_offset(0) == obj.header["entries_off"]


def one_entry_object(**kw) -> bytes:
    b = CodeObjectBuilder()
    b.add_entry("k", exit_code(), n_r32=1, n_r64=1, n_pred=1,
                params=kw.get("params", []), param_size=kw.get("param_size", 0))
    return b.build()


def patch(blob: bytes, offset: int, fmt: str, value) -> bytes:
    out = bytearray(blob)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


FIELD = {name: struct.calcsize("<4sHH" + "I" * i) for i, name in
         enumerate(isa.COBJ_HEADER_FIELDS[3:21])}


@pytest.mark.parametrize("mutate, message", [
    (lambda b: b"JUNK" + b[4:], "magic"),
    (lambda b: patch(b, 4, "<H", 2), "version"),
    (lambda b: patch(b, FIELD["size"], "<I", len(b) + 8), "size"),
    (lambda b: patch(b, FIELD["entries_off"], "<I", 4), "entries"),
    (lambda b: patch(b, FIELD["code_off"], "<I", FIELD["entries_off"] and
                     struct.unpack_from("<I", b, FIELD["entries_off"])[0]), "overlap"),
    (lambda b: patch(b, FIELD["code_count"], "<I", 10_000), "outside"),
    (lambda b: patch(b, FIELD["data_init_size"], "<I", 8), "data_init"),
    (lambda b: b[:50], "shorter"),
])
def test_malformed_objects_are_refused(mutate, message):
    blob = one_entry_object()
    read_code_object(blob)
    with pytest.raises(CodeObjectError) as e:
        read_code_object(mutate(blob))
    assert message in str(e.value)


def test_parameter_outside_the_buffer_is_refused():
    blob = one_entry_object(params=[ParamInfo(8, 8, 8, isa.TYPE_U64)], param_size=8)
    with pytest.raises(CodeObjectError, match="parameter outside"):
        read_code_object(blob)


def test_disassembly_names_operands_and_modifiers():
    rec = np.frombuffer(isa.encode_instruction(
        isa.OP_LD, isa.TYPE_F32, mod=isa.SPACE_GLOBAL << isa.MOD_SPACE_SHIFT,
        guard=isa.GUARD_ON | isa.GUARD_NEG | 2, d=isa.operand(isa.OPND_R32, 5),
        a=isa.operand(isa.OPND_R64, 3), imm=16), dtype=isa.INSTR_DTYPE)[0]
    assert format_instruction(rec) == "@!p2 ld.global.f32 r5, [rd3+16]"
    rec = np.frombuffer(isa.encode_instruction(
        isa.OP_SETP, isa.TYPE_F32, mod=(isa.CMP_LT << isa.MOD_CMP_SHIFT) |
        (isa.BOOL_AND << isa.MOD_BOOL_SHIFT) | isa.MOD_NEG_C,
        d=isa.operand(isa.OPND_PRED, 1), a=isa.operand(isa.OPND_R32, 1),
        b=isa.operand(isa.OPND_IMM), c=isa.operand(isa.OPND_PRED, 0), imm=0x3F800000),
        dtype=isa.INSTR_DTYPE)[0]
    assert format_instruction(rec) == "setp.lt.and.f32 p1, r1, 1.0f, !p0"
    text = disassemble(one_entry_object())
    assert text.splitlines()[0].startswith(".entry k ()")
    assert text.splitlines()[1].strip() == "0: exit"
