"""Whatever the validator accepts, the SMs can run: every opcode with every allowed type and
every defined value of the modifier fields it reads decodes, and a sample of them runs
(with operands of the right register files) without anything but page or code faults."""

import itertools
import random
import struct

import numpy as np
import pytest
from smtest import Env, smasm

from pvgpu.host.hw.mmu import MmuFault
from pvgpu.host.hw.sm import CodeFault
from pvgpu.host.hw.sm.decode import decode
from pvgpu.host.hw.sm.isa_check import signature_fault, slot_types
from pvgpu.spec import isa

FIELDS = [  # (mask, values)
    (isa.MOD_ROUND_MASK, range(0, 9)), (isa.MOD_SAT, (0, isa.MOD_SAT)),
    (isa.MOD_FTZ, (0, isa.MOD_FTZ)), (isa.MOD_APPROX, (0, isa.MOD_APPROX)),
    (isa.MOD_VARIANT_MASK, range(0, 7)), (isa.MOD_CMP_MASK, range(0, 19)),
    (isa.MOD_BOOL_MASK, range(0, 4)), (isa.MOD_NEG_C, (0, isa.MOD_NEG_C)),
    (isa.MOD_SPACE_MASK, range(0, 6)), (isa.MOD_VOLATILE, (0, isa.MOD_VOLATILE)),
    (isa.MOD_ATOM_MASK, range(0, 11)),
]


def _shift(mask):
    return (mask & -mask).bit_length() - 1


def mods_of(spec):
    """Every combination of defined field values among the fields the opcode reads."""
    fields = [(m, v) for m, v in FIELDS if spec.mods & m]
    for combo in itertools.product(*(v for _, v in fields)):
        mod = 0
        for (m, _), val in zip(fields, combo):
            mod |= val if m & (m - 1) == 0 else val << _shift(m)
        yield mod


def operands(op, t, t2, mod):
    """A valid operand per slot: registers of the role's file (index 1), or none."""
    spec = isa.OPCODES[op]
    types = slot_types(op, t, t2, mod)
    out = []
    for slot, (role, ty) in enumerate(zip(spec.roles, types)):
        r = role.rstrip("?")
        if r == "-" or (ty in (None, isa.TYPE_NONE) and r != "A"):
            out.append(isa.OPND_NONE)
        elif r == "A":
            out.append(isa.operand(isa.OPND_R64, 1))
        else:
            out.append(isa.operand(isa.register_file(ty), 1))
    return out


def accepted():
    sigs = []
    for op, spec in sorted(isa.OPCODES.items()):
        t2s = sorted(isa.OPCODES[isa.OP_CVT].types) if op in (isa.OP_CVT, isa.OP_SET,
                                                                isa.OP_SLCT) else [0]
        for t in sorted(spec.types):
            for t2 in t2s:
                for mod in mods_of(spec):
                    kinds = operands(op, t, t2, mod)
                    for drop_c in (False, True):
                        k = list(kinds)
                        if drop_c:
                            k[4] = isa.OPND_NONE
                        sig = (op, t, t2, mod, 0, tuple(v >> isa.OPND_KIND_SHIFT for v in k))
                        if signature_fault(*sig) is None:
                            sigs.append((op, t, t2, mod, k))
    return sigs


SIGS = accepted()


def test_every_opcode_has_accepted_signatures():
    assert {s[0] for s in SIGS} == set(isa.OPCODES) and len(SIGS) > 10000


class _Prog:
    data_va = const_va = 0
    start = 0

    def __init__(self, recs):
        self.code = recs

    def instruction_offset(self, pc):
        return pc * isa.INSTR_SIZE


def test_every_accepted_signature_decodes():
    raws = [isa.encode_instruction(op, t, type2=t2, mod=mod, d=k[0], d2=k[1], a=k[2], b=k[3],
                                   c=k[4]) for op, t, t2, mod, k in SIGS]
    recs = np.frombuffer(b"".join(raws), isa.INSTR_DTYPE)
    prog = _Prog(recs)
    for pc in range(len(raws)):
        decode(prog, pc)


@pytest.fixture(scope="module")
def env():
    return Env(128 << 20)


def test_a_sample_of_accepted_signatures_runs(env):
    rng = random.Random(11)
    sample = rng.sample(SIGS, 400)
    for op, t, t2, mod, k in sample:
        if op == isa.OP_TRAP:
            continue
        lines = [isa.encode_instruction(op, t, type2=t2, mod=mod, d=k[0], d2=k[1], a=k[2],
                                        b=k[3], c=k[4], imm=0),
                 isa.encode_instruction(isa.OP_EXIT)]
        if op == isa.OP_BRA:
            lines[0] = isa.encode_instruction(op, imm=1)
        entry = struct.pack(isa.COBJ_ENTRY_FORMAT, 0, 1, 0, 2, 4, 4, 4, 0, 0, 0, 64, 16, 0, 0, 0)
        obj = smasm.build_object([entry], [], [], b"k", lines)
        mod_ = env.load(obj)
        try:
            env.run(mod_, block=40, params=b"")
        except (CodeFault, MmuFault):
            pass
