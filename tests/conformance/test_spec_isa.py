"""spec/isa.md and spec/isa.py: clause IDs are unique and every cited one exists, every
constant the text names is defined, and the opcode table is well formed (the contract
between the guest's compiler and the device's SMs)."""

import re
import struct
from pathlib import Path

import numpy as np
import pytest

from pvgpu.spec import isa

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "spec" / "isa.md").read_text()
CLAUSE = re.compile(r"^\[((?:COBJ|ISA|SM)(?:-[A-Z0-9]+)+)\]", re.M)
CITED = re.compile(r"\b((?:COBJ|ISA|SM)-[A-Z]+-[A-Z0-9]+)\b")
ROLES = {"-", "T", "T2", "W", "P", "U", "A", "D", "P?", "U?", "T?", "D?"}


def test_clause_ids_are_unique_and_cited_ones_exist():
    ids = CLAUSE.findall(TEXT)
    assert len(ids) > 30 and len(ids) == len(set(ids))
    cited = set(CITED.findall(TEXT))
    for folder in ("tests", "host", "guest", "spec"):
        for path in (ROOT / folder).rglob("*.py"):
            cited |= set(CITED.findall(path.read_text()))
    assert sorted(cited - set(ids)) == []


def test_named_constants_exist():
    prefixes = ("COBJ_", "INSTR_", "OPND_", "TYPE_", "SREG_", "MOD_", "RND_", "VAR_", "CMP_",
                "BOOL_", "SPACE_", "ATOM_", "OP_", "GUARD_", "GENERIC_", "MAX_", "WARP_",
                "NUM_", "SM_", "CLOCK_")
    named = set(re.findall(r"`((?:%s)[A-Z0-9_]+)`" % "|".join(prefixes), TEXT))
    wire_names = {"OP_BRA"}  # (all ISA opcodes live in spec/isa.py)
    assert named and sorted(n for n in named - wire_names if not hasattr(isa, n)
                            and not n.endswith("_")) == []


def test_struct_formats_and_sizes():
    assert struct.calcsize(isa.COBJ_HEADER_FORMAT) == isa.COBJ_HEADER_SIZE == 96
    assert struct.calcsize(isa.COBJ_ENTRY_FORMAT) == isa.COBJ_ENTRY_SIZE
    assert len(isa.COBJ_ENTRY_FIELDS) == len(struct.unpack(isa.COBJ_ENTRY_FORMAT,
                                                           bytes(isa.COBJ_ENTRY_SIZE)))
    assert len(isa.COBJ_HEADER_FIELDS) == len(struct.unpack(isa.COBJ_HEADER_FORMAT,
                                                            bytes(isa.COBJ_HEADER_SIZE)))
    header = dict(zip(isa.COBJ_HEADER_FIELDS, struct.unpack(isa.COBJ_HEADER_FORMAT,
                                                             bytes(range(96)))))
    assert header["data_va"] == int.from_bytes(bytes(range(96))[isa.COBJ_DATA_VA_OFFSET:][:8],
                                               "little")
    raw = isa.encode_instruction(isa.OP_ADD, isa.TYPE_S32, d=isa.operand(isa.OPND_R32, 3),
                                 imm=-1)
    rec = np.frombuffer(raw, isa.INSTR_DTYPE)[0]
    assert len(raw) == isa.INSTR_SIZE and rec["op"] == isa.OP_ADD and rec["imm"] == 2**64 - 1


def test_opcode_table_is_well_formed():
    names = set()
    for op, spec in isa.OPCODES.items():
        assert op == spec.opcode and 0 <= op < 1 << 16 and spec.name not in names
        names.add(spec.name)
        assert len(spec.roles) == 5 and set(spec.roles) <= ROLES, spec
        assert spec.types and spec.types <= set(isa.TYPE_NAMES), spec
        assert spec.mods & ~isa.MOD_KNOWN == 0, spec


@pytest.mark.parametrize("value", [0, 1, -1, (1 << 27) - 1, -(1 << 27), 12345, -777])
def test_simm_operands_round_trip(value):
    opnd = isa.operand(isa.OPND_SIMM, value)
    assert isa.operand_kind(opnd) == isa.OPND_SIMM and isa.operand_value(opnd) == value


@pytest.mark.parametrize("value", [1 << 27, -(1 << 27) - 1])
def test_simm_out_of_range_is_refused(value):
    with pytest.raises(ValueError):
        isa.operand(isa.OPND_SIMM, value)


def test_register_files():
    assert isa.register_file(isa.TYPE_PRED) == isa.OPND_PRED
    assert {isa.register_file(t) for t in (isa.TYPE_U64, isa.TYPE_F64, isa.TYPE_B64)} == {isa.OPND_R64}
    assert {isa.register_file(t) for t in (isa.TYPE_U8, isa.TYPE_F16, isa.TYPE_S32,
                                           isa.TYPE_F32)} == {isa.OPND_R32}


def test_mod_fields_do_not_overlap():
    fields = [isa.MOD_ROUND_MASK, isa.MOD_SAT, isa.MOD_FTZ, isa.MOD_APPROX, isa.MOD_CC,
              isa.MOD_VARIANT_MASK, isa.MOD_CMP_MASK, isa.MOD_BOOL_MASK, isa.MOD_NEG_C,
              isa.MOD_SPACE_MASK, isa.MOD_VOLATILE, isa.MOD_ATOM_MASK]
    seen = 0
    for f in fields:
        assert seen & f == 0
        seen |= f
    mod = (isa.CMP_GEU << isa.MOD_CMP_SHIFT) | (isa.SPACE_SHARED << isa.MOD_SPACE_SHIFT)
    assert isa.mod_field(mod, isa.MOD_CMP_MASK) == isa.CMP_GEU
    assert isa.mod_field(mod, isa.MOD_SPACE_MASK) == isa.SPACE_SHARED
