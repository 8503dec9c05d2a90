"""Instruction selection: each PTX instruction becomes one or more ISA instructions.

`Lowering` holds one handler per PTX instruction name. A handler reads the instruction's
modifiers (refusing any it does not know, with the PTX ISA section), turns its operands
into emitter operands (`src`, `dst`, `address`) and emits ISA instructions whose meaning
is exactly the PTX instruction's: vector loads and stores become scalar ones, vector
`mov`s pack and unpack bits, forms the ISA lacks (`shf`, `cnot`, `lop3`, `mul24`, `sad`,
f16 `min`/`max`, `isspacep`, `cvt` to f16x2, carry chains) are built from ISA instructions, and cache
hints, scopes and memory-ordering qualifiers are dropped (every access of the device is
sequentially consistent, spec/isa.md ISA-MEM-5). The compiler (guest/jit/compiler.py)
provides name resolution, calls and memory layout.
"""

from __future__ import annotations

import struct

import numpy as np

from pvgpu.guest.jit.emit import Emitter, Imm, Reg, Seg, SReg, mov_type_for, wide_type
from pvgpu.guest.jit.errors import PtxCompileError, PtxUnsupportedError
from pvgpu.guest.jit.names import ExternVar, ParamSlot, RegVar, SpaceVar, VecRegVar
from pvgpu.guest.jit.ptx import ast
from pvgpu.guest.jit.sections import SPECIAL_REGISTERS, section
from pvgpu.spec import isa

R32, R64, PRED = isa.OPND_R32, isa.OPND_R64, isa.OPND_PRED
U32, U64, S32, S64, B32, B64 = (isa.TYPE_U32, isa.TYPE_U64, isa.TYPE_S32, isa.TYPE_S64,
                                isa.TYPE_B32, isa.TYPE_B64)
T_PRED = isa.TYPE_PRED

PTX_TYPES = frozenset(isa.TYPES_BY_NAME) - {"none"} | {
    "b128", "f16x2", "bf16x2", "u16x2", "s16x2", "tf32", "e4m3", "e5m2", "e4m3x2", "e5m2x2",
    "e2m1x2", "e2m3x2", "e3m2x2", "ue8m0x2", "e2m1", "s4", "u4", "b1"}
_HINTS = frozenset({"ca", "cg", "cs", "lu", "cv", "wb", "wt", "nc", "weak", "relaxed",
                    "acquire", "release", "acq_rel", "sc", "cta", "gpu", "sys", "cluster",
                    "mmio", "aligned", "unified"})
_ROUNDING = {"rn": isa.RND_RN, "rz": isa.RND_RZ, "rm": isa.RND_RM, "rp": isa.RND_RP,
             "rni": isa.RND_RNI, "rzi": isa.RND_RZI, "rmi": isa.RND_RMI, "rpi": isa.RND_RPI}
_SPACES = {"global": isa.SPACE_GLOBAL, "shared": isa.SPACE_SHARED, "shared::cta":
           isa.SPACE_SHARED, "local": isa.SPACE_LOCAL, "param": isa.SPACE_PARAM,
           "param::entry": isa.SPACE_PARAM, "param::func": isa.SPACE_PARAM,
           "const": isa.SPACE_CONST}
_CMP = {v: k for k, v in isa.CMP_NAMES.items()}
_BOOL = {"and": isa.BOOL_AND, "or": isa.BOOL_OR, "xor": isa.BOOL_XOR}
_ATOM = {v: k for k, v in isa.ATOM_NAMES.items()}
_SREGS = {name: n for n, name in isa.SREG_NAMES.items()}
_COMPONENTS = {"x": 0, "y": 1, "z": 2, "w": 3, "r": 0, "g": 1, "b": 2, "a": 3}
_UNARY_FLOAT = {"sqrt": isa.OP_SQRT, "rsqrt": isa.OP_RSQRT, "rcp": isa.OP_RCP,
                "ex2": isa.OP_EX2, "lg2": isa.OP_LG2, "sin": isa.OP_SIN, "cos": isa.OP_COS,
                "tanh": isa.OP_TANH}


def ptx_bits(name: str) -> int:
    if name == "pred":
        return 1
    return isa.TYPE_BITS[isa.TYPES_BY_NAME[name]] if name in isa.TYPES_BY_NAME else \
        int("".join(ch for ch in name if ch.isdigit()) or 0)


def file_of(name: str) -> int:
    return isa.register_file(isa.TYPES_BY_NAME[name])


def bit_type(bits: int) -> int:
    return {8: isa.TYPE_B8, 16: isa.TYPE_B16, 32: B32, 64: B64}[bits]


def unsigned_type(bits: int) -> int:
    return {8: isa.TYPE_U8, 16: isa.TYPE_U16, 32: U32, 64: U64}[bits]


def mod_var(v: int) -> int:
    return v << isa.MOD_VARIANT_SHIFT


def mod_space(s: int) -> int:
    return s << isa.MOD_SPACE_SHIFT


def float_bits(value: float, t: int) -> int:
    if t == isa.TYPE_F32:
        return int(np.array(value, dtype=np.float32).view(np.uint32))
    if t == isa.TYPE_F64:
        return struct.unpack("<Q", struct.pack("<d", value))[0]
    if t == isa.TYPE_F16:
        return int(np.array(value, dtype=np.float16).view(np.uint16))
    if t == isa.TYPE_BF16:
        f32 = int(np.array(value, dtype=np.float32).view(np.uint32))
        return ((f32 + 0x7FFF + ((f32 >> 16) & 1)) >> 16) & 0xFFFF
    raise ValueError(t)


class Mods:
    """The modifiers of one instruction, consumed by its handler; leftovers are refused."""

    def __init__(self, low: "Lowering", ins: ast.Instruction):
        self.low = low
        self.ins = ins
        self.left = list(ins.mods)

    def take(self, *names: str):
        """The first of `names` present (removing every one present), or None."""
        found = None
        for n in names:
            if n in self.left:
                self.left.remove(n)
                found = found or n
        return found

    def hints(self) -> bool:
        """Drop cache, ordering and scope qualifiers; True if an `L2::cache_hint` operand
        follows the instruction's operands."""
        extra = False
        for m in list(self.left):
            if m in _HINTS or m.startswith(("L1::", "L2::", "level::")):
                self.left.remove(m)
                extra = extra or m == "L2::cache_hint"
        return extra

    def space(self, default: int = isa.SPACE_GENERIC) -> int:
        for m in list(self.left):
            if m in _SPACES:
                self.left.remove(m)
                return _SPACES[m]
            if m in ("shared::cluster", "tex", "param::cluster"):
                raise self.low.unsupported(self.ins, f"state space .{m}")
        return default

    def vector(self) -> int:
        v = self.take("v2", "v4", "v8", "v16")
        if v in ("v8", "v16"):
            raise self.low.unsupported(self.ins, f".{v} vectors")
        return int(v[1:]) if v else 0

    def rounding(self) -> int:
        for m in list(self.left):
            if m in _ROUNDING:
                self.left.remove(m)
                return _ROUNDING[m]
            if m in ("rna", "rs"):
                raise self.low.unsupported(self.ins, f"rounding .{m}")
        return isa.RND_DEFAULT

    def types(self) -> list:
        out = []
        for m in list(self.left):
            if m in PTX_TYPES:
                self.left.remove(m)
                out.append(m)
        for m in out:
            if m not in isa.TYPES_BY_NAME:
                raise self.low.unsupported(self.ins, f"type .{m}")
        return [isa.TYPES_BY_NAME[m] for m in out]

    def one_type(self) -> int:
        ts = self.types()
        if len(ts) != 1:
            raise self.low.syntax(self.ins, f"expected one type, found {len(ts)}")
        return ts[0]

    def done(self) -> None:
        if self.left:
            raise self.low.unsupported(self.ins, f"modifier .{self.left[0]}")


class Lowering:
    """PTX instruction handlers over an `Emitter`; name resolution, calls and layout are
    the compiler's (the methods `lookup`, `lower_call`, `frame` used here)."""

    em: Emitter

    # ---------------------------------------------------------------- errors
    def unsupported(self, ins, what: str) -> PtxUnsupportedError:
        name = getattr(ins, "opcode", "call")
        mods = getattr(ins, "mods", ())
        return PtxUnsupportedError(f"{what} is not supported", ins.line, ins.text,
                                   section(name, mods))

    def syntax(self, ins, what: str) -> PtxCompileError:
        return PtxCompileError(what, ins.line, ins.text)

    # ---------------------------------------------------------------- entry point
    def lower_instruction(self, ins: ast.Instruction) -> None:
        handler = self.HANDLERS.get(ins.opcode)
        if handler is None:
            raise PtxUnsupportedError(f"instruction {ins.full_name} is not supported",
                                      ins.line, ins.text, section(ins.opcode, ins.mods))
        guard = 0
        if ins.guard is not None:
            reg, neg = ins.guard
            p = self.reg_of(reg, ins)
            if p.file != PRED:
                raise self.syntax(ins, f"guard {reg} is not a predicate")
            guard = isa.GUARD_ON | (isa.GUARD_NEG if neg else 0) | p.index
        start = self.em.begin(ins.line, guard)
        handler(self, ins)
        if guard:
            gi = guard & isa.GUARD_INDEX
            for x in self.em.code[start:-1]:
                for v in (x.d, x.d2):
                    if isinstance(v, Reg) and v.file == PRED and v.index == gi and not v.scratch:
                        raise AssertionError(f"line {ins.line}: guard overwritten mid-sequence")

    # ---------------------------------------------------------------- operands
    def reg_of(self, r: ast.Reg, ins) -> Reg:
        b = self.lookup(r.name)
        if isinstance(b, RegVar):
            if r.component:
                raise self.syntax(ins, f"{r} : {r.name} is not a vector register")
            return b.reg
        if isinstance(b, VecRegVar):
            if r.component not in _COMPONENTS or _COMPONENTS[r.component] >= len(b.regs):
                raise self.syntax(ins, f"bad component in {r}")
            return b.regs[_COMPONENTS[r.component]]
        if str(r) in _SREGS or r.name in ("%tid", "%ntid", "%ctaid", "%nctaid"):
            raise self.syntax(ins, f"special register {r} cannot be used here")
        raise PtxCompileError(f"undeclared register {r}", ins.line, ins.text)

    def sreg_of(self, r: ast.Reg, ins):
        """The SREG_* number of a special register operand, or None for ordinary ones."""
        if self.lookup(r.name) is not None:
            return None
        name = str(r)
        if name in _SREGS:
            return _SREGS[name]
        if name in ("%globaltimer_lo", "%globaltimer_hi"):
            return name
        if name.startswith(("%envreg", "%pm", "%cluster", "%is_explicit_cluster",
                            "%aggr_smem_size", "%reserved_smem", "%lanemask", "%clock_hi",
                            "%current_graph_exec", "%nclusterid", "%clusterid",
                            "%cluster_ctaid", "%cluster_nctaid", "%cluster_ctarank",
                            "%cluster_nctarank")):
            raise PtxUnsupportedError(f"special register {name} is not supported", ins.line,
                                      ins.text, SPECIAL_REGISTERS)
        return None

    def sreg_value(self, n, t: int, ins):
        """A special register's value as type t (a register or an SReg operand for mov)."""
        if isinstance(n, str):  # %globaltimer_lo / _hi
            s = self.em.scratch(R64)
            self.em.emit(isa.OP_MOV, U64, d=s, a=SReg(isa.SREG_GLOBALTIMER))
            if n.endswith("_hi"):
                self.em.emit(isa.OP_SHR, B64, d=s, a=s, b=Imm(32))
            return self.coerce(s, U64, t, ins)
        width = 64 if n in isa.SREGS_64 else 32
        st = U64 if width == 64 else U32
        s = self.em.scratch(R64 if width == 64 else R32)
        self.em.emit(isa.OP_MOV, st, d=s, a=SReg(n))
        return self.coerce(s, st, t, ins)

    def coerce(self, r: Reg, have: int, want: int, ins) -> Reg:
        """Register r holding a value of type `have` as a register for type `want`."""
        wf = isa.register_file(want)
        if r.file == wf:
            return r
        if r.file == R64 and wf == R32 and want in isa.INT_TYPES:
            s = self.em.scratch(R32)
            self.em.emit(isa.OP_CVT, U32, type2=U64, d=s, a=r)
            return s
        if r.file == R32 and wf == R64 and have in isa.INT_TYPES and want in isa.INT_TYPES:
            s = self.em.scratch(R64)
            sign = have in isa.SIGNED_TYPES
            self.em.emit(isa.OP_CVT, S64 if sign else U64, type2=S32 if sign else U32, d=s, a=r)
            return s
        raise self.syntax(ins, f"a {isa.TYPE_NAMES[have]} register cannot be used as "
                               f".{isa.TYPE_NAMES[want]}")

    def reg_type(self, r: Reg) -> int:
        return {R32: U32, R64: U64, PRED: T_PRED}[r.file]

    def imm_bits(self, op, t: int, ins) -> int:
        bits = isa.TYPE_BITS[t]
        if isinstance(op, ast.Imm):
            if t in isa.FLOAT_TYPES:
                if op.value == 0:
                    return 0
                raise self.syntax(ins, f"integer literal {op.value} used as .{isa.TYPE_NAMES[t]}"
                                       " (write a float literal)")
            return op.value & ((1 << bits) - 1)
        lit = op.literal
        if t in isa.FLOAT_TYPES:
            if lit.width == 32 and t == isa.TYPE_F32 and not op.negative:
                return lit.bits
            if lit.width == 64 and t == isa.TYPE_F64 and not op.negative:
                return lit.bits
            v = -lit.value if op.negative else lit.value
            return float_bits(v, t)
        if lit.width and lit.width == bits and not op.negative:
            return lit.bits
        raise self.syntax(ins, f"float literal {op} used as .{isa.TYPE_NAMES[t]}")

    def src(self, op, t: int, ins):
        """A source operand of type t: a register, an Imm, an address (Seg/Imm) or SReg."""
        if isinstance(op, ast.Reg):
            n = self.sreg_of(op, ins)
            if n is not None:
                return self.sreg_value(n, t, ins)
            r = self.reg_of(op, ins)
            if t == T_PRED or r.file == PRED:
                if r.file != PRED or t != T_PRED:
                    raise self.syntax(ins, f"{op} and .{isa.TYPE_NAMES[t]} do not match")
                return r
            return self.coerce(r, self.declared_type(op), t, ins)
        if isinstance(op, (ast.Imm, ast.FImm)):
            if t == T_PRED:
                if isinstance(op, ast.Imm):  # PTX: zero is false, any other value true
                    return self.em.materialize(Imm(1 if op.value else 0), T_PRED)
                raise self.syntax(ins, f"bad predicate literal {op}")
            return Imm(self.imm_bits(op, t, ins))
        if isinstance(op, ast.Sym):
            b = self.lookup(op.name)
            if isinstance(b, RegVar):
                return self.coerce(b.reg, isa.TYPES_BY_NAME[b.type], t, ins)
            return self.address_value(op, t, ins)
        raise self.syntax(ins, f"unexpected operand {op}")

    def declared_type(self, op: ast.Reg) -> int:
        b = self.lookup(op.name)
        return isa.TYPES_BY_NAME.get(getattr(b, "type", "b32"), U32)

    def address_value(self, op: ast.Sym, t: int, ins):
        """The address of a variable (in its own state space) as a value of type t."""
        b = self.lookup(op.name)
        if b is None:
            raise PtxCompileError(f"undefined name {op.name}", ins.line, ins.text)
        self.refuse_extern(b, op.name, ins)
        if isinstance(b, ParamSlot):
            b = self.slot_in_memory(b, ins)
        if not isinstance(b, SpaceVar):
            raise self.syntax(ins, f"{op.name} has no address")
        if t not in isa.INT_TYPES:
            raise self.syntax(ins, f"the address of {op.name} is not a .{isa.TYPE_NAMES[t]}")
        if b.space in (isa.SPACE_GLOBAL, isa.SPACE_CONST):
            if isa.TYPE_BITS[t] != 64:
                raise self.syntax(ins, f"the address of {op.name} needs 64 bits")
            kind = isa.OPND_DATA if b.space == isa.SPACE_GLOBAL else isa.OPND_CONST
            if op.offset:
                s = self.em.scratch(R64)
                self.em.emit(isa.OP_ADD, U64, d=s, a=Seg(kind, b.offset), b=Imm(op.offset & (2**64 - 1)))
                return s
            return Seg(kind, b.offset)
        return Imm((b.offset + op.offset) & ((1 << isa.TYPE_BITS[t]) - 1))

    def refuse_extern(self, b, name: str, ins) -> None:
        if isinstance(b, ExternVar):
            raise PtxUnsupportedError(
                f"{name} is an .extern variable that this module does not define (linking "
                "is not supported)", ins.line, ins.text,
                "Directives › Linking Directives › .extern")

    def dst(self, op, t: int, ins, widen: bool = False):
        """-> (register to write, fix-up to call after writing it or None)."""
        if isinstance(op, ast.Sink):
            return self.em.scratch(isa.register_file(t)), None
        if isinstance(op, ast.Sym):
            b = self.lookup(op.name)
            if isinstance(b, RegVar):
                op = ast.Reg(op.name)
        if not isinstance(op, ast.Reg):
            raise self.syntax(ins, f"destination {op} is not a register")
        if self.sreg_of(op, ins) is not None:
            raise self.syntax(ins, f"cannot write special register {op}")
        r = self.reg_of(op, ins)
        want = isa.register_file(t)
        if r.file == want:
            return r, None
        if widen and r.file == R64 and want == R32 and t in isa.INT_TYPES:
            s = self.em.scratch(R32)
            sign = t in isa.SIGNED_TYPES

            def post():
                self.em.emit(isa.OP_CVT, S64 if sign else U64, type2=t, d=r, a=s)
            return s, post
        if widen and r.file == R32 and want == R32:
            return r, None
        raise self.syntax(ins, f"destination {op} cannot hold a .{isa.TYPE_NAMES[t]}")

    def pred_src(self, op, ins) -> tuple:
        """-> (predicate register, negated) for a `{!}p` operand."""
        neg = False
        if isinstance(op, ast.Not):
            neg, op = True, op.reg
        v = self.src(op, T_PRED, ins)
        return v, neg

    # ---------------------------------------------------------------- addresses
    def address(self, op, space: int, ins, t: int):
        """-> (base operand, byte offset, space) for a memory operand `[...]`."""
        if not isinstance(op, ast.Addr):
            raise self.syntax(ins, f"expected an address, found {op}")
        base, off = op.base, op.offset
        if base is None:
            return None, off, space
        if isinstance(base, ast.Reg):
            if self.sreg_of(base, ins) is not None:
                raise self.syntax(ins, f"special register {base} as an address")
            r = self.reg_of(base, ins)
            if r.file == PRED:
                raise self.syntax(ins, f"predicate {base} as an address")
            return r, off, space
        b = self.lookup(base.name)
        off += base.offset
        if isinstance(b, RegVar):
            return b.reg, off, space
        self.refuse_extern(b, base.name, ins)
        if isinstance(b, ParamSlot):
            b = self.slot_in_memory(b, ins)
            if space == isa.SPACE_PARAM:
                space = isa.SPACE_LOCAL
        if not isinstance(b, SpaceVar):
            raise PtxCompileError(f"undefined variable {base.name}", ins.line, ins.text)
        if b.space == isa.SPACE_GLOBAL:
            if space not in (isa.SPACE_GENERIC, isa.SPACE_GLOBAL):
                raise self.syntax(ins, f"{base.name} is a .global variable")
            return Seg(isa.OPND_DATA, b.offset), off, space
        if b.space == isa.SPACE_CONST:
            if space not in (isa.SPACE_GENERIC, isa.SPACE_CONST):
                raise self.syntax(ins, f"{base.name} is a .const variable")
            return Seg(isa.OPND_CONST, b.offset), off, space
        if space not in (isa.SPACE_GENERIC, b.space):
            raise self.syntax(ins, f"{base.name} is a .{isa.SPACE_NAMES[b.space]} variable")
        return None, b.offset + off, b.space

    # ---------------------------------------------------------------- data movement
    def h_mov(self, ins):
        m = Mods(self, ins)
        t = m.one_type()
        m.done()
        self.nops(ins, 2)
        d, a = ins.operands
        if isinstance(d, ast.Vec):
            return self.unpack(ins, t, d, a)
        if isinstance(a, ast.Vec):
            return self.pack(ins, t, d, a)
        if isinstance(a, ast.Reg):
            n = self.sreg_of(a, ins)
            if n is not None and not isinstance(n, str):
                w = 64 if n in isa.SREGS_64 else 32
                if isa.TYPE_BITS.get(t) == w:
                    r, _ = self.dst(d, t, ins)
                    self.em.emit(isa.OP_MOV, t, d=r, a=SReg(n))
                    return
        r, _ = self.dst(d, t, ins)
        self.em.emit(isa.OP_MOV, t, d=r, a=self.src(a, t, ins))

    def pack(self, ins, t: int, d, vec: ast.Vec):
        bits = isa.TYPE_BITS[t]
        n = len(vec.items)
        if t == T_PRED or bits % n or n not in (2, 4):
            raise self.syntax(ins, "bad vector mov")
        eb = bits // n
        et = unsigned_type(eb)
        wt = unsigned_type(bits)
        r, _ = self.dst(d, t, ins)
        acc = None
        for i, item in enumerate(vec.items):
            if isinstance(item, ast.Sink):
                raise self.syntax(ins, "'_' in a source vector")
            v = self.src(item, et, ins)
            s = self.em.scratch(isa.register_file(wt))
            self.em.emit(isa.OP_CVT, wt, type2=et, d=s, a=v)
            if i:
                self.em.emit(isa.OP_SHL, bit_type(bits), d=s, a=s, b=Imm(i * eb))
                self.em.emit(isa.OP_OR, bit_type(bits), d=s, a=s, b=acc)
            acc = s
        self.em.emit(isa.OP_MOV, bit_type(bits), d=r, a=acc)

    def unpack(self, ins, t: int, vec: ast.Vec, a):
        bits = isa.TYPE_BITS[t]
        n = len(vec.items)
        if t == T_PRED or bits % n or n not in (2, 4):
            raise self.syntax(ins, "bad vector mov")
        eb = bits // n
        et = unsigned_type(eb)
        src = self.src(a, bit_type(bits), ins)
        if not isinstance(src, Reg):
            src = self.em.materialize(src, bit_type(bits))
        # element 0 last: a destination may be the source register itself
        for i in list(range(1, n)) + [0]:
            item = vec.items[i]
            if isinstance(item, ast.Sink):
                continue
            r, _ = self.dst(item, et, ins, widen=True)
            v = src
            if i:
                v = self.em.scratch(src.file)
                self.em.emit(isa.OP_SHR, bit_type(bits), d=v, a=src, b=Imm(i * eb))
            self.em.emit(isa.OP_CVT, et, type2=unsigned_type(bits), d=r, a=v)

    def nops(self, ins, *counts):
        if len(ins.operands) not in counts:
            raise self.syntax(ins, f"{ins.opcode} takes {' or '.join(map(str, counts))} operands")

    def h_ld(self, ins):
        m = Mods(self, ins)
        vol = m.take("volatile")
        hint = m.hints()
        space = m.space()
        nvec = m.vector()
        t = m.one_type()
        m.done()
        ops = ins.operands[:-1] if hint else ins.operands
        self.nops_list(ins, ops, 2)
        d, a = ops
        self.load(ins, t, space, bool(vol), nvec, d, a)

    h_ldu = h_ld

    def nops_list(self, ins, ops, n):
        if len(ops) != n:
            raise self.syntax(ins, f"{ins.opcode} takes {n} operands")

    def load(self, ins, t, space, vol, nvec, d, a):
        dests = list(d.items) if isinstance(d, ast.Vec) else [d]
        if (len(dests) > 1) != bool(nvec) or (nvec and len(dests) != nvec):
            raise self.syntax(ins, "vector size and operand do not match")
        if space == isa.SPACE_PARAM and self.param_slot_access(ins, a, t, dests, load=True):
            return
        base, off, space = self.address(a, space, ins, t)
        if space == isa.SPACE_PARAM and not self.frame.is_entry:
            space = isa.SPACE_LOCAL  # a .func's parameters live in local memory
        size = isa.TYPE_BITS[t] // 8
        if isinstance(base, Reg) and len(dests) > 1:
            for x in dests:
                if isinstance(x, (ast.Reg, ast.Sym)) and \
                        isinstance(self.lookup(x.name), (RegVar, VecRegVar)) and \
                        self.reg_of(ast.Reg(x.name, getattr(x, "component", None)), ins) == base:
                    s = self.em.scratch(base.file)
                    self.em.emit(isa.OP_MOV, U64 if base.file == R64 else U32, d=s, a=base)
                    base = s
                    break
        mod = mod_space(space) | (isa.MOD_VOLATILE if vol else 0)
        for i, x in enumerate(dests):
            if isinstance(x, ast.Sink):
                continue
            r, post = self.dst(x, t, ins, widen=True)
            self.em.emit(isa.OP_LD, t, mod=mod, d=r, a=base, offset=off + i * size)
            if post:
                post()

    def h_st(self, ins):
        m = Mods(self, ins)
        vol = m.take("volatile")
        hint = m.hints()
        space = m.space()
        nvec = m.vector()
        t = m.one_type()
        m.done()
        ops = ins.operands[:-1] if hint else ins.operands
        self.nops_list(ins, ops, 2)
        a, v = ops
        vals = list(v.items) if isinstance(v, ast.Vec) else [v]
        if (len(vals) > 1) != bool(nvec) or (nvec and len(vals) != nvec):
            raise self.syntax(ins, "vector size and operand do not match")
        if space == isa.SPACE_CONST:
            raise self.syntax(ins, "st to .const")
        if space == isa.SPACE_PARAM and self.param_slot_access(ins, a, t, vals, load=False):
            return
        base, off, space = self.address(a, space, ins, t)
        if space == isa.SPACE_PARAM:
            if self.frame.is_entry:
                raise self.syntax(ins, "st.param to a kernel parameter")
            space = isa.SPACE_LOCAL
        if space == isa.SPACE_CONST:
            raise self.syntax(ins, "st to .const")
        size = isa.TYPE_BITS[t] // 8
        mod = mod_space(space) | (isa.MOD_VOLATILE if vol else 0)
        for i, x in enumerate(vals):
            if isinstance(x, ast.Sink):
                raise self.syntax(ins, "'_' as a stored value")
            val = self.src(x, t, ins)
            self.em.emit(isa.OP_ST, t, mod=mod, a=base, b=val, offset=off + i * size)

    def param_slot_access(self, ins, a, t, regs, load: bool) -> bool:
        """ld.param/st.param on a call's `.param` kept in a register: a move."""
        if not (isinstance(a, ast.Addr) and isinstance(a.base, ast.Sym)):
            return False
        b = self.lookup(a.base.name)
        if not isinstance(b, ParamSlot) or b.reg is None:
            return False
        if len(regs) != 1 or a.offset or a.base.offset:
            raise AssertionError("a register parameter slot accessed in parts")
        if load:
            r, post = self.dst(regs[0], t, ins, widen=True)
            self.em.emit(isa.OP_MOV, mov_type_for(t), d=r, a=self.coerce(b.reg, t, t, ins))
            if post:
                post()
        else:
            self.em.emit(isa.OP_MOV, mov_type_for(t), d=b.reg, a=self.src(regs[0], t, ins))
        return True

    def h_cvt(self, ins):
        m = Mods(self, ins)
        rnd = m.rounding()
        ftz = m.take("ftz")
        sat = m.take("sat")
        for bad in ("relu", "satfinite"):
            if m.take(bad):
                raise self.unsupported(ins, f".{bad}")
        names = [x for x in ins.mods if x in PTX_TYPES]
        if len(names) == 2 and names[0] in ("f16x2", "bf16x2") and names[1] == "f32":
            m.left = [x for x in m.left if x not in names]
            m.done()
            return self.cvt_x2(ins, names[0], rnd)
        ts = m.types()
        m.done()
        if len(ts) != 2:
            raise self.syntax(ins, "cvt needs a destination and a source type")
        dt, st = ts
        self.nops(ins, 2)
        mod = rnd | (isa.MOD_FTZ if ftz else 0) | (isa.MOD_SAT if sat else 0)
        r, post = self.dst(ins.operands[0], dt, ins, widen=True)
        self.em.emit(isa.OP_CVT, dt, type2=st, mod=mod, d=r, a=self.src(ins.operands[1], st, ins))
        if post:
            post()

    def cvt_x2(self, ins, pair: str, rnd: int):
        """cvt.rn.f16x2.f32 d, a, b: d = {cvt(a) in the high half, cvt(b) in the low}."""
        self.nops(ins, 3)
        et = isa.TYPE_F16 if pair == "f16x2" else isa.TYPE_BF16
        hi = self.em.scratch(R32)
        lo = self.em.scratch(R32)
        self.em.emit(isa.OP_CVT, et, type2=isa.TYPE_F32, mod=rnd, d=hi,
                     a=self.src(ins.operands[1], isa.TYPE_F32, ins))
        self.em.emit(isa.OP_CVT, et, type2=isa.TYPE_F32, mod=rnd, d=lo,
                     a=self.src(ins.operands[2], isa.TYPE_F32, ins))
        self.em.emit(isa.OP_CVT, U32, type2=isa.TYPE_U16, d=lo, a=lo)
        self.em.emit(isa.OP_SHL, B32, d=hi, a=hi, b=Imm(16))
        r, _ = self.dst(ins.operands[0], B32, ins)
        self.em.emit(isa.OP_OR, B32, d=r, a=hi, b=lo)

    def h_cvta(self, ins):
        m = Mods(self, ins)
        to = m.take("to")
        space = m.space(default=-1)
        t = m.one_type()
        m.done()
        if space in (-1, isa.SPACE_PARAM):
            raise self.unsupported(ins, "cvta without a space, or on .param")
        if t not in (U32, U64):
            raise self.syntax(ins, "cvta is .u32 or .u64")
        self.nops(ins, 2)
        d, a = ins.operands
        r, _ = self.dst(d, t, ins)
        var = isa.VAR_CVTA_FROM_GENERIC if to else isa.VAR_CVTA_TO_GENERIC
        self.em.emit(isa.OP_CVTA, t, mod=mod_var(var) | mod_space(space), d=r,
                     a=self.src(a, t, ins))

    def h_isspacep(self, ins):
        m = Mods(self, ins)
        space = m.space(default=-1)
        m.done()
        self.nops(ins, 2)
        if space not in (isa.SPACE_GLOBAL, isa.SPACE_SHARED, isa.SPACE_LOCAL):
            raise self.unsupported(ins, "isspacep for this space")
        a = self.src(ins.operands[1], U64, ins)
        a = self.em.materialize(a, U64)
        r, _ = self.dst(ins.operands[0], T_PRED, ins)

        def inside(base: int) -> Reg:
            p = self.em.scratch(PRED)
            self.em.emit(isa.OP_SETP, U64, mod=isa.CMP_HS << isa.MOD_CMP_SHIFT, d=p, a=a,
                         b=Imm(base))
            self.em.emit(isa.OP_SETP, U64, mod=(isa.CMP_LO << isa.MOD_CMP_SHIFT) |
                         (isa.BOOL_AND << isa.MOD_BOOL_SHIFT), d=p, a=a,
                         b=Imm(base + isa.GENERIC_WINDOW_SIZE), c=p)
            return p
        if space == isa.SPACE_SHARED:
            self.em.emit(isa.OP_MOV, T_PRED, d=r, a=inside(isa.GENERIC_SHARED_BASE))
        elif space == isa.SPACE_LOCAL:
            self.em.emit(isa.OP_MOV, T_PRED, d=r, a=inside(isa.GENERIC_LOCAL_BASE))
        else:
            p1 = inside(isa.GENERIC_SHARED_BASE)
            p2 = inside(isa.GENERIC_LOCAL_BASE)
            self.em.emit(isa.OP_OR, T_PRED, d=p1, a=p1, b=p2)
            self.em.emit(isa.OP_NOT, T_PRED, d=r, a=p1)

    def h_nothing(self, ins):
        """prefetch, nanosleep, ...: no effect on the results."""
        return None

    # ---------------------------------------------------------------- arithmetic
    def arith(self, ins, op: int, nsrc: int, *, allowed=(), default_var: int = 0):
        m = Mods(self, ins)
        if m.take("cc"):
            raise self.unsupported(ins, "carry (.cc)")
        rnd = m.rounding()
        mod = rnd
        if m.take("ftz"):
            mod |= isa.MOD_FTZ
        if m.take("sat"):
            mod |= isa.MOD_SAT
        if m.take("approx", "full"):
            mod |= isa.MOD_APPROX
        var = m.take("lo", "hi", "wide")
        for bad in ("relu", "NaN", "xorsign", "abs", "oob"):
            if m.take(bad):
                raise self.unsupported(ins, f".{bad}")
        t = m.one_type()
        m.done()
        if var:
            mod |= mod_var({"lo": isa.VAR_LO, "hi": isa.VAR_HI, "wide": isa.VAR_WIDE}[var])
        elif default_var and t in isa.INT_TYPES:
            mod |= mod_var(default_var)
        self.nops(ins, nsrc + 1)
        if t not in isa.OPCODES[op].types:
            raise self.unsupported(ins, f"{ins.opcode}.{isa.TYPE_NAMES[t]}")
        spec = isa.OPCODES[op]
        if mod & ~spec.mods:
            raise self.unsupported(ins, "this combination of modifiers")
        wide = var == "wide"
        dt = self.wide(t, ins) if wide else t
        r, _ = self.dst(ins.operands[0], dt, ins)
        srcs = []
        for i, o in enumerate(ins.operands[1:]):
            st = dt if (wide and op == isa.OP_MAD and i == 2) else t
            if op in (isa.OP_SHL, isa.OP_SHR) and i == 1:
                st = U32
            srcs.append(self.src(o, st, ins))
        srcs += [None] * (3 - len(srcs))
        self.em.emit(op, t, mod=mod, d=r, a=srcs[0], b=srcs[1], c=srcs[2])

    def wide(self, t, ins) -> int:
        if isa.TYPE_BITS[t] not in (16, 32) or t not in isa.INT_TYPES:
            raise self.syntax(ins, ".wide needs a 16- or 32-bit integer type")
        return wide_type(t)

    def h_add(self, ins):
        if "cc" in ins.mods:
            return self.carry(ins)
        self.arith(ins, isa.OP_ADD, 2)

    def h_sub(self, ins):
        if "cc" in ins.mods:
            return self.carry(ins)
        self.arith(ins, isa.OP_SUB, 2)

    def carry(self, ins):
        """add.cc/addc/sub.cc/subc/mad.cc/madc: extended-precision arithmetic with the
        carry flag CC.CF kept in a predicate register of the entry (`self.cc`); the carry
        (borrow, for subtraction) out of each step is computed with unsigned compares."""
        m = Mods(self, ins)
        cc_out = m.take("cc")
        var = m.take("lo", "hi")
        t = m.one_type()
        m.done()
        if t not in (U32, S32, U64, S64):
            raise self.syntax(ins, f"{ins.opcode} is .u32, .s32, .u64 or .s64")
        base = ins.opcode.rstrip("c") if ins.opcode in ("addc", "subc", "madc") else ins.opcode
        carry_in = ins.opcode in ("addc", "subc", "madc")
        ut = unsigned_type(isa.TYPE_BITS[t])
        f = isa.register_file(t)
        o = ins.operands
        em = self.em
        if base == "mad":
            self.nops(ins, 4)
            x = em.scratch(f)
            em.emit(isa.OP_MUL, ut, mod=mod_var(isa.VAR_HI if var == "hi" else isa.VAR_LO), d=x,
                    a=self.src(o[1], ut, ins), b=self.src(o[2], ut, ins))
            y = self.src(o[3], ut, ins)
        else:
            self.nops(ins, 3)
            x = em.materialize(self.src(o[1], ut, ins), ut)
            y = self.src(o[2], ut, ins)
        add = base in ("add", "mad")
        s = em.scratch(f)
        em.emit(isa.OP_ADD if add else isa.OP_SUB, ut, d=s, a=x, b=y)
        cmp_lo = isa.CMP_LO << isa.MOD_CMP_SHIFT
        p = None
        if cc_out:
            p = em.scratch(PRED)
            if add:
                em.emit(isa.OP_SETP, ut, mod=cmp_lo, d=p, a=s, b=x)
            else:
                em.emit(isa.OP_SETP, ut, mod=cmp_lo, d=p, a=x, b=y)
        if carry_in:
            cin = em.scratch(f)
            em.emit(isa.OP_SELP, ut, d=cin, a=Imm(1), b=Imm(0), c=self.cc)
            s2 = em.scratch(f)
            em.emit(isa.OP_ADD if add else isa.OP_SUB, ut, d=s2, a=s, b=cin)
            if cc_out:
                p2 = em.scratch(PRED)
                if add:
                    em.emit(isa.OP_SETP, ut, mod=cmp_lo, d=p2, a=s2, b=s)
                else:
                    em.emit(isa.OP_SETP, ut, mod=cmp_lo, d=p2, a=s, b=cin)
                em.emit(isa.OP_OR, T_PRED, d=p, a=p, b=p2)
            s = s2
        if cc_out:
            em.emit(isa.OP_MOV, T_PRED, d=self.cc, a=p)
        r, _ = self.dst(o[0], t, ins)
        em.emit(isa.OP_MOV, ut, d=r, a=s)

    h_addc = h_subc = h_madc = carry

    def h_mul(self, ins):
        self.arith(ins, isa.OP_MUL, 2, default_var=isa.VAR_LO)

    def h_mad(self, ins):
        if "cc" in ins.mods:
            return self.carry(ins)
        self.arith(ins, isa.OP_MAD, 3, default_var=isa.VAR_LO)

    def h_fma(self, ins):
        self.arith(ins, isa.OP_FMA, 3)

    def h_div(self, ins):
        self.arith(ins, isa.OP_DIV, 2)

    def h_rem(self, ins):
        self.arith(ins, isa.OP_REM, 2)

    def h_abs(self, ins):
        self.arith(ins, isa.OP_ABS, 1)

    def h_neg(self, ins):
        self.arith(ins, isa.OP_NEG, 1)

    def h_min(self, ins):
        self.minmax(ins, isa.OP_MIN)

    def h_max(self, ins):
        self.minmax(ins, isa.OP_MAX)

    def minmax(self, ins, op):
        if "f16" in ins.mods:
            m = Mods(self, ins)
            ftz = m.take("ftz")
            t = m.one_type()
            m.done()
            self.nops(ins, 3)
            F16, F32 = isa.TYPE_F16, isa.TYPE_F32
            s1, s2 = self.em.scratch(R32), self.em.scratch(R32)
            self.em.emit(isa.OP_CVT, F32, type2=F16, d=s1, a=self.src(ins.operands[1], t, ins))
            self.em.emit(isa.OP_CVT, F32, type2=F16, d=s2, a=self.src(ins.operands[2], t, ins))
            self.em.emit(op, F32, mod=isa.MOD_FTZ if ftz else 0, d=s1, a=s1, b=s2)
            r, _ = self.dst(ins.operands[0], F16, ins)
            self.em.emit(isa.OP_CVT, F16, type2=F32, mod=isa.RND_RN, d=r, a=s1)
            return
        self.arith(ins, op, 2)

    def h_copysign(self, ins):
        self.arith(ins, isa.OP_COPYSIGN, 2)

    def h_testp(self, ins):
        m = Mods(self, ins)
        kinds = {"finite": isa.VAR_TESTP_FINITE, "infinite": isa.VAR_TESTP_INFINITE,
                 "number": isa.VAR_TESTP_NUMBER, "notanumber": isa.VAR_TESTP_NOTANUMBER,
                 "normal": isa.VAR_TESTP_NORMAL, "subnormal": isa.VAR_TESTP_SUBNORMAL}
        k = m.take(*kinds)
        t = m.one_type()
        m.done()
        if not k:
            raise self.syntax(ins, "testp needs a test")
        self.nops(ins, 2)
        r, _ = self.dst(ins.operands[0], T_PRED, ins)
        self.em.emit(isa.OP_TESTP, t, mod=mod_var(kinds[k]), d=r,
                     a=self.src(ins.operands[1], t, ins))

    def h_unary_float(self, ins):
        self.arith(ins, _UNARY_FLOAT[ins.opcode], 1)

    # ---------------------------------------------------------------- bits
    def logic(self, ins, op: int, nsrc: int):
        m = Mods(self, ins)
        t = m.one_type()
        m.done()
        if t != T_PRED:
            t = bit_type(isa.TYPE_BITS[t])
        if t not in isa.OPCODES[op].types:
            raise self.unsupported(ins, f"{ins.opcode}.{isa.TYPE_NAMES[t]}")
        self.nops(ins, nsrc + 1)
        r, _ = self.dst(ins.operands[0], t, ins)
        srcs = [self.src(o, t, ins) for o in ins.operands[1:]] + [None]
        self.em.emit(op, t, d=r, a=srcs[0], b=srcs[1])

    def h_and(self, ins):
        self.logic(ins, isa.OP_AND, 2)

    def h_or(self, ins):
        self.logic(ins, isa.OP_OR, 2)

    def h_xor(self, ins):
        self.logic(ins, isa.OP_XOR, 2)

    def h_not(self, ins):
        self.logic(ins, isa.OP_NOT, 1)

    def h_cnot(self, ins):
        m = Mods(self, ins)
        t = m.one_type()
        m.done()
        self.nops(ins, 2)
        t = bit_type(isa.TYPE_BITS[t])
        p = self.em.scratch(PRED)
        self.em.emit(isa.OP_SETP, t, mod=isa.CMP_EQ << isa.MOD_CMP_SHIFT, d=p,
                     a=self.src(ins.operands[1], t, ins), b=Imm(0))
        r, _ = self.dst(ins.operands[0], t, ins)
        self.em.emit(isa.OP_SELP, t, d=r, a=Imm(1), b=Imm(0), c=p)

    def h_shl(self, ins):
        self.arith(ins, isa.OP_SHL, 2)

    def h_shr(self, ins):
        self.arith(ins, isa.OP_SHR, 2)

    def count_bits(self, ins, op):
        m = Mods(self, ins)
        t = m.one_type()
        m.done()
        self.nops(ins, 2)
        if t not in isa.OPCODES[op].types:
            raise self.unsupported(ins, f"{ins.opcode}.{isa.TYPE_NAMES[t]}")
        r, _ = self.dst(ins.operands[0], U32, ins)
        self.em.emit(op, t, d=r, a=self.src(ins.operands[1], t, ins))

    def h_popc(self, ins):
        self.count_bits(ins, isa.OP_POPC)

    def h_clz(self, ins):
        self.count_bits(ins, isa.OP_CLZ)

    def h_brev(self, ins):
        self.arith(ins, isa.OP_BREV, 1)

    def h_bfind(self, ins):
        m = Mods(self, ins)
        sa = m.take("shiftamt")
        t = m.one_type()
        m.done()
        self.nops(ins, 2)
        r, _ = self.dst(ins.operands[0], U32, ins)
        self.em.emit(isa.OP_BFIND, t, mod=mod_var(isa.VAR_BFIND_SHIFTAMT) if sa else 0, d=r,
                     a=self.src(ins.operands[1], t, ins))

    def h_bfe(self, ins):
        m = Mods(self, ins)
        t = m.one_type()
        m.done()
        self.nops(ins, 4)
        r, _ = self.dst(ins.operands[0], t, ins)
        o = ins.operands
        self.em.emit(isa.OP_BFE, t, d=r, a=self.src(o[1], t, ins), b=self.src(o[2], U32, ins),
                     c=self.src(o[3], U32, ins))

    def h_bfi(self, ins):
        m = Mods(self, ins)
        t = m.one_type()
        m.done()
        self.nops(ins, 5)
        o = ins.operands
        a, b = self.src(o[1], t, ins), self.src(o[2], t, ins)
        c, ln = self.src(o[3], U32, ins), self.src(o[4], U32, ins)
        r, _ = self.dst(o[0], t, ins)
        self.em.emit(isa.OP_BFI, t, d=r, a=a, b=b, c=c, d2=ln)

    def h_prmt(self, ins):
        m = Mods(self, ins)
        modes = {"f4e": isa.VAR_PRMT_F4E, "b4e": isa.VAR_PRMT_B4E, "rc8": isa.VAR_PRMT_RC8,
                 "ecl": isa.VAR_PRMT_ECL, "ecr": isa.VAR_PRMT_ECR, "rc16": isa.VAR_PRMT_RC16}
        mode = m.take(*modes)
        if m.one_type() != B32:
            raise self.syntax(ins, "prmt is .b32")
        m.done()
        self.nops(ins, 4)
        o = ins.operands
        r, _ = self.dst(o[0], B32, ins)
        self.em.emit(isa.OP_PRMT, B32, mod=mod_var(modes[mode]) if mode else 0, d=r,
                     a=self.src(o[1], B32, ins), b=self.src(o[2], B32, ins),
                     c=self.src(o[3], U32, ins))

    def h_shf(self, ins):
        """shf.{l,r}.{wrap,clamp}.b32 d, a, b, c: a funnel shift of {b:a}, built from shifts."""
        m = Mods(self, ins)
        left = m.take("l")
        right = m.take("r")
        clamp = m.take("clamp")
        wrap = m.take("wrap")
        t = m.one_type()
        m.done()
        if bool(left) == bool(right) or bool(clamp) == bool(wrap) or t not in (B32, U32, S32):
            raise self.syntax(ins, "shf needs .l or .r, .wrap or .clamp, and .b32")
        self.nops(ins, 4)
        o = ins.operands
        a, b = self.src(o[1], B32, ins), self.src(o[2], B32, ins)
        c = self.src(o[3], U32, ins)
        if isinstance(c, Imm):
            n = min(c.bits, 32) if clamp else c.bits & 31
            n_op, m_op = Imm(n), Imm(32 - n)
        else:
            n_op = self.em.scratch(R32)
            if clamp:
                self.em.emit(isa.OP_MIN, U32, d=n_op, a=c, b=Imm(32))
            else:
                self.em.emit(isa.OP_AND, B32, d=n_op, a=c, b=Imm(31))
            m_op = self.em.scratch(R32)
            self.em.emit(isa.OP_SUB, U32, d=m_op, a=Imm(32), b=n_op)
        hi, lo = self.em.scratch(R32), self.em.scratch(R32)
        if left:   # upper 32 bits of {b:a} << n
            self.em.emit(isa.OP_SHL, B32, d=hi, a=b, b=n_op)
            self.em.emit(isa.OP_SHR, B32, d=lo, a=a, b=m_op)
        else:      # lower 32 bits of {b:a} >> n
            self.em.emit(isa.OP_SHR, B32, d=hi, a=a, b=n_op)
            self.em.emit(isa.OP_SHL, B32, d=lo, a=b, b=m_op)
        r, _ = self.dst(o[0], B32, ins)
        self.em.emit(isa.OP_OR, B32, d=r, a=hi, b=lo)

    def h_lop3(self, ins):
        """lop3.b32 d, a, b, c, lut: the sum of the minterms the lookup table selects."""
        m = Mods(self, ins)
        t = m.one_type()
        m.done()
        self.nops(ins, 5)
        o = ins.operands
        if not isinstance(o[4], ast.Imm) or t != B32:
            raise self.unsupported(ins, "lop3 with a non-constant table or a predicate result")
        lut = o[4].value & 0xFF
        r, _ = self.dst(o[0], B32, ins)
        if lut in (0, 0xFF):
            self.em.emit(isa.OP_MOV, B32, d=r, a=Imm(0 if lut == 0 else 0xFFFFFFFF))
            return
        srcs = [self.em.materialize(self.src(x, B32, ins), B32) for x in o[1:4]]
        inv = []
        for s in srcs:
            n = self.em.scratch(R32)
            self.em.emit(isa.OP_NOT, B32, d=n, a=s)
            inv.append(n)
        acc = self.em.scratch(R32)
        term = self.em.scratch(R32)
        first = True
        for i in range(8):
            if not (lut >> i) & 1:
                continue
            pa = srcs[0] if i & 4 else inv[0]
            pb = srcs[1] if i & 2 else inv[1]
            pc = srcs[2] if i & 1 else inv[2]
            self.em.emit(isa.OP_AND, B32, d=term, a=pa, b=pb)
            self.em.emit(isa.OP_AND, B32, d=term, a=term, b=pc)
            if first:
                self.em.emit(isa.OP_MOV, B32, d=acc, a=term)
                first = False
            else:
                self.em.emit(isa.OP_OR, B32, d=acc, a=acc, b=term)
        self.em.emit(isa.OP_MOV, B32, d=r, a=acc)

    def mul24(self, ins, add: bool):
        m = Mods(self, ins)
        hi = m.take("hi")
        m.take("lo")
        t = m.one_type()
        m.done()
        if t not in (U32, S32):
            raise self.syntax(ins, f"{ins.opcode} is .u32 or .s32")
        self.nops(ins, 4 if add else 3)
        o = ins.operands
        s1, s2 = self.em.scratch(R32), self.em.scratch(R32)
        self.em.emit(isa.OP_BFE, t, d=s1, a=self.src(o[1], t, ins), b=Imm(0), c=Imm(24))
        self.em.emit(isa.OP_BFE, t, d=s2, a=self.src(o[2], t, ins), b=Imm(0), c=Imm(24))
        if hi:
            w = self.em.scratch(R64)
            self.em.emit(isa.OP_MUL, t, mod=mod_var(isa.VAR_WIDE), d=w, a=s1, b=s2)
            self.em.emit(isa.OP_SHR, B64, d=w, a=w, b=Imm(16))
            self.em.emit(isa.OP_CVT, U32, type2=U64, d=s1, a=w)
        else:
            self.em.emit(isa.OP_MUL, t, mod=mod_var(isa.VAR_LO), d=s1, a=s1, b=s2)
        r, _ = self.dst(o[0], t, ins)
        if add:
            self.em.emit(isa.OP_ADD, t, d=r, a=s1, b=self.src(o[3], t, ins))
        else:
            self.em.emit(isa.OP_MOV, t, d=r, a=s1)

    def h_mul24(self, ins):
        self.mul24(ins, False)

    def h_mad24(self, ins):
        self.mul24(ins, True)

    def h_sad(self, ins):
        m = Mods(self, ins)
        t = m.one_type()
        m.done()
        if t not in (U32, S32, isa.TYPE_U16, isa.TYPE_S16, U64, S64):
            raise self.syntax(ins, "bad sad type")
        self.nops(ins, 4)
        o = ins.operands
        f = isa.register_file(t)
        a, b = self.src(o[1], t, ins), self.src(o[2], t, ins)
        hi, lo = self.em.scratch(f), self.em.scratch(f)
        self.em.emit(isa.OP_MAX, t, d=hi, a=a, b=b)
        self.em.emit(isa.OP_MIN, t, d=lo, a=a, b=b)
        ut = unsigned_type(isa.TYPE_BITS[t])
        self.em.emit(isa.OP_SUB, ut, d=hi, a=hi, b=lo)
        r, _ = self.dst(o[0], t, ins)
        self.em.emit(isa.OP_ADD, ut, d=r, a=hi, b=self.src(o[3], ut, ins))

    # ---------------------------------------------------------------- comparison
    def compare_mods(self, ins, m: Mods) -> int:
        cmp_ = m.take(*_CMP)
        if not cmp_:
            raise self.syntax(ins, f"{ins.opcode} needs a comparison")
        mod = _CMP[cmp_] << isa.MOD_CMP_SHIFT
        b = m.take(*_BOOL)
        if b:
            mod |= _BOOL[b] << isa.MOD_BOOL_SHIFT
        if m.take("ftz"):
            mod |= isa.MOD_FTZ
        return mod

    def h_setp(self, ins):
        m = Mods(self, ins)
        mod = self.compare_mods(ins, m)
        t = m.one_type()
        m.done()
        boolop = mod & isa.MOD_BOOL_MASK
        self.nops(ins, 4 if boolop else 3)
        o = ins.operands
        a, b = self.src(o[1], t, ins), self.src(o[2], t, ins)
        c = None
        if boolop:
            c, neg = self.pred_src(o[3], ins)
            if neg:
                mod |= isa.MOD_NEG_C
        d = o[0]
        if isinstance(d, ast.Pair):
            p, _ = self.dst(d.first, T_PRED, ins)
            q, _ = self.dst(d.second, T_PRED, ins)
        else:
            p, _ = self.dst(d, T_PRED, ins)
            q = None
        self.em.emit(isa.OP_SETP, t, mod=mod, d=p, d2=q, a=a, b=b, c=c)

    def h_set(self, ins):
        m = Mods(self, ins)
        mod = self.compare_mods(ins, m)
        ts = m.types()
        m.done()
        if len(ts) != 2:
            raise self.syntax(ins, "set needs a destination and a source type")
        dt, st = ts
        boolop = mod & isa.MOD_BOOL_MASK
        self.nops(ins, 4 if boolop else 3)
        o = ins.operands
        a, b = self.src(o[1], st, ins), self.src(o[2], st, ins)
        c = None
        if boolop:
            c, neg = self.pred_src(o[3], ins)
            if neg:
                mod |= isa.MOD_NEG_C
        r, _ = self.dst(o[0], dt, ins)
        self.em.emit(isa.OP_SET, dt, type2=st, mod=mod, d=r, a=a, b=b, c=c)

    def h_selp(self, ins):
        m = Mods(self, ins)
        t = m.one_type()
        m.done()
        self.nops(ins, 4)
        o = ins.operands
        a, b = self.src(o[1], t, ins), self.src(o[2], t, ins)
        c, neg = self.pred_src(o[3], ins)
        r, _ = self.dst(o[0], t, ins)
        self.em.emit(isa.OP_SELP, t, mod=isa.MOD_NEG_C if neg else 0, d=r, a=a, b=b, c=c)

    def h_slct(self, ins):
        m = Mods(self, ins)
        ftz = m.take("ftz")
        ts = m.types()
        m.done()
        if len(ts) != 2:
            raise self.syntax(ins, "slct needs two types")
        dt, ct = ts
        self.nops(ins, 4)
        o = ins.operands
        a, b = self.src(o[1], dt, ins), self.src(o[2], dt, ins)
        c = self.src(o[3], ct, ins)
        r, _ = self.dst(o[0], dt, ins)
        self.em.emit(isa.OP_SLCT, dt, type2=ct, mod=isa.MOD_FTZ if ftz else 0, d=r, a=a, b=b, c=c)

    # ---------------------------------------------------------------- control
    def h_bra(self, ins):
        m = Mods(self, ins)
        m.take("uni")
        m.done()
        self.nops(ins, 1)
        tgt = ins.operands[0]
        if not isinstance(tgt, ast.Sym) or tgt.offset:
            raise self.syntax(ins, "bra needs a label")
        label = self.frame.labels.get(tgt.name)
        if label is None:
            raise PtxCompileError(f"undefined label {tgt.name}", ins.line, ins.text)
        self.em.emit(isa.OP_BRA, target=label)

    def h_ret(self, ins):
        m = Mods(self, ins)
        m.take("uni")
        m.done()
        if self.frame.is_entry:
            self.em.emit(isa.OP_EXIT)
        elif not (ins is self.frame.last_stmt and not self.em.guard):
            self.em.emit(isa.OP_BRA, target=self.frame.ret_label)

    def h_exit(self, ins):
        Mods(self, ins).done()
        self.em.emit(isa.OP_EXIT)

    def h_trap(self, ins):
        Mods(self, ins).done()
        self.em.emit(isa.OP_TRAP)

    # ---------------------------------------------------------------- synchronisation
    def h_bar(self, ins):
        m = Mods(self, ins)
        m.take("cta")
        m.take("aligned")
        if m.take("warp"):
            m.take("sync")
            m.done()
            self.em.emit(isa.OP_MEMBAR)  # warps run in lock step at their reconvergence points
            return
        if m.take("cluster"):
            raise self.unsupported(ins, "cluster barriers")
        red = m.take("red")
        kind = m.take("sync", "arrive")
        o = ins.operands
        if red:
            op = m.take("popc", "and", "or")
            t = m.one_type()
            m.done()
            var = {"popc": isa.VAR_BAR_RED_POPC, "and": isa.VAR_BAR_RED_AND,
                   "or": isa.VAR_BAR_RED_OR}.get(op)
            if var is None or (op == "popc") != (t == U32) or (op != "popc") != (t == T_PRED):
                raise self.syntax(ins, "bar.red needs .popc.u32, .and.pred or .or.pred")
            self.nops(ins, 3, 4)
            c, neg = self.pred_src(o[-1], ins)
            a = self.src(o[1], U32, ins)
            b = self.src(o[2], U32, ins) if len(o) == 4 else None
            r, _ = self.dst(o[0], t, ins)
            self.em.emit(isa.OP_BAR, t, mod=mod_var(var) | (isa.MOD_NEG_C if neg else 0), d=r,
                         a=a, b=b, c=c)
            return
        m.done()
        if ins.opcode == "bar" and kind is None and not ins.mods:
            kind = "sync"
        if kind is None:
            raise self.syntax(ins, "bar needs .sync, .arrive or .red")
        self.nops(ins, 1, 2)
        a = self.src(o[0], U32, ins)
        b = self.src(o[1], U32, ins) if len(o) == 2 else None
        var = isa.VAR_BAR_SYNC if kind == "sync" else isa.VAR_BAR_ARRIVE
        self.em.emit(isa.OP_BAR, mod=mod_var(var), a=a, b=b)

    h_barrier = h_bar

    def h_membar(self, ins):
        m = Mods(self, ins)
        m.take("cta", "gl", "sys", "gpu", "cluster")
        m.hints()
        for x in list(m.left):
            if x.startswith(("proxy", "op_restrict", "sync_restrict", "mbarrier_init",
                             "acquire", "release")) or x in ("alias", "async", "generic",
                                                             "tensormap", "global", "shared",
                                                             "shared::cta", "shared::cluster"):
                m.left.remove(x)
        m.done()
        self.em.emit(isa.OP_MEMBAR)

    h_fence = h_membar

    def atomic(self, ins, red: bool):
        m = Mods(self, ins)
        hint = m.hints()
        space = m.space()
        if space not in (isa.SPACE_GENERIC, isa.SPACE_GLOBAL, isa.SPACE_SHARED):
            raise self.syntax(ins, f"{ins.opcode} on .{isa.SPACE_NAMES[space]}")
        op = m.take(*_ATOM)
        if m.vector():
            raise self.unsupported(ins, "vector atomics")
        if m.take("noftz"):
            raise self.unsupported(ins, "f16/bf16 atomics")
        ts = m.types()
        m.done()
        if op is None or len(ts) != 1:
            raise self.syntax(ins, f"{ins.opcode} needs an operation and a type")
        t = ts[0]
        if t not in isa.OPCODES[isa.OP_ATOM].types:
            raise self.unsupported(ins, f"{ins.opcode}.{isa.TYPE_NAMES[t]}")
        a = _ATOM[op]
        float_ok = a in (isa.ATOM_ADD, isa.ATOM_EXCH)
        if (t in isa.FLOAT_TYPES and not float_ok) or \
                (a in (isa.ATOM_INC, isa.ATOM_DEC) and t != U32) or \
                (a in (isa.ATOM_AND, isa.ATOM_OR, isa.ATOM_XOR) and t not in (B32, B64)) or \
                (a == isa.ATOM_CAS and t not in (B32, B64)):
            raise self.unsupported(ins, f"{ins.opcode}.{op}.{isa.TYPE_NAMES[t]}")
        ops = ins.operands[:-1] if hint else ins.operands
        mod = mod_space(space) | (a << isa.MOD_ATOM_SHIFT)
        if red:
            self.nops_list(ins, ops, 2)
            base, off, sp = self.address(ops[0], space, ins, t)
            mod = mod_space(sp) | (a << isa.MOD_ATOM_SHIFT)
            self.em.emit(isa.OP_RED, t, mod=mod, a=base, b=self.src(ops[1], t, ins), offset=off)
            return
        self.nops_list(ins, ops, 4 if a == isa.ATOM_CAS else 3)
        base, off, sp = self.address(ops[1], space, ins, t)
        mod = mod_space(sp) | (a << isa.MOD_ATOM_SHIFT)
        b = self.src(ops[2], t, ins)
        c = self.src(ops[3], t, ins) if a == isa.ATOM_CAS else None
        r, _ = self.dst(ops[0], t, ins)
        self.em.emit(isa.OP_ATOM, t, mod=mod, d=r, a=base, b=b, c=c, offset=off)

    def h_atom(self, ins):
        self.atomic(ins, False)

    def h_red(self, ins):
        self.atomic(ins, True)

    def h_shfl(self, ins):
        m = Mods(self, ins)
        m.take("sync")
        modes = {"up": isa.VAR_SHFL_UP, "down": isa.VAR_SHFL_DOWN, "bfly": isa.VAR_SHFL_BFLY,
                 "idx": isa.VAR_SHFL_IDX}
        mode = m.take(*modes)
        t = m.one_type()
        m.done()
        if mode is None or t != B32:
            raise self.syntax(ins, "shfl needs a mode and .b32")
        o = ins.operands
        self.nops(ins, 4, 5)  # the .sync form's membermask is dropped (SM-EXEC-4)
        a, b, c = (self.src(o[1], B32, ins), self.src(o[2], U32, ins), self.src(o[3], U32, ins))
        d = o[0]
        if isinstance(d, ast.Pair):
            r, _ = self.dst(d.first, B32, ins)
            p, _ = self.dst(d.second, T_PRED, ins)
        else:
            r, _ = self.dst(d, B32, ins)
            p = None
        self.em.emit(isa.OP_SHFL, B32, mod=mod_var(modes[mode]), d=r, d2=p, a=a, b=b, c=c)

    def h_vote(self, ins):
        m = Mods(self, ins)
        m.take("sync")
        modes = {"all": isa.VAR_VOTE_ALL, "any": isa.VAR_VOTE_ANY, "uni": isa.VAR_VOTE_UNI,
                 "ballot": isa.VAR_VOTE_BALLOT}
        mode = m.take(*modes)
        t = m.one_type()
        m.done()
        if mode is None or (mode == "ballot") != (t == B32) or t not in (B32, T_PRED):
            raise self.syntax(ins, "vote needs .all/.any/.uni.pred or .ballot.b32")
        self.nops(ins, 2, 3)
        a, neg = self.pred_src(ins.operands[1], ins)
        r, _ = self.dst(ins.operands[0], t, ins)
        self.em.emit(isa.OP_VOTE, t, mod=mod_var(modes[mode]) | (isa.MOD_NEG_C if neg else 0),
                     d=r, a=a)

    def h_activemask(self, ins):
        m = Mods(self, ins)
        m.one_type()
        m.done()
        self.nops(ins, 1)
        r, _ = self.dst(ins.operands[0], B32, ins)
        self.em.emit(isa.OP_ACTIVEMASK, B32, d=r)

    HANDLERS = {
        "mov": h_mov, "ld": h_ld, "ldu": h_ldu, "st": h_st, "cvt": h_cvt, "cvta": h_cvta,
        "isspacep": h_isspacep, "prefetch": h_nothing, "prefetchu": h_nothing,
        "nanosleep": h_nothing,
        "add": h_add, "sub": h_sub, "addc": h_addc, "subc": h_subc, "madc": h_madc, "mul": h_mul, "mad": h_mad, "fma": h_fma, "div": h_div,
        "rem": h_rem, "abs": h_abs, "neg": h_neg, "min": h_min, "max": h_max,
        "copysign": h_copysign, "testp": h_testp,
        "sqrt": h_unary_float, "rsqrt": h_unary_float, "rcp": h_unary_float,
        "ex2": h_unary_float, "lg2": h_unary_float, "sin": h_unary_float, "cos": h_unary_float,
        "tanh": h_unary_float,
        "and": h_and, "or": h_or, "xor": h_xor, "not": h_not, "cnot": h_cnot, "shl": h_shl,
        "shr": h_shr, "popc": h_popc, "clz": h_clz, "brev": h_brev, "bfind": h_bfind,
        "bfe": h_bfe, "bfi": h_bfi, "prmt": h_prmt, "shf": h_shf, "lop3": h_lop3,
        "mul24": h_mul24, "mad24": h_mad24, "sad": h_sad,
        "setp": h_setp, "set": h_set, "selp": h_selp, "slct": h_slct,
        "bra": h_bra, "ret": h_ret, "exit": h_exit, "trap": h_trap,
        "bar": h_bar, "barrier": h_barrier, "membar": h_membar, "fence": h_fence,
        "atom": h_atom, "red": h_red, "shfl": h_shfl, "vote": h_vote,
        "activemask": h_activemask,
    }
