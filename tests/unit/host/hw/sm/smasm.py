"""A small test-side assembler: text -> code-object bytes, from spec/isa.py alone.

It is not the guest's PTX compiler: it writes ISA instructions one to one, so tests of the
hardware control every field. Syntax, one statement per line (`//` comments):

  .entry NAME [r32=N] [r64=N] [pred=N] [shared=N] [local=N] [maxntid=N]
  .param TYPE NAME [align=N]          TYPE: u32, f32, u64, ..., or b8[SIZE] (by value)
  .global NAME SIZE [HEX]             a .global variable (data segment), optional init
  .const NAME SIZE [HEX]              a .const variable
  LABEL:
  [@pN | @!pN] op[.mod ...] operands

Modifiers are PTX-like: types (the first is `type`, a second one `type2` for cvt, set,
slct), rounding (rn rz rm rp rni rzi rmi rpi), sat ftz approx volatile, variants (lo hi
wide, up down bfly idx, all any uni ballot, sync arrive red.popc red.and red.or,
shiftamt, f4e b4e rc8 ecl ecr rc16, finite infinite number notanumber normal subnormal),
comparisons (eq ... nan) and boolean ops (and or xor) for setp/set, spaces (global
shared local param const), atomic operations, `to` for cvta from generic.

Operands: rN (R32), rdN (R64), pN / !pN (PRED; `!` on c sets MOD_NEG_C), %tid.x and other
special registers, integers (SIMM when they fit 28 bits and the slot is an integer, else
IMM), floats (1.5, 0f3F800000, 0d...), data+N / const+N or a variable's name (DATA /
CONST), _ (none), labels, and addresses [base], [base+off], [off], [param_name].
Destination pairs (setp, shfl) are written d|d2. Register counts default to the highest
index used plus one.
"""

from __future__ import annotations

import re
import struct

from pvgpu.spec import isa
from pvgpu.spec.isa import (OPND_CONST, OPND_DATA, OPND_IMM, OPND_NONE, OPND_PRED, OPND_R32, OPND_R64,
                      OPND_SIMM, OPND_SREG, operand)

SREGS = {v: k for k, v in isa.SREG_NAMES.items()}
ROUND = {"rn": isa.RND_RN, "rz": isa.RND_RZ, "rm": isa.RND_RM, "rp": isa.RND_RP,
         "rni": isa.RND_RNI, "rzi": isa.RND_RZI, "rmi": isa.RND_RMI, "rpi": isa.RND_RPI}
CMPS = {v: k for k, v in isa.CMP_NAMES.items()}
SPACES = {v: k for k, v in isa.SPACE_NAMES.items() if v != "generic"}
ATOMS = {v: k for k, v in isa.ATOM_NAMES.items()}
VARIANTS = {
    "mul": {"lo": isa.VAR_LO, "hi": isa.VAR_HI, "wide": isa.VAR_WIDE},
    "mad": {"lo": isa.VAR_LO, "hi": isa.VAR_HI, "wide": isa.VAR_WIDE},
    "shfl": {"up": isa.VAR_SHFL_UP, "down": isa.VAR_SHFL_DOWN, "bfly": isa.VAR_SHFL_BFLY,
             "idx": isa.VAR_SHFL_IDX},
    "vote": {"all": isa.VAR_VOTE_ALL, "any": isa.VAR_VOTE_ANY, "uni": isa.VAR_VOTE_UNI,
             "ballot": isa.VAR_VOTE_BALLOT},
    "bar": {"sync": isa.VAR_BAR_SYNC, "arrive": isa.VAR_BAR_ARRIVE},
    "bfind": {"shiftamt": isa.VAR_BFIND_SHIFTAMT},
    "prmt": {"f4e": isa.VAR_PRMT_F4E, "b4e": isa.VAR_PRMT_B4E, "rc8": isa.VAR_PRMT_RC8,
             "ecl": isa.VAR_PRMT_ECL, "ecr": isa.VAR_PRMT_ECR, "rc16": isa.VAR_PRMT_RC16},
    "testp": {"finite": isa.VAR_TESTP_FINITE, "infinite": isa.VAR_TESTP_INFINITE,
              "number": isa.VAR_TESTP_NUMBER, "notanumber": isa.VAR_TESTP_NOTANUMBER,
              "normal": isa.VAR_TESTP_NORMAL, "subnormal": isa.VAR_TESTP_SUBNORMAL},
}
BAR_RED = {"popc": isa.VAR_BAR_RED_POPC, "and": isa.VAR_BAR_RED_AND, "or": isa.VAR_BAR_RED_OR}
BOOLS = {"and": isa.BOOL_AND, "or": isa.BOOL_OR, "xor": isa.BOOL_XOR}
REG = re.compile(r"^(rd|r|p)(\d+)$")


class AsmError(Exception):
    pass


def _align(n, a=isa.COBJ_ALIGN):
    return -(-n // a) * a


class _Entry:
    def __init__(self, name, opts):
        self.name = name
        self.opts = opts
        self.params = []  # (name, type, size, align, offset)
        self.lines = []  # (lineno, text)
        self.labels = {}


def _parse_int(s):
    s = s.strip()
    neg = s.startswith("-")
    if neg:
        s = s[1:]
    v = int(s, 0)
    return -v if neg else v


class Assembler:
    def __init__(self, text: str, data_va: int = 0, const_va: int = 0):
        self.data_va = data_va
        self.const_va = const_va
        self.entries: list = []
        self.symbols: dict = {}  # name -> (space, offset, size, init)
        self.data_size = 0
        self.const_size = 0
        self._parse(text)

    # ------------------------------------------------------------ parsing
    def _parse(self, text):
        cur = None
        for lineno, line in enumerate(text.splitlines(), 1):
            line = line.split("//")[0].strip()
            if not line:
                continue
            if line.startswith(".entry"):
                parts = line.split()
                opts = dict(p.split("=") for p in parts[2:])
                cur = _Entry(parts[1], {k: int(v, 0) for k, v in opts.items()})
                self.entries.append(cur)
            elif line.startswith(".param"):
                parts = line.split()
                tname, name = parts[1], parts[2]
                opts = dict(p.split("=") for p in parts[3:])
                m = re.match(r"b8\[(\d+)\]", tname)
                if m:
                    t, size = isa.TYPE_B8, int(m.group(1))
                    align = int(opts.get("align", 1))
                else:
                    t = isa.TYPES_BY_NAME[tname]
                    size = isa.TYPE_BITS[t] // 8
                    align = int(opts.get("align", size))
                end = cur.params[-1][4] + cur.params[-1][2] if cur.params else 0
                off = _align(end, align)
                cur.params.append((name, t, size, align, off))
            elif line.startswith(".global") or line.startswith(".const"):
                parts = line.split()
                space = isa.SPACE_GLOBAL if parts[0] == ".global" else isa.SPACE_CONST
                size = int(parts[2], 0)
                init = bytes.fromhex(parts[3]) if len(parts) > 3 else b""
                if space == isa.SPACE_GLOBAL:
                    off = _align(self.data_size)
                    self.data_size = off + size
                else:
                    off = _align(self.const_size)
                    self.const_size = off + size
                self.symbols[parts[1]] = (space, off, size, init)
            elif line.endswith(":"):
                cur.labels[line[:-1]] = len(cur.lines)
            else:
                cur.lines.append((lineno, line))

    # ------------------------------------------------------------ encoding
    def build(self) -> bytes:
        code = []
        records = []
        params = []
        strtab = b""
        for e in self.entries:
            start = len(code)
            counts = {OPND_R32: 0, OPND_R64: 0, OPND_PRED: 0}
            for lineno, text in e.lines:
                try:
                    raw = self._instruction(e, text, start, counts)
                except (AsmError, KeyError, ValueError) as err:
                    raise AsmError(f"line {lineno}: {text!r}: {err}") from None
                code.append(raw)
            param_size = (e.params[-1][4] + e.params[-1][2]) if e.params else 0
            param_size = int(e.opts.get("param_size", param_size))
            name_off = len(strtab)
            strtab += e.name.encode()
            records.append(struct.pack(
                isa.COBJ_ENTRY_FORMAT, name_off, len(e.name), start, len(code) - start,
                e.opts.get("r32", counts[OPND_R32]), e.opts.get("r64", counts[OPND_R64]),
                e.opts.get("pred", counts[OPND_PRED]), len(e.params), len(params),
                param_size, e.opts.get("shared", 0), e.opts.get("local", 0),
                e.opts.get("maxntid", 0), 0, 0))
            for name, t, size, align, off in e.params:
                params.append(struct.pack(isa.COBJ_PARAM_FORMAT, off, size, align, t))
        symbols = []
        for name, (space, off, size, init) in self.symbols.items():
            symbols.append(struct.pack(isa.COBJ_SYMBOL_FORMAT, len(strtab), len(name), space, 0,
                                       off, size))
            strtab += name.encode()
        data_init = bytearray(self.data_size)
        const_init = bytearray(self.const_size)
        for space, off, size, init in self.symbols.values():
            (data_init if space == isa.SPACE_GLOBAL else const_init)[off:off + len(init)] = init
        return build_object(records, params, symbols, strtab, code, bytes(data_init),
                            bytes(const_init), self.data_size, self.const_size,
                            self.data_va if self.data_size else 0,
                            self.const_va if self.const_size else 0)

    def _instruction(self, e, text, start, counts) -> bytes:
        guard = 0
        if text.startswith("@"):
            g, text = text.split(None, 1)
            neg = g.startswith("@!")
            idx = int(g.lstrip("@!").lstrip("p"))
            counts[OPND_PRED] = max(counts[OPND_PRED], idx + 1)
            guard = isa.GUARD_ON | (isa.GUARD_NEG if neg else 0) | idx
        parts = text.split(None, 1)
        words = parts[0].split(".")
        opnds = [o.strip() for o in _split_operands(parts[1])] if len(parts) > 1 else []
        name = words[0]
        spec = isa.OPCODES_BY_NAME[name]
        op = spec.opcode
        t = t2 = isa.TYPE_NONE
        mod = 0
        var = 0
        ws = words[1:]
        i = 0
        while i < len(ws):
            w = ws[i]
            if name == "bar" and w == "red":
                var = BAR_RED[ws[i + 1]]
                i += 2
                continue
            if name == "cvta" and w == "to":
                var = isa.VAR_CVTA_FROM_GENERIC
            elif w in isa.TYPES_BY_NAME:
                if t == isa.TYPE_NONE:
                    t = isa.TYPES_BY_NAME[w]
                else:
                    t2 = isa.TYPES_BY_NAME[w]
            elif w in ROUND:
                mod |= ROUND[w]
            elif w == "sat":
                mod |= isa.MOD_SAT
            elif w == "ftz":
                mod |= isa.MOD_FTZ
            elif w == "approx":
                mod |= isa.MOD_APPROX
            elif w == "volatile":
                mod |= isa.MOD_VOLATILE
            elif name in VARIANTS and w in VARIANTS[name]:
                var = VARIANTS[name][w]
            elif name in ("setp", "set") and w in CMPS and not (mod & isa.MOD_CMP_MASK):
                mod |= CMPS[w] << isa.MOD_CMP_SHIFT
            elif name in ("setp", "set") and w in BOOLS:
                mod |= BOOLS[w] << isa.MOD_BOOL_SHIFT
            elif w in SPACES:
                mod |= SPACES[w] << isa.MOD_SPACE_SHIFT
            elif name in ("atom", "red") and w in ATOMS:
                mod |= ATOMS[w] << isa.MOD_ATOM_SHIFT
            elif w == "uni" and name == "bra":
                pass
            else:
                raise AsmError(f"unknown modifier .{w}")
            i += 1
        if name == "cvta" and not var:
            var = isa.VAR_CVTA_TO_GENERIC
        mod |= var << isa.MOD_VARIANT_SHIFT
        slots = {"d": 0, "d2": 0, "a": 0, "b": 0, "c": 0}
        imm = 0
        types = _slot_types(op, t, t2, mod)

        def put(slot, text_, role_type):
            nonlocal imm, mod
            o, value, neg = self._operand(e, text_, role_type, counts)
            if neg:
                mod |= isa.MOD_NEG_C
            if value is not None:
                imm = value
            slots[slot] = o

        if name == "bra":
            target = opnds[0]
            if target not in e.labels:
                raise AsmError(f"unknown label {target}")
            imm = start + e.labels[target]
        elif name in ("ld", "st", "atom", "red"):
            order = {"ld": ["d", "a"], "st": ["a", "b"], "atom": ["d", "a", "b", "c"],
                     "red": ["a", "b"]}[name]
            for slot, text_ in zip(order, opnds):
                if slot == "a":
                    base, off = self._address(e, text_, counts)
                    slots["a"] = base[0]
                    if base[1] is not None:
                        imm = base[1]
                    else:
                        imm = off
                else:
                    put(slot, text_, t)
        elif name == "bar":
            if var >= isa.VAR_BAR_RED_POPC:
                order = ["d", "a", "b", "c"] if len(opnds) == 4 else ["d", "a", "c"]
            else:
                order = ["a", "b"]
            tmap = {"d": t, "a": isa.TYPE_U32, "b": isa.TYPE_U32, "c": isa.TYPE_PRED}
            for slot, text_ in zip(order, opnds):
                put(slot, text_, tmap[slot])
        else:
            if name == "bfi":
                order = ["d", "a", "b", "c", "d2"]
            else:
                order = ["d", "a", "b", "c"]
            texts = list(opnds)
            if texts and "|" in texts[0]:
                first, second = texts[0].split("|")
                put("d", first, types[0])
                put("d2", second, types[1])
                order, texts = order[1:], texts[1:]
            slot_type = dict(zip(("d", "d2", "a", "b", "c"), types))
            for slot, text_ in zip(order, texts):
                put(slot, text_, slot_type[slot])
        return isa.encode_instruction(op, t, type2=t2, mod=mod, guard=guard, **slots, imm=imm)

    def _operand(self, e, text, t, counts):
        """-> (operand, imm value or None, negated)."""
        neg = text.startswith("!")
        if neg:
            text = text[1:]
        if text == "_":
            return OPND_NONE, None, neg
        m = REG.match(text)
        if m:
            kind = {"r": OPND_R32, "rd": OPND_R64, "p": OPND_PRED}[m.group(1)]
            idx = int(m.group(2))
            counts[kind] = max(counts[kind], idx + 1)
            return operand(kind, idx), None, neg
        if text in SREGS:
            return operand(OPND_SREG, SREGS[text]), None, neg
        if text.startswith("data+") or text.startswith("const+"):
            kind = OPND_DATA if text.startswith("data") else OPND_CONST
            return operand(kind, int(text.split("+")[1], 0)), None, neg
        if text in self.symbols:
            space, off, _, _ = self.symbols[text]
            return operand(OPND_DATA if space == isa.SPACE_GLOBAL else OPND_CONST, off), None, neg
        value, is_float = _literal(text, t)
        if (not is_float and t in isa.INT_TYPES and -(1 << 27) <= value < (1 << 27)
                and not text.startswith("imm:")):
            return operand(OPND_SIMM, value), None, neg
        return operand(OPND_IMM), value & 0xFFFF_FFFF_FFFF_FFFF, neg

    def _address(self, e, text, counts):
        """[base+off] -> ((operand, imm or None), offset)."""
        if not (text.startswith("[") and text.endswith("]")):
            raise AsmError(f"address {text!r}")
        inner = text[1:-1].replace(" ", "")
        for p in e.params:
            if inner == p[0]:
                return (OPND_NONE, None), p[4]
        m = re.match(r"^([^+\-]+)([+\-].+)?$", inner)
        base, off = m.group(1), m.group(2)
        offset = _parse_int(off) if off else 0
        if base.startswith("data") or base.startswith("const") or base in self.symbols:
            o, _, _ = self._operand(e, base if base in self.symbols else base + "+0", isa.TYPE_U64,
                                    counts)
            if base.startswith("data+") or base.startswith("const+"):
                o, _, _ = self._operand(e, base, isa.TYPE_U64, counts)
            return (o, None), offset
        if REG.match(base):
            o, _, _ = self._operand(e, base, isa.TYPE_U64, counts)
            return (o, None), offset
        if base.startswith("imm:"):
            return (operand(OPND_IMM), _parse_int(base[4:]) + offset), 0
        return (OPND_NONE, None), _parse_int(base) + offset


def _split_operands(s):
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return out


def _literal(text, t):
    """-> (value bits or integer, is_float)."""
    if text.startswith("imm:"):
        text = text[4:]
    if text.startswith("0f") and len(text) == 10:
        return int(text[2:], 16), True
    if text.startswith("0d") and len(text) == 18:
        return int(text[2:], 16), True
    if t in isa.FLOAT_TYPES and re.match(r"^-?(\d+\.?\d*(e-?\d+)?|inf|nan)$", text):
        x = float(text)
        if t == isa.TYPE_F64:
            return struct.unpack("<Q", struct.pack("<d", x))[0], True
        if t == isa.TYPE_F16:
            return struct.unpack("<H", struct.pack("<e", x))[0], True
        return struct.unpack("<I", struct.pack("<f", x))[0], True
    return _parse_int(text), False


_WIDE = {isa.TYPE_U16: isa.TYPE_U32, isa.TYPE_S16: isa.TYPE_S32, isa.TYPE_U32: isa.TYPE_U64,
         isa.TYPE_S32: isa.TYPE_S64}


def _slot_types(op, t, t2, mod):
    """The type each slot's role refers to (spec/isa.py role legend)."""
    spec = isa.OPCODES[op]
    wide = isa.mod_field(mod, isa.MOD_VARIANT_MASK) == isa.VAR_WIDE and op in (isa.OP_MUL,
                                                                            isa.OP_MAD)
    out = []
    for slot, role in enumerate(spec.roles):
        r = role.rstrip("?")
        ty = {"T": t, "D": t, "T2": t2, "U": isa.TYPE_U32, "P": isa.TYPE_PRED}.get(r)
        if wide and (slot == 0 or (op == isa.OP_MAD and slot == 4)):
            ty = _WIDE.get(t, t)
        out.append(ty)
    return out


def build_object(entry_records, param_records, symbol_records, strtab: bytes, code,
                 data_init: bytes = b"", const_init: bytes = b"", data_size: int = 0,
                 const_size: int = 0, data_va: int = 0, const_va: int = 0) -> bytes:
    """Lay out a code object from its parts (each table 8-aligned, in spec order)."""
    parts = [b"".join(entry_records), b"".join(param_records), b"".join(symbol_records),
             strtab, b"".join(code), data_init, const_init]
    offs = []
    pos = isa.COBJ_HEADER_SIZE
    for p in parts:
        pos = _align(pos)
        offs.append(pos)
        pos += len(p)
    size = _align(pos)
    header = struct.pack(
        isa.COBJ_HEADER_FORMAT, isa.COBJ_MAGIC, isa.COBJ_VERSION, 0, size,
        offs[0], len(entry_records), offs[1], len(param_records), offs[2], len(symbol_records),
        offs[3], len(strtab), offs[4], len(code), data_size, offs[5], len(data_init),
        const_size, offs[6], len(const_init), 0, data_va, const_va)
    out = bytearray(size)
    out[:len(header)] = header
    for off, p in zip(offs, parts):
        out[off:off + len(p)] = p
    return bytes(out)


def assemble(text: str, data_va: int = 0, const_va: int = 0) -> bytes:
    return Assembler(text, data_va, const_va).build()


def entry_offset(obj: bytes, index: int = 0) -> int:
    """Byte offset of entry record `index` in the object."""
    hdr = dict(zip(isa.COBJ_HEADER_FIELDS, struct.unpack_from(isa.COBJ_HEADER_FORMAT, obj)))
    return hdr["entries_off"] + index * isa.COBJ_ENTRY_SIZE


def header(obj: bytes) -> dict:
    return dict(zip(isa.COBJ_HEADER_FIELDS, struct.unpack_from(isa.COBJ_HEADER_FORMAT, obj)))
