"""SIMT control flow (SM-EXEC-*): divergence and reconvergence (if/else, nested, an
out-of-line else, loops with different trip counts, break/continue, early exit), every
instruction executed exactly once per thread, barriers (with shared memory, exited
threads, different bar instructions, bar.red, bar.arrive with a count), trap, the stop
token on an infinite loop and on a deadlock, batches of blocks, special registers."""

import numpy as np
import pytest
from smtest import Env, StopAfter

from pvgpu.host.hw.sm import CodeFault
from pvgpu.host.hw.sm import launch as sm_launch
from pvgpu.spec import isa

FULL = 0xFFFFFFFF
PRO = """
  mov.u32 r0, %ctaid.x
  mov.u32 r1, %ntid.x
  mov.u32 r2, %tid.x
  mad.lo.u32 r0, r0, r1, r2
  ld.param.u64 rd1, [out]
  mul.wide.u32 rd2, r0, 4
  add.u64 rd3, rd1, rd2
  ld.param.u64 rd4, [out2]
  add.u64 rd5, rd4, rd2
"""


@pytest.fixture
def env():
    return Env(256 << 20)


def run(env, body, n_blocks, threads, shared=0, **kw):
    src = f".entry k shared={shared}\n.param u64 out\n.param u64 out2\n{PRO}\n{body}"
    mod = env.load(src)
    n = n_blocks * threads
    out = env.buffer(np.zeros(n, np.uint32))
    out2 = env.buffer(np.zeros(n, np.uint32))
    env.run(mod, grid=n_blocks, block=threads, args=(out, out2), **kw)
    return env.read(out, n, np.uint32), env.read(out2, n, np.uint32)


IF_ELSE = """
  and.b32 r4, r2, 1
  setp.eq.u32 p1, r4, 0
  @p1 bra EVEN
  mov.u32 r5, 100
  bra JOIN
EVEN:
  mov.u32 r5, 200
JOIN:
  activemask.b32 r6
  st.global.u32 [rd3], r5
  st.global.u32 [rd5], r6
  exit
"""

OUT_OF_LINE_ELSE = """
  and.b32 r4, r2, 1
  setp.eq.u32 p1, r4, 0
  @p1 bra ELSE
  mov.u32 r5, 100
JOIN:
  activemask.b32 r6
  st.global.u32 [rd3], r5
  st.global.u32 [rd5], r6
  exit
ELSE:
  mov.u32 r5, 200
  bra JOIN
"""


@pytest.mark.parametrize("body", [IF_ELSE, OUT_OF_LINE_ELSE], ids=["in_line", "out_of_line"])
def test_if_else_reconverges_at_the_join(env, body):
    a, mask = run(env, body, 3, 64)
    tid = np.tile(np.arange(64), 3)
    assert list(a) == [200 if t % 2 == 0 else 100 for t in tid]
    assert (mask == FULL).all()


def test_nested_branches(env):
    body = """
  and.b32 r4, r2, 1
  and.b32 r7, r2, 2
  mov.u32 r5, 0
  setp.ne.u32 p1, r4, 0
  @p1 bra ODD
  setp.ne.u32 p2, r7, 0
  @p2 bra E2
  add.u32 r5, r5, 1
  bra EJ
E2:
  add.u32 r5, r5, 2
EJ:
  activemask.b32 r8
  add.u32 r5, r5, 10
  bra JOIN
ODD:
  setp.ne.u32 p2, r7, 0
  @!p2 bra JOIN
  add.u32 r5, r5, 4
JOIN:
  activemask.b32 r6
  mul.lo.u32 r5, r5, 100
  st.global.u32 [rd3], r5
  and.b32 r8, r8, 0x55555555
  setp.eq.u32 p3, r4, 0
  selp.u32 r9, r8, r6, p3
  st.global.u32 [rd5], r9
  exit
"""
    a, m = run(env, body, 2, 32)
    want = {0: 1100, 2: 1200, 1: 0, 3: 400}
    assert list(a) == [want[t % 4] for t in np.tile(np.arange(32), 2)]
    # the even threads met at EJ together (both inner paths), all met at JOIN
    assert list(m) == [0x55555555 if t % 2 == 0 else FULL for t in np.tile(np.arange(32), 2)]


def test_loops_with_different_trip_counts_reconverge(env):
    body = """
  mov.u32 r5, 0
  mov.u32 r7, 0
LOOP:
  setp.ge.u32 p1, r7, r2
  @p1 bra DONE
  add.u32 r5, r5, r7
  add.u32 r7, r7, 1
  bra LOOP
DONE:
  activemask.b32 r6
  st.global.u32 [rd3], r5
  st.global.u32 [rd5], r6
  exit
"""
    a, m = run(env, body, 2, 96)
    tid = np.tile(np.arange(96), 2)
    assert list(a) == [t * (t - 1) // 2 for t in tid]
    assert (m == FULL).all()


def test_break_and_continue(env):
    body = """
  mov.u32 r7, 0
  mov.u32 r5, 0
  rem.u32 r8, r2, 5
  rem.u32 r9, r2, 3
  add.u32 r9, r9, 7
LOOP:
  setp.ge.u32 p1, r7, 10
  @p1 bra DONE
  setp.eq.u32 p2, r7, r8
  @p2 bra CONT
  setp.eq.u32 p3, r7, r9
  @p3 bra DONE
  add.u32 r5, r5, r7
CONT:
  add.u32 r7, r7, 1
  bra LOOP
DONE:
  activemask.b32 r6
  st.global.u32 [rd3], r5
  st.global.u32 [rd5], r6
  exit
"""
    a, m = run(env, body, 1, 64)

    def ref(t):
        acc = 0
        for k in range(10):
            if k == t % 5:
                continue
            if k == 7 + t % 3:
                break
            acc += k
        return acc
    assert list(a) == [ref(t) for t in range(64)] and (m == FULL).all()


def test_every_instruction_runs_exactly_once_per_thread(env):
    """Each basic block counts its executions per thread (an atomic per block and thread)."""
    body = """
  mul.lo.u32 r20, r0, 16
  mov.u32 r7, 0
  atom.global.add.u32 r30, [rd3], 1
LOOP:
  and.b32 r4, r7, 1
  setp.ne.u32 p1, r4, 0
  @p1 bra ODD
  atom.global.add.u32 r30, [rd5], 1
  bra NEXT
ODD:
  atom.global.add.u32 r30, [rd5], 65536
NEXT:
  add.u32 r7, r7, 1
  setp.lt.u32 p2, r7, r2
  @p2 bra LOOP
  exit
"""
    a, b = run(env, body, 2, 50)
    tid = np.tile(np.arange(50), 2)
    trips = np.maximum(tid, 1)
    assert (a == 1).all()
    assert list(b) == [((k + 1) // 2) + ((k // 2) << 16) for k in trips]


def test_early_exit_and_barrier_with_shared_memory(env):
    body = """
  shl.b32 r10, r2, 2
  st.shared.u32 [r10], r2
  and.b32 r4, r2, 3
  setp.eq.u32 p1, r4, 3
  @p1 exit
  bar.sync 0
  add.u32 r11, r2, 1
  rem.u32 r11, r11, r1
  shl.b32 r12, r11, 2
  ld.shared.u32 r13, [r12]
  add.u32 r13, r13, 1000
  st.global.u32 [rd3], r13
  exit
"""
    a, _ = run(env, body, 4, 128, shared=512)
    tid = np.tile(np.arange(128), 4)
    assert list(a) == [0 if t % 4 == 3 else 1000 + (t + 1) % 128 for t in tid]


def test_threads_meet_at_a_barrier_from_different_instructions(env):
    body = """
  shl.b32 r10, r2, 2
  and.b32 r4, r2, 1
  setp.eq.u32 p1, r4, 0
  @p1 bra EVEN
  st.shared.u32 [r10], r2
  bar.sync 0
  bra JOIN
EVEN:
  mul.lo.u32 r9, r2, 10
  st.shared.u32 [r10], r9
  bar.sync 0
JOIN:
  xor.b32 r11, r2, 1
  shl.b32 r12, r11, 2
  ld.shared.u32 r13, [r12]
  st.global.u32 [rd3], r13
  exit
"""
    a, _ = run(env, body, 2, 64, shared=256)
    tid = np.tile(np.arange(64), 2)
    assert list(a) == [(t ^ 1) * (10 if (t ^ 1) % 2 == 0 else 1) for t in tid]


def test_bar_red(env):
    body = """
  rem.u32 r4, r2, 3
  setp.eq.u32 p1, r4, 0
  bar.red.popc.u32 r5, 0, p1
  setp.lt.u32 p2, r2, 100
  bar.red.and.pred p3, 1, p2
  bar.red.or.pred p4, 2, !p2
  selp.u32 r6, 1, 0, p3
  selp.u32 r7, 2, 0, p4
  add.u32 r6, r6, r7
  st.global.u32 [rd3], r5
  st.global.u32 [rd5], r6
  exit
"""
    a, b = run(env, body, 3, 96)
    assert (a == 32).all()  # 96 threads, every third
    assert (b == 1).all()  # all < 100, none >= 100
    a, b = run(env, body.replace("bar.red.popc.u32 r5, 0, p1",
                                 "@p1 bra SKIP\nSKIP:\nbar.red.popc.u32 r5, 0, p1"), 1, 130)
    assert (a == 44).all() and (b == 2).all()  # 130 threads: 44 multiples of 3, some >= 100


def test_bar_arrive_with_a_thread_count(env):
    """Producer warp writes, arrives; the consumer warp waits for 64 threads at barrier 1."""
    body = """
  shl.b32 r10, r2, 2
  setp.lt.u32 p1, r2, 32
  @!p1 bra CONSUMER
  mul.lo.u32 r9, r2, 3
  st.shared.u32 [r10], r9
  bar.arrive 1, 64
  exit
CONSUMER:
  bar.sync 1, 64
  sub.u32 r11, r2, 32
  shl.b32 r12, r11, 2
  ld.shared.u32 r13, [r12]
  st.global.u32 [rd3], r13
  exit
"""
    a, _ = run(env, body, 2, 64, shared=256)
    tid = np.tile(np.arange(64), 2)
    assert list(a) == [0 if t < 32 else (t - 32) * 3 for t in tid]


def test_trap_faults_at_its_instruction_after_earlier_stores(env):
    body = """
  st.global.u32 [rd3], r2
  setp.eq.u32 p1, r2, 5
  @p1 trap
  st.global.u32 [rd5], 7
  exit
"""
    src = f".entry k\n.param u64 out\n.param u64 out2\n{PRO}\n{body}"
    mod = env.load(src)
    out = env.buffer(np.zeros(32, np.uint32))
    out2 = env.buffer(np.zeros(32, np.uint32))
    with pytest.raises(CodeFault) as e:
        env.run(mod, block=32, args=(out, out2))
    h = mod.header
    trap_index = len([ln for ln in PRO.strip().splitlines()]) + 2
    assert e.value.address == mod.va + h["code_off"] + trap_index * isa.INSTR_SIZE
    assert e.value.reason == isa.COBJ_ERR_TRAP
    assert list(env.read(out, 32, np.uint32)) == list(range(32))  # written before the trap


def test_the_stop_token_ends_an_infinite_loop(env):
    mod = env.load(".entry spin\nL:\n  add.u32 r0, r0, 1\n  bra L")
    ctl = StopAfter(500)
    env.run(mod, grid=3, block=64, ctl=ctl)  # returns, quietly
    assert ctl.checks == 501


def test_a_deadlocked_barrier_waits_for_the_stop_token(env):
    body = """
  setp.lt.u32 p1, r2, 32
  @p1 bra A
  bar.sync 1
  exit
A:
  bar.sync 0
  exit
"""
    src = f".entry k\n.param u64 out\n.param u64 out2\n{PRO}\n{body}"
    mod = env.load(src)
    ctl = StopAfter(40)
    env.run(mod, block=64, args=(0, 0), ctl=ctl)
    assert ctl.checks > 40


def test_batches_of_blocks_and_3d_ids(env, monkeypatch):
    monkeypatch.setattr(sm_launch, "BATCH_THREADS", 48)  # 2 blocks of 24 per batch
    src = """
.entry k
.param u64 out
  ld.param.u64 rd1, [out]
  mov.u32 r0, %tid.x
  mov.u32 r1, %tid.y
  mov.u32 r2, %tid.z
  mov.u32 r3, %ctaid.x
  mov.u32 r4, %ctaid.y
  mov.u32 r5, %ctaid.z
  mov.u32 r6, %ntid.x
  mov.u32 r7, %ntid.y
  mov.u32 r8, %nctaid.x
  mov.u32 r9, %nctaid.y
  mad.lo.u32 r10, r2, r7, r1
  mad.lo.u32 r10, r10, r6, r0
  mov.u32 r11, %ntid.z
  mul.lo.u32 r12, r6, r7
  mul.lo.u32 r12, r12, r11
  mad.lo.u32 r13, r5, r9, r4
  mad.lo.u32 r13, r13, r8, r3
  mad.lo.u32 r14, r13, r12, r10
  shl.b32 r15, r3, 24
  shl.b32 r16, r4, 16
  or.b32 r15, r15, r16
  shl.b32 r16, r5, 8
  or.b32 r15, r15, r16
  or.b32 r15, r15, r10
  mul.wide.u32 rd2, r14, 4
  add.u64 rd3, rd1, rd2
  st.global.u32 [rd3], r15
  exit
"""
    mod = env.load(src)
    grid, block = (3, 2, 2), (4, 3, 2)
    n = 12 * 24
    out = env.buffer(np.zeros(n, np.uint32))
    env.run(mod, grid=grid, block=block, args=(out,))
    got = env.read(out, n, np.uint32)
    want = []
    for z in range(2):
        for y in range(2):
            for x in range(3):
                for tz in range(2):
                    for ty in range(3):
                        for tx in range(4):
                            want.append((x << 24) | (y << 16) | (z << 8) | (tz * 12 + ty * 4 + tx))
    assert list(got) == want
    assert env.sm.batches >= 6


def test_special_registers(env):
    body = """
  mov.u32 r4, %laneid
  mov.u32 r5, %warpid
  mov.u32 r6, %nwarpid
  mov.u32 r7, %lanemask_lt
  mov.u32 r8, %lanemask_ge
  mov.u32 r9, %smid
  mov.u32 r10, %nsmid
  mov.u32 r11, %dynamic_smem_size
  mov.u32 r12, %total_smem_size
  shl.b32 r13, r5, 8
  or.b32 r13, r13, r4
  shl.b32 r14, r6, 16
  or.b32 r13, r13, r14
  st.global.u32 [rd3], r13
  xor.b32 r15, r7, r8
  st.global.u32 [rd5], r15
  setp.ne.u32 p1, r2, 0
  @p1 exit
  mul.wide.u32 rd6, r0, 4
  add.u64 rd7, rd4, rd6
  add.u64 rd7, rd7, 4
  st.global.u32 [rd7], r9
  st.global.u32 [rd7+4], r10
  st.global.u32 [rd7+8], r11
  st.global.u32 [rd7+12], r12
  exit
"""
    a, b = run(env, body, 2, 70, shared=16, dyn_shared=48)
    tid = np.tile(np.arange(70), 2)
    assert list(a) == [(t // 32) << 8 | t % 32 | 3 << 16 for t in tid]
    # lanemask_lt ^ lanemask_ge is every lane; thread 0 of each block then wrote %smid,
    # %nsmid, %dynamic_smem_size and %total_smem_size over the next four entries
    extra = {1: 0, 2: isa.SM_COUNT, 3: 48, 4: 64, 71: 1, 72: isa.SM_COUNT, 73: 48, 74: 64}
    assert list(b) == [extra.get(i, FULL) for i in range(140)]


def test_clock_and_globaltimer_advance():
    src = """
.entry k
.param u64 out
  ld.param.u64 rd1, [out]
  mov.u64 rd2, %clock64
  mov.u64 rd3, %globaltimer
  mov.u32 r1, %clock
  add.u32 r0, r0, 1
  mov.u64 rd4, %clock64
  mov.u64 rd5, %gridid
  st.global.u64 [rd1], rd2
  st.global.u64 [rd1+8], rd4
  st.global.u64 [rd1+16], rd3
  st.global.u64 [rd1+24], rd5
  exit
"""
    ns = iter(range(10**9, 10**9 + 10**6, 1000))
    env2 = Env(64 << 20, clock=lambda: next(ns))
    mod = env2.load(src)
    out = env2.buffer(np.zeros(4, np.uint64))
    env2.run(mod, block=1, args=(out,))
    first, second, timer, grid1 = (int(v) for v in env2.read(out, 4, np.uint64))
    assert second > first >= 10**9 and timer >= 10**9
    env2.run(mod, block=1, args=(out,))
    assert int(env2.read(out, 4, np.uint64)[3]) != grid1


def test_shared_memory_counts_against_the_batch_budget(env, monkeypatch):
    monkeypatch.setattr(sm_launch, "BATCH_BYTES", 16 << 20)
    mod = env.load(".entry k\n  mov.u32 r0, %tid.x\n  st.shared.u32 [0], r0\n  exit")
    env.run(mod, grid=512, block=32, dyn_shared=160 << 10)
    assert env.sm.batches >= 5  # 16 MiB holds fewer than 103 blocks of 160 KiB
