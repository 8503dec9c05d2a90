"""Decoding: one checked instruction record -> an executable Instr (per program, lazily).

decode(prog, pc) reads the record once and binds what running it needs: the decoded
operands (executor.REG with (file, index), CONST with the value's bits -- IMM and SIMM
taken at the operand's type, DATA/CONST as the segment address --, or SREG), the compute
function from alu.py, the destination and its register file, and the unit that executes
it (ALU, load/store unit, warp unit, branch unit). Data instructions implement
run(batch, act); control instructions (bra, exit, trap, bar) control_run(batch, act,
sub), where sub is the part of the group whose guard holds (None: nobody).
"""

from __future__ import annotations

import struct

import numpy as np

from pvgpu.host.hw.sm import alu, lsu, warp
from pvgpu.host.hw.sm import values as V
from pvgpu.host.hw.sm.codeobject import CodeFault
from pvgpu.host.hw.sm.executor import CONST, EXIT, JUMP, NEXT, REG, SPLIT, SREG
from pvgpu.host.hw.sm.isa_check import slot_types
from pvgpu.spec import isa

_SLOTS = ("d", "d2", "a", "b", "c")


def _operand(prog, rec, slot: str, t):
    """-> decoded operand (kind, x) or None."""
    raw = int(rec[slot])
    kind = raw >> isa.OPND_KIND_SHIFT
    value = raw & isa.OPND_VALUE_MASK
    if kind == isa.OPND_NONE:
        return None
    if kind in (isa.OPND_R32, isa.OPND_R64, isa.OPND_PRED):
        return (REG, (kind, value))
    if kind == isa.OPND_SREG:
        return (SREG, value)
    if kind == isa.OPND_DATA:
        return (CONST, (prog.data_va + value) & V.M64)
    if kind == isa.OPND_CONST:
        return (CONST, (prog.const_va + value) & V.M64)
    if t == isa.TYPE_PRED:
        return (CONST, bool(int(rec["imm"]) & 1))
    bits = isa.TYPE_BITS[t] if t in isa.TYPE_BITS else 64
    width = 32 if bits < 32 else bits  # narrow values live in 32-bit registers
    if kind == isa.OPND_IMM:
        v = int(rec["imm"]) & V.mask_of(bits)
        if t in isa.SIGNED_TYPES and bits < 32:
            v = V.to_signed(v, bits)
    else:  # SIMM: sign-extended to the type
        v = isa.operand_value(raw)
    return (CONST, v & V.mask_of(width))


class Instr:
    control = False
    guard = None

    def __init__(self, pc, rec):
        self.pc = pc
        g = int(rec["guard"])
        if g:
            self.guard = (g & isa.GUARD_INDEX, bool(g & isa.GUARD_NEG))


def _typed_full(b, v, t):
    if isinstance(v, np.ndarray):
        return V.typed(v, t)
    if isinstance(v, V.Lazy):
        return V.typed(v.materialize(b.geo), t)
    return V.scalar(v, t)


def _typed_at(b, v, t, idx):
    if isinstance(v, np.ndarray):
        return V.typed(v[idx], t)
    if isinstance(v, V.Lazy):
        return V.typed(v.at(b.geo, idx), t)
    return V.scalar(v, t)


class AluInstr(Instr):
    """d = fn(sources): every ALU instruction with one result."""

    def __init__(self, pc, rec, a: alu.Alu, srcs, d):
        super().__init__(pc, rec)
        self.fn = a.fn
        self.lin = a.lin
        self.src_types = a.src_types
        self.srcs = srcs
        self.d = d
        self.dst_type = a.dst_type
        self.fdt = V.FILE_DTYPES[isa.register_file(a.dst_type)]

    def run(self, b, act):
        files = b.files
        vals = []
        affine = self.lin is not None  # no operand an array or a Span
        for s in self.srcs:
            kind, x = s
            v = files[x[0]][x[1]] if kind == REG else x if kind == CONST else b.val(s)
            if affine and isinstance(v, (np.ndarray, V.Span)):
                affine = False
            vals.append(v)
        if affine:
            r = self.lin(b.geo, *vals)
            if r is not None:
                b.write(self.d, r, act)
                return
        if act.dense:
            typed = [_typed_full(b, v, t) for v, t in zip(vals, self.src_types)]
            b.write(self.d, _uniform(V.bits(self.fn(*typed), self.dst_type, self.fdt)), act)
        else:
            idx = act.idx
            typed = [_typed_at(b, v, t, idx) for v, t in zip(vals, self.src_types)]
            b.write_at(self.d, _uniform(V.bits(self.fn(*typed), self.dst_type, self.fdt)), act)


def _uniform(v):
    """A one-element array (from uniform operands) -> the uniform value it is."""
    if isinstance(v, np.ndarray) and v.shape == (1,):
        x = v[0]
        return bool(x) if v.dtype == np.bool_ else int(x)
    return v


class MovInstr(Instr):
    """mov of a 32/64-bit or predicate value: the bits move unchanged."""

    def __init__(self, pc, rec, src, d):
        super().__init__(pc, rec)
        self.src = src
        self.d = d

    def run(self, b, act):
        v = b.val(self.src)
        if isinstance(v, np.ndarray):
            if act.dense:
                b.write(self.d, v.copy() if act.full else v, act)
            else:
                b.write_at(self.d, v[act.idx], act)
            return
        b.write(self.d, v, act)


class SetpInstr(Instr):
    def __init__(self, pc, rec, t, mod, srcs, d, d2):
        super().__init__(pc, rec)
        self.t = t
        self.cmp = isa.mod_field(mod, isa.MOD_CMP_MASK)
        self.boolop = isa.mod_field(mod, isa.MOD_BOOL_MASK)
        self.negc = bool(mod & isa.MOD_NEG_C)
        self.ftz = bool(mod & isa.MOD_FTZ)
        self.srcs = srcs
        self.d, self.d2 = d, d2

    def compute(self, b, act):
        vals = [b.val(s) for s in self.srcs[:2]]
        if act.dense:
            a, c = (_typed_full(b, v, self.t) for v in vals)
        else:
            a, c = (_typed_at(b, v, self.t, act.idx) for v in vals)
        r = alu.compare(self.cmp, self.t, a, c, self.ftz)
        p = None
        if self.srcs[2] is not None:
            p = b.at(b.val(self.srcs[2]), None if act.dense else act.idx)
            p = np.logical_xor(p, self.negc)
        return r, p

    def run(self, b, act):
        if act.full and self.boolop == isa.BOOL_NONE and self.d2 is None:
            span = _lin_span(b, self.cmp, self.t, b.val(self.srcs[0]), b.val(self.srcs[1]))
            if span is not None:
                b.write(self.d, span, act)
                return
        r, p = self.compute(b, act)
        w = b.write if act.dense else b.write_at
        d = alu.combine(r, self.boolop, p)
        w(self.d, _pred(d), act)
        if self.d2 is not None:
            w(self.d2, _pred(alu.combine(~r, self.boolop, p)), act)


_FLIP = {isa.CMP_LT: isa.CMP_GT, isa.CMP_GT: isa.CMP_LT, isa.CMP_LE: isa.CMP_GE,
         isa.CMP_GE: isa.CMP_LE, isa.CMP_LO: isa.CMP_HI, isa.CMP_HI: isa.CMP_LO,
         isa.CMP_LS: isa.CMP_HS, isa.CMP_HS: isa.CMP_LS}
_UNSIGNED_CMP = {isa.CMP_LO: isa.CMP_LT, isa.CMP_LS: isa.CMP_LE, isa.CMP_HI: isa.CMP_GT,
                 isa.CMP_HS: isa.CMP_GE}


def _lin_span(b, cmp, t, x, y):
    """setp of an affine thread index against a uniform bound -> the predicate as a
    values.Span (or bool), or None when it is not one run of lanes."""
    if t not in isa.INT_TYPES or isa.TYPE_BITS[t] not in (32, 64) or cmp not in _FLIP:
        return None
    if isinstance(x, V.Lin) and type(y) is int:
        lin, n = x, y
    elif isinstance(y, V.Lin) and type(x) is int:
        lin, n, cmp = y, x, _FLIP[cmp]
    else:
        return None
    geo = b.geo
    s = lin.stride(geo.T)
    if not s:
        return None
    bits = isa.TYPE_BITS[t]
    signed = t in isa.SIGNED_TYPES and cmp not in _UNSIGNED_CMP
    cmp = _UNSIGNED_CMP.get(cmp, cmp)
    s = V.to_signed(s, bits)
    c0 = V.to_signed(lin.c0, bits) if signed else lin.c0
    n = V.to_signed(n, bits) if signed else n & V.mask_of(bits)
    last = c0 + s * (geo.N - 1)
    lo_dom, hi_dom = (-(1 << (bits - 1)), 1 << (bits - 1)) if signed else (0, 1 << bits)
    if not (lo_dom <= min(c0, last) and max(c0, last) < hi_dom):
        return None  # the values wrap within the batch
    N = geo.N
    if s > 0:  # c0 + s*i CMP n
        first_ge = -(-(n - c0) // s)  # smallest i with value >= n
        first_gt = (n - c0) // s + 1  # smallest i with value > n
        lanes = {isa.CMP_GE: (first_ge, N), isa.CMP_GT: (first_gt, N),
                 isa.CMP_LT: (0, first_ge), isa.CMP_LE: (0, first_gt)}[cmp]
    else:
        m = -s
        last_ge = (c0 - n) // m  # largest i with value >= n
        last_gt = -(-(c0 - n) // m) - 1  # largest i with value > n
        lanes = {isa.CMP_GE: (0, last_ge + 1), isa.CMP_GT: (0, last_gt + 1),
                 isa.CMP_LT: (last_ge + 1, N), isa.CMP_LE: (last_gt + 1, N)}[cmp]
    return V.make_span(lanes[0], lanes[1], N)


def _pred(x):
    x = np.asarray(x, dtype=bool)
    return bool(x) if x.ndim == 0 else x


class SetInstr(SetpInstr):
    def __init__(self, pc, rec, t, t2, mod, srcs, d):
        super().__init__(pc, rec, t2, mod, srcs, d, None)
        self.dst_type = t

    def run(self, b, act):
        r, p = self.compute(b, act)
        r = np.asarray(alu.combine(r, self.boolop, p), dtype=bool)
        if self.dst_type == isa.TYPE_F32:
            out = np.where(r, np.float32(1.0), np.float32(0.0)).view(np.uint32)
        else:
            out = np.where(r, np.uint32(0xFFFFFFFF), np.uint32(0))
        out = int(out) if out.ndim == 0 else out
        (b.write if act.dense else b.write_at)(self.d, out, act)


class MemInstr(Instr):
    def __init__(self, pc, rec, prog, t):
        super().__init__(pc, rec)
        mod = int(rec["mod"])
        self.type = t
        self.space = isa.mod_field(mod, isa.MOD_SPACE_MASK)
        self.dtype = V.TYPE_DTYPES[t]
        self.fdt = V.FILE_DTYPES[isa.register_file(t)]
        kinds = [int(rec[s]) >> isa.OPND_KIND_SHIFT for s in _SLOTS]
        imm_used = isa.OPND_IMM in kinds
        a_kind = kinds[2]
        if a_kind == isa.OPND_NONE:
            self.addr = None
        elif a_kind == isa.OPND_R32:
            self.addr = (REG, (isa.OPND_R32, int(rec["a"]) & isa.OPND_VALUE_MASK))
        else:
            self.addr = _operand(prog, rec, "a", isa.TYPE_U64)
        self.offset = 0 if imm_used else V.to_signed(int(rec["imm"]), 64)


class LdInstr(MemInstr):
    def __init__(self, pc, rec, prog, t, d):
        super().__init__(pc, rec, prog, t)
        self.d = d
        w = self.dtype.itemsize
        # ld.param of a fixed, aligned offset whose value fills the register: its bits
        # unpacked at once (lsu.load checks the offset against the buffer otherwise)
        self.param = None
        if (self.space == isa.SPACE_PARAM and self.addr is None and self.offset >= 0
                and self.offset % w == 0 and w == self.fdt.itemsize and t != isa.TYPE_PRED):
            self.param = _PARAM_BITS[w]

    def run(self, b, act):
        buf = b.launch.params
        if self.param is not None and self.offset + self.param.size <= buf.shape[0]:
            b.write_at(self.d, self.param.unpack_from(buf, self.offset)[0], act)
            return
        lsu.load(b, act, self)


_PARAM_BITS = {4: struct.Struct("<I"), 8: struct.Struct("<Q")}


class StInstr(MemInstr):
    def __init__(self, pc, rec, prog, t, value):
        super().__init__(pc, rec, prog, t)
        self.value = value

    def run(self, b, act):
        lsu.store(b, act, self)


class AtomInstr(MemInstr):
    def __init__(self, pc, rec, prog, t, d, bsrc, csrc):
        super().__init__(pc, rec, prog, t)
        self.aop = isa.mod_field(int(rec["mod"]), isa.MOD_ATOM_MASK)
        self.d = d
        self.b = bsrc
        self.c = csrc

    def run(self, b, act):
        lsu.atomic(b, act, self)


class WarpInstr(Instr):
    def __init__(self, pc, rec, fn, **kw):
        super().__init__(pc, rec)
        self.fn = fn
        self.__dict__.update(kw)

    def run(self, b, act):
        self.fn(b, act, self)


class NopInstr(Instr):
    def run(self, b, act):
        pass


class BraInstr(Instr):
    control = True

    def __init__(self, pc, rec, target):
        super().__init__(pc, rec)
        self.target = target

    def control_run(self, b, act, sub):
        if sub is None:
            return NEXT
        b.target = self.target
        if sub is act:
            return JUMP
        b.taken = sub
        return SPLIT


class ExitInstr(Instr):
    control = True

    def control_run(self, b, act, sub):
        if sub is None:
            return NEXT
        b.taken = sub
        return EXIT


class TrapInstr(Instr):
    control = True

    def __init__(self, pc, rec, address_offset):
        super().__init__(pc, rec)
        self.address_offset = address_offset

    def control_run(self, b, act, sub):
        if sub is None:
            return NEXT
        raise CodeFault((b.launch.object_va + self.address_offset) & V.M64,
                        isa.COBJ_ERR_TRAP, "trap")


class BarInstr(Instr):
    control = True

    def __init__(self, pc, rec, var, d, a, bsrc, c, neg):
        super().__init__(pc, rec)
        self.var = var
        self.d = d
        self.a = a
        self.bsrc = bsrc
        self.c = c
        self.neg = neg
        self.red_kind = var if var >= isa.VAR_BAR_RED_POPC else None
        self.red = self.red_kind

    def control_run(self, b, act, sub):
        if sub is None:
            return NEXT
        bar_id = _full_or_int(b, b.val(self.a)) if self.a is not None else 0
        count = _full_or_int(b, b.val(self.bsrc)) if self.bsrc is not None else None
        red = None
        if self.red_kind is not None:
            red = (self.red_kind, b.val(self.c), self.d, self.neg)
        return b.barrier(act, sub, self.var != isa.VAR_BAR_ARRIVE, bar_id, count, red)


def _full_or_int(b, v):
    if isinstance(v, V.Lin):
        return v.materialize(b.geo)
    return v


def decode(prog, pc: int) -> Instr:
    rec = prog.code[pc]
    op, t, t2, mod = int(rec["op"]), int(rec["type"]), int(rec["type2"]), int(rec["mod"])
    types = slot_types(op, t, t2, mod)
    opnds = {s: _operand(prog, rec, s, ty if ty is not None else isa.TYPE_U64)
             for s, ty in zip(_SLOTS, types)}
    d, d2 = opnds["d"], opnds["d2"]
    dst = d[1] if d is not None and d[0] == REG else None
    dst2 = d2[1] if d2 is not None and d2[0] == REG else None
    var = isa.mod_field(mod, isa.MOD_VARIANT_MASK)
    if op in (isa.OP_NOP, isa.OP_MEMBAR):
        return NopInstr(pc, rec)
    if op == isa.OP_BRA:
        return BraInstr(pc, rec, int(rec["imm"]) - prog.start)
    if op == isa.OP_EXIT:
        return ExitInstr(pc, rec)
    if op == isa.OP_TRAP:
        return TrapInstr(pc, rec, prog.instruction_offset(pc))
    if op == isa.OP_BAR:
        return BarInstr(pc, rec, var, dst, opnds["a"], opnds["b"], opnds["c"],
                        bool(mod & isa.MOD_NEG_C))
    if op == isa.OP_LD:
        return LdInstr(pc, rec, prog, t, dst)
    if op == isa.OP_ST:
        return StInstr(pc, rec, prog, t, opnds["b"])
    if op in (isa.OP_ATOM, isa.OP_RED):
        return AtomInstr(pc, rec, prog, t, dst, opnds["b"], opnds["c"])
    if op == isa.OP_SHFL:
        return WarpInstr(pc, rec, warp.shfl, d=dst, d2=dst2, a=opnds["a"], b=opnds["b"],
                         c=opnds["c"], var=var)
    if op == isa.OP_VOTE:
        return WarpInstr(pc, rec, warp.vote, d=dst, a=opnds["a"], var=var,
                         neg=bool(mod & isa.MOD_NEG_C))
    if op == isa.OP_ACTIVEMASK:
        return WarpInstr(pc, rec, warp.activemask, d=dst)
    if op == isa.OP_SETP:
        return SetpInstr(pc, rec, t, mod, (opnds["a"], opnds["b"], opnds["c"]), dst, dst2)
    if op == isa.OP_SET:
        return SetInstr(pc, rec, t, t2, mod, (opnds["a"], opnds["b"], opnds["c"]), dst)
    if op == isa.OP_MOV and (isa.TYPE_BITS[t] in (32, 64) or t == isa.TYPE_PRED):
        return MovInstr(pc, rec, opnds["a"], dst)
    if op == isa.OP_MOV:
        a = alu.Alu(lambda x: np.array(x, copy=True), (t,), t)
        return AluInstr(pc, rec, a, (opnds["a"],), dst)
    if op == isa.OP_SELP:
        neg = bool(mod & isa.MOD_NEG_C)
        a = alu.Alu(lambda x, y, c: np.where(np.logical_xor(c, neg), x, y), (t, t, isa.TYPE_PRED), t)
        return AluInstr(pc, rec, a, (opnds["a"], opnds["b"], opnds["c"]), dst)
    if op == isa.OP_CVTA:
        return AluInstr(pc, rec, _cvta(t, mod), (opnds["a"],), dst)
    if op == isa.OP_BFI:
        a = alu.Alu(lambda x, y, c, n: alu.bfi(x, y, c, n, t), (t, t, isa.TYPE_U32, isa.TYPE_U32), t)
        return AluInstr(pc, rec, a, (opnds["a"], opnds["b"], opnds["c"], opnds["d2"]), dst)
    a = alu.make(op, t, t2, mod)
    srcs = tuple(opnds[s] for s in ("a", "b", "c"))[:len(a.src_types)]
    return AluInstr(pc, rec, a, srcs, dst)


def _cvta(t, mod) -> alu.Alu:
    space = isa.mod_field(mod, isa.MOD_SPACE_MASK)
    var = isa.mod_field(mod, isa.MOD_VARIANT_MASK)
    base = {isa.SPACE_SHARED: isa.GENERIC_SHARED_BASE,
            isa.SPACE_LOCAL: isa.GENERIC_LOCAL_BASE}.get(space, 0)
    bits = isa.TYPE_BITS[t]
    if var == isa.VAR_CVTA_FROM_GENERIC:
        base = -base
    dt = V.TYPE_DTYPES[t]
    k = dt.type(base & V.mask_of(bits))
    return alu.Alu(lambda x: np.add(x, k, dtype=dt), (t,), t,
                   lambda geo, x: V.lin_add(x, base, bits))
