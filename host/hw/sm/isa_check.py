"""Instruction validation: spec/isa.md ISA-VALID-1..6 over an entry's instructions.

The checks split in two:

  * rules that depend only on an instruction's *signature* -- opcode, type, type2, mod,
    the guard's flag bits and the five operand kinds: the opcode exists, its type, type2
    and modifier values are defined for it, each operand kind fits its slot's role
    (OPCODES[op].roles), at most one OPND_IMM, the memory space, atomics and barrier
    forms (signature_fault). A program has few distinct signatures even when it is
    large, so each is checked once, in Python, in the order of its first use;
  * rules that depend on operand values -- register indexes below the entry's counts,
    special registers known and of the type's width, DATA/CONST offsets inside their
    segments, guard predicates below n_pred, branch targets inside the entry, the
    reserved field, the last instruction (ISA-VALID-5) -- checked for all instructions
    at once with numpy.

first_bad_instruction returns the index of the first instruction that breaks any rule
(with the reason, for the log), or None.
"""

from __future__ import annotations

import numpy as np

from pvgpu.spec import isa
from pvgpu.spec.isa import (OPND_CONST, OPND_DATA, OPND_IMM, OPND_NONE, OPND_PRED, OPND_R32,
                      OPND_R64, OPND_SIMM, OPND_SREG)

_KIND_SHIFT = isa.OPND_KIND_SHIFT
_VALUE = isa.OPND_VALUE_MASK
_SLOTS = ("d", "d2", "a", "b", "c")
_REG_KINDS = (OPND_R32, OPND_R64, OPND_PRED)
_INT64 = frozenset({isa.TYPE_B64, isa.TYPE_U64, isa.TYPE_S64})
_WIDE = {isa.TYPE_U16: isa.TYPE_U32, isa.TYPE_S16: isa.TYPE_S32,
         isa.TYPE_U32: isa.TYPE_U64, isa.TYPE_S32: isa.TYPE_S64}
_FLOAT_ROUND_OPS = frozenset({isa.OP_ADD, isa.OP_SUB, isa.OP_MUL, isa.OP_MAD, isa.OP_FMA,
                              isa.OP_DIV, isa.OP_SQRT, isa.OP_RCP})
_SETP_TYPES = isa.OPCODES[isa.OP_SETP].types
_CVT_TYPES = isa.OPCODES[isa.OP_CVT].types
_INT_CMPS = range(isa.CMP_EQ, isa.CMP_HS + 1)
_FLOAT_CMPS = frozenset(range(isa.CMP_EQ, isa.CMP_GE + 1)) | frozenset(
    range(isa.CMP_EQU, isa.CMP_NAN + 1))
_VARIANTS = {  # opcode -> (allowed variant values, 0 allowed)
    isa.OP_PRMT: (range(0, isa.VAR_PRMT_RC16 + 1), True),
    isa.OP_BFIND: ((0, isa.VAR_BFIND_SHIFTAMT), True),
    isa.OP_SHFL: (range(isa.VAR_SHFL_UP, isa.VAR_SHFL_IDX + 1), False),
    isa.OP_VOTE: (range(isa.VAR_VOTE_ALL, isa.VAR_VOTE_BALLOT + 1), False),
    isa.OP_BAR: (range(isa.VAR_BAR_SYNC, isa.VAR_BAR_RED_OR + 1), False),
    isa.OP_CVTA: ((isa.VAR_CVTA_TO_GENERIC, isa.VAR_CVTA_FROM_GENERIC), False),
    isa.OP_TESTP: (range(isa.VAR_TESTP_FINITE, isa.VAR_TESTP_SUBNORMAL + 1), False),
}
_SPACES = {
    isa.OP_LD: frozenset(isa.SPACE_NAMES),
    isa.OP_ST: frozenset({isa.SPACE_GENERIC, isa.SPACE_GLOBAL, isa.SPACE_SHARED,
                          isa.SPACE_LOCAL}),
    isa.OP_ATOM: frozenset({isa.SPACE_GENERIC, isa.SPACE_GLOBAL, isa.SPACE_SHARED}),
    isa.OP_RED: frozenset({isa.SPACE_GENERIC, isa.SPACE_GLOBAL, isa.SPACE_SHARED}),
    isa.OP_CVTA: frozenset({isa.SPACE_GLOBAL, isa.SPACE_SHARED, isa.SPACE_LOCAL,
                            isa.SPACE_CONST}),
}
_SREG_WIDTH = np.zeros(64, np.int8)  # value -> bits (0: unknown)
for _s in isa.SREG_NAMES:
    _SREG_WIDTH[_s] = 64 if _s in isa.SREGS_64 else 32
# guard flag of a signature: 0 none, 1 on, 2 on + negated, 3 bits without GUARD_ON
_GFLAG_BAD = 3


def slot_types(op: int, type_: int, type2: int, mod: int) -> tuple:
    """The type each slot's role refers to (d, d2, a, b, c): TYPE_* or None (no type)."""
    spec = isa.OPCODES[op]
    var = isa.mod_field(mod, isa.MOD_VARIANT_MASK)
    out = []
    for slot, role in enumerate(spec.roles):
        r = role.rstrip("?")
        if r in ("T", "D"):
            t = type_
        elif r == "T2":
            t = type2
        elif r == "U":
            t = isa.TYPE_U32
        elif r == "P":
            t = isa.TYPE_PRED
        else:
            t = None
        if var == isa.VAR_WIDE and op in (isa.OP_MUL, isa.OP_MAD) and (
                slot == 0 or (op == isa.OP_MAD and slot == 4)):
            t = _WIDE.get(type_)
        out.append(t)
    return tuple(out)


def _slot_fault(op, slot, role, kind, t):
    if role == "-":
        return None if kind == OPND_NONE else "operand in an unused slot"
    r = role.rstrip("?")
    if kind == OPND_NONE:  # an address may be the offset alone
        return None if role.endswith("?") or r == "A" else "missing operand"
    dest = slot in (0, 1) and not (op == isa.OP_BFI and slot == 1)
    if r == "A":
        ok = kind in (OPND_R64, OPND_R32, OPND_DATA, OPND_CONST, OPND_SIMM, OPND_IMM)
        return None if ok else "bad address operand"
    if t is None or t == isa.TYPE_NONE:
        return "operand without a type"
    rfile = isa.register_file(t)
    if dest:
        return None if kind == rfile else "destination not a register of its type's file"
    if kind in _REG_KINDS:
        return None if kind == rfile else "register of the wrong file"
    if kind == OPND_IMM:
        return None
    if kind == OPND_SIMM:
        return None if t in isa.INT_TYPES else "SIMM for a non-integer operand"
    if kind == OPND_SREG:
        return None if op == isa.OP_MOV and slot == 2 else "special register outside mov"
    if kind in (OPND_DATA, OPND_CONST):
        return None if t in _INT64 else "DATA/CONST where no 64-bit integer is expected"
    return "unknown operand kind"


def signature_fault(op: int, type_: int, type2: int, mod: int, gflag: int,
                    kinds: tuple) -> str | None:
    """Why an instruction of this signature is invalid, or None (ISA-VALID-1/2/4/6)."""
    spec = isa.OPCODES.get(op)
    if spec is None:
        return f"unknown opcode {op:#x}"
    if type_ not in spec.types:
        return f"type {type_} not allowed for {spec.name}"
    if mod & ~spec.mods:
        return f"modifier bits {mod & ~spec.mods:#x} not read by {spec.name}"
    if gflag == _GFLAG_BAD:
        return "guard without GUARD_ON"
    rnd = mod & isa.MOD_ROUND_MASK
    var = isa.mod_field(mod, isa.MOD_VARIANT_MASK)
    cmp = isa.mod_field(mod, isa.MOD_CMP_MASK)
    boolop = isa.mod_field(mod, isa.MOD_BOOL_MASK)
    space = isa.mod_field(mod, isa.MOD_SPACE_MASK)
    aop = isa.mod_field(mod, isa.MOD_ATOM_MASK)
    is_float = type_ in isa.FLOAT_TYPES
    has_c = kinds[4] != OPND_NONE
    name = spec.name

    # type2 (ISA-VALID-6)
    if op == isa.OP_CVT:
        if type2 not in _CVT_TYPES:
            return "cvt source type"
    elif op == isa.OP_SET:
        if type2 not in _SETP_TYPES:
            return "set comparison type"
    elif op == isa.OP_SLCT:
        if type2 not in (isa.TYPE_S32, isa.TYPE_F32):
            return "slct selector type"
    elif type2:
        return "type2 not 0"

    # rounding and saturation
    if op in _FLOAT_ROUND_OPS:
        if is_float and rnd > isa.RND_RP:
            return "rounding mode"
        if not is_float and rnd:
            return "rounding on an integer type"
    elif op == isa.OP_CVT:
        src_float, dst_float = type2 in isa.FLOAT_TYPES, is_float
        if src_float and not dst_float:
            ok = rnd == 0 or isa.RND_RNI <= rnd <= isa.RND_RPI
        elif dst_float and not src_float:
            ok = rnd <= isa.RND_RP
        elif dst_float:
            ok = rnd <= isa.RND_RPI
        else:
            ok = rnd == 0
        if not ok:
            return "cvt rounding mode"
    elif rnd:
        return "rounding mode"
    if mod & isa.MOD_SAT and not is_float and op in (isa.OP_ADD, isa.OP_SUB, isa.OP_MUL,
                                                      isa.OP_MAD):
        if type_ != isa.TYPE_S32 or op == isa.OP_MUL or (op == isa.OP_MAD and var != isa.VAR_HI):
            return "saturation on an integer type other than s32 add/sub/mad.hi"

    # variants
    if op in (isa.OP_MUL, isa.OP_MAD):
        if is_float and var:
            return "variant on a float mul/mad"
        if var not in (0, isa.VAR_LO, isa.VAR_HI, isa.VAR_WIDE):
            return "mul/mad variant"
        if var == isa.VAR_WIDE and type_ not in _WIDE:
            return "wide multiply of a 64-bit type"
    elif op in _VARIANTS:
        allowed, _ = _VARIANTS[op]
        if var not in allowed:
            return f"{name} variant {var}"
    elif var:
        return "variant"
    if op == isa.OP_VOTE:
        want = isa.TYPE_B32 if var == isa.VAR_VOTE_BALLOT else isa.TYPE_PRED
        if type_ != want:
            return "vote type"

    # comparisons
    if op in (isa.OP_SETP, isa.OP_SET):
        ctype = type_ if op == isa.OP_SETP else type2
        cmps = _FLOAT_CMPS if ctype in isa.FLOAT_TYPES else _INT_CMPS
        if cmp not in cmps:
            return "comparison"
        if (boolop != isa.BOOL_NONE) != has_c:
            return "BOOL_* exactly when c is present"
        if mod & isa.MOD_NEG_C and not has_c:
            return "MOD_NEG_C without c"

    # memory spaces (ISA-VALID-4)
    if op in _SPACES:
        if space not in _SPACES[op]:
            return f"space {space} for {name}"
        if op != isa.OP_CVTA and kinds[2] in (OPND_DATA, OPND_CONST) and space not in (
                isa.SPACE_GENERIC, isa.SPACE_GLOBAL, isa.SPACE_CONST):
            return "DATA/CONST address in a non-global space"
    if op in (isa.OP_ATOM, isa.OP_RED):
        if not isa.ATOM_ADD <= aop <= isa.ATOM_XOR:
            return "atomic operation"
        if is_float and aop != isa.ATOM_ADD:
            return "float atomic other than add"
        if op == isa.OP_ATOM and (aop == isa.ATOM_CAS) != has_c:
            return "c present exactly for cas"
        if op == isa.OP_RED and aop in (isa.ATOM_EXCH, isa.ATOM_CAS):
            return "red.exch / red.cas"

    # barriers
    if op == isa.OP_BAR:
        if var in (isa.VAR_BAR_SYNC, isa.VAR_BAR_ARRIVE):
            if type_ != isa.TYPE_NONE or kinds[0] != OPND_NONE or has_c or mod & isa.MOD_NEG_C:
                return "bar.sync/arrive with a result or predicate"
            if var == isa.VAR_BAR_ARRIVE and kinds[3] == OPND_NONE:
                return "bar.arrive without a thread count"
        else:
            want = isa.TYPE_U32 if var == isa.VAR_BAR_RED_POPC else isa.TYPE_PRED
            if type_ != want or kinds[0] == OPND_NONE or not has_c:
                return "bar.red form"

    # operands (ISA-VALID-2)
    if sum(k == OPND_IMM for k in kinds) > 1:
        return "more than one OPND_IMM"
    types = slot_types(op, type_, type2, mod)
    for slot, (role, kind, t) in enumerate(zip(spec.roles, kinds, types)):
        why = _slot_fault(op, slot, role, kind, t)
        if why:
            return f"{name} operand {_SLOTS[slot]}: {why}"
    return None


def signatures(code: np.ndarray) -> np.ndarray:
    """Per instruction: the signature as a (n, 2) u64 array (see signature_fault)."""
    g = code["guard"].astype(np.uint64)
    on = (g & isa.GUARD_ON) != 0
    gflag = np.where(g == 0, 0, np.where(on, np.where(g & isa.GUARD_NEG, 2, 1), _GFLAG_BAD))
    k1 = (code["op"].astype(np.uint64) | (code["type"].astype(np.uint64) << 16)
          | (code["type2"].astype(np.uint64) << 24) | (code["mod"].astype(np.uint64) << 32))
    k2 = gflag.astype(np.uint64)
    for i, slot in enumerate(_SLOTS):
        k2 |= (code[slot].astype(np.uint64) >> _KIND_SHIFT) << np.uint64(4 + 4 * i)
    return np.stack([k1, k2], axis=1)


def unpack_signature(k1: int, k2: int) -> tuple:
    kinds = tuple((k2 >> (4 + 4 * i)) & 0xF for i in range(5))
    return (k1 & 0xFFFF, (k1 >> 16) & 0xFF, (k1 >> 24) & 0xFF, k1 >> 32, k2 & 0xF, kinds)


def first_bad_instruction(code: np.ndarray, entry, header) -> tuple | None:
    """-> (index in `code`, reason) of the first invalid instruction, or None.

    `code` is the entry's instructions (INSTR_DTYPE), `entry` its EntryRecord,
    `header` the object's Header."""
    n = code.shape[0]
    bad = _value_faults(code, entry, header)
    first = int(bad.argmax()) if bad.any() else n
    reason = "operand value, guard, branch target or reserved field" if first < n else None
    sig = signatures(code)
    keys = np.ascontiguousarray(sig).view(np.dtype((np.void, 16))).ravel()
    _, first_use = np.unique(keys, return_index=True)
    for i in np.sort(first_use).tolist():
        if i >= first:
            break
        why = signature_fault(*unpack_signature(int(sig[i, 0]), int(sig[i, 1])))
        if why:
            first, reason = i, why
            break
    last = code[n - 1]
    if first >= n - 1 and not (int(last["guard"]) == 0 and int(last["op"]) in (
            isa.OP_EXIT, isa.OP_BRA, isa.OP_TRAP)):
        first, reason = n - 1, "the last instruction is not an unguarded exit, bra or trap"
    return (first, reason) if first < n else None


def _value_faults(code: np.ndarray, entry, header) -> np.ndarray:
    """Per instruction: does an operand value, the guard, a branch target or the reserved
    field break a rule? (The kinds themselves are checked by signature.)"""
    bad = code["reserved"] != 0
    limits = {OPND_R32: entry.n_r32, OPND_R64: entry.n_r64, OPND_PRED: entry.n_pred,
              OPND_DATA: header.data_size, OPND_CONST: header.const_size}
    bits = np.zeros(32, np.int8)
    for t, b in isa.TYPE_BITS.items():
        bits[t] = b
    tbits = bits[np.minimum(code["type"], 31)]
    for slot in _SLOTS:
        opnd = code[slot]
        kind = opnd >> _KIND_SHIFT
        value = opnd & _VALUE
        for k, limit in limits.items():
            bad |= (kind == k) & (value >= limit)
        sreg = kind == OPND_SREG
        if sreg.any():
            width = _SREG_WIDTH[np.minimum(value, 63)]
            bad |= sreg & ((width == 0) | (width != tbits))
    guard = code["guard"]
    bad |= ((guard & isa.GUARD_ON) != 0) & ((guard & isa.GUARD_INDEX) >= entry.n_pred)
    bra = code["op"] == isa.OP_BRA
    if bra.any():
        target = code["imm"]
        lo, hi = entry.code_start, entry.code_start + entry.code_count
        bad |= bra & ((target < lo) | (target >= hi))
    return bad
