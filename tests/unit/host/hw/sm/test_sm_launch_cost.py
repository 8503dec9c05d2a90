"""The fixed cost of a small code launch on the SMs, counted in Python function calls
(deterministic, unlike a time): fetching and checking the object again, setting up the
launch and its batch, and running a kernel of a dozen instructions on one block of 256
threads -- the `scale` kernel of the README, as the guest's PTX compiler emits it. A
launch runs on the calling thread, so sys.setprofile sees every call. The caches that
make it cheap must not let changed bytes or another launch shape skip a check."""

import struct
import sys

import numpy as np
import pytest
from anymachine import python_calls_per_run
from smtest import Env, VMID

from pvgpu.host.hw.kernels import NEVER_STOP
from pvgpu.host.hw.sm import CodeFault
from pvgpu.spec import isa

# Python-level calls of one launch of SCALE over 256 threads, after its first: 297 before
# issue 12's cuts to the SMs; 166 with the object's bytes as the check cache's key and
# the launch shapes that passed remembered, batch shapes kept between launches, the
# common step of a whole group without helper calls, ld.param of a fixed offset at once,
# ALU operands read in place; 167 with a store's copy kept under the GIL (copy_bytes); 157
# with the special registers of a batch's place kept by its Shape, and the per-PC counts
# brought up to date only when the group may change; 150 with an address without an
# offset taken as it is; 164 with a register write and a memory range each through its one
# helper (_put, GlobalMemory.extents) instead of inlined copies (2 to spare)
CALLS_PER_LAUNCH = 166

SCALE = """
.entry scale
.param u64 p_x
.param f32 p_a
.param u32 p_n
  ld.param.u64 rd1, [p_x]
  ld.param.f32 r6, [p_a]
  ld.param.u32 r1, [p_n]
  mov.u32 r2, %ctaid.x
  mov.u32 r3, %ntid.x
  mov.u32 r4, %tid.x
  mad.lo.s32 r5, r2, r3, r4
  setp.ge.u32 p1, r5, r1
  @p1 bra DONE
  cvta.to.global.u64 rd2, rd1
  mul.wide.u32 rd3, r5, 4
  add.s64 rd2, rd2, rd3
  ld.global.f32 r7, [rd2]
  mul.f32 r7, r7, r6
  st.global.f32 [rd2], r7
DONE:
  exit
"""


@pytest.fixture
def env():
    return Env(64 << 20)


def test_a_small_launch_stays_within_its_call_budget(env):
    mod = env.load(SCALE)
    x = env.buffer(np.ones(256, np.float32))
    launch = env.code_launch(mod, "scale", 1, 256, (x, 2.0, 256))

    def run():
        env.sm.launch(VMID, launch, NEVER_STOP)

    for _ in range(3):  # first-use paths (checking, decoding) out of the way
        run()
    calls = python_calls_per_run(run, 10)
    assert (env.read(x, 256, np.float32) == 2.0 ** 13).all()
    assert calls <= CALLS_PER_LAUNCH, \
        f"{calls} Python calls per launch (budget {CALLS_PER_LAUNCH})"


def test_changed_bytes_at_the_same_address_are_checked_again(env):
    """The check cache is keyed by the bytes read at this launch: an object rewritten in
    place after launches that passed is checked again (COBJ-VALID-2), never run as the
    cached program."""
    mod = env.load(SCALE)
    x = env.buffer(np.ones(256, np.float32))
    launch = env.code_launch(mod, "scale", 1, 256, (x, 2.0, 256))
    for _ in range(2):
        env.sm.launch(VMID, launch, NEVER_STOP)
    h = mod.header
    _, entry, _ = mod.entry("scale")
    first = h["code_off"] + entry["code_start"] * isa.INSTR_SIZE
    bad = first + 3 * isa.INSTR_SIZE  # the 4th instruction gets an opcode that does not exist
    env.poke(mod.va + bad, struct.pack("<B", 0xFF))
    with pytest.raises(CodeFault) as e:
        env.sm.launch(VMID, launch, NEVER_STOP)
    assert e.value.address == mod.va + bad and e.value.reason == isa.COBJ_ERR_INSTR
    env.poke(mod.va, mod.obj)  # the original bytes again: the cached answer is right
    env.sm.launch(VMID, launch, NEVER_STOP)
    assert (env.read(x, 256, np.float32) == 8.0).all()


def test_a_launch_shape_that_passed_does_not_let_another_skip_its_checks(env):
    """COBJ-VALID-3 is remembered per (entry, block, shared memory, parameter bytes): the
    same entry with a block over the limit, or the wrong parameter size, still faults."""
    mod = env.load(SCALE.replace(".entry scale", ".entry scale maxntid=256"))
    x = env.buffer(np.ones(512, np.float32))
    ok = env.code_launch(mod, "scale", 1, 256, (x, 2.0, 256))
    env.sm.launch(VMID, ok, NEVER_STOP)
    env.sm.launch(VMID, ok, NEVER_STOP)
    for launch in (env.code_launch(mod, "scale", 1, 512, (x, 2.0, 512)),
                   env.code_launch(mod, "scale", 1, 256, params=bytes(12))):
        with pytest.raises(CodeFault) as e:
            env.sm.launch(VMID, launch, NEVER_STOP)
        assert e.value.reason == isa.COBJ_ERR_LAUNCH
    assert (env.read(x, 256, np.float32) == 4.0).all()
    assert (env.read(x + 1024, 256, np.float32) == 1.0).all()
