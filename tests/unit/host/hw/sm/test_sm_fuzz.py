"""Hostile code objects: valid objects mutated at random (bytes anywhere, or one field of
one instruction set to a plausible value so that many mutants pass validation and run)
never make the SMs raise anything but a page fault or a code fault, and never hang: a
stop token ends whatever loops."""

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from smtest import Env, StopAfter, smasm

from pvgpu.host.hw.mmu import MmuFault
from pvgpu.host.hw.sm import CodeFault
from pvgpu.spec import isa

PROGRAMS = [
    """
.entry k shared=256 local=16
.param u64 out
.param u32 n
  ld.param.u64 rd0, [out]
  mov.u32 r0, %tid.x
  mov.u32 r1, %ctaid.x
  mov.u32 r2, %ntid.x
  mad.lo.u32 r3, r1, r2, r0
  setp.ge.u32 p0, r3, 40
  @p0 bra END
  mul.wide.u32 rd1, r3, 4
  add.u64 rd2, rd0, rd1
  shl.b32 r4, r0, 2
  st.shared.u32 [r4], r3
  st.local.u32 [4], r3
  bar.sync 0
  ld.shared.u32 r5, [r4]
  ld.local.u32 r6, [4]
  add.u32 r5, r5, r6
  cvt.rn.f32.u32 r7, r5
  mul.f32 r7, r7, 0.5
  shfl.down.b32 r8|p1, r5, 1, 31
  vote.ballot.b32 r9, p1
  atom.global.add.u32 r10, [rd0], 1
  st.global.u32 [rd2+4], r7
END:
  exit
""",
    """
.entry loop
.param u64 out
.param u32 n
  ld.param.u64 rd0, [out]
  mov.u32 r0, %tid.x
  mov.u32 r1, 0
  mov.u32 r2, 0
L:
  setp.ge.u32 p0, r1, r0
  @p0 bra D
  add.u32 r2, r2, r1
  rem.u32 r3, r1, 3
  setp.eq.u32 p1, r3, 1
  @p1 bra C
  xor.b32 r2, r2, 5
C:
  add.u32 r1, r1, 1
  bra L
D:
  mul.wide.u32 rd1, r0, 4
  add.u64 rd2, rd0, rd1
  st.global.u32 [rd2+4], r2
  red.global.max.u32 [rd0], r2
  exit
""",
]
KINDS = [isa.OPND_NONE, isa.OPND_R32, isa.OPND_R64, isa.OPND_PRED, isa.OPND_IMM,
         isa.OPND_SIMM, isa.OPND_SREG, isa.OPND_DATA, isa.OPND_CONST]
FIELDS = ["op", "type", "type2", "mod", "guard", "d", "d2", "a", "b", "c", "imm"]


@pytest.fixture(scope="module")
def env():
    return Env(128 << 20)


@pytest.fixture(scope="module")
def bases():
    return [smasm.assemble(p) for p in PROGRAMS]


def plausible(field, draw):
    if field == "op":
        return draw(st.sampled_from(sorted(isa.OPCODES)))
    if field in ("type", "type2"):
        return draw(st.integers(0, 18))
    if field == "mod":
        return draw(st.integers(0, 15) | st.builds(lambda a, b: a << b, st.integers(0, 31),
                                                     st.sampled_from([8, 12, 17, 20, 25])))
    if field == "guard":
        return draw(st.sampled_from([0, isa.GUARD_ON, isa.GUARD_ON | 1, isa.GUARD_ON | isa.GUARD_NEG]))
    if field == "imm":
        return draw(st.integers(0, 20) | st.integers(0, (1 << 64) - 1))
    kind = draw(st.sampled_from(KINDS))
    value = draw(st.integers(0, 12) | st.integers(0, isa.OPND_VALUE_MASK))
    return (kind << isa.OPND_KIND_SHIFT) | value


def run_mutant(env, raw: bytes):
    mod = env.load(raw)
    out = env.buffer(np.zeros(64, np.uint32))
    params = struct.pack("<QI", out, 64)
    ctl = StopAfter(3000)
    try:
        env.run(mod, grid=2, block=48, params=params, entry_va=mod.va + smasm.header(raw)["entries_off"],
                ctl=ctl)
    except (CodeFault, MmuFault):
        pass
    assert ctl.checks <= 3001


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(st.data())
def test_mutated_instructions_only_fault_or_run(env, bases, data):
    base = bytearray(data.draw(st.sampled_from(bases)))
    h = smasm.header(bytes(base))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, h["code_count"] - 1))
        off = h["code_off"] + i * isa.INSTR_SIZE
        rec = np.frombuffer(bytes(base[off:off + isa.INSTR_SIZE]), isa.INSTR_DTYPE).copy()
        field = data.draw(st.sampled_from(FIELDS))
        limit = (1 << (8 * rec.dtype[field].itemsize)) - 1
        rec[field] = plausible(field, data.draw) & limit
        base[off:off + isa.INSTR_SIZE] = rec.tobytes()
    run_mutant(env, bytes(base))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.data())
def test_mutated_bytes_only_fault_or_run(env, bases, data):
    base = bytearray(data.draw(st.sampled_from(bases)))
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(0, len(base) - 1))
        base[pos] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):  # keep the magic and size so the rest gets checked
        base[:4] = isa.COBJ_MAGIC
        base[4:6] = struct.pack("<H", isa.COBJ_VERSION)
        base[8:12] = struct.pack("<I", len(base))
    run_mutant(env, bytes(base))


@pytest.mark.parametrize("field,value", [("entry_count", 0xFFFFFFFF), ("code_count", 0xFFFFFFFF),
                                         ("param_count", 0xFFFFFFFF), ("strtab_size", 0xFFFFFFFF),
                                         ("size", 0xFFFFFFFF), ("data_init_size", 0xFFFFFFFF)])
def test_huge_counts_and_sizes(env, bases, field, value):
    raw = bytearray(bases[0])
    h = smasm.header(bytes(raw))
    h[field] = value
    raw[:isa.COBJ_HEADER_SIZE] = struct.pack(isa.COBJ_HEADER_FORMAT,
                                             *(h[f] for f in isa.COBJ_HEADER_FIELDS))
    with pytest.raises(CodeFault) as e:
        mod = env.load(bytes(raw))
        env.run(mod, block=32, params=bytes(12), entry_va=mod.va + h["entries_off"])
    assert e.value.reason == isa.COBJ_ERR_HEADER
