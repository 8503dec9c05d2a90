"""Warp instructions (SM-EXEC-4): shfl in every mode with clamp and segment operands, in
full and partial warps, the in-range predicate; vote all/any/uni/ballot and activemask over
the threads that execute them together; a shuffle reduction."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from smtest import Env

PRO = """
.entry k
.param u64 out
.param u64 out2
.param u64 act
  mov.u32 r0, %ctaid.x
  mov.u32 r1, %ntid.x
  mov.u32 r2, %tid.x
  mad.lo.u32 r0, r0, r1, r2
  ld.param.u64 rd1, [out]
  ld.param.u64 rd9, [out2]
  ld.param.u64 rd7, [act]
  mul.wide.u32 rd2, r0, 4
  add.u64 rd3, rd1, rd2
  add.u64 rd4, rd9, rd2
  add.u64 rd8, rd7, rd2
  ld.global.u32 r20, [rd8]
  setp.ne.u32 p5, r20, 0
  mul.lo.u32 r3, r0, 7
  add.u32 r3, r3, 1000
"""


@pytest.fixture(scope="module")
def env():
    return Env(64 << 20)


def run(env, body, blocks, threads, active=None):
    n = blocks * threads
    mod = env.load(PRO + body + "\n  exit")
    out = env.buffer(np.zeros(n, np.uint32))
    out2 = env.buffer(np.zeros(n, np.uint32))
    act = env.buffer(np.ones(n, np.uint32) if active is None else np.asarray(active, np.uint32))
    env.run(mod, grid=blocks, block=threads, args=(out, out2, act))
    return env.read(out, n, np.uint32), env.read(out2, n, np.uint32)


def ref_shfl(mode, vals, b, c, threads, active):
    """PTX shfl.sync per lane; vals are every thread's source register."""
    n = len(vals)
    d, p = [0] * n, [0] * n
    for i in range(n):
        if not active[i]:
            continue
        t = i % threads
        lane = t % 32
        warp_base = i - lane
        bval, cval, seg = b & 31, c & 31, (c >> 8) & 31
        max_lane = (lane & seg) | (cval & ~seg)
        min_lane = lane & seg
        if mode == "up":
            j, ok = lane - bval, lane - bval >= max_lane
        elif mode == "down":
            j, ok = lane + bval, lane + bval <= max_lane
        elif mode == "bfly":
            j, ok = lane ^ bval, (lane ^ bval) <= max_lane
        else:
            j = min_lane | (bval & ~seg)
            ok = j <= max_lane
        if not ok or t - lane + j >= threads:
            j = lane
        d[i] = vals[warp_base + j]
        p[i] = int(ok)
    return d, p


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.sampled_from(["up", "down", "bfly", "idx"]), st.integers(0, 40),
       st.sampled_from([0x1F, 0, 0x0F, 0x101F, 0x181F, 0x1C03, 0x0807, 5]),
       st.sampled_from([32, 48, 64, 70]), st.booleans())
def test_shfl(env, mode, b, c, threads, some_inactive):
    n = 2 * threads
    active = [1] * n if not some_inactive else [int(i % 5 != 2) for i in range(n)]
    body = f"""
  @!p5 bra SKIP
  shfl.{mode}.b32 r4|p6, r3, {b}, {c}
  selp.u32 r5, 1, 0, p6
  st.global.u32 [rd3], r4
  st.global.u32 [rd4], r5
SKIP:
"""
    d, p = run(env, body, 2, threads, active)
    vals = [i * 7 + 1000 for i in range(n)]
    want_d, want_p = ref_shfl(mode, vals, b, c, threads, active)
    assert list(d) == want_d and list(p) == want_p


def test_shfl_reduction(env):
    body = """
  mov.u32 r4, r3
  shfl.down.b32 r5, r4, 16, 31
  add.u32 r4, r4, r5
  shfl.down.b32 r5, r4, 8, 31
  add.u32 r4, r4, r5
  shfl.down.b32 r5, r4, 4, 31
  add.u32 r4, r4, r5
  shfl.down.b32 r5, r4, 2, 31
  add.u32 r4, r4, r5
  shfl.down.b32 r5, r4, 1, 31
  add.u32 r4, r4, r5
  shfl.idx.b32 r6, r4, 0, 31
  st.global.u32 [rd3], r6
"""
    d, _ = run(env, body, 4, 128)
    vals = np.arange(512) * 7 + 1000
    assert list(d) == list(np.repeat(vals.reshape(-1, 32).sum(axis=1), 32))


def test_vote_and_activemask_over_the_executing_threads(env):
    body = """
  @!p5 bra SKIP
  and.b32 r6, r0, 3
  setp.eq.u32 p1, r6, 0
  vote.ballot.b32 r7, p1
  vote.all.pred p2, !p1
  vote.any.pred p3, p1
  vote.uni.pred p4, p1
  activemask.b32 r8
  selp.u32 r9, 1, 0, p2
  selp.u32 r10, 2, 0, p3
  selp.u32 r11, 4, 0, p4
  or.b32 r9, r9, r10
  or.b32 r9, r9, r11
  st.global.u32 [rd3], r7
  xor.b32 r8, r8, r9
  st.global.u32 [rd4], r8
SKIP:
"""
    threads = 48
    active = [int(i % 7 != 3 and i < 80) for i in range(2 * threads)]
    d, m = run(env, body, 2, threads, active)
    for i in range(2 * threads):
        if not active[i]:
            assert d[i] == 0 and m[i] == 0
            continue
        t = i % threads
        base = i - t % 32
        size = min(32, threads - (t - t % 32))
        lanes = [base + k for k in range(size) if active[base + k]]
        mask = sum(1 << (j - base) for j in lanes)
        ballot = sum(1 << (j - base) for j in lanes if j % 4 == 0)
        bits = (int(all(j % 4 != 0 for j in lanes)) | 2 * int(any(j % 4 == 0 for j in lanes))
                | 4 * int(len({j % 4 == 0 for j in lanes}) == 1))
        assert d[i] == ballot and m[i] == mask ^ bits, i
