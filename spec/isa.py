"""The pvgpu device ISA and code objects, version 1 — the single source of their numbers.

`spec/isa.md` says what every number means (clauses ISA-* and COBJ-*). The guest's PTX
compiler (guest/jit) writes code objects with these constants; the hardware's streaming
multiprocessors (host/hw/sm) validate and execute them. Neither imports the other: this
module and `spec/isa.md` are the whole contract between them.

Layout of a code object (COBJ): a header, then tables and sections at the offsets the
header gives, all little-endian:

  header        COBJ_HEADER_FORMAT
  entries       COBJ_ENTRY_FORMAT x entry_count          (kernels: `.entry`)
  params        COBJ_PARAM_FORMAT x param_count          (the .param layout of every entry)
  symbols       COBJ_SYMBOL_FORMAT x symbol_count        (module variables: .global, .const)
  strtab        UTF-8 names, not NUL-terminated
  code          INSTR_FORMAT x code_count                (every entry's instructions)
  data_init     initial bytes of the .global segment (the rest of it is zero)
  const_init    initial bytes of the .const segment (the rest of it is zero)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

# --------------------------------------------------------------------------- COBJ
COBJ_MAGIC = b"PVCO"
COBJ_VERSION = 1
COBJ_ALIGN = 8  # every table and section starts at a multiple of this offset
COBJ_MAX_SIZE = 64 << 20  # bytes of one code object

# magic, version, flags, size, entries_off, entry_count, params_off, param_count,
# symbols_off, symbol_count, strtab_off, strtab_size, code_off, code_count,
# data_size, data_init_off, data_init_size, const_size, const_init_off, const_init_size,
# reserved, data_va, const_va
COBJ_HEADER_FORMAT = "<4sHH" + "I" * 18 + "QQ"
COBJ_HEADER_SIZE = struct.calcsize(COBJ_HEADER_FORMAT)  # 96
COBJ_HEADER_FIELDS = (
    "magic", "version", "flags", "size", "entries_off", "entry_count", "params_off",
    "param_count", "symbols_off", "symbol_count", "strtab_off", "strtab_size", "code_off",
    "code_count", "data_size", "data_init_off", "data_init_size", "const_size",
    "const_init_off", "const_init_size", "reserved", "data_va", "const_va")
COBJ_DATA_VA_OFFSET = 80  # where the loader writes data_va (and const_va 8 bytes later)

# name_off, name_len, code_start, code_count, n_r32, n_r64, n_pred, n_params,
# params_first, param_size, shared_size, local_size, max_threads, flags, reserved
COBJ_ENTRY_FORMAT = "<IIIIHHHHIIIIIII"
COBJ_ENTRY_SIZE = struct.calcsize(COBJ_ENTRY_FORMAT)  # 52
COBJ_ENTRY_FIELDS = (
    "name_off", "name_len", "code_start", "code_count", "n_r32", "n_r64", "n_pred",
    "n_params", "params_first", "param_size", "shared_size", "local_size", "max_threads",
    "flags", "reserved")

# offset, size, align, type (a TYPE_*; TYPE_B8 with size > 1 for a byte array / struct)
COBJ_PARAM_FORMAT = "<IIHH"
COBJ_PARAM_SIZE = struct.calcsize(COBJ_PARAM_FORMAT)  # 12

# name_off, name_len, space (SPACE_GLOBAL or SPACE_CONST), flags, offset, size
COBJ_SYMBOL_FORMAT = "<IIHHII"
COBJ_SYMBOL_SIZE = struct.calcsize(COBJ_SYMBOL_FORMAT)  # 20

# --------------------------------------------------------------------------- limits
MAX_REGS = 1 << 14  # registers of one file (R32, R64, PRED) an entry may use
MAX_PARAM_SIZE = 4096  # bytes of an entry's parameters (CUDA's limit)
MAX_SHARED_SIZE = 48 << 10  # static shared memory of an entry (sm_80's static limit)
MAX_DYNAMIC_SHARED = 163 << 10  # static + dynamic shared memory of a block (sm_80)
MAX_LOCAL_SIZE = 512 << 10  # local memory per thread (CUDA's limit)
MAX_BLOCK_THREADS = 1024
WARP_SIZE = 32
NUM_BARRIERS = 16  # barriers per block (bar's `a`, taken modulo NUM_BARRIERS)
SM_COUNT = 16  # streaming multiprocessors of a device (%nsmid; %smid < SM_COUNT)
CLOCK_RATE_KHZ = 1_000_000  # %clock/%clock64 tick once per nanosecond of device time

# Generic addressing (ISA-MEM-2): the shared and local windows of the 64-bit generic
# address space. Everything else is a global (device virtual) address.
GENERIC_SHARED_BASE = 0xFFFF_0000_0000_0000
GENERIC_LOCAL_BASE = 0xFFFE_0000_0000_0000
GENERIC_WINDOW_SIZE = 1 << 40

# --------------------------------------------------------------------------- instructions
# op, type, type2, mod, guard, reserved, d, d2, a, b, c, imm
INSTR_FORMAT = "<HBBIHHIIIIIQ"
INSTR_SIZE = struct.calcsize(INSTR_FORMAT)  # 40
INSTR_DTYPE = np.dtype([
    ("op", "<u2"), ("type", "u1"), ("type2", "u1"), ("mod", "<u4"), ("guard", "<u2"),
    ("reserved", "<u2"), ("d", "<u4"), ("d2", "<u4"), ("a", "<u4"), ("b", "<u4"),
    ("c", "<u4"), ("imm", "<u8")])
assert INSTR_DTYPE.itemsize == INSTR_SIZE

# guard: GUARD_ON | (GUARD_NEG if negated) | predicate register index
GUARD_ON = 0x8000
GUARD_NEG = 0x4000
GUARD_INDEX = 0x3FFF

# Operands: a u32, kind in the top 4 bits, value in the low 28.
OPND_KIND_SHIFT = 28
OPND_VALUE_MASK = (1 << 28) - 1
OPND_NONE = 0
OPND_R32 = 1  # 32-bit register `value`
OPND_R64 = 2  # 64-bit register `value`
OPND_PRED = 3  # predicate register `value`
OPND_IMM = 4  # the instruction's `imm` field, as a value of the operand's type
OPND_SIMM = 5  # `value` as a 28-bit two's-complement integer (integer operands only)
OPND_SREG = 6  # special register `value` (SREG_*)
OPND_DATA = 7  # the address data_va + `value` (a byte offset in the .global segment)
OPND_CONST = 8  # the address const_va + `value` (a byte offset in the .const segment)
OPND_KIND_NAMES = {OPND_NONE: "none", OPND_R32: "r32", OPND_R64: "r64", OPND_PRED: "pred",
                   OPND_IMM: "imm", OPND_SIMM: "simm", OPND_SREG: "sreg", OPND_DATA: "data",
                   OPND_CONST: "const"}


def operand(kind: int, value: int = 0) -> int:
    """Encode an operand; SIMM takes a signed value in [-2**27, 2**27)."""
    if kind == OPND_SIMM:
        if not -(1 << 27) <= value < (1 << 27):
            raise ValueError(f"{value} does not fit a 28-bit SIMM operand")
        value &= OPND_VALUE_MASK
    elif not 0 <= value <= OPND_VALUE_MASK:
        raise ValueError(f"operand value {value} out of range")
    return (kind << OPND_KIND_SHIFT) | value


def operand_kind(opnd: int) -> int:
    return opnd >> OPND_KIND_SHIFT


def operand_value(opnd: int) -> int:
    """The value field; a SIMM is sign-extended."""
    v = opnd & OPND_VALUE_MASK
    if opnd >> OPND_KIND_SHIFT == OPND_SIMM and v & (1 << 27):
        v -= 1 << 28
    return v


# Types (the `type` and `type2` fields). Register file of a type: PRED for TYPE_PRED,
# R64 for the 64-bit types, R32 for every other (narrower values sit in the low bits).
TYPE_NONE = 0
TYPE_B8, TYPE_U8, TYPE_S8 = 1, 2, 3
TYPE_B16, TYPE_U16, TYPE_S16, TYPE_F16, TYPE_BF16 = 4, 5, 6, 7, 8
TYPE_B32, TYPE_U32, TYPE_S32, TYPE_F32 = 9, 10, 11, 12
TYPE_B64, TYPE_U64, TYPE_S64, TYPE_F64 = 13, 14, 15, 16
TYPE_PRED = 17
TYPE_NAMES = {
    TYPE_NONE: "none", TYPE_B8: "b8", TYPE_U8: "u8", TYPE_S8: "s8", TYPE_B16: "b16",
    TYPE_U16: "u16", TYPE_S16: "s16", TYPE_F16: "f16", TYPE_BF16: "bf16", TYPE_B32: "b32",
    TYPE_U32: "u32", TYPE_S32: "s32", TYPE_F32: "f32", TYPE_B64: "b64", TYPE_U64: "u64",
    TYPE_S64: "s64", TYPE_F64: "f64", TYPE_PRED: "pred"}
TYPES_BY_NAME = {v: k for k, v in TYPE_NAMES.items()}
TYPE_BITS = {TYPE_B8: 8, TYPE_U8: 8, TYPE_S8: 8, TYPE_B16: 16, TYPE_U16: 16, TYPE_S16: 16,
             TYPE_F16: 16, TYPE_BF16: 16, TYPE_B32: 32, TYPE_U32: 32, TYPE_S32: 32,
             TYPE_F32: 32, TYPE_B64: 64, TYPE_U64: 64, TYPE_S64: 64, TYPE_F64: 64,
             TYPE_PRED: 1}
SIGNED_TYPES = frozenset({TYPE_S8, TYPE_S16, TYPE_S32, TYPE_S64})
UNSIGNED_TYPES = frozenset({TYPE_U8, TYPE_U16, TYPE_U32, TYPE_U64})
BIT_TYPES = frozenset({TYPE_B8, TYPE_B16, TYPE_B32, TYPE_B64})
FLOAT_TYPES = frozenset({TYPE_F16, TYPE_BF16, TYPE_F32, TYPE_F64})
INT_TYPES = SIGNED_TYPES | UNSIGNED_TYPES | BIT_TYPES


def register_file(type_: int) -> int:
    """-> OPND_R32, OPND_R64 or OPND_PRED: where values of `type_` live."""
    if type_ == TYPE_PRED:
        return OPND_PRED
    return OPND_R64 if TYPE_BITS.get(type_) == 64 else OPND_R32


# Special registers (OPND_SREG values), all read as u32 unless noted.
SREG_TID_X, SREG_TID_Y, SREG_TID_Z = 0, 1, 2
SREG_NTID_X, SREG_NTID_Y, SREG_NTID_Z = 3, 4, 5
SREG_CTAID_X, SREG_CTAID_Y, SREG_CTAID_Z = 6, 7, 8
SREG_NCTAID_X, SREG_NCTAID_Y, SREG_NCTAID_Z = 9, 10, 11
SREG_LANEID = 12
SREG_WARPID = 13
SREG_NWARPID = 14
SREG_SMID = 15
SREG_NSMID = 16
SREG_CLOCK = 17
SREG_CLOCK64 = 18  # u64
SREG_GLOBALTIMER = 19  # u64, nanoseconds
SREG_LANEMASK_EQ, SREG_LANEMASK_LE, SREG_LANEMASK_LT = 20, 21, 22
SREG_LANEMASK_GE, SREG_LANEMASK_GT = 23, 24
SREG_DYNAMIC_SMEM_SIZE = 25
SREG_TOTAL_SMEM_SIZE = 26
SREG_GRIDID = 27  # u64
SREG_NAMES = {
    SREG_TID_X: "%tid.x", SREG_TID_Y: "%tid.y", SREG_TID_Z: "%tid.z",
    SREG_NTID_X: "%ntid.x", SREG_NTID_Y: "%ntid.y", SREG_NTID_Z: "%ntid.z",
    SREG_CTAID_X: "%ctaid.x", SREG_CTAID_Y: "%ctaid.y", SREG_CTAID_Z: "%ctaid.z",
    SREG_NCTAID_X: "%nctaid.x", SREG_NCTAID_Y: "%nctaid.y", SREG_NCTAID_Z: "%nctaid.z",
    SREG_LANEID: "%laneid", SREG_WARPID: "%warpid", SREG_NWARPID: "%nwarpid",
    SREG_SMID: "%smid", SREG_NSMID: "%nsmid", SREG_CLOCK: "%clock", SREG_CLOCK64: "%clock64",
    SREG_GLOBALTIMER: "%globaltimer", SREG_LANEMASK_EQ: "%lanemask_eq",
    SREG_LANEMASK_LE: "%lanemask_le", SREG_LANEMASK_LT: "%lanemask_lt",
    SREG_LANEMASK_GE: "%lanemask_ge", SREG_LANEMASK_GT: "%lanemask_gt",
    SREG_DYNAMIC_SMEM_SIZE: "%dynamic_smem_size", SREG_TOTAL_SMEM_SIZE: "%total_smem_size",
    SREG_GRIDID: "%gridid"}
SREGS_64 = frozenset({SREG_CLOCK64, SREG_GLOBALTIMER, SREG_GRIDID})

# --------------------------------------------------------------------------- modifiers
# `mod` is a bit field; which parts an opcode reads is in OPCODES (ISA-MOD-*).
MOD_ROUND_MASK = 0xF  # bits 0-3: rounding
RND_DEFAULT, RND_RN, RND_RZ, RND_RM, RND_RP = 0, 1, 2, 3, 4  # float results
RND_RNI, RND_RZI, RND_RMI, RND_RPI = 5, 6, 7, 8  # float -> integral value (cvt)
RND_NAMES = {RND_RN: "rn", RND_RZ: "rz", RND_RM: "rm", RND_RP: "rp", RND_RNI: "rni",
             RND_RZI: "rzi", RND_RMI: "rmi", RND_RPI: "rpi"}
MOD_SAT = 1 << 4  # saturate (float: clamp to [0, 1]; s32 add/sub/mad.hi: clamp to s32)
MOD_FTZ = 1 << 5  # flush subnormal inputs and results to zero
MOD_APPROX = 1 << 6  # the approximate form (.approx); otherwise IEEE-rounded (.rn/.full)
MOD_CC = 1 << 7  # reserved (carry chains are not part of version 1)

MOD_VARIANT_SHIFT = 8  # bits 8-11: an opcode's variant (below)
MOD_VARIANT_MASK = 0xF << MOD_VARIANT_SHIFT
# MUL / MAD
VAR_LO, VAR_HI, VAR_WIDE = 1, 2, 3
# SHFL
VAR_SHFL_UP, VAR_SHFL_DOWN, VAR_SHFL_BFLY, VAR_SHFL_IDX = 1, 2, 3, 4
# VOTE
VAR_VOTE_ALL, VAR_VOTE_ANY, VAR_VOTE_UNI, VAR_VOTE_BALLOT = 1, 2, 3, 4
# BAR
VAR_BAR_SYNC, VAR_BAR_ARRIVE, VAR_BAR_RED_POPC, VAR_BAR_RED_AND, VAR_BAR_RED_OR = 1, 2, 3, 4, 5
# CVTA
VAR_CVTA_TO_GENERIC, VAR_CVTA_FROM_GENERIC = 1, 2
# TESTP
VAR_TESTP_FINITE, VAR_TESTP_INFINITE, VAR_TESTP_NUMBER = 1, 2, 3
VAR_TESTP_NOTANUMBER, VAR_TESTP_NORMAL, VAR_TESTP_SUBNORMAL = 4, 5, 6
# BFIND
VAR_BFIND_SHIFTAMT = 1
# PRMT (the mode; 0 is the default byte permute)
VAR_PRMT_F4E, VAR_PRMT_B4E, VAR_PRMT_RC8, VAR_PRMT_ECL, VAR_PRMT_ECR, VAR_PRMT_RC16 = 1, 2, 3, 4, 5, 6

MOD_CMP_SHIFT = 12  # bits 12-16: comparison of SETP / SET / SLCT
MOD_CMP_MASK = 0x1F << MOD_CMP_SHIFT
CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE = 1, 2, 3, 4, 5, 6
CMP_LO, CMP_LS, CMP_HI, CMP_HS = 7, 8, 9, 10  # unsigned forms
CMP_EQU, CMP_NEU, CMP_LTU, CMP_LEU, CMP_GTU, CMP_GEU = 11, 12, 13, 14, 15, 16  # or NaN
CMP_NUM, CMP_NAN = 17, 18
CMP_NAMES = {CMP_EQ: "eq", CMP_NE: "ne", CMP_LT: "lt", CMP_LE: "le", CMP_GT: "gt",
             CMP_GE: "ge", CMP_LO: "lo", CMP_LS: "ls", CMP_HI: "hi", CMP_HS: "hs",
             CMP_EQU: "equ", CMP_NEU: "neu", CMP_LTU: "ltu", CMP_LEU: "leu", CMP_GTU: "gtu",
             CMP_GEU: "geu", CMP_NUM: "num", CMP_NAN: "nan"}
MOD_BOOL_SHIFT = 17  # bits 17-18: how SETP / SET combine with the predicate operand c
MOD_BOOL_MASK = 0x3 << MOD_BOOL_SHIFT
BOOL_NONE, BOOL_AND, BOOL_OR, BOOL_XOR = 0, 1, 2, 3
MOD_NEG_C = 1 << 19  # SETP / SET / SELP / BAR.RED: the predicate operand c is negated

MOD_SPACE_SHIFT = 20  # bits 20-23: state space of LD / ST / ATOM / RED / CVTA
MOD_SPACE_MASK = 0xF << MOD_SPACE_SHIFT
SPACE_GENERIC, SPACE_GLOBAL, SPACE_SHARED, SPACE_LOCAL, SPACE_PARAM, SPACE_CONST = 0, 1, 2, 3, 4, 5
SPACE_NAMES = {SPACE_GENERIC: "generic", SPACE_GLOBAL: "global", SPACE_SHARED: "shared",
               SPACE_LOCAL: "local", SPACE_PARAM: "param", SPACE_CONST: "const"}
MOD_VOLATILE = 1 << 24  # LD / ST: .volatile (no effect beyond ordering: see ISA-MEM-5)

MOD_ATOM_SHIFT = 25  # bits 25-28: ATOM / RED operation
MOD_ATOM_MASK = 0xF << MOD_ATOM_SHIFT
ATOM_ADD, ATOM_MIN, ATOM_MAX, ATOM_INC, ATOM_DEC = 1, 2, 3, 4, 5
ATOM_EXCH, ATOM_CAS, ATOM_AND, ATOM_OR, ATOM_XOR = 6, 7, 8, 9, 10
ATOM_NAMES = {ATOM_ADD: "add", ATOM_MIN: "min", ATOM_MAX: "max", ATOM_INC: "inc",
              ATOM_DEC: "dec", ATOM_EXCH: "exch", ATOM_CAS: "cas", ATOM_AND: "and",
              ATOM_OR: "or", ATOM_XOR: "xor"}
MOD_KNOWN = (MOD_ROUND_MASK | MOD_SAT | MOD_FTZ | MOD_APPROX | MOD_VARIANT_MASK | MOD_CMP_MASK
             | MOD_BOOL_MASK | MOD_NEG_C | MOD_SPACE_MASK | MOD_VOLATILE | MOD_ATOM_MASK)


def mod_field(mod: int, mask: int) -> int:
    """The value of one modifier field (mask as above)."""
    return (mod & mask) >> ((mask & -mask).bit_length() - 1)


# --------------------------------------------------------------------------- opcodes
# Operand roles, per slot (d, d2, a, b, c) (ISA-VALID-2):
#   "-"  must be OPND_NONE          "T"  a value of the instruction's type
#   "T2" a value of type2           "W"  a value of twice the type's width (same signedness)
#   "P"  a predicate                "U"  a u32 value (R32 register or immediate)
#   "A"  an address: R64 or R32 register, DATA, CONST, SIMM, IMM or NONE (plus imm offset)
#   "D"  the destination-side of T: a register of the type's file
# A trailing "?" makes the slot optional (NONE allowed). Destinations (d, d2) are always
# registers; sources may be registers, IMM, SIMM (integer types), SREG (MOV only), DATA and
# CONST (64-bit integer types: MOV, and addresses).
@dataclass(frozen=True)
class OpSpec:
    opcode: int
    name: str
    roles: tuple  # (d, d2, a, b, c)
    types: frozenset  # allowed `type` values
    mods: int  # the modifier bits this opcode reads; any other set bit is invalid


def _t(*names) -> frozenset:
    return frozenset(TYPES_BY_NAME[n] for n in names)


_INT32 = ("b32", "u32", "s32")
_INT64 = ("b64", "u64", "s64")
_INTS = ("u16", "s16", "u32", "s32", "u64", "s64")
_FLOATS = ("f32", "f64")
_ALL = ("b8", "u8", "s8", "b16", "u16", "s16", "f16", "bf16", "b32", "u32", "s32", "f32",
        "b64", "u64", "s64", "f64")
_RND = MOD_ROUND_MASK | MOD_FTZ | MOD_SAT
_SPACE = MOD_SPACE_MASK | MOD_VOLATILE

OP_NOP = 0x00
OP_MOV = 0x01
OP_LD = 0x02
OP_ST = 0x03
OP_CVT = 0x04
OP_CVTA = 0x05
OP_SELP = 0x06
OP_ADD = 0x10
OP_SUB = 0x11
OP_MUL = 0x12
OP_MAD = 0x13
OP_FMA = 0x14
OP_DIV = 0x15
OP_REM = 0x16
OP_ABS = 0x17
OP_NEG = 0x18
OP_MIN = 0x19
OP_MAX = 0x1A
OP_AND = 0x20
OP_OR = 0x21
OP_XOR = 0x22
OP_NOT = 0x23
OP_SHL = 0x24
OP_SHR = 0x25
OP_POPC = 0x26
OP_CLZ = 0x27
OP_BREV = 0x28
OP_BFE = 0x29
OP_BFI = 0x2A
OP_PRMT = 0x2B
OP_BFIND = 0x2C
OP_SETP = 0x30
OP_SET = 0x31
OP_SLCT = 0x32
OP_TESTP = 0x33
OP_SQRT = 0x40
OP_RSQRT = 0x41
OP_RCP = 0x42
OP_EX2 = 0x43
OP_LG2 = 0x44
OP_SIN = 0x45
OP_COS = 0x46
OP_TANH = 0x47
OP_COPYSIGN = 0x48
OP_BRA = 0x50
OP_EXIT = 0x51
OP_TRAP = 0x52
OP_BAR = 0x53
OP_MEMBAR = 0x54
OP_ATOM = 0x60
OP_RED = 0x61
OP_SHFL = 0x70
OP_VOTE = 0x71
OP_ACTIVEMASK = 0x72

OPCODES = {s.opcode: s for s in (
    OpSpec(OP_NOP, "nop", ("-", "-", "-", "-", "-"), _t("none"), 0),
    OpSpec(OP_MOV, "mov", ("D", "-", "T", "-", "-"), _t(*_ALL, "pred"), 0),
    OpSpec(OP_LD, "ld", ("D", "-", "A", "-", "-"), _t(*_ALL), _SPACE),
    OpSpec(OP_ST, "st", ("-", "-", "A", "T", "-"), _t(*_ALL), _SPACE),
    OpSpec(OP_CVT, "cvt", ("D", "-", "T2", "-", "-"), _t(*_ALL), _RND),
    OpSpec(OP_CVTA, "cvta", ("D", "-", "T", "-", "-"), _t("u32", "u64"),
           MOD_SPACE_MASK | MOD_VARIANT_MASK),
    OpSpec(OP_SELP, "selp", ("D", "-", "T", "T", "P"), _t(*_ALL), MOD_NEG_C),
    OpSpec(OP_ADD, "add", ("D", "-", "T", "T", "-"), _t(*_INTS, *_FLOATS, "f16"), _RND),
    OpSpec(OP_SUB, "sub", ("D", "-", "T", "T", "-"), _t(*_INTS, *_FLOATS, "f16"), _RND),
    OpSpec(OP_MUL, "mul", ("D", "-", "T", "T", "-"), _t(*_INTS, *_FLOATS, "f16"),
           _RND | MOD_VARIANT_MASK),
    OpSpec(OP_MAD, "mad", ("D", "-", "T", "T", "T"), _t(*_INTS, *_FLOATS),
           _RND | MOD_VARIANT_MASK),
    OpSpec(OP_FMA, "fma", ("D", "-", "T", "T", "T"), _t(*_FLOATS, "f16"), _RND),
    OpSpec(OP_DIV, "div", ("D", "-", "T", "T", "-"), _t(*_INTS, *_FLOATS), _RND | MOD_APPROX),
    OpSpec(OP_REM, "rem", ("D", "-", "T", "T", "-"), _t(*_INTS), 0),
    OpSpec(OP_ABS, "abs", ("D", "-", "T", "-", "-"), _t("s16", "s32", "s64", *_FLOATS, "f16"),
           MOD_FTZ),
    OpSpec(OP_NEG, "neg", ("D", "-", "T", "-", "-"), _t("s16", "s32", "s64", *_FLOATS, "f16"),
           MOD_FTZ),
    OpSpec(OP_MIN, "min", ("D", "-", "T", "T", "-"), _t(*_INTS, *_FLOATS), MOD_FTZ),
    OpSpec(OP_MAX, "max", ("D", "-", "T", "T", "-"), _t(*_INTS, *_FLOATS), MOD_FTZ),
    OpSpec(OP_AND, "and", ("D", "-", "T", "T", "-"), _t("b16", "b32", "b64", "pred"), 0),
    OpSpec(OP_OR, "or", ("D", "-", "T", "T", "-"), _t("b16", "b32", "b64", "pred"), 0),
    OpSpec(OP_XOR, "xor", ("D", "-", "T", "T", "-"), _t("b16", "b32", "b64", "pred"), 0),
    OpSpec(OP_NOT, "not", ("D", "-", "T", "-", "-"), _t("b16", "b32", "b64", "pred"), 0),
    OpSpec(OP_SHL, "shl", ("D", "-", "T", "U", "-"), _t("b16", "b32", "b64"), 0),
    OpSpec(OP_SHR, "shr", ("D", "-", "T", "U", "-"), _t("b16", "b32", "b64", "u16", "u32",
                                                         "u64", "s16", "s32", "s64"), 0),
    OpSpec(OP_POPC, "popc", ("U", "-", "T", "-", "-"), _t("b32", "b64"), 0),
    OpSpec(OP_CLZ, "clz", ("U", "-", "T", "-", "-"), _t("b32", "b64"), 0),
    OpSpec(OP_BREV, "brev", ("D", "-", "T", "-", "-"), _t("b32", "b64"), 0),
    OpSpec(OP_BFE, "bfe", ("D", "-", "T", "U", "U"), _t("u32", "s32", "u64", "s64"), 0),
    OpSpec(OP_BFI, "bfi", ("D", "U", "T", "T", "U"), _t("b32", "b64"), 0),
    OpSpec(OP_PRMT, "prmt", ("D", "-", "T", "T", "U"), _t("b32"), MOD_VARIANT_MASK),
    OpSpec(OP_BFIND, "bfind", ("U", "-", "T", "-", "-"), _t("u32", "s32", "u64", "s64"),
           MOD_VARIANT_MASK),
    OpSpec(OP_SETP, "setp", ("P", "P?", "T", "T", "P?"), _t(*_ALL[1:]),
           MOD_CMP_MASK | MOD_BOOL_MASK | MOD_NEG_C | MOD_FTZ),
    OpSpec(OP_SET, "set", ("D", "-", "T2", "T2", "P?"), _t("u32", "s32", "f32"),
           MOD_CMP_MASK | MOD_BOOL_MASK | MOD_NEG_C | MOD_FTZ),
    OpSpec(OP_SLCT, "slct", ("D", "-", "T", "T", "T2"), _t(*_INT32, *_INT64, *_FLOATS), MOD_FTZ),
    OpSpec(OP_TESTP, "testp", ("P", "-", "T", "-", "-"), _t(*_FLOATS), MOD_VARIANT_MASK),
    OpSpec(OP_SQRT, "sqrt", ("D", "-", "T", "-", "-"), _t(*_FLOATS), _RND | MOD_APPROX),
    OpSpec(OP_RSQRT, "rsqrt", ("D", "-", "T", "-", "-"), _t(*_FLOATS), MOD_FTZ | MOD_APPROX),
    OpSpec(OP_RCP, "rcp", ("D", "-", "T", "-", "-"), _t(*_FLOATS), _RND | MOD_APPROX),
    OpSpec(OP_EX2, "ex2", ("D", "-", "T", "-", "-"), _t("f32", "f16"), MOD_FTZ | MOD_APPROX),
    OpSpec(OP_LG2, "lg2", ("D", "-", "T", "-", "-"), _t("f32"), MOD_FTZ | MOD_APPROX),
    OpSpec(OP_SIN, "sin", ("D", "-", "T", "-", "-"), _t("f32"), MOD_FTZ | MOD_APPROX),
    OpSpec(OP_COS, "cos", ("D", "-", "T", "-", "-"), _t("f32"), MOD_FTZ | MOD_APPROX),
    OpSpec(OP_TANH, "tanh", ("D", "-", "T", "-", "-"), _t("f32", "f16"), MOD_APPROX),
    OpSpec(OP_COPYSIGN, "copysign", ("D", "-", "T", "T", "-"), _t(*_FLOATS), 0),
    OpSpec(OP_BRA, "bra", ("-", "-", "-", "-", "-"), _t("none"), 0),
    OpSpec(OP_EXIT, "exit", ("-", "-", "-", "-", "-"), _t("none"), 0),
    OpSpec(OP_TRAP, "trap", ("-", "-", "-", "-", "-"), _t("none"), 0),
    OpSpec(OP_BAR, "bar", ("D?", "-", "U?", "U?", "P?"), _t("none", "u32", "pred"),
           MOD_VARIANT_MASK | MOD_NEG_C),
    OpSpec(OP_MEMBAR, "membar", ("-", "-", "-", "-", "-"), _t("none"), 0),
    OpSpec(OP_ATOM, "atom", ("D", "-", "A", "T", "T?"),
           _t("b32", "b64", "u32", "s32", "u64", "s64", "f32", "f64"),
           MOD_SPACE_MASK | MOD_ATOM_MASK),
    OpSpec(OP_RED, "red", ("-", "-", "A", "T", "-"),
           _t("b32", "b64", "u32", "s32", "u64", "s64", "f32", "f64"),
           MOD_SPACE_MASK | MOD_ATOM_MASK),
    OpSpec(OP_SHFL, "shfl", ("D", "P?", "T", "U", "U"), _t("b32"), MOD_VARIANT_MASK),
    OpSpec(OP_VOTE, "vote", ("D", "-", "P", "-", "-"), _t("pred", "b32"),
           MOD_VARIANT_MASK | MOD_NEG_C),
    OpSpec(OP_ACTIVEMASK, "activemask", ("U", "-", "-", "-", "-"), _t("b32"), 0),
)}
OPCODES_BY_NAME = {s.name: s for s in OPCODES.values()}

# --------------------------------------------------------------------------- faults
# Why the hardware refused a code object or stopped a launch (reported with the fault).
COBJ_ERR_FETCH = 1  # the object cannot be read through the MMU with EXEC permission
COBJ_ERR_HEADER = 2  # bad magic, version, size or table offsets
COBJ_ERR_ENTRY = 3  # the launch names no entry of the object, or the entry is invalid
COBJ_ERR_INSTR = 4  # an instruction fails ISA-VALID-*
COBJ_ERR_LAUNCH = 5  # the launch does not fit the entry (threads, shared memory, params)
COBJ_ERR_TRAP = 6  # the kernel executed TRAP
COBJ_ERR_NAMES = {COBJ_ERR_FETCH: "fetch", COBJ_ERR_HEADER: "header", COBJ_ERR_ENTRY: "entry",
                  COBJ_ERR_INSTR: "instruction", COBJ_ERR_LAUNCH: "launch",
                  COBJ_ERR_TRAP: "trap"}


def encode_instruction(op: int, type_: int = TYPE_NONE, *, type2: int = TYPE_NONE,
                       mod: int = 0, guard: int = 0, d: int = 0, d2: int = 0, a: int = 0,
                       b: int = 0, c: int = 0, imm: int = 0) -> bytes:
    return struct.pack(INSTR_FORMAT, op, type_, type2, mod, guard, 0, d, d2, a, b, c,
                       imm & 0xFFFF_FFFF_FFFF_FFFF)


assert COBJ_HEADER_SIZE == 96 and len(COBJ_HEADER_FIELDS) == 23
assert struct.calcsize("<4sHH" + "I" * 18) == COBJ_DATA_VA_OFFSET
