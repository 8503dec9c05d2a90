"""Code-object validation (COBJ-VALID-*, ISA-VALID-*): every rule broken on purpose gives
a CodeFault naming the first offending record (header, entry, parameter record or
instruction) and its reason, and nothing runs; hostile objects (huge counts, offsets past
the end, overlapping sections) fault the same way; EXEC is checked on every page; checking
is cached by the object's bytes."""

import struct

import numpy as np
import pytest
from smtest import EXEC, RW, VMID, Env, smasm

from pvgpu.host.hw.mmu import MmuFault
from pvgpu.host.hw.regs import PAGE_SIZE
from pvgpu.host.hw.sm import CodeFault
from pvgpu.spec import isa
from pvgpu.spec.isa import operand
from pvgpu.spec.kernels import ACCESS_EXEC

BASE = """
.entry k r32=8 r64=4 pred=2 shared=64
.param u64 out
.param u32 n
.global g 16
.const c 16
  ld.param.u64 rd0, [out]
  mov.u32 r0, %tid.x
  mul.wide.u32 rd1, r0, 4
  add.u64 rd2, rd0, rd1
  setp.lt.u32 p0, r0, 4
  add.u32 r1, r0, 1
  st.global.u32 [rd2], r1
  exit
"""
MARK = 5  # index of `add.u32 r1, r0, 1`, the instruction the tests rewrite
ENTRY = struct.Struct(isa.COBJ_ENTRY_FORMAT)


@pytest.fixture
def env():
    return Env(64 << 20)


class Obj:
    """The base object as a bytearray with field-level patching."""

    def __init__(self, env, text=BASE):
        asm = smasm.Assembler(text, data_va=0x7700_0000, const_va=0x7800_0000)
        self.raw = bytearray(asm.build())
        self.h = smasm.header(bytes(self.raw))

    def header(self, **fields):
        h = dict(self.h, **fields)
        self.raw[:isa.COBJ_HEADER_SIZE] = struct.pack(isa.COBJ_HEADER_FORMAT,
                                                      *(h[f] for f in isa.COBJ_HEADER_FIELDS))
        self.h = h

    def entry(self, index=0, **fields):
        off = self.h["entries_off"] + index * isa.COBJ_ENTRY_SIZE
        e = dict(zip(isa.COBJ_ENTRY_FIELDS, ENTRY.unpack_from(self.raw, off)))
        e.update(fields)
        ENTRY.pack_into(self.raw, off, *(e[f] for f in isa.COBJ_ENTRY_FIELDS))

    def param(self, index, offset, size, align=8, type_=isa.TYPE_U64):
        off = self.h["params_off"] + index * isa.COBJ_PARAM_SIZE
        struct.pack_into(isa.COBJ_PARAM_FORMAT, self.raw, off, offset, size, align, type_)
        return off

    def instr(self, index, **fields):
        off = self.h["code_off"] + index * isa.INSTR_SIZE
        rec = np.frombuffer(self.raw, isa.INSTR_DTYPE, 1, off).copy()
        for k, v in fields.items():
            rec[k] = v
        self.raw[off:off + isa.INSTR_SIZE] = rec.tobytes()
        return off

    def set_instr(self, index, raw: bytes):
        off = self.h["code_off"] + index * isa.INSTR_SIZE
        self.raw[off:off + isa.INSTR_SIZE] = raw
        return off


def launch(env, obj, block=32, params=None, dyn_shared=0, entry_va=None, grid=1):
    mod = env.load(bytes(obj.raw))
    out = env.buffer(np.zeros(32, np.uint32))
    params = params if params is not None else struct.pack("<QI", out, 32)
    eva = entry_va(mod) if entry_va else None
    env.run(mod, grid=grid, block=block, params=params, dyn_shared=dyn_shared, entry_va=eva)
    return mod, out


def fault(env, obj, **kw):
    with pytest.raises(CodeFault) as e:
        launch(env, obj, **kw)
    return e.value


def test_the_base_object_runs(env):
    mod, out = launch(env, Obj(env))
    assert list(env.read(out, 32, np.uint32)) == list(range(1, 33))


# ------------------------------------------------------------------ header
HEADER_CASES = {
    "magic": dict(magic=b"XVCO"),
    "version": dict(version=2),
    "flags": dict(flags=1),
    "reserved": dict(reserved=5),
    "entries_misaligned": dict(entries_off=100),
    "entries_past_end": dict(entry_count=1 << 20),
    "code_past_end": dict(code_count=1 << 26),
    "params_before_header": dict(params_off=8),
    "strtab_overlaps_code": "overlap",
    "data_init_larger": "data_init",
    "empty_segment_with_va": dict(const_size=0, const_init_size=0),
    "too_small": dict(size=40),
    "too_big": dict(size=isa.COBJ_MAX_SIZE + 8),
}


@pytest.mark.parametrize("case", list(HEADER_CASES))
def test_bad_headers(env, case):
    obj = Obj(env)
    fields = HEADER_CASES[case]
    if fields == "overlap":
        fields = dict(strtab_off=obj.h["code_off"], strtab_size=16)
    elif fields == "data_init":
        fields = dict(data_init_size=obj.h["data_size"] + 8, data_init_off=obj.h["data_init_off"])
    obj.header(**fields)
    mod_va = env.code_next
    f = fault(env, obj)
    assert (f.address, f.reason) == (mod_va, isa.COBJ_ERR_HEADER)


def test_empty_tables_may_have_any_offset(env):
    obj = Obj(env, BASE.replace(".global g 16\n.const c 16\n", ""))
    obj.header(symbols_off=3, data_init_off=12345, const_init_off=1)
    launch(env, obj)


# ------------------------------------------------------------------ entry
ENTRY_CASES = {
    "name": dict(name_off=1 << 20),
    "no_code": dict(code_count=0),
    "code_range": dict(code_start=5),
    "registers": dict(n_r32=isa.MAX_REGS + 1),
    "params": dict(params_first=1, n_params=5),
    "param_size": dict(param_size=isa.MAX_PARAM_SIZE + 4),
    "shared": dict(shared_size=isa.MAX_SHARED_SIZE + 1),
    "local": dict(local_size=isa.MAX_LOCAL_SIZE + 1),
    "max_threads": dict(max_threads=isa.MAX_BLOCK_THREADS + 1),
    "flags": dict(flags=1),
    "reserved": dict(reserved=1),
}


@pytest.mark.parametrize("case", list(ENTRY_CASES))
def test_bad_entries(env, case):
    obj = Obj(env)
    obj.entry(**ENTRY_CASES[case])
    va = env.code_next
    f = fault(env, obj)
    assert (f.address, f.reason) == (va + obj.h["entries_off"], isa.COBJ_ERR_ENTRY)


@pytest.mark.parametrize("delta", [1, isa.COBJ_ENTRY_SIZE, -isa.COBJ_ENTRY_SIZE, 1 << 40])
def test_an_entry_address_that_is_not_a_record(env, delta):
    obj = Obj(env)
    va = env.code_next
    f = fault(env, obj, entry_va=lambda m: m.entry()[0] + delta)
    assert (f.address, f.reason) == ((va + obj.h["entries_off"] + delta) % (1 << 64),
                                     isa.COBJ_ERR_ENTRY)


def test_a_parameter_outside_the_buffer_names_its_record(env):
    obj = Obj(env)
    off = obj.param(1, 8, 8)  # the u32 n grown to 8 bytes: past param_size 12
    va = env.code_next
    f = fault(env, obj)
    assert (f.address, f.reason) == (va + off, isa.COBJ_ERR_ENTRY)


# ------------------------------------------------------------------ instructions
R32, R64, PRED = isa.OPND_R32, isa.OPND_R64, isa.OPND_PRED


def enc(op, t=isa.TYPE_U32, **kw):
    return isa.encode_instruction(op, t, **kw)


ADD = dict(d=operand(R32, 1), a=operand(R32, 0), b=operand(isa.OPND_SIMM, 1))
INSTR_CASES = {
    "opcode": enc(0x7F, **ADD),
    "type": enc(isa.OP_ADD, isa.TYPE_B32, **ADD),
    "mod_bit": enc(isa.OP_ADD, mod=isa.MOD_VOLATILE, **ADD),
    "rounding_on_int": enc(isa.OP_ADD, mod=isa.RND_RZ, **ADD),
    "sat_on_u32": enc(isa.OP_ADD, mod=isa.MOD_SAT, **ADD),
    "r32_index": enc(isa.OP_ADD, d=operand(R32, 8), a=operand(R32, 0), b=operand(R32, 1)),
    "r64_for_u32": enc(isa.OP_ADD, d=operand(R32, 1), a=operand(R64, 0), b=operand(R32, 1)),
    "missing_b": enc(isa.OP_ADD, d=operand(R32, 1), a=operand(R32, 0)),
    "extra_c": enc(isa.OP_ADD, c=operand(R32, 2), **ADD),
    "imm_destination": enc(isa.OP_ADD, d=operand(isa.OPND_IMM), a=operand(R32, 0), b=operand(R32, 1)),
    "simm_float": enc(isa.OP_ADD, isa.TYPE_F32, d=operand(R32, 1), a=operand(R32, 0),
                      b=operand(isa.OPND_SIMM, 1)),
    "two_imms": enc(isa.OP_ADD, d=operand(R32, 1), a=operand(isa.OPND_IMM), b=operand(isa.OPND_IMM)),
    "sreg_outside_mov": enc(isa.OP_ADD, d=operand(R32, 1), a=operand(isa.OPND_SREG, 0),
                            b=operand(R32, 1)),
    "sreg_unknown": enc(isa.OP_MOV, d=operand(R32, 1), a=operand(isa.OPND_SREG, 40)),
    "sreg_width": enc(isa.OP_MOV, isa.TYPE_U64, d=operand(R64, 1), a=operand(isa.OPND_SREG, 0)),
    "data_out_of_segment": enc(isa.OP_MOV, isa.TYPE_U64, d=operand(R64, 1),
                               a=operand(isa.OPND_DATA, 16)),
    "data_for_u32": enc(isa.OP_MOV, d=operand(R32, 1), a=operand(isa.OPND_DATA, 0)),
    "const_in_shared_ld": enc(isa.OP_LD, d=operand(R32, 1), a=operand(isa.OPND_CONST, 0),
                              mod=isa.SPACE_SHARED << isa.MOD_SPACE_SHIFT),
    "kind_15": enc(isa.OP_ADD, d=operand(R32, 1), a=(15 << 28), b=operand(R32, 1)),
    "guard_index": enc(isa.OP_ADD, guard=isa.GUARD_ON | 2, **ADD),
    "guard_without_on": enc(isa.OP_ADD, guard=1, **ADD),
    "reserved": "reserved",
    "bra_out_of_range": enc(isa.OP_BRA, isa.TYPE_NONE, imm=8),
    "bra_negative": enc(isa.OP_BRA, isa.TYPE_NONE, imm=-1),
    "type2_on_add": enc(isa.OP_ADD, type2=isa.TYPE_U32, **ADD),
    "cvt_bad_rounding": enc(isa.OP_CVT, isa.TYPE_S32, type2=isa.TYPE_F32, mod=isa.RND_RN,
                            d=operand(R32, 1), a=operand(R32, 0)),
    "mul_wide_64": enc(isa.OP_MUL, isa.TYPE_U64, mod=isa.VAR_WIDE << 8, d=operand(R64, 1),
                       a=operand(R64, 0), b=operand(R64, 0)),
    "setp_no_cmp": enc(isa.OP_SETP, d=operand(PRED, 1), a=operand(R32, 0), b=operand(R32, 1)),
    "setp_float_cmp_on_int": enc(isa.OP_SETP, mod=isa.CMP_NAN << isa.MOD_CMP_SHIFT,
                                 d=operand(PRED, 1), a=operand(R32, 0), b=operand(R32, 1)),
    "setp_bool_without_c": enc(isa.OP_SETP, mod=(isa.CMP_EQ << 12) | (isa.BOOL_AND << 17),
                               d=operand(PRED, 1), a=operand(R32, 0), b=operand(R32, 1)),
    "shfl_no_mode": enc(isa.OP_SHFL, isa.TYPE_B32, d=operand(R32, 1), a=operand(R32, 0),
                        b=operand(isa.OPND_SIMM, 1), c=operand(isa.OPND_SIMM, 31)),
    "vote_ballot_pred": enc(isa.OP_VOTE, isa.TYPE_PRED, mod=isa.VAR_VOTE_BALLOT << 8,
                            d=operand(PRED, 1), a=operand(PRED, 0)),
    "st_param": enc(isa.OP_ST, a=operand(isa.OPND_NONE), b=operand(R32, 0),
                    mod=isa.SPACE_PARAM << isa.MOD_SPACE_SHIFT),
    "atom_cas_without_c": enc(isa.OP_ATOM, isa.TYPE_B32, d=operand(R32, 1), a=operand(R64, 2),
                              b=operand(R32, 0), mod=isa.ATOM_CAS << isa.MOD_ATOM_SHIFT),
    "atom_no_op": enc(isa.OP_ATOM, isa.TYPE_U32, d=operand(R32, 1), a=operand(R64, 2),
                      b=operand(R32, 0)),
    "atom_float_min": enc(isa.OP_ATOM, isa.TYPE_F32, d=operand(R32, 1), a=operand(R64, 2),
                          b=operand(R32, 0), mod=isa.ATOM_MIN << isa.MOD_ATOM_SHIFT),
    "red_exch": enc(isa.OP_RED, isa.TYPE_B32, a=operand(R64, 2), b=operand(R32, 0),
                    mod=isa.ATOM_EXCH << isa.MOD_ATOM_SHIFT),
    "atom_local": enc(isa.OP_ATOM, isa.TYPE_U32, d=operand(R32, 1), a=operand(R64, 2),
                      b=operand(R32, 0), mod=(isa.ATOM_ADD << isa.MOD_ATOM_SHIFT)
                      | (isa.SPACE_LOCAL << isa.MOD_SPACE_SHIFT)),
    "bar_sync_with_d": enc(isa.OP_BAR, isa.TYPE_U32, mod=isa.VAR_BAR_SYNC << 8, d=operand(R32, 1)),
    "bar_arrive_without_count": enc(isa.OP_BAR, isa.TYPE_NONE, mod=isa.VAR_BAR_ARRIVE << 8),
    "bar_red_popc_pred": enc(isa.OP_BAR, isa.TYPE_PRED, mod=isa.VAR_BAR_RED_POPC << 8,
                             d=operand(PRED, 1), c=operand(PRED, 0)),
    "cvta_generic": enc(isa.OP_CVTA, isa.TYPE_U64, mod=isa.VAR_CVTA_TO_GENERIC << 8,
                        d=operand(R64, 1), a=operand(R64, 0)),
}


@pytest.mark.parametrize("case", list(INSTR_CASES))
def test_bad_instructions_name_the_first_offending_record(env, case):
    obj = Obj(env)
    raw = INSTR_CASES[case]
    if raw == "reserved":
        off = obj.instr(MARK, reserved=1)
    else:
        off = obj.set_instr(MARK, raw)
    obj.instr(MARK + 2, op=0x7E)  # a later bad one must not be the one reported
    va = env.code_next
    f = fault(env, obj)
    assert (f.address, f.reason) == (va + off, isa.COBJ_ERR_INSTR), f


@pytest.mark.parametrize("last", [enc(isa.OP_ADD, **ADD),
                                  enc(isa.OP_EXIT, isa.TYPE_NONE, guard=isa.GUARD_ON),
                                  enc(isa.OP_BRA, isa.TYPE_NONE, guard=isa.GUARD_ON, imm=0)])
def test_the_last_instruction_must_end_every_thread(env, last):
    obj = Obj(env)
    off = obj.set_instr(7, last)
    va = env.code_next
    f = fault(env, obj)
    assert (f.address, f.reason) == (va + off, isa.COBJ_ERR_INSTR)


# ------------------------------------------------------------------ launch
@pytest.mark.parametrize("case", ["no_threads", "too_many", "max_threads", "shared", "params"])
def test_launches_that_do_not_fit_the_entry(env, case):
    obj = Obj(env)
    kw = {}
    if case == "no_threads":
        kw["block"] = (0, 1, 1)
    elif case == "too_many":
        kw["block"] = (32, 33, 1)
    elif case == "max_threads":
        obj.entry(max_threads=16)
    elif case == "shared":
        kw["dyn_shared"] = isa.MAX_DYNAMIC_SHARED - 63
    else:
        kw["params"] = bytes(16)
    va = env.code_next
    f = fault(env, obj, **kw)
    assert (f.address, f.reason) == (va + obj.h["entries_off"], isa.COBJ_ERR_LAUNCH)


def test_nothing_runs_when_a_check_fails(env):
    obj = Obj(env)
    obj.instr(MARK, reserved=3)
    mod = env.load(bytes(obj.raw))
    out = env.buffer(np.zeros(32, np.uint32))
    with pytest.raises(CodeFault):
        env.run(mod, block=32, params=struct.pack("<QI", out, 32))
    assert (env.read(out, 32, np.uint32) == 0).all()


# ------------------------------------------------------------------ fetch and cache
def test_every_page_of_the_object_needs_exec(env):
    obj = Obj(env)
    obj.raw += bytes(PAGE_SIZE)  # the object now spans two pages
    obj.header(size=len(obj.raw))
    va = 0x5000_0000
    env.map(va, PAGE_SIZE, EXEC)
    env.map(va + PAGE_SIZE, PAGE_SIZE, RW)
    env.poke(va, bytes(obj.raw[:PAGE_SIZE]))
    env.poke(va + PAGE_SIZE, bytes(obj.raw[PAGE_SIZE:]))
    mod = smtest_module(bytes(obj.raw), va)
    with pytest.raises(MmuFault) as e:
        env.run(mod, block=32, params=bytes(12))
    assert (e.value.vmid, e.value.address, e.value.access) == (VMID, va + PAGE_SIZE, ACCESS_EXEC)
    with pytest.raises(MmuFault) as e:
        env.run(mod, block=32, params=bytes(12), entry_va=va + obj.h["entries_off"])
    env2 = Env(64 << 20)
    mod2 = env2.load(bytes(Obj(env2).raw), flags=RW)
    with pytest.raises(MmuFault) as e:
        env2.run(mod2, block=32, params=bytes(12))
    assert (e.value.address, e.value.access) == (mod2.va, ACCESS_EXEC)


def smtest_module(obj, va):
    from smtest import Module
    return Module(obj, va)


def test_checking_is_cached_by_the_bytes(env):
    obj = Obj(env)
    launch(env, obj)
    launch(env, obj)  # the same bytes at another VA
    stats = env.sm.cache.stats()
    assert (stats["modules"], stats["hits"], stats["misses"]) == (1, 1, 1)
    bad = Obj(env)
    bad.instr(MARK, reserved=1)
    va1 = env.code_next
    f1 = fault(env, bad)
    va2 = env.code_next
    f2 = fault(env, bad)  # the cached answer, at the new VA
    assert f1.address - va1 == f2.address - va2 and f1.reason == f2.reason
    assert env.sm.cache.stats()["hits"] == 2


def test_the_cache_is_bounded():
    from pvgpu.host.hw.sm.codeobject import ModuleCache
    cache = ModuleCache(max_modules=3, max_bytes=1 << 20)
    for k in range(10):
        cache.module(bytes([k]) * 200)
    assert len(cache) == 3
    cache = ModuleCache(max_modules=100, max_bytes=1000)
    for k in range(10):
        cache.module(bytes([k]) * 400)
    assert len(cache) == 2
