"""Code objects (spec/isa.md §1, clauses COBJ-*): a builder, a reader and a disassembler.

The builder (`CodeObjectBuilder`) is what the PTX compiler writes with: entries with their
parameter layouts and resource counts, module variables (the symbol table), the `.global`
and `.const` segments with their initial bytes, and the instructions. `read_code_object`
parses bytes back into a `CodeObject` (header, entries, parameters, symbols, code as a
numpy array of `INSTR_DTYPE`), checking the layout rules COBJ-LAYOUT-1/2 and the entry and
parameter records COBJ-ENTRY-1/COBJ-PARAM-1; the guest's loader uses it to find entries,
parameter layouts and globals by name. It depends on spec/isa.py only, not on the
compiler. `disassemble` prints instructions as text, for messages and debugging.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from pvgpu.spec import isa


class CodeObjectError(ValueError):
    """Bytes that are not a well-formed code object (COBJ-LAYOUT-*, COBJ-ENTRY-1, ...)."""


@dataclass(frozen=True)
class ParamInfo:
    offset: int
    size: int
    align: int
    type: int  # TYPE_*; TYPE_B8 with size > 1 for a byte array (a struct by value)

    @property
    def type_name(self) -> str:
        return isa.TYPE_NAMES.get(self.type, f"type{self.type}")


@dataclass(frozen=True)
class EntryInfo:
    index: int
    name: str
    code_start: int
    code_count: int
    n_r32: int
    n_r64: int
    n_pred: int
    params: tuple  # ParamInfo, in declaration order
    params_first: int
    param_size: int
    shared_size: int
    local_size: int
    max_threads: int


@dataclass(frozen=True)
class SymbolInfo:
    name: str
    space: int  # SPACE_GLOBAL or SPACE_CONST
    offset: int
    size: int


@dataclass
class CodeObject:
    header: dict
    entries: list
    symbols: list
    code: np.ndarray  # INSTR_DTYPE records
    data_init: bytes
    const_init: bytes
    size: int

    @property
    def data_size(self) -> int:
        return self.header["data_size"]

    @property
    def const_size(self) -> int:
        return self.header["const_size"]

    def entry(self, name: str) -> EntryInfo:
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(name)

    def symbol(self, name: str) -> SymbolInfo:
        for s in self.symbols:
            if s.name == name:
                return s
        raise KeyError(name)

    def entry_offset(self, entry: EntryInfo | int) -> int:
        """Byte offset of an entry record from the object's start (COBJ-LAUNCH-1)."""
        i = entry if isinstance(entry, int) else entry.index
        return self.header["entries_off"] + i * isa.COBJ_ENTRY_SIZE

    def entry_code(self, entry: EntryInfo) -> np.ndarray:
        return self.code[entry.code_start:entry.code_start + entry.code_count]


# --------------------------------------------------------------------------- builder
@dataclass
class _Entry:
    name: str
    code: bytes
    n_r32: int
    n_r64: int
    n_pred: int
    params: list
    param_size: int
    shared_size: int
    local_size: int
    max_threads: int


@dataclass
class CodeObjectBuilder:
    """Collects entries, symbols and segments; `build()` lays them out (COBJ-LAYOUT-*).

    An entry's code is given as bytes of INSTR_FORMAT records whose branch targets are
    indices *relative to the entry's first instruction*; `build()` rebases them."""

    entries: list = field(default_factory=list)
    symbols: list = field(default_factory=list)
    data_size: int = 0
    data_init: bytes = b""
    const_size: int = 0
    const_init: bytes = b""

    def add_entry(self, name: str, code: bytes, *, n_r32: int, n_r64: int, n_pred: int,
                  params: list, param_size: int, shared_size: int = 0, local_size: int = 0,
                  max_threads: int = 0) -> int:
        if len(code) % isa.INSTR_SIZE:
            raise ValueError("code is not a whole number of instructions")
        self.entries.append(_Entry(name, bytes(code), n_r32, n_r64, n_pred, list(params),
                                   param_size, shared_size, local_size, max_threads))
        return len(self.entries) - 1

    def add_symbol(self, name: str, space: int, offset: int, size: int) -> None:
        self.symbols.append(SymbolInfo(name, space, offset, size))

    def set_data(self, size: int, init: bytes = b"") -> None:
        self.data_size, self.data_init = size, bytes(init)

    def set_const(self, size: int, init: bytes = b"") -> None:
        self.const_size, self.const_init = size, bytes(init)

    def build(self) -> bytes:
        strtab = bytearray()
        names = {}

        def intern(name: str) -> tuple[int, int]:
            if name not in names:
                b = name.encode("utf-8")
                names[name] = (len(strtab), len(b))
                strtab.extend(b)
            return names[name]

        entry_recs, param_recs, code = [], [], bytearray()
        for e in self.entries:
            name_off, name_len = intern(e.name)
            start = len(code) // isa.INSTR_SIZE
            recs = np.frombuffer(e.code, dtype=isa.INSTR_DTYPE).copy()
            bra = recs["op"] == isa.OP_BRA
            recs["imm"][bra] += start
            code.extend(recs.tobytes())
            first = len(param_recs)
            for p in e.params:
                param_recs.append(struct.pack(isa.COBJ_PARAM_FORMAT, p.offset, p.size, p.align,
                                              p.type))
            entry_recs.append((name_off, name_len, start, len(recs), e.n_r32, e.n_r64,
                               e.n_pred, len(e.params), first, e.param_size, e.shared_size,
                               e.local_size, e.max_threads, 0, 0))
        sym_recs = []
        for s in self.symbols:
            name_off, name_len = intern(s.name)
            sym_recs.append(struct.pack(isa.COBJ_SYMBOL_FORMAT, name_off, name_len, s.space, 0,
                                        s.offset, s.size))

        out = bytearray(isa.COBJ_HEADER_SIZE)

        def place(blob: bytes) -> int:
            pad = -len(out) % isa.COBJ_ALIGN
            out.extend(b"\0" * pad)
            off = len(out)
            out.extend(blob)
            return off

        entries_off = place(b"".join(struct.pack(isa.COBJ_ENTRY_FORMAT, *r) for r in entry_recs))
        params_off = place(b"".join(param_recs))
        symbols_off = place(b"".join(sym_recs))
        strtab_off = place(bytes(strtab))
        code_off = place(bytes(code))
        data_init_off = place(self.data_init)
        const_init_off = place(self.const_init)
        out.extend(b"\0" * (-len(out) % isa.COBJ_ALIGN))
        if len(out) > isa.COBJ_MAX_SIZE:
            raise CodeObjectError(f"code object of {len(out)} bytes exceeds COBJ_MAX_SIZE")
        header = struct.pack(
            isa.COBJ_HEADER_FORMAT, isa.COBJ_MAGIC, isa.COBJ_VERSION, 0, len(out), entries_off,
            len(entry_recs), params_off, len(param_recs), symbols_off, len(sym_recs),
            strtab_off, len(strtab), code_off, len(code) // isa.INSTR_SIZE, self.data_size,
            data_init_off, len(self.data_init), self.const_size, const_init_off,
            len(self.const_init), 0, 0, 0)
        out[:isa.COBJ_HEADER_SIZE] = header
        return bytes(out)


# --------------------------------------------------------------------------- reader
def _check(cond: bool, message: str) -> None:
    if not cond:
        raise CodeObjectError(message)


def read_code_object(data: bytes) -> CodeObject:
    """Parse and check a code object's layout, entries, parameters and symbols."""
    data = bytes(data)
    _check(len(data) >= isa.COBJ_HEADER_SIZE, "shorter than a code-object header")
    h = dict(zip(isa.COBJ_HEADER_FIELDS, struct.unpack_from(isa.COBJ_HEADER_FORMAT, data)))
    _check(h["magic"] == isa.COBJ_MAGIC, f"bad magic {h['magic']!r}")
    _check(h["version"] == isa.COBJ_VERSION, f"unsupported version {h['version']}")
    _check(h["flags"] == 0 and h["reserved"] == 0, "flags or reserved field not zero")
    size = h["size"]
    _check(size == len(data), f"header size {size} != {len(data)} bytes given")
    _check(size <= isa.COBJ_MAX_SIZE, "object larger than COBJ_MAX_SIZE")
    sections = [
        ("entries", h["entries_off"], h["entry_count"] * isa.COBJ_ENTRY_SIZE),
        ("params", h["params_off"], h["param_count"] * isa.COBJ_PARAM_SIZE),
        ("symbols", h["symbols_off"], h["symbol_count"] * isa.COBJ_SYMBOL_SIZE),
        ("strtab", h["strtab_off"], h["strtab_size"]),
        ("code", h["code_off"], h["code_count"] * isa.INSTR_SIZE),
        ("data_init", h["data_init_off"], h["data_init_size"]),
        ("const_init", h["const_init_off"], h["const_init_size"]),
    ]
    spans = []
    for name, off, length in sections:
        _check(off % isa.COBJ_ALIGN == 0, f"{name} offset {off} not a multiple of COBJ_ALIGN")
        _check(isa.COBJ_HEADER_SIZE <= off and off + length <= size,
               f"{name} [{off}, {off + length}) outside the object")
        if length:
            spans.append((off, off + length, name))
    spans.sort()
    for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
        _check(a1 <= b0, f"sections {an} and {bn} overlap")
    _check(h["data_init_size"] <= h["data_size"], "data_init_size > data_size")
    _check(h["const_init_size"] <= h["const_size"], "const_init_size > const_size")

    strtab = data[h["strtab_off"]:h["strtab_off"] + h["strtab_size"]]

    def name_at(off: int, length: int, what: str) -> str:
        _check(off + length <= len(strtab), f"{what} name outside the string table")
        try:
            return strtab[off:off + length].decode("utf-8")
        except UnicodeDecodeError as e:
            raise CodeObjectError(f"{what} name is not UTF-8") from e

    params = []
    for i in range(h["param_count"]):
        off = h["params_off"] + i * isa.COBJ_PARAM_SIZE
        p = ParamInfo(*struct.unpack_from(isa.COBJ_PARAM_FORMAT, data, off))
        _check(p.align and p.align & (p.align - 1) == 0 and p.align <= 256,
               f"parameter {i}: alignment {p.align}")
        _check(p.offset % p.align == 0, f"parameter {i}: offset {p.offset} not aligned")
        _check(p.type in isa.TYPE_BITS and p.type != isa.TYPE_PRED, f"parameter {i}: type")
        if p.type != isa.TYPE_B8:
            _check(p.size * 8 == isa.TYPE_BITS[p.type], f"parameter {i}: size {p.size}")
        params.append(p)

    entries = []
    for i in range(h["entry_count"]):
        off = h["entries_off"] + i * isa.COBJ_ENTRY_SIZE
        r = dict(zip(isa.COBJ_ENTRY_FIELDS, struct.unpack_from(isa.COBJ_ENTRY_FORMAT, data, off)))
        name = name_at(r["name_off"], r["name_len"], f"entry {i}")
        _check(r["flags"] == 0 and r["reserved"] == 0, f"entry {name}: flags/reserved")
        _check(r["code_count"] >= 1 and r["code_start"] + r["code_count"] <= h["code_count"],
               f"entry {name}: code range")
        for f in ("n_r32", "n_r64", "n_pred"):
            _check(r[f] <= isa.MAX_REGS, f"entry {name}: {f} {r[f]} > MAX_REGS")
        _check(r["params_first"] + r["n_params"] <= h["param_count"], f"entry {name}: params")
        _check(r["param_size"] <= isa.MAX_PARAM_SIZE, f"entry {name}: param_size")
        _check(r["shared_size"] <= isa.MAX_SHARED_SIZE, f"entry {name}: shared_size")
        _check(r["local_size"] <= isa.MAX_LOCAL_SIZE, f"entry {name}: local_size")
        _check(r["max_threads"] <= isa.MAX_BLOCK_THREADS, f"entry {name}: max_threads")
        eparams = tuple(params[r["params_first"]:r["params_first"] + r["n_params"]])
        for p in eparams:
            _check(p.offset + p.size <= r["param_size"], f"entry {name}: parameter outside")
        entries.append(EntryInfo(i, name, r["code_start"], r["code_count"], r["n_r32"],
                                 r["n_r64"], r["n_pred"], eparams, r["params_first"],
                                 r["param_size"], r["shared_size"], r["local_size"],
                                 r["max_threads"]))

    symbols = []
    for i in range(h["symbol_count"]):
        off = h["symbols_off"] + i * isa.COBJ_SYMBOL_SIZE
        name_off, name_len, space, flags, soff, ssize = struct.unpack_from(
            isa.COBJ_SYMBOL_FORMAT, data, off)
        name = name_at(name_off, name_len, f"symbol {i}")
        _check(space in (isa.SPACE_GLOBAL, isa.SPACE_CONST) and flags == 0,
               f"symbol {name}: space/flags")
        limit = h["data_size"] if space == isa.SPACE_GLOBAL else h["const_size"]
        _check(soff + ssize <= limit, f"symbol {name}: outside its segment")
        symbols.append(SymbolInfo(name, space, soff, ssize))

    code = np.frombuffer(data, dtype=isa.INSTR_DTYPE, count=h["code_count"],
                         offset=h["code_off"]).copy()
    data_init = data[h["data_init_off"]:h["data_init_off"] + h["data_init_size"]]
    const_init = data[h["const_init_off"]:h["const_init_off"] + h["const_init_size"]]
    return CodeObject(h, entries, symbols, code, data_init, const_init, size)


# --------------------------------------------------------------------------- disassembler
_VARIANTS = {
    isa.OP_MUL: {isa.VAR_LO: "lo", isa.VAR_HI: "hi", isa.VAR_WIDE: "wide"},
    isa.OP_MAD: {isa.VAR_LO: "lo", isa.VAR_HI: "hi", isa.VAR_WIDE: "wide"},
    isa.OP_SHFL: {isa.VAR_SHFL_UP: "up", isa.VAR_SHFL_DOWN: "down",
                  isa.VAR_SHFL_BFLY: "bfly", isa.VAR_SHFL_IDX: "idx"},
    isa.OP_VOTE: {isa.VAR_VOTE_ALL: "all", isa.VAR_VOTE_ANY: "any", isa.VAR_VOTE_UNI: "uni",
                  isa.VAR_VOTE_BALLOT: "ballot"},
    isa.OP_BAR: {isa.VAR_BAR_SYNC: "sync", isa.VAR_BAR_ARRIVE: "arrive",
                 isa.VAR_BAR_RED_POPC: "red.popc", isa.VAR_BAR_RED_AND: "red.and",
                 isa.VAR_BAR_RED_OR: "red.or"},
    isa.OP_CVTA: {isa.VAR_CVTA_TO_GENERIC: "", isa.VAR_CVTA_FROM_GENERIC: "to"},
    isa.OP_TESTP: {isa.VAR_TESTP_FINITE: "finite", isa.VAR_TESTP_INFINITE: "infinite",
                   isa.VAR_TESTP_NUMBER: "number", isa.VAR_TESTP_NOTANUMBER: "notanumber",
                   isa.VAR_TESTP_NORMAL: "normal", isa.VAR_TESTP_SUBNORMAL: "subnormal"},
    isa.OP_BFIND: {isa.VAR_BFIND_SHIFTAMT: "shiftamt"},
    isa.OP_PRMT: {isa.VAR_PRMT_F4E: "f4e", isa.VAR_PRMT_B4E: "b4e", isa.VAR_PRMT_RC8: "rc8",
                  isa.VAR_PRMT_ECL: "ecl", isa.VAR_PRMT_ECR: "ecr", isa.VAR_PRMT_RC16: "rc16"},
}
_BOOLS = {isa.BOOL_AND: "and", isa.BOOL_OR: "or", isa.BOOL_XOR: "xor"}
_MEMORY_OPS = (isa.OP_LD, isa.OP_ST, isa.OP_ATOM, isa.OP_RED)


def _mnemonic(rec) -> str:
    op, mod = int(rec["op"]), int(rec["mod"])
    spec = isa.OPCODES.get(op)
    parts = [spec.name if spec else f"op{op:#x}"]
    if op in (isa.OP_LD, isa.OP_ST, isa.OP_ATOM, isa.OP_RED, isa.OP_CVTA):
        var = isa.mod_field(mod, isa.MOD_VARIANT_MASK)
        if op == isa.OP_CVTA and var == isa.VAR_CVTA_FROM_GENERIC:
            parts.append("to")
        space = isa.mod_field(mod, isa.MOD_SPACE_MASK)
        if space != isa.SPACE_GENERIC:
            parts.append(isa.SPACE_NAMES.get(space, f"space{space}"))
        if mod & isa.MOD_VOLATILE:
            parts.append("volatile")
        atom = isa.mod_field(mod, isa.MOD_ATOM_MASK)
        if atom:
            parts.append(isa.ATOM_NAMES.get(atom, f"atom{atom}"))
    elif op in _VARIANTS:
        var = isa.mod_field(mod, isa.MOD_VARIANT_MASK)
        if var:
            name = _VARIANTS[op].get(var, f"var{var}")
            if name:
                parts.append(name)
    cmp_ = isa.mod_field(mod, isa.MOD_CMP_MASK)
    if cmp_:
        parts.append(isa.CMP_NAMES.get(cmp_, f"cmp{cmp_}"))
    bool_ = isa.mod_field(mod, isa.MOD_BOOL_MASK)
    if bool_:
        parts.append(_BOOLS[bool_])
    rnd = mod & isa.MOD_ROUND_MASK
    if rnd:
        parts.append(isa.RND_NAMES.get(rnd, f"rnd{rnd}"))
    if mod & isa.MOD_APPROX:
        parts.append("approx")
    if mod & isa.MOD_FTZ:
        parts.append("ftz")
    if mod & isa.MOD_SAT:
        parts.append("sat")
    t, t2 = int(rec["type"]), int(rec["type2"])
    if t:
        parts.append(isa.TYPE_NAMES.get(t, f"type{t}"))
    if t2:
        parts.append(isa.TYPE_NAMES.get(t2, f"type{t2}"))
    return ".".join(parts)


def _format_imm(value: int, type_: int) -> str:
    if type_ == isa.TYPE_F32:
        f = struct.unpack("<f", struct.pack("<I", value & 0xFFFFFFFF))[0]
        return f"{f!r}f"
    if type_ == isa.TYPE_F64:
        return repr(struct.unpack("<d", struct.pack("<Q", value))[0])
    bits = isa.TYPE_BITS.get(type_, 64)
    return hex(value & ((1 << bits) - 1))


def format_operand(opnd: int, imm: int = 0, type_: int = 0) -> str:
    kind, value = isa.operand_kind(opnd), isa.operand_value(opnd)
    if kind == isa.OPND_R32:
        return f"r{value}"
    if kind == isa.OPND_R64:
        return f"rd{value}"
    if kind == isa.OPND_PRED:
        return f"p{value}"
    if kind == isa.OPND_IMM:
        return _format_imm(imm, type_)
    if kind == isa.OPND_SIMM:
        return str(value)
    if kind == isa.OPND_SREG:
        return isa.SREG_NAMES.get(value, f"%sreg{value}")
    if kind == isa.OPND_DATA:
        return f"data+{value:#x}"
    if kind == isa.OPND_CONST:
        return f"const+{value:#x}"
    if kind == isa.OPND_NONE:
        return "_"
    return f"opnd{opnd:#x}"


def _role_type(role: str, rec) -> int:
    r = role.rstrip("?")
    if r == "T2":
        return int(rec["type2"])
    if r == "U":
        return isa.TYPE_U32
    if r == "A":
        return isa.TYPE_U64
    return int(rec["type"])


def format_instruction(rec, index: int | None = None) -> str:
    op = int(rec["op"])
    spec = isa.OPCODES.get(op)
    guard = int(rec["guard"])
    g = ""
    if guard & isa.GUARD_ON:
        g = f"@{'!' if guard & isa.GUARD_NEG else ''}p{guard & isa.GUARD_INDEX} "
    text = g + _mnemonic(rec)
    imm = int(rec["imm"])
    slots = ("d", "d2", "a", "b", "c")
    roles = spec.roles if spec else ("T?",) * 5
    ops = []
    uses_imm = any(isa.operand_kind(int(rec[s])) == isa.OPND_IMM for s in slots)
    for slot, role in zip(slots, roles):
        opnd = int(rec[slot])
        if isa.operand_kind(opnd) == isa.OPND_NONE and not (role.startswith("A") and op in _MEMORY_OPS):
            continue
        s = format_operand(opnd, imm, _role_type(role, rec))
        if role.startswith("A") and op in _MEMORY_OPS:
            off = imm if not uses_imm else 0
            if off >= 1 << 63:
                off -= 1 << 64
            base = "" if isa.operand_kind(opnd) == isa.OPND_NONE else s
            if not base:
                s = f"[{off}]"
            else:
                s = f"[{base}{f'+{off}' if off > 0 else (str(off) if off < 0 else '')}]"
        if slot == "c" and int(rec["mod"]) & isa.MOD_NEG_C and role.startswith("P"):
            s = "!" + s
        ops.append(s)
    if op == isa.OP_BRA:
        ops.append(str(imm))
    return (f"{index:5d}: " if index is not None else "") + text + (" " + ", ".join(ops) if ops else "")


def disassemble(obj: CodeObject | bytes, entry: str | None = None) -> str:
    """The text of an object's entries (or of one entry), one instruction a line."""
    if not isinstance(obj, CodeObject):
        obj = read_code_object(obj)
    out = []
    for e in obj.entries:
        if entry is not None and e.name != entry:
            continue
        params = ", ".join(f"{p.type_name}[{p.size}]@{p.offset}" for p in e.params)
        out.append(f".entry {e.name} ({params}) r32={e.n_r32} r64={e.n_r64} pred={e.n_pred} "
                   f"shared={e.shared_size} local={e.local_size} max_threads={e.max_threads}")
        for i in range(e.code_start, e.code_start + e.code_count):
            out.append(format_instruction(obj.code[i], i))
    if entry is None:
        for s in obj.symbols:
            out.append(f".symbol {s.name} {isa.SPACE_NAMES[s.space]}+{s.offset:#x} [{s.size}]")
    return "\n".join(out) + "\n"
