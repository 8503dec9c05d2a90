"""Hand-built code objects (spec/isa.md §1) for the tests of the hardware-facing paths:
no compiler involved, only the numbers of spec/isa.py.

    obj = build([Entry("store_index", store_index_code(), params=U64_U32, param_size=12)])

`build` lays the tables and sections out as [COBJ-LAYOUT-1]/[COBJ-LAYOUT-2] say; the
kernels below are written instruction by instruction with isa.encode_instruction.
"""

import struct
from dataclasses import dataclass, field

from pvgpu.spec import isa

I = isa.encode_instruction
R32 = lambda i: isa.operand(isa.OPND_R32, i)  # noqa: E731
R64 = lambda i: isa.operand(isa.OPND_R64, i)  # noqa: E731
PRED = lambda i: isa.operand(isa.OPND_PRED, i)  # noqa: E731
SIMM = lambda v: isa.operand(isa.OPND_SIMM, v)  # noqa: E731
SREG = lambda s: isa.operand(isa.OPND_SREG, s)  # noqa: E731
U32, U64, S32, F32 = isa.TYPE_U32, isa.TYPE_U64, isa.TYPE_S32, isa.TYPE_F32


def space(s: int) -> int:
    return s << isa.MOD_SPACE_SHIFT


@dataclass
class Entry:
    name: str
    code: list  # encoded instructions; bra targets relative to the entry's first one
    params: tuple = ()  # (offset, size, align, type)
    param_size: int = 0
    n_r32: int = 8
    n_r64: int = 8
    n_pred: int = 2
    shared_size: int = 0
    local_size: int = 0
    max_threads: int = 0


@dataclass
class Layout:
    """Where build() put things (byte offsets in the object)."""

    entries_off: int = 0
    params_off: int = 0
    code_off: int = 0
    size: int = 0
    entry_code: list = field(default_factory=list)  # code index of each entry's first instr


def _relocate(instr: bytes, start: int) -> bytes:
    """Entries are written with branch targets relative to their first instruction; the
    object's are indices into the whole code section ([ISA-VALID-3])."""
    fields = list(struct.unpack(isa.INSTR_FORMAT, instr))
    if fields[0] == isa.OP_BRA:
        fields[-1] += start
    return struct.pack(isa.INSTR_FORMAT, *fields)


def _align(n: int) -> int:
    return -(-n // isa.COBJ_ALIGN) * isa.COBJ_ALIGN


def build(entries, *, data_init=b"", data_size=0, const_init=b"", const_size=0,
          symbols=(), layout: Layout | None = None) -> bytes:
    """A code object with `entries`; symbols are (name, space, offset, size)."""
    strtab = bytearray()

    def name(s):
        off = len(strtab)
        strtab.extend(s.encode())
        return off, len(s.encode())

    params, code, entry_recs, syms = [], [], [], []
    for e in entries:
        first = len(params)
        params += list(e.params)
        start = len(code)
        code += [_relocate(instr, start) for instr in e.code]
        no, nl = name(e.name)
        entry_recs.append((no, nl, start, len(e.code), e.n_r32, e.n_r64, e.n_pred,
                           len(e.params), first, e.param_size, e.shared_size, e.local_size,
                           e.max_threads, 0, 0))
    for sname, sspace, soff, ssize in symbols:
        no, nl = name(sname)
        syms.append((no, nl, sspace, 0, soff, ssize))
    off = isa.COBJ_HEADER_SIZE
    sections = {}
    for key, blob in (("entries", b"".join(struct.pack(isa.COBJ_ENTRY_FORMAT, *r) for r in entry_recs)),
                      ("params", b"".join(struct.pack(isa.COBJ_PARAM_FORMAT, *p) for p in params)),
                      ("symbols", b"".join(struct.pack(isa.COBJ_SYMBOL_FORMAT, *s) for s in syms)),
                      ("strtab", bytes(strtab)), ("code", b"".join(code)),
                      ("data_init", data_init), ("const_init", const_init)):
        off = _align(off)
        sections[key] = (off, blob)
        off += len(blob)
    size = _align(off)
    out = bytearray(size)
    for o, blob in sections.values():
        out[o:o + len(blob)] = blob
    header = struct.pack(
        isa.COBJ_HEADER_FORMAT, isa.COBJ_MAGIC, isa.COBJ_VERSION, 0, size,
        sections["entries"][0], len(entry_recs), sections["params"][0], len(params),
        sections["symbols"][0], len(syms), sections["strtab"][0], len(strtab),
        sections["code"][0], len(code), data_size or len(data_init), sections["data_init"][0],
        len(data_init), const_size or len(const_init), sections["const_init"][0],
        len(const_init), 0, 0, 0)
    out[:len(header)] = header
    if layout is not None:
        layout.entries_off, layout.params_off = sections["entries"][0], sections["params"][0]
        layout.code_off, layout.size = sections["code"][0], size
    return bytes(out)


def entry_va(object_va: int, obj: bytes, index: int = 0) -> int:
    """[COBJ-LAUNCH-1]: the VA of entry `index`'s record."""
    entries_off = struct.unpack_from(isa.COBJ_HEADER_FORMAT, obj)[4]
    return object_va + entries_off + index * isa.COBJ_ENTRY_SIZE


def instr_va(object_va: int, obj: bytes, index: int = 0, i: int = 0) -> int:
    """The VA of instruction `i` of entry `index`."""
    code_off = struct.unpack_from(isa.COBJ_HEADER_FORMAT, obj)[12]
    entries_off = struct.unpack_from(isa.COBJ_HEADER_FORMAT, obj)[4]
    code_start = struct.unpack_from(isa.COBJ_ENTRY_FORMAT, obj,
                                    entries_off + index * isa.COBJ_ENTRY_SIZE)[2]
    return object_va + code_off + (code_start + i) * isa.INSTR_SIZE


# ---------------------------------------------------------------------- kernels
# Parameters (out: u64 at 0, n: u32 at 8) of store_index and spin.
OUT_N = ((0, 8, 8, U64), (8, 4, 4, U32))


def _ld_param(d, type_, offset):
    return I(isa.OP_LD, type_, mod=space(isa.SPACE_PARAM), d=d, imm=offset)


def store_index_code() -> list:
    """out[i] = i for i = ctaid.x * ntid.x + tid.x < n (u32 elements)."""
    return [
        _ld_param(R64(0), U64, 0),
        _ld_param(R32(0), U32, 8),
        I(isa.OP_MOV, U32, d=R32(1), a=SREG(isa.SREG_TID_X)),
        I(isa.OP_MOV, U32, d=R32(2), a=SREG(isa.SREG_CTAID_X)),
        I(isa.OP_MOV, U32, d=R32(3), a=SREG(isa.SREG_NTID_X)),
        I(isa.OP_MAD, U32, mod=isa.VAR_LO << isa.MOD_VARIANT_SHIFT, d=R32(4), a=R32(2),
          b=R32(3), c=R32(1)),
        I(isa.OP_SETP, U32, mod=isa.CMP_GE << isa.MOD_CMP_SHIFT, d=PRED(0), a=R32(4), b=R32(0)),
        I(isa.OP_EXIT, guard=isa.GUARD_ON | 0),
        I(isa.OP_CVT, U64, type2=U32, d=R64(1), a=R32(4)),
        I(isa.OP_SHL, isa.TYPE_B64, d=R64(1), a=R64(1), b=SIMM(2)),
        I(isa.OP_ADD, U64, d=R64(2), a=R64(0), b=R64(1)),
        I(isa.OP_ST, U32, mod=space(isa.SPACE_GLOBAL), a=R64(2), b=R32(4)),
        I(isa.OP_EXIT),
    ]


def spin_code() -> list:
    """An infinite loop (only a job timeout or a reset stops it)."""
    return [I(isa.OP_NOP), I(isa.OP_BRA, imm=0)]


# Parameter (flag: u64 at 0) of wait_flag.
FLAG = ((0, 8, 8, U64),)


def wait_flag_code() -> list:
    """Spin until the u32 at `flag` is not zero: a job that stays on the hardware until
    the test writes the flag (host memory mapped into the context), then completes."""
    return [
        _ld_param(R64(0), U64, 0),
        I(isa.OP_LD, U32, mod=space(isa.SPACE_GLOBAL) | isa.MOD_VOLATILE, d=R32(0), a=R64(0)),
        I(isa.OP_SETP, U32, mod=isa.CMP_EQ << isa.MOD_CMP_SHIFT, d=PRED(0), a=R32(0),
          b=SIMM(0)),
        I(isa.OP_BRA, guard=isa.GUARD_ON | 0, imm=1),
        I(isa.OP_EXIT),
    ]


def wait_flag() -> bytes:
    return build([Entry("wait_flag", wait_flag_code(), params=FLAG, param_size=8)])


def trap_code() -> list:
    return [I(isa.OP_TRAP)]


def store_index(**kw) -> bytes:
    return build([Entry("store_index", store_index_code(), params=OUT_N, param_size=12, **kw)])


def kernels() -> bytes:
    """One object with three entries: store_index (0), spin (1), trap (2)."""
    return build([Entry("store_index", store_index_code(), params=OUT_N, param_size=12),
                  Entry("spin", spin_code()), Entry("trap", trap_code())])
