"""A batch of blocks running on the SMs: registers, scheduling, barriers (spec/isa.md §3).

A launch's blocks run in batches (launch.py picks how many blocks fit a budget). A Batch
holds, for its N = nb * T threads, the register files (values.py: arrays over the N
threads, uniform ints, or affine values), the shared memory of its nb blocks and the local
memory of its threads, and runs them to the end:

Scheduling (SM-EXEC-2). Every thread has a PC. At each step the executor takes the
runnable threads whose PC comes first in the program's scheduling order (program.py) --
the *group* -- and runs that one instruction for all of them at once, as numpy
operations over the group's lanes. Threads that branched apart wait until the others
reach them, so they reconverge where their paths meet and a warp's threads execute warp
instructions together. While the group stays whole (uniform control flow, the common
case) a step costs no scheduling work: the group's lanes do not have their PCs written,
and counts per PC (`cnt`) tell whether anyone else has to join. While the group is every
runnable lane, data instructions step on without touching `cnt` either; it is brought up
to date before a control instruction or a scheduling decision reads it.

How an instruction touches the registers depends on the group (class Active):
  all    every thread of the batch: results replace whole registers;
  full   every live thread (the others have exited): the same, since an exited thread's
         registers are never read again;
  dense  many threads: computed over all N lanes, merged with np.copyto(where=mask);
  sparse few threads: operands gathered at the group's lanes, results scattered.
A load of consecutive addresses by every thread makes the register a view of global
memory instead of a copy (put_view); before any store or atomic writes memory a register
views, that register gets its own copy (unview), so a loaded value never changes.

Progress. Warps are independent: a warp that loops must not keep other warps from
running (a lock taken with atom.cas in a loop by one thread of each warp). Each warp has
an epoch, the number of backward branches it took while other threads were waiting to
run; the group is chosen by (epoch of its warp, scheduling order), so a looping warp
yields to the others. Within a warp the order alone decides, which keeps reconvergence.

Barriers (SM-EXEC-3). bar.sync makes the arriving threads wait (their PC is stored as
-2 - pc); per block and barrier number the arrivals are counted, exited threads count as
arrived, and when a block's count is complete its waiting threads move on together. A
group that is every live thread of the batch, with nobody waiting, passes a bar.sync at
once. If every live thread waits and no barrier can complete, the batch is deadlocked, as
real hardware would be: it sleeps until the engine stops it (job timeout or reset).

Stopping (SM-EXEC-5): ctl.stopped() is checked before every step, and inside the long
ones (stopping.py).
"""

from __future__ import annotations

import numpy as np

from pvgpu.host.hw.sm import values as V
from pvgpu.host.hw.sm.stopping import Stopped, running
from pvgpu.spec import isa
from pvgpu.spec.isa import OPND_PRED, OPND_R32, OPND_R64

NEXT, JUMP, SPLIT, EXIT, REGROUP = 0, 1, 2, 3, 4
DENSE_FRACTION = 0.25  # groups with at least this share of the lanes compute densely
DEADLOCK_SLEEP = 0.001  # seconds between stop checks of a deadlocked batch

REG, CONST, SREG, NONE = 0, 1, 2, 3  # decoded operand kinds (decode.py)
# special registers whose value is the launch's or the clock's, not the batch's geometry
_LAUNCH_SREGS = frozenset((isa.SREG_CLOCK, isa.SREG_CLOCK64, isa.SREG_GLOBALTIMER,
                           isa.SREG_DYNAMIC_SMEM_SIZE, isa.SREG_TOTAL_SMEM_SIZE,
                           isa.SREG_GRIDID))
SREG_PLACES = 16  # (grid, first block) places whose special registers a Shape keeps


class Shape:
    """Per-lane index arrays of a batch of nb blocks of T threads (shared by the batches of
    the same block and nb, of one launch or of several: they differ only in their first
    block; the arrays are read only)."""

    def __init__(self, block, nb: int):
        self.block = tuple(block)
        self.T = block[0] * block[1] * block[2]
        self.nb = nb
        self.N = nb * self.T
        self._cache: dict = {}

    def cached(self, key, make):
        a = self._cache.get(key)
        if a is None:
            a = self._cache[key] = make()
        return a

    def sregs(self, grid, block0: int) -> dict:
        """The special registers of the batch at block0 of grid (filled as they are read;
        launches of one shape and grid share them, a few places at a time)."""
        places = self.cached("sregs", dict)
        d = places.get((grid, block0))
        if d is None:
            if len(places) >= SREG_PLACES:
                places.clear()
            d = places[grid, block0] = {}
        return d

    def lanes(self, dt=np.int64) -> np.ndarray:
        return self.cached(("i", dt), lambda: np.arange(self.N, dtype=dt))

    def tq(self, dt=np.int64):
        def make():
            if dt != np.int64:
                t, q = self.tq()
                return t.astype(dt), q.astype(dt)
            if self.nb == 1:
                return np.arange(self.N, dtype=np.int64), np.zeros(self.N, dtype=np.int64)
            return (np.tile(np.arange(self.T, dtype=np.int64), self.nb),
                    np.repeat(np.arange(self.nb, dtype=np.int64), self.T))
        return self.cached(("tq", dt), make)

    def warps(self):
        """-> (warp index of each lane in the batch, lane id, number of warps)."""
        def make():
            t, q = self.tq()
            wpb = -(-self.T // isa.WARP_SIZE)
            return q * wpb + t // isa.WARP_SIZE, t % isa.WARP_SIZE, self.nb * wpb
        return self.cached("warps", make)


class Geometry:
    """Where a batch's threads sit: nb blocks of T threads from linear block block0."""

    def __init__(self, shape: Shape, grid, block0: int):
        self.shape = shape
        self.block = shape.block
        self.grid = tuple(grid)
        self.T = shape.T
        self.nb = shape.nb
        self.N = shape.N
        self.block0 = block0
        self.lanes = shape.lanes
        self.tq = shape.tq
        self.warps = shape.warps
        self.cached = shape.cached


class Active:
    """The lanes an instruction runs for (see the module doc)."""

    __slots__ = ("mask", "k", "full", "all", "dense", "_idx")

    def __init__(self, mask, k: int, full: bool, n: int):
        self.mask = mask  # bool (N,), or None for every lane
        self.k = k
        self.full = full
        self.all = mask is None
        self.dense = full or k >= n * DENSE_FRACTION
        self._idx = None

    @property
    def idx(self):
        """Lane indices (sorted), or None for every lane."""
        if self._idx is None and self.mask is not None:
            self._idx = np.flatnonzero(self.mask)
        return self._idx

    def span(self):
        """(lo, hi) if the lanes are exactly lo..hi-1, else None."""
        if self.mask is None:
            return None
        idx = self.idx
        if idx.shape[0] and int(idx[-1]) - int(idx[0]) + 1 == idx.shape[0]:
            return int(idx[0]), int(idx[-1]) + 1
        return None


class Batch:
    def __init__(self, launch, prog, geo: Geometry):
        self.launch = launch
        self.prog = prog
        self.geo = geo
        n = self.N = geo.N
        self.files = {OPND_R32: [0] * prog.n_r32, OPND_R64: [0] * prog.n_r64,
                      OPND_PRED: [False] * prog.n_pred}
        self.shared_stride = -(-launch.shared_bytes // 8) * 8
        self.shared = (np.zeros(geo.nb * self.shared_stride, dtype=np.uint8)
                       if self.shared_stride else None)
        self.local_stride = -(-prog.local_size // 8) * 8
        self.local = (np.zeros(n * self.local_stride, dtype=np.uint8)
                      if self.local_stride else None)
        self._sregs = geo.shape.sregs(geo.grid, geo.block0)
        self.views: set = set()  # registers (f, i) whose array is a view of global memory
        launch.gmem.on_write = self.unview
        # scheduler
        self.pc_arr = None  # per-lane PC (stale for the group's lanes): -1 exited, <= -2 waiting
        self.cnt = np.zeros(prog.n, dtype=np.int64)  # runnable lanes per priority
        self.cnt[prog.prio[0]] = n
        self.live = n  # lanes not exited
        self.nwait = 0
        self.gpc = 0
        self.gmask = None
        self.gk = n
        self.every = Active(None, n, True, n)  # the group while it is every lane
        self.exited = None  # bool (N,) once a lane exits
        self.exited_blk = np.zeros(geo.nb, dtype=np.int64)
        self.bar_count = None  # (nb, NUM_BARRIERS) arrivals, allocated at first use
        self.bar_expect = None  # thread counts of bar with b (0: the whole block)
        self.bar_of = None  # barrier number each waiting lane waits at
        self.bar_pred = None  # bar.red predicate of each waiting lane
        self.epoch = None  # per warp: backward branches taken while others waited
        self.target = 0  # branch target of JUMP / SPLIT
        self.taken = None  # the Active that branches (SPLIT) or exits (EXIT)
        self.steps = 0

    # ------------------------------------------------------------ registers
    def val(self, opnd):
        """An operand's value for every lane: ndarray, int/bool or Lin."""
        kind, x = opnd
        if kind == REG:
            return self.files[x[0]][x[1]]
        if kind == CONST:
            return x
        if kind == SREG:
            return self.sreg(x)
        return 0

    def at(self, v, idx):
        """A value (from val) at lanes idx (None: all lanes, as a full array or scalar)."""
        if idx is None:
            return v.materialize(self.geo) if isinstance(v, V.Lazy) else v
        if isinstance(v, np.ndarray):
            return v[idx]
        if isinstance(v, V.Lazy):
            return v.at(self.geo, idx)
        return v

    def full_array(self, v, fdt) -> np.ndarray:
        """A value as an (N,) array of the file dtype (shared: do not modify)."""
        if isinstance(v, np.ndarray):
            return v
        if isinstance(v, V.Lazy):
            return v.materialize(self.geo)
        return np.full(self.N, v, dtype=fdt)

    def _put(self, f: int, i: int, v) -> None:
        self.files[f][i] = v
        if self.views:
            self.views.discard((f, i))

    def put_view(self, f: int, i: int, view: np.ndarray) -> None:
        """Register (f, i) = a view of global memory (a load without a copy; unview copies
        it before anything writes that memory)."""
        self.files[f][i] = view
        self.views.add((f, i))

    def unview(self, targets) -> None:
        """Memory in targets (uint8 arrays) is about to be written: registers that view
        it get their own copy first."""
        for key in list(self.views):
            v = self.files[key[0]][key[1]]
            if any(np.may_share_memory(v, t) for t in targets):
                self.files[key[0]][key[1]] = v.copy()
                self.views.discard(key)

    def own(self, f: int, i: int) -> np.ndarray:
        """Register (f, i) as an array this register alone owns (for partial writes)."""
        v = self.files[f][i]
        if isinstance(v, np.ndarray):
            if (f, i) in self.views:
                v = v.copy()
                self._put(f, i, v)
            return v
        fdt = V.FILE_DTYPES[f]
        arr = v.materialize(self.geo).copy() if isinstance(v, V.Lazy) else np.full(self.N, v, fdt)
        self._put(f, i, arr)
        return arr

    def write(self, dst, v, act: Active) -> None:
        """Write a result computed for all N lanes (or uniform) to the group's lanes."""
        f, i = dst
        if act.full:
            self._put(f, i, v)
            return
        o = self.own(f, i)
        if isinstance(v, V.Lazy):
            v = v.materialize(self.geo)
        elif not isinstance(v, np.ndarray):
            v = V.FILE_DTYPES[f].type(v)
        np.copyto(o, v, where=act.mask)

    def write_at(self, dst, v, act: Active) -> None:
        """Write a result computed at the group's lanes (act.idx order, or uniform)."""
        f, i = dst
        if act.all:
            self._put(f, i, v)
            return
        if not isinstance(v, np.ndarray):
            if act.full:
                self._put(f, i, v)
                return
            self.own(f, i)[act.idx] = v
            return
        if act.full:
            arr = np.zeros(self.N, V.FILE_DTYPES[f])
            span = act.span()
            if span is not None:
                arr[span[0]:span[1]] = v
            else:
                arr[act.idx] = v
            self._put(f, i, arr)
            return
        self.own(f, i)[act.idx] = v

    # ------------------------------------------------------------ special registers
    def sreg(self, s: int):
        v = self._sregs.get(s)  # (the geometry's, shared by batches of the same place)
        if v is None:
            if s in _LAUNCH_SREGS:
                return self._launch_sreg(s)
            v = self._sregs[s] = self._make_sreg(s)
        return v

    def _launch_sreg(self, s: int):
        if s == isa.SREG_GLOBALTIMER:
            return self.launch.clock() & V.M64
        if s in (isa.SREG_CLOCK, isa.SREG_CLOCK64):
            c = self.launch.cycles()
            return c & V.M32 if s == isa.SREG_CLOCK else c & V.M64
        if s == isa.SREG_DYNAMIC_SMEM_SIZE:
            return self.launch.dyn_shared
        if s == isa.SREG_TOTAL_SMEM_SIZE:
            return self.launch.shared_bytes
        return self.launch.gridid

    def _make_sreg(self, s: int):
        geo = self.geo
        bx, by, bz = geo.block
        gx, gy, gz = geo.grid
        T, nb, b0 = geo.T, geo.nb, geo.block0
        if s == isa.SREG_TID_X:
            return V.make_lin(0, 1, 0, 32) if bx == T else (geo.tq()[0] % bx).astype(np.uint32)
        if s == isa.SREG_TID_Y:
            return 0 if by == 1 else ((geo.tq()[0] // bx) % by).astype(np.uint32)
        if s == isa.SREG_TID_Z:
            return 0 if bz == 1 else (geo.tq()[0] // (bx * by)).astype(np.uint32)
        if s in (isa.SREG_NTID_X, isa.SREG_NTID_Y, isa.SREG_NTID_Z):
            return geo.block[s - isa.SREG_NTID_X]
        if s in (isa.SREG_NCTAID_X, isa.SREG_NCTAID_Y, isa.SREG_NCTAID_Z):
            return geo.grid[s - isa.SREG_NCTAID_X]
        if s in (isa.SREG_CTAID_X, isa.SREG_CTAID_Y, isa.SREG_CTAID_Z):
            one_row = b0 // gx == (b0 + nb - 1) // gx
            if s == isa.SREG_CTAID_X:
                if one_row:
                    return V.make_lin(b0 % gx, 0, 1, 32)
                return ((b0 + geo.tq()[1]) % gx).astype(np.uint32)
            k = s - isa.SREG_CTAID_X
            div = gx if k == 1 else gx * gy
            mod = gy if k == 1 else gz
            if one_row or (b0 // div == (b0 + nb - 1) // div):
                return (b0 // div) % mod
            return (((b0 + geo.tq()[1]) // div) % mod).astype(np.uint32)
        if s == isa.SREG_LANEID:
            return V.make_lin(0, 1, 0, 32) if T <= isa.WARP_SIZE else (
                geo.tq()[0] % isa.WARP_SIZE).astype(np.uint32)
        if s == isa.SREG_WARPID:
            return 0 if T <= isa.WARP_SIZE else (geo.tq()[0] // isa.WARP_SIZE).astype(np.uint32)
        if s == isa.SREG_NWARPID:
            return -(-T // isa.WARP_SIZE)
        if s == isa.SREG_SMID:
            if nb == 1:
                return b0 % isa.SM_COUNT
            return ((b0 + geo.tq()[1]) % isa.SM_COUNT).astype(np.uint32)
        if s == isa.SREG_NSMID:
            return isa.SM_COUNT
        if s in (isa.SREG_LANEMASK_EQ, isa.SREG_LANEMASK_LE, isa.SREG_LANEMASK_LT,
                 isa.SREG_LANEMASK_GE, isa.SREG_LANEMASK_GT):
            lane = (geo.tq()[0] % isa.WARP_SIZE).astype(np.uint64)
            bit = np.uint64(1) << lane
            full = np.uint64(0xFFFFFFFF)
            m = {isa.SREG_LANEMASK_EQ: bit, isa.SREG_LANEMASK_LE: (bit << np.uint64(1)) - np.uint64(1),
                 isa.SREG_LANEMASK_LT: bit - np.uint64(1),
                 isa.SREG_LANEMASK_GE: full & ~(bit - np.uint64(1)),
                 isa.SREG_LANEMASK_GT: full & ~((bit << np.uint64(1)) - np.uint64(1))}[s]
            return (m & full).astype(np.uint32)
        raise ValueError(f"special register {s}")  # isa_check refuses unknown ones

    # ------------------------------------------------------------ scheduling
    def _active(self) -> Active:
        if self.gmask is None:  # every lane of the batch: one Active for the whole run
            return self.every
        return Active(self.gmask, self.gk, self.gk == self.live, self.N)

    def _pcs(self) -> np.ndarray:
        if self.pc_arr is None:
            self.pc_arr = np.zeros(self.N, dtype=np.int64)
        return self.pc_arr

    def _set_group_pc(self, pc: int, mask=None) -> None:
        """Write pc for the group's lanes (or the lanes of mask)."""
        arr = self._pcs()
        m = self.gmask if mask is None else mask
        if m is None:
            arr[:] = pc
        else:
            arr[m] = pc

    def _first(self) -> int:
        nz = np.flatnonzero(self.cnt)
        return int(nz[0]) if nz.shape[0] else -1

    def _regroup(self) -> bool:
        """Choose the next group; -> False when no lane can run."""
        m = self._first()
        if m < 0:
            return False
        if self.epoch is not None:
            return self._regroup_by_epoch()
        pc = int(self.prog.order[m])
        self.gpc = pc
        self.gk = int(self.cnt[m])
        self.gmask = None if self.gk == self.N else (self._pcs() == pc)
        return True

    def _regroup_by_epoch(self) -> bool:
        """The group is the runnable lanes with the smallest (warp epoch, priority)."""
        pcs = self._pcs()
        runnable = pcs >= 0
        warp, _, _ = self.geo.warps()
        prog = self.prog
        key = self.epoch[warp] * prog.n + prog.prio[np.where(runnable, pcs, 0)]
        key = np.where(runnable, key, np.iinfo(np.int64).max)
        k = key.min()
        self.gmask = key == k
        self.gk = int(np.count_nonzero(self.gmask))
        self.gpc = int(prog.order[int(k) % prog.n])
        if self.gk == self.N:
            self.gmask = None
        return True

    def _loop_back(self, lanes: Active, target: int) -> None:
        """lanes take a backward branch: when other threads are waiting to run, the warps
        of these lanes yield to them (their epoch grows), so that no warp can keep the
        others from making progress by looping (a spin lock on a flag another warp sets)."""
        prio = self.prog.prio
        if prio[target] > prio[self.gpc] or self.live - self.nwait == lanes.k:
            return
        warp, _, nw = self.geo.warps()
        if self.epoch is None:
            self.epoch = np.zeros(nw, dtype=np.int64)
        w = warp if lanes.mask is None else warp[lanes.idx]
        self.epoch[np.unique(w)] += 1

    def _advance(self, newpc: int) -> bool:
        prio = self.prog.prio
        gk = self.gk
        self.cnt[prio[self.gpc]] -= gk
        pn = prio[newpc]
        self.cnt[pn] += gk
        if self.live - self.nwait == gk:
            self.gpc = newpc
            return True
        if self._first() == pn and self.cnt[pn] == gk:
            self.gpc = newpc
            return True
        if newpc != self.gpc + 1:
            self._loop_back(self._active(), newpc)
        self._set_group_pc(newpc)
        return self._regroup()

    def _split(self, target: int, taken: Active) -> bool:
        prio = self.prog.prio
        nxt = self.gpc + 1
        self._loop_back(taken, target)
        self.cnt[prio[self.gpc]] -= self.gk
        self.cnt[prio[target]] += taken.k
        self.cnt[prio[nxt]] += self.gk - taken.k
        self._set_group_pc(nxt)
        self._pcs()[taken.mask] = target
        return self._regroup()

    def _exit(self, who: Active) -> bool:
        prio = self.prog.prio
        if who.k == self.live:  # the last threads: the batch is done
            self.live = 0
            return False
        self.cnt[prio[self.gpc]] -= self.gk
        rest = self.gk - who.k
        pcs = self._pcs()
        if rest:
            self.cnt[prio[self.gpc + 1]] += rest
            self._set_group_pc(self.gpc + 1)
        if self.exited is None:
            self.exited = np.zeros(self.N, dtype=bool)
        if who.mask is None:
            pcs[:] = -1
            self.exited[:] = True
            self.exited_blk[:] = self.geo.T
        else:
            pcs[who.mask] = -1
            self.exited |= who.mask
            _, q = self.geo.tq()
            self.exited_blk += np.bincount(q[who.idx], minlength=self.geo.nb)
        self.live -= who.k
        if self.nwait:
            self._release()
        return self._regroup()

    def run(self, ctl) -> None:
        prog = self.prog
        decoded = prog.decoded
        prio = prog.prio
        cnt = self.cnt
        launch = self.launch
        lag = None  # while every runnable lane steps on together, cnt still counts them
        # at pc `lag`: it is brought up to date before anything reads it
        from pvgpu.host.hw.sm.decode import decode
        with np.errstate(all="ignore"), running(ctl):
            while True:
                if ctl.stopped():
                    raise Stopped()
                pc = self.gpc
                ins = decoded[pc]
                if ins is None:
                    ins = decoded[pc] = decode(prog, pc)
                act = self.every if self.gmask is None else self._active()
                self.steps += 1
                launch.lane_instructions += act.k
                sub = act
                if ins.guard is not None:
                    sub = self._guarded(act, ins.guard)
                if ins.control:
                    if lag is not None:
                        cnt[prio[lag]] -= self.gk
                        cnt[prio[pc]] += self.gk
                        lag = None
                    out = ins.control_run(self, act, sub)
                else:
                    if sub is not None:
                        ins.run(self, sub)
                    if self.nwait == 0 and self.gk == self.live:  # (_advance's first case)
                        if lag is None:
                            lag = pc
                        self.gpc = pc + 1
                        continue
                    out = NEXT
                if lag is not None:
                    cnt[prio[lag]] -= self.gk
                    cnt[prio[pc]] += self.gk
                    lag = None
                if out == NEXT:
                    ok = self._advance(pc + 1)
                elif out == JUMP:
                    ok = self._advance(self.target)
                elif out == SPLIT:
                    ok = self._split(self.target, self.taken)
                elif out == EXIT:
                    ok = self._exit(self.taken)
                else:
                    ok = self._regroup()
                if not ok:
                    if self.live == 0:
                        return
                    self._deadlock(ctl)

    def _deadlock(self, ctl) -> None:
        while not ctl.sleep(DEADLOCK_SLEEP):
            pass
        raise Stopped()

    def _guarded(self, act: Active, guard):
        idx, neg = guard
        g = self.files[OPND_PRED][idx]
        if isinstance(g, V.Span) and act.mask is None and not neg:
            k = g.hi - g.lo
            return Active(g.materialize(self.geo), k, False, self.N)
        if isinstance(g, V.Lazy):
            g = g.materialize(self.geo)
        elif not isinstance(g, np.ndarray):
            return act if bool(g) != neg else None
        m = ~g if neg else g
        if act.mask is not None:
            m = m & act.mask
        k = int(np.count_nonzero(m))
        if k == act.k:
            return act
        if k == 0:
            return None
        return Active(m, k, False, self.N)

    # ------------------------------------------------------------ barriers
    def barrier(self, act: Active, sub: Active, wait: bool, bar_id, count, red) -> int:
        """bar.sync / bar.arrive / bar.red for the lanes of sub (a subset of the group
        act). bar_id, count: values (int or array over all lanes); red: None or
        (kind, predicate values over all lanes, dst, negate)."""
        geo = self.geo
        nb = geo.nb
        if (wait and sub is act and act.full and self.nwait == 0 and count is None
                and not isinstance(bar_id, np.ndarray) and self.bar_count is None):
            if red is not None:  # every live lane of every block arrives at once
                self._reduce_blocks(act, red)
            return NEXT
        if self.bar_count is None:
            self.bar_count = np.zeros((nb, isa.NUM_BARRIERS), dtype=np.int64)
            self.bar_expect = np.zeros((nb, isa.NUM_BARRIERS), dtype=np.int64)
            self.bar_of = np.zeros(self.N, dtype=np.int64)
            self.bar_pred = np.zeros(self.N, dtype=bool)
        lanes = sub.idx if sub.mask is not None else geo.lanes()
        _, q = geo.tq()
        blk = q[lanes]
        ids = (self.at(bar_id, lanes) if isinstance(bar_id, np.ndarray) else bar_id)
        ids = np.asarray(ids, dtype=np.int64) % isa.NUM_BARRIERS
        ids = np.broadcast_to(ids, lanes.shape)
        np.add.at(self.bar_count, (blk, ids), 1)
        if count is not None:
            c = np.broadcast_to(np.asarray(self.at(count, lanes), dtype=np.int64), lanes.shape)
            self.bar_expect[blk, ids] = np.maximum(c, 1)
        prio = self.prog.prio
        pcs = self._pcs()
        nxt = self.gpc + 1
        self.cnt[prio[self.gpc]] -= self.gk
        if wait:
            rest = self.gk - sub.k
            if rest:
                self.cnt[prio[nxt]] += rest
                self._set_group_pc(nxt)
            pcs[lanes] = -2 - self.gpc
            self.bar_of[lanes] = ids
            if red is not None:
                kind, pred, dst, neg = red
                p = self.at(pred, lanes)
                self.bar_pred[lanes] = np.logical_xor(p, neg)
            self.nwait += sub.k
        else:
            self.cnt[prio[nxt]] += self.gk
            self._set_group_pc(nxt)
        self._release()
        return REGROUP

    def _release(self) -> None:
        """Let the waiting threads of every complete (block, barrier) go on."""
        if self.bar_count is None:
            return
        T = self.geo.T
        whole = self.bar_expect == 0
        need = np.where(whole, T, self.bar_expect)
        have = self.bar_count + np.where(whole, self.exited_blk[:, None], 0)
        ready = (self.bar_count > 0) & (have >= need)
        if not ready.any():
            return
        pcs = self._pcs()
        waiting = np.flatnonzero(pcs <= -2)
        _, q = self.geo.tq()
        if waiting.shape[0]:
            sel = ready[q[waiting], self.bar_of[waiting]]
            rel = waiting[sel]
        else:
            rel = waiting
        if rel.shape[0]:
            old_pc = -2 - pcs[rel]
            new_pc = old_pc + 1
            pcs[rel] = new_pc
            self.cnt += np.bincount(self.prog.prio[new_pc], minlength=self.cnt.shape[0])
            self.nwait -= rel.shape[0]
            self._reduce_released(rel, old_pc)
        self.bar_count[ready] = 0
        self.bar_expect[ready] = 0

    def _reduce_released(self, rel, old_pc) -> None:
        prog = self.prog
        reds = [(pc, prog.decoded[pc]) for pc in np.unique(old_pc).tolist()
                if getattr(prog.decoded[pc], "red", None) is not None]
        if not reds:
            return
        _, q = self.geo.tq()
        key = q[rel] * isa.NUM_BARRIERS + self.bar_of[rel]
        nkeys = self.geo.nb * isa.NUM_BARRIERS
        ones = np.bincount(key, weights=self.bar_pred[rel], minlength=nkeys)
        total = np.bincount(key, minlength=nkeys)
        for pc, ins in reds:
            lanes = rel[old_pc == pc]
            k = q[lanes] * isa.NUM_BARRIERS + self.bar_of[lanes]
            self._write_red(ins.red_kind, ins.d, lanes, ones[k], total[k])

    def _reduce_blocks(self, act: Active, red) -> None:
        kind, pred, dst, neg = red
        _, q = self.geo.tq()
        lanes = act.idx if act.mask is not None else None
        p = np.logical_xor(self.at(pred, lanes), neg)
        p = np.broadcast_to(p, (act.k,))
        ql = q if lanes is None else q[lanes]
        ones = np.bincount(ql, weights=p, minlength=self.geo.nb)
        total = np.bincount(ql, minlength=self.geo.nb)
        self._write_red(kind, dst, lanes, ones[ql], total[ql])

    def _write_red(self, kind, dst, lanes, ones, total) -> None:
        if kind == isa.VAR_BAR_RED_POPC:
            v = ones.astype(np.uint32)
        elif kind == isa.VAR_BAR_RED_AND:
            v = ones == total
        else:
            v = ones > 0
        if lanes is None:
            self._put(dst[0], dst[1], v)
        else:
            self.own(*dst)[lanes] = v
