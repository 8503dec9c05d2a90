"""The instruction emitter: builds one entry's ISA code (spec/isa.md §2) and legalizes it.

The lowering (guest/jit/lower.py) emits instructions with symbolic operands: registers
(`Reg`), immediates already in the bits of the operand's type (`Imm`), special registers
(`SReg`) and segment addresses (`Seg`). The emitter turns each immediate into an
`OPND_SIMM` when it fits 28 bits (integer roles only, ISA-ENC-2) and otherwise into the
instruction's single `OPND_IMM`; when `imm` is already taken (another immediate, a memory
offset, a branch target) it first moves the value into a scratch register. Scratch
registers are numbered after every PTX register of the entry, so they are resolved only
when the entry is finished. Labels are resolved to instruction indices relative to the
entry's first instruction (the code-object builder rebases them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np

from pvgpu.spec import isa

FILES = (isa.OPND_R32, isa.OPND_R64, isa.OPND_PRED)
_SLOTS = ("d", "d2", "a", "b", "c")


class Reg(NamedTuple):
    file: int  # OPND_R32 / OPND_R64 / OPND_PRED
    index: int
    scratch: bool = False


class Imm(NamedTuple):
    bits: int  # the value as bits of the operand's type (two's complement for integers)


class SReg(NamedTuple):
    sreg: int


class Seg(NamedTuple):
    kind: int  # OPND_DATA or OPND_CONST
    offset: int


class Label:
    __slots__ = ("index", "name")

    def __init__(self, name: str = ""):
        self.index: Optional[int] = None
        self.name = name


@dataclass
class Ins:
    op: int
    type: int
    type2: int
    mod: int
    guard: int
    d: object
    d2: object
    a: object
    b: object
    c: object
    imm: int
    target: Optional[Label]
    line: int


def type_bits(t: int) -> int:
    return isa.TYPE_BITS[t]


def is_int_type(t: int) -> bool:
    return t in isa.INT_TYPES


def fits_simm(bits: int, width: int) -> tuple[bool, int]:
    """Whether `bits` (a value of `width` bits) fits a SIMM operand, and its signed value."""
    v = bits & ((1 << width) - 1)
    if v >> (width - 1):
        v -= 1 << width
    return -(1 << 27) <= v < (1 << 27), v


def role_type(op: int, role: str, slot: str, t: int, t2: int, mod: int) -> int:
    """The type of the value in one operand slot (for immediates and register files)."""
    r = role.rstrip("?")
    if r == "T2":
        return t2
    if r == "U":
        return isa.TYPE_U32
    if r == "A":
        return isa.TYPE_U64
    if r == "P":
        return isa.TYPE_PRED
    if op in (isa.OP_MUL, isa.OP_MAD) and isa.mod_field(mod, isa.MOD_VARIANT_MASK) == isa.VAR_WIDE \
            and (slot == "d" or (op == isa.OP_MAD and slot == "c")):
        return wide_type(t)
    return t


def wide_type(t: int) -> int:
    name = isa.TYPE_NAMES[t]
    return isa.TYPES_BY_NAME[name[0] + str(2 * int(name[1:]))]


def mov_type_for(t: int) -> int:
    """A type `mov` accepts for moving a value of type t into a register."""
    if t == isa.TYPE_PRED:
        return isa.TYPE_PRED
    return t if t in isa.OPCODES[isa.OP_MOV].types else isa.TYPE_B32


class Emitter:
    """One entry's instructions, registers, scratch registers and labels."""

    def __init__(self):
        self.code: list[Ins] = []
        self.guard = 0  # the guard applied to everything emitted (set per PTX instruction)
        self.line = 0
        self.next_reg = {f: 0 for f in FILES}
        self.max_reg = {f: 0 for f in FILES}
        self.scratch_used = {f: 0 for f in FILES}  # during the current PTX instruction
        self.max_scratch = {f: 0 for f in FILES}
        self.labels: list[Label] = []

    # ---------------------------------------------------------------- registers
    def alloc(self, file: int) -> Reg:
        i = self.next_reg[file]
        self.next_reg[file] = i + 1
        if i + 1 > self.max_reg[file]:
            self.max_reg[file] = i + 1
        return Reg(file, i)

    def mark(self) -> dict:
        return dict(self.next_reg)

    def release(self, mark: dict) -> None:
        self.next_reg = dict(mark)

    def scratch(self, file: int) -> Reg:
        k = self.scratch_used[file]
        self.scratch_used[file] = k + 1
        if k + 1 > self.max_scratch[file]:
            self.max_scratch[file] = k + 1
        return Reg(file, k, True)

    def begin(self, line: int, guard: int) -> int:
        """Start the instructions of one PTX statement; scratch registers are reused."""
        self.line = line
        self.guard = guard
        for f in FILES:
            self.scratch_used[f] = 0
        return len(self.code)

    # ---------------------------------------------------------------- labels
    def label(self, name: str = "") -> Label:
        lab = Label(name)
        self.labels.append(lab)
        return lab

    def place(self, label: Label) -> None:
        label.index = len(self.code)

    # ---------------------------------------------------------------- emission
    def emit(self, op: int, type_: int = isa.TYPE_NONE, *, type2: int = isa.TYPE_NONE,
             mod: int = 0, d=None, d2=None, a=None, b=None, c=None, offset: int = 0,
             target: Optional[Label] = None, guard: Optional[int] = None) -> None:
        spec = isa.OPCODES[op]
        guard = self.guard if guard is None else guard
        vals = {"d": d, "d2": d2, "a": a, "b": b, "c": c}
        imm_taken = target is not None or offset != 0
        imm_value = offset if offset else 0
        out = {}
        for slot, role in zip(_SLOTS, spec.roles):
            v = vals[slot]
            if not isinstance(v, Imm):
                out[slot] = v
                continue
            rt = role_type(op, role, slot, type_, type2, mod)
            if is_int_type(rt) or rt == isa.TYPE_U64:
                ok, sv = fits_simm(v.bits, type_bits(rt))
                if ok:
                    out[slot] = ("simm", sv)
                    continue
            if not imm_taken:
                imm_taken = True
                imm_value = v.bits
                out[slot] = ("imm",)
                continue
            s = self.scratch(isa.register_file(rt))
            self.code.append(Ins(isa.OP_MOV, mov_type_for(rt), 0, 0, guard, s, None, ("imm",),
                                 None, None, v.bits, None, self.line))
            out[slot] = s
        self.code.append(Ins(op, type_, type2, mod, guard, out["d"], out["d2"], out["a"],
                             out["b"], out["c"], imm_value, target, self.line))

    def materialize(self, value, type_: int) -> Reg:
        """A register holding `value` (a Reg is returned as it is)."""
        if isinstance(value, Reg):
            return value
        if type_ == isa.TYPE_PRED:
            s = self.scratch(isa.OPND_PRED)
            cmp_ = isa.CMP_EQ if (value.bits & 1) else isa.CMP_NE
            self.emit(isa.OP_SETP, isa.TYPE_U32, mod=cmp_ << isa.MOD_CMP_SHIFT, d=s,
                      a=Imm(0), b=Imm(0))
            return s
        s = self.scratch(isa.register_file(type_))
        self.emit(isa.OP_MOV, mov_type_for(type_), d=s, a=value)
        return s

    # ---------------------------------------------------------------- finishing
    def finish(self) -> tuple[bytes, int, int, int]:
        """-> (code bytes with entry-relative branch targets, n_r32, n_r64, n_pred)."""
        last = self.code[-1] if self.code else None
        ends = last is not None and (last.op in (isa.OP_EXIT, isa.OP_TRAP) or
                                     (last.op == isa.OP_BRA and not last.guard))
        if not ends or any(lab.index == len(self.code) for lab in self.labels):
            self.code.append(Ins(isa.OP_EXIT, 0, 0, 0, 0, None, None, None, None, None, 0,
                                 None, self.line))
        base = self.max_reg
        recs = np.zeros(len(self.code), dtype=isa.INSTR_DTYPE)

        def enc(v) -> int:
            if v is None:
                return 0
            if isinstance(v, Reg):
                idx = v.index + (base[v.file] if v.scratch else 0)
                return isa.operand(v.file, idx)
            if isinstance(v, tuple) and v and v[0] == "simm":
                return isa.operand(isa.OPND_SIMM, v[1])
            if isinstance(v, tuple) and v and v[0] == "imm":
                return isa.operand(isa.OPND_IMM, 0)
            if isinstance(v, SReg):
                return isa.operand(isa.OPND_SREG, v.sreg)
            if isinstance(v, Seg):
                return isa.operand(v.kind, v.offset)
            raise TypeError(f"cannot encode operand {v!r}")

        for i, ins in enumerate(self.code):
            imm = ins.imm
            if ins.target is not None:
                if ins.target.index is None:
                    raise AssertionError(f"label {ins.target.name} never placed")
                imm = ins.target.index
            recs[i] = (ins.op, ins.type, ins.type2, ins.mod, ins.guard, 0, enc(ins.d),
                       enc(ins.d2), enc(ins.a), enc(ins.b), enc(ins.c),
                       imm & 0xFFFF_FFFF_FFFF_FFFF)
        counts = [base[f] + self.max_scratch[f] for f in FILES]
        return recs.tobytes(), counts[0], counts[1], counts[2]
