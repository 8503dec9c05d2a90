"""Atomics (ISA-MEM-4): every operation on global and shared memory, with and without
conflicts, with the old values returned as some sequential order would return them, across
batches of blocks; a histogram, a ticket counter, a CAS loop, float adds."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from smtest import Env, StopAfter

from pvgpu.host.hw.sm import launch as sm_launch
from pvgpu.host.hw.sm.memory import apply_atomic
from pvgpu.spec import isa

IDX = """
  mov.u32 r0, %ctaid.x
  mov.u32 r1, %ntid.x
  mov.u32 r2, %tid.x
  mad.lo.u32 r0, r0, r1, r2
  ld.param.u64 rd1, [mem]
  ld.param.u64 rd2, [vals]
  ld.param.u64 rd3, [idx]
  ld.param.u64 rd9, [old]
  ld.param.u32 r3, [n]
  setp.ge.u32 p0, r0, r3
  @p0 exit
  mul.wide.u32 rd4, r0, 4
  add.u64 rd5, rd3, rd4
  ld.global.u32 r4, [rd5]
"""
PARAMS = ".param u64 mem\n.param u64 vals\n.param u64 idx\n.param u64 old\n.param u32 n"


@pytest.fixture
def env():
    return Env(128 << 20)


def sequential(op, t, mem, idx, vals, cmp=None):
    """The lanes' atomics one after another in lane order -> (final memory, olds)."""
    mem = list(mem)
    olds = []
    bits = 64 if t.endswith("64") else 32
    mask = (1 << bits) - 1
    for k, (i, v) in enumerate(zip(idx, vals)):
        o = mem[i]
        olds.append(o)
        if op == "add":
            n = o + v if t.startswith("f") else (o + v) & mask
        elif op == "min":
            n = min(o, v)
        elif op == "max":
            n = max(o, v)
        elif op == "inc":
            n = 0 if o >= v else o + 1
        elif op == "dec":
            n = v if o == 0 or o > v else o - 1
        elif op == "exch":
            n = v
        elif op == "cas":
            n = cmp[k] if o == v else o
        elif op == "and":
            n = o & v
        elif op == "or":
            n = o | v
        else:
            n = o ^ v
        if not t.startswith("f"):
            n &= mask
            if t.startswith("s") and n >> (bits - 1):
                n -= 1 << bits
        mem[i] = n
    return mem, olds


DT = {"u32": np.uint32, "s32": np.int32, "b32": np.uint32, "u64": np.uint64, "s64": np.int64,
      "b64": np.uint64, "f32": np.float32, "f64": np.float64}


def run_atomic(env, op, t, mem0, idx, vals, cmp=None, space="global", ret=True, block=64):
    w = np.dtype(DT[t]).itemsize
    reg = "rd" if w == 8 else "r"
    n = len(idx)
    body = IDX + f"""
  mul.wide.u32 rd6, r0, {w}
  add.u64 rd7, rd2, rd6
  ld.global.{t} {reg}10, [rd7]
  add.u64 rd7, rd7, {w * n}
  ld.global.{t} {reg}11, [rd7]
"""
    if space == "global":
        body += f"  mul.wide.u32 rd8, r4, {w}\n  add.u64 rd8, rd1, rd8\n"
        addr = "[rd8]"
    else:  # shared: copied in by thread 0 of each block, out by an atomic add of each word
        body += f"""
  setp.ne.u32 p1, r2, 0
  @p1 bra GO
  mov.u32 r20, 0
COPY:
  mul.wide.u32 rd12, r20, {w}
  add.u64 rd13, rd1, rd12
  ld.global.{t} {reg}21, [rd13]
  cvt.u32.u64 r22, rd12
  st.shared.{t} [r22], {reg}21
  add.u32 r20, r20, 1
  setp.lt.u32 p2, r20, {len(mem0)}
  @p2 bra COPY
GO:
  bar.sync 0
  mul.lo.u32 r8, r4, {w}
"""
        addr = "[r8]"
    c = f", {reg}11" if op == "cas" else ""
    if ret:
        body += f"  atom.{space}.{op}.{t} {reg}12, {addr}, {reg}10{c}\n"
        body += f"  add.u64 rd14, rd9, rd6\n  st.global.{t} [rd14], {reg}12\n"
    else:
        body += f"  red.{space}.{op}.{t} {addr}, {reg}10\n"
    if space == "shared":
        body += "  bar.sync 0\n  setp.ne.u32 p1, r2, 0\n  @p1 exit\n  mov.u32 r20, 0\nBACK:\n"
        body += f"""
  mul.wide.u32 rd12, r20, {w}
  cvt.u32.u64 r22, rd12
  ld.shared.{t} {reg}21, [r22]
  add.u64 rd13, rd1, rd12
  st.global.{t} [rd13], {reg}21
  add.u32 r20, r20, 1
  setp.lt.u32 p2, r20, {len(mem0)}
  @p2 bra BACK
"""
    mod = env.load(f".entry k shared={len(mem0) * w if space == 'shared' else 0}\n{PARAMS}\n{body}\n  exit")
    dt = DT[t]
    mem = env.buffer(np.array(mem0, dtype=object).astype(dt) if not t.startswith("f")
                     else np.array(mem0, dt))
    vb = np.concatenate([np.array(vals, dtype=object).astype(dt) if not t.startswith("f")
                         else np.array(vals, dt),
                         np.array(cmp if cmp else [0] * n, dtype=object).astype(dt)
                         if not t.startswith("f") else np.zeros(n, dt)])
    vva = env.buffer(vb)
    iva = env.buffer(np.array(idx, np.uint32))
    ova = env.buffer(np.zeros(max(n, 1), dt))
    env.run(mod, grid=-(-n // block), block=block, args=(mem, vva, iva, ova, n))
    return env.read(mem, len(mem0), dt), env.read(ova, n, dt)


OPS = [("add", "u32"), ("add", "s64"), ("min", "s32"), ("max", "u32"), ("min", "u64"),
       ("inc", "u32"), ("dec", "u32"), ("exch", "b32"), ("cas", "b32"), ("cas", "b64"),
       ("and", "b32"), ("or", "b64"), ("xor", "b32")]


def _vals(op, t, n, rng):
    bits = 64 if t.endswith("64") else 32
    if op in ("inc", "dec"):
        return [int(v) for v in rng.integers(0, 5, n)]
    if t.startswith("s"):
        return [int(v) for v in rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), n)]
    return [int(v) * 4 + int(w) for v, w in zip(rng.integers(0, 1 << (bits - 2), n),
                                                 rng.integers(0, 4, n))]


@pytest.mark.parametrize("op,t", OPS)
@pytest.mark.parametrize("conflicts", [False, True])
def test_atomic_ops_in_lane_order(env, op, t, conflicts):
    rng = np.random.default_rng(hash((op, t)) & 0xFFFF)
    n, words = 200, 64
    idx = [int(i) for i in (rng.integers(0, 6, n) if conflicts else rng.permutation(words)[:n % words + 50])]
    n = len(idx)
    mem0 = _vals(op, t, words, rng)
    vals = _vals(op, t, n, rng)
    cmp = None
    if op == "cas":
        vals = [mem0[i] if k % 3 else vals[k] for k, i in enumerate(idx)]  # some match
        cmp = _vals(op, t, n, rng)
    mem, old = run_atomic(env, op, t, mem0, idx, vals, cmp)
    want_mem, want_old = sequential(op, t, mem0, idx, vals, cmp)
    assert [int(v) for v in mem] == want_mem
    assert [int(v) for v in old] == want_old


@pytest.mark.parametrize("space", ["global", "shared"])
def test_histogram_with_red_and_atom(env, space):
    rng = np.random.default_rng(7)
    n, bins = 1000, 16
    block = 250 if space == "global" else n  # shared: one block sees every lane
    idx = [int(i) for i in rng.integers(0, bins, n)]
    mem, _ = run_atomic(env, "add", "u32", [0] * bins, idx, [1] * n, space=space, ret=False,
                        block=block)
    counts = np.bincount(idx, minlength=bins)
    assert list(mem) == list(counts)
    mem, old = run_atomic(env, "add", "u32", [0] * bins, idx, [1] * n, space=space, block=block)
    assert list(mem) == list(counts)
    for b in range(bins):  # each bin's tickets are 0..count-1, in lane order
        assert [int(o) for o, i in zip(old, idx) if i == b] == list(range(counts[b]))


def test_atomics_across_batches(env, monkeypatch):
    monkeypatch.setattr(sm_launch, "BATCH_THREADS", 64)
    n = 640
    mem, old = run_atomic(env, "add", "u32", [0], [0] * n, [1] * n, block=32)
    assert int(mem[0]) == n and sorted(int(o) for o in old) == list(range(n))


def test_float_adds(env):
    rng = np.random.default_rng(9)
    n = 300
    vals = rng.standard_normal(n).astype(np.float32)
    idx = [int(i) for i in rng.integers(0, 3, n)]
    mem, old = run_atomic(env, "add", "f32", [0.0, 1.0, -2.0], idx, list(vals))
    want_mem, want_old = sequential("add", "f32", [np.float32(0), np.float32(1), np.float32(-2)],
                                    idx, list(vals))
    np.testing.assert_array_equal(mem, np.array(want_mem, np.float32))
    np.testing.assert_array_equal(old, np.array(want_old, np.float32))
    mem, _ = run_atomic(env, "add", "f64", [0.0], [0] * n, list(vals.astype(np.float64)), ret=False)
    np.testing.assert_allclose(mem[0], vals.astype(np.float64).sum(), rtol=1e-12)


def test_a_cas_spin_lock_serialises_a_critical_section(env):
    """Lane 0 of each warp takes a lock with atom.cas in a loop, increments a counter
    non-atomically, releases with atom.exch."""
    src = """
.entry k
.param u64 lock
.param u64 counter
  ld.param.u64 rd1, [lock]
  ld.param.u64 rd2, [counter]
  mov.u32 r0, %laneid
  setp.ne.u32 p0, r0, 0
  @p0 exit
SPIN:
  atom.global.cas.b32 r1, [rd1], 0, 1
  setp.ne.u32 p1, r1, 0
  @p1 bra SPIN
  ld.global.u32 r2, [rd2]
  add.u32 r2, r2, 1
  st.global.u32 [rd2], r2
  atom.global.exch.b32 r3, [rd1], 0
  exit
"""
    mod = env.load(src)
    lock, counter = env.buffer(np.zeros(1, np.uint32)), env.buffer(np.zeros(1, np.uint32))
    env.run(mod, grid=4, block=256, args=(lock, counter))
    assert int(env.read(counter, 1, np.uint32)[0]) == 32


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["add", "min", "max", "inc", "dec", "exch", "cas", "and", "or", "xor"]),
       st.lists(st.integers(0, 4), min_size=1, max_size=50), st.data())
def test_apply_atomic_matches_a_sequential_model(op, idx, data):
    """The vectorised core (memory.apply_atomic), integers, both result modes."""
    n = len(idx)
    vals = data.draw(st.lists(st.integers(0, 10), min_size=n, max_size=n))
    cmp = data.draw(st.lists(st.integers(0, 10), min_size=n, max_size=n))
    mem0 = data.draw(st.lists(st.integers(0, 10), min_size=5, max_size=5))
    aop = {v: k for k, v in isa.ATOM_NAMES.items()}[op]
    view = np.array(mem0, np.uint32)
    old = apply_atomic(view, np.array(idx), aop, np.array(vals, np.uint32),
                       np.array(cmp, np.uint32), True)
    want_mem, want_old = sequential(op, "u32", mem0, idx, vals, cmp)
    assert list(view) == want_mem and list(old) == want_old
    view = np.array(mem0, np.uint32)
    apply_atomic(view, np.array(idx), aop, np.array(vals, np.uint32), np.array(cmp, np.uint32), False)
    assert list(view) == want_mem


def test_the_stop_token_ends_a_long_chain_of_conflicting_atomics(env):
    """Every lane CASes the one address from i to i + 1: a round per lane, in lane order.
    A reset during the instruction stops it after a few rounds, not after all of them."""
    src = """
.entry k
.param u64 x
  ld.param.u64 rd1, [x]
  mov.u32 r0, %ctaid.x
  mov.u32 r1, %ntid.x
  mov.u32 r2, %tid.x
  mad.lo.u32 r0, r0, r1, r2
  add.u32 r3, r0, 1
  atom.global.cas.b32 r4, [rd1], r0, r3
  exit
"""
    mod = env.load(src)
    x = env.buffer(np.zeros(1, np.uint32))
    ctl = StopAfter(8 + 4)  # through the instructions before the atom, then 4 checks in it
    env.run(mod, grid=64, block=1024, args=(x,), ctl=ctl)
    done = int(env.read(x, 1, np.uint32)[0])
    assert done < 64 * 1024 // 4  # (the stopped instruction may leave its word unwritten)
    env.run(mod, grid=64, block=1024, args=(x,))  # the next launch is not affected


def test_a_cas_loop_on_one_word_and_counters_with_one_limit(env):
    """The CUDA idioms: `do { assumed = old; old = atomicCAS(p, assumed, f(assumed)); }
    while (old != assumed)` by every thread on one word, and atomicInc/atomicDec(p, limit)."""
    src = """
.entry k
.param u64 x
  ld.param.u64 rd1, [x]
  ld.global.u32 r1, [rd1]
L:
  mov.u32 r2, r1
  add.u32 r3, r2, 3
  atom.global.cas.b32 r1, [rd1], r2, r3
  setp.ne.u32 p1, r1, r2
  @p1 bra L
  atom.global.inc.u32 r4, [rd1+4], 6
  atom.global.dec.u32 r5, [rd1+8], 4
  exit
"""
    mod = env.load(src)
    x = env.buffer(np.array([10, 2, 9], np.uint32))
    n = 3000
    env.run(mod, grid=3, block=1000, args=(x,))
    want_inc = 2
    for _ in range(n):
        want_inc = 0 if want_inc >= 6 else want_inc + 1
    want_dec = 9
    for _ in range(n):
        want_dec = 4 if want_dec == 0 or want_dec > 4 else want_dec - 1
    assert list(env.read(x, 3, np.uint32)) == [10 + 3 * n, want_inc, want_dec]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["inc", "dec"]), st.sampled_from([np.uint32, np.uint64]),
       st.integers(1, 300), st.sampled_from([0, 1, 5, 1000, 0xFFFFFFFF, (1 << 64) - 1]),
       st.integers(0, (1 << 64) - 1) | st.integers(0, 8))
def test_counters_with_one_limit_in_closed_form(op, dt, k, limit, start):
    bits = 8 * np.dtype(dt).itemsize
    limit &= (1 << bits) - 1
    start &= (1 << bits) - 1
    aop = isa.ATOM_INC if op == "inc" else isa.ATOM_DEC
    view = np.array([start], dt)
    old = apply_atomic(view, np.zeros(k, np.int64), aop, np.full(k, limit, dt), None, True)
    want_mem, want_old = sequential(op, "u64" if bits == 64 else "u32", [start], [0] * k,
                                    [limit] * k)
    assert [int(v) for v in old] == want_old and int(view[0]) == want_mem[0]
