"""A structural check of a code object against the instruction rules (spec/isa.md
ISA-VALID-1..5, ISA-ENC-2), written from spec/isa.py alone.

The device validates every object it runs and is the authority; this check exists so the
compiler's own tests catch a malformed object before any device sees it: opcodes, types
and modifier bits, each operand slot against its role (register files and counts,
immediates, special registers, segment addresses), guards, branch targets, memory spaces
and the last-instruction rule of every entry.
"""

from __future__ import annotations

from pvgpu.guest.jit.codeobject import CodeObject, format_instruction, read_code_object
from pvgpu.spec import isa

_SLOTS = ("d", "d2", "a", "b", "c")
_REG_KINDS = (isa.OPND_R32, isa.OPND_R64, isa.OPND_PRED)
_ST_SPACES = (isa.SPACE_GENERIC, isa.SPACE_GLOBAL, isa.SPACE_SHARED, isa.SPACE_LOCAL)
_ATOM_SPACES = (isa.SPACE_GENERIC, isa.SPACE_GLOBAL, isa.SPACE_SHARED)
_CVTA_SPACES = (isa.SPACE_GLOBAL, isa.SPACE_SHARED, isa.SPACE_LOCAL, isa.SPACE_CONST)


class VerifyError(ValueError):
    """A code object breaks an instruction rule; the message names the instruction."""


def _wide(t: int) -> int:
    name = isa.TYPE_NAMES[t]
    return isa.TYPES_BY_NAME[name[0] + str(2 * int(name[1:]))]


def _slot_type(rec, slot: str, role: str) -> int:
    op, t, t2, mod = int(rec["op"]), int(rec["type"]), int(rec["type2"]), int(rec["mod"])
    r = role.rstrip("?")
    if r == "T2":
        return t2
    if r == "U":
        return isa.TYPE_U32
    if r == "P":
        return isa.TYPE_PRED
    if r == "A":
        return isa.TYPE_U64
    if op in (isa.OP_MUL, isa.OP_MAD) and \
            isa.mod_field(mod, isa.MOD_VARIANT_MASK) == isa.VAR_WIDE and \
            (slot == "d" or (op == isa.OP_MAD and slot == "c")):
        return _wide(t)
    return t


def check_instruction(rec, entry, obj: CodeObject) -> str | None:
    """The first rule instruction `rec` of `entry` breaks, or None."""
    op = int(rec["op"])
    spec = isa.OPCODES.get(op)
    if spec is None:
        return "unknown opcode"
    t, mod = int(rec["type"]), int(rec["mod"])
    if t not in spec.types:
        return f"type {isa.TYPE_NAMES.get(t, t)} not allowed"
    if mod & ~spec.mods:
        return f"modifier bits {mod & ~spec.mods:#x} not allowed"
    if int(rec["reserved"]):
        return "reserved field not zero"
    counts = {isa.OPND_R32: entry.n_r32, isa.OPND_R64: entry.n_r64, isa.OPND_PRED: entry.n_pred}
    n_imm = 0
    for slot, role in zip(_SLOTS, spec.roles):
        opnd = int(rec[slot])
        kind, value = isa.operand_kind(opnd), isa.operand_value(opnd)
        if role == "-":
            if opnd:
                return f"{slot} must be empty"
            continue
        if kind == isa.OPND_NONE:
            if value:
                return f"{slot}: empty operand with a value"
            if role.endswith("?") or role.startswith("A"):
                continue
            return f"{slot} missing"
        is_dest = slot == "d" or (slot == "d2" and op != isa.OP_BFI)
        vt = _slot_type(rec, slot, role)
        if kind in _REG_KINDS:
            if role.startswith("A"):
                if kind not in (isa.OPND_R32, isa.OPND_R64):
                    return f"{slot}: an address register must be R32 or R64"
            elif kind != isa.register_file(vt):
                return f"{slot}: {isa.OPND_KIND_NAMES[kind]} register for a {isa.TYPE_NAMES.get(vt)}"
            if value >= counts[kind]:
                return f"{slot}: register {value} beyond the entry's {counts[kind]}"
            continue
        if is_dest:
            return f"{slot}: a destination must be a register"
        if kind == isa.OPND_IMM:
            n_imm += 1
            if role.startswith("P"):
                return f"{slot}: immediate predicate"
        elif kind == isa.OPND_SIMM:
            if not (role.startswith(("U", "A")) or vt in isa.INT_TYPES):
                return f"{slot}: SIMM for a non-integer operand"
        elif kind == isa.OPND_SREG:
            if op != isa.OP_MOV or slot != "a":
                return f"{slot}: special register outside mov"
            if value not in isa.SREG_NAMES:
                return f"{slot}: unknown special register {value}"
            width = 64 if value in isa.SREGS_64 else 32
            if isa.TYPE_BITS.get(t) != width:
                return f"{slot}: special register of {width} bits read as {isa.TYPE_NAMES[t]}"
        elif kind in (isa.OPND_DATA, isa.OPND_CONST):
            if not (role.startswith("A") or (vt in isa.INT_TYPES and isa.TYPE_BITS[vt] == 64)):
                return f"{slot}: segment address where no address is expected"
            limit = obj.data_size if kind == isa.OPND_DATA else obj.const_size
            if value >= limit:
                return f"{slot}: segment offset {value} outside the segment ({limit})"
            if op in (isa.OP_LD, isa.OP_ST, isa.OP_ATOM, isa.OP_RED):
                space = isa.mod_field(mod, isa.MOD_SPACE_MASK)
                if space not in (isa.SPACE_GENERIC, isa.SPACE_GLOBAL, isa.SPACE_CONST):
                    return f"{slot}: segment address used in space {isa.SPACE_NAMES[space]}"
        else:
            return f"{slot}: operand kind {kind}"
    if n_imm > 1:
        return "more than one IMM operand"
    if n_imm and op == isa.OP_BRA:
        return "IMM operand in a branch"
    guard = int(rec["guard"])
    if guard & ~(isa.GUARD_ON | isa.GUARD_NEG | isa.GUARD_INDEX):
        return "bad guard"
    if guard and not guard & isa.GUARD_ON:
        return "guard bits without GUARD_ON"
    if guard & isa.GUARD_ON and (guard & isa.GUARD_INDEX) >= entry.n_pred:
        return "guard predicate beyond the entry's predicates"
    if op == isa.OP_BRA:
        tgt = int(rec["imm"])
        if not entry.code_start <= tgt < entry.code_start + entry.code_count:
            return f"branch target {tgt} outside the entry"
    space = isa.mod_field(mod, isa.MOD_SPACE_MASK)
    if op == isa.OP_ST and space not in _ST_SPACES:
        return f"st to space {space}"
    if op in (isa.OP_ATOM, isa.OP_RED) and space not in _ATOM_SPACES:
        return f"atomic on space {space}"
    if op == isa.OP_LD and space not in isa.SPACE_NAMES:
        return f"ld from space {space}"
    if op == isa.OP_CVTA and space not in _CVTA_SPACES:
        return f"cvta with space {space}"
    return None


def verify(obj: CodeObject | bytes) -> CodeObject:
    """Check every entry's instructions; raise VerifyError naming the first bad one."""
    if not isinstance(obj, CodeObject):
        obj = read_code_object(obj)
    for e in obj.entries:
        for i in range(e.code_start, e.code_start + e.code_count):
            rec = obj.code[i]
            problem = check_instruction(rec, e, obj)
            if problem:
                raise VerifyError(f"entry {e.name}, instruction {i} "
                                  f"({format_instruction(rec)}): {problem}")
        last = obj.code[e.code_start + e.code_count - 1]
        op = int(last["op"])
        if not (op in (isa.OP_EXIT, isa.OP_TRAP) or (op == isa.OP_BRA and not int(last["guard"]))):
            raise VerifyError(f"entry {e.name} does not end with exit, trap or an unguarded bra "
                              "(ISA-VALID-5)")
    return obj
