"""The GPU scheduler (drivers/gpu/drm/scheduler) with Gdev's vGPU policies, as pure logic.

One GpuScheduler per hardware ring. Work reaches it as SchedJobs pushed onto an
SchedEntity — a submission timeline's FIFO on that ring, with a priority, a `guilty` flag
and the vGPU it belongs to. A job carries dependency fences and two fences of its own:
`scheduled` (signalled when the job is handed to the hardware) and `finished` (signalled
when the hardware fence of the job signals, with its error and completion timestamp).
Nothing in the driver waits for `scheduled`, so it is made when first asked for (already
signalled if the job was handed over or finished by then).

Readiness (drm_sched_entity_pop_job): the head job of an entity is ready when every
dependency has signalled. A dependency that is the finished fence of a job on this same
ring only needs that job to have been *scheduled*: the ring executes in order.

Selection, whenever fewer than `hw_limit` jobs are in flight (the hardware submission
limit, drm_sched credits):
  fifo    the ready entity of the most urgent priority whose head job arrived first
          (DRM_SCHED_POLICY_FIFO; also the policy within one vGPU under credit/band);
  credit  Gdev's Credit scheduler: the vGPUs form a rotation; the first vGPU in it with
          ready work owns the ring until its in-flight jobs complete; a vGPU whose credit
          is exhausted (<= 0) when its last job completes goes to the tail;
  band    Gdev's BAND (Bandwidth-Aware Non-preemptive Device) scheduler: as credit, but a
          vGPU goes to the tail only when its credit is exhausted *and* its measured
          utilisation is above its share; and when the vGPU that would get the ring next
          is over its share, the ring is held idle for a time buffer so that another
          vGPU's job, arriving in a gap between its jobs, can take it. Gdev's buffer is a
          fixed 500 µs; here it is each waiting vGPU's measured gap (host/kmd/turnaround.py):
          the ring is held until the latest time a vGPU idle between its jobs is due to
          push its next one, and a fixed buffer (DEFAULT_TIME_BUFFER_NS) applies only to
          a vGPU whose gaps have not been measured yet; a vGPU due only after the held
          vGPU's job (as long as its last one) would have ended is not waited for.
Credits (Gdev): every `period` a vGPU's credit grows by period * share / 100, and is
reset to 0 when it leaves [-period, period]; a job's device time (end - start) is
charged when it completes. Utilisation is the vGPU's device time over the last `window`.

Timeouts (drm_sched_job_timedout): the job at the head of the hardware queue has
`timeout` of device time from the moment it became the head; timed_out(now) reports it,
the driver resets the engine and calls recover(): the guilty job fails with JobTimedOut,
its entity (and, through the driver, its whole context) becomes guilty, and the other
jobs that were in flight are handed to the hardware again, in order. Jobs of a guilty
entity are not run: they complete with ContextLost (drm_sched's -ECANCELED).

Everything here is called with the driver's lock held, never sleeps and never signals a
fence: fences to signal are queued (take_signals()) and signalled by the caller once the
lock is released, so no callback ever runs under the lock. Time comes in as `now`
arguments (ns), so tests drive it with a clock they advance.
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass

from pvgpu.host.kmd.counters import Counters
from pvgpu.host.kmd.errors import ContextLost, InvalidArgument, JobTimedOut
from pvgpu.host.kmd.fence import Fence
from pvgpu.host.kmd.turnaround import Turnaround

PRIORITY_KERNEL = 0
PRIORITY_HIGH = 1
PRIORITY_NORMAL = 2
PRIORITY_LOW = 3
PRIORITIES = (PRIORITY_KERNEL, PRIORITY_HIGH, PRIORITY_NORMAL, PRIORITY_LOW)
PRIORITY_NAMES = {PRIORITY_KERNEL: "kernel", PRIORITY_HIGH: "high", PRIORITY_NORMAL: "normal",
                  PRIORITY_LOW: "low"}

POLICIES = ("fifo", "credit", "band")
DEFAULT_PERIOD_NS = 30_000_000  # Gdev: 30 ms
# the hold for a vGPU whose gaps are not measured yet (Gdev: 500 µs; a guest's turnaround
# between two synchronous kernels is ≈0.4 ms in this emulator, ≈0.1 ms on Gdev's hardware);
# 0 disables BAND's time buffer
DEFAULT_TIME_BUFFER_NS = 1_000_000
DEFAULT_WINDOW_PERIODS = 10  # utilisation window = 10 periods
DEFAULT_TIMEOUT_NS = 10_000_000_000  # amdgpu's default lockup timeout: 10 s
DEFAULT_HW_LIMIT = 2


@dataclass(frozen=True)
class VgpuShares:
    """A vGPU's configured shares, in percent of one device's compute engine, copy
    engines and VRAM (Gdev's vGPU model)."""

    name: str
    compute: int = 100
    copy: int = 100
    mem: int = 100

    def __post_init__(self):
        if not self.name or not isinstance(self.name, str):
            raise InvalidArgument("a vGPU needs a name")
        for what in ("compute", "copy", "mem"):
            v = getattr(self, what)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= 100:
                raise InvalidArgument(f"vGPU {self.name}: {what} share {v!r} must be 1..100")


class SchedFence(Fence):
    """The scheduled or finished fence of a SchedJob (drm_sched_fence)."""

    __slots__ = ("job",)

    def __init__(self, job: "SchedJob", engine: int, seq: int):
        # Fence.__init__'s fields, set here: two of these per job
        self.engine = engine
        self.seq = seq
        self.driver = self.error = self.timestamp = self._callbacks = self._event = None
        self._signaled = False
        self.job = job

    @property
    def context(self):
        """The dma_fence context: the job's entity, whose jobs complete in order."""
        return self.job.entity


class SchedJob:
    """One unit of hardware work: `payload` is opaque to the scheduler (the driver's IB)."""

    __slots__ = ("entity", "deps", "payload", "_scheduled", "finished", "hw_fence", "seq",
                 "arrival_ns", "run_ns", "start_ns", "end_ns", "karma", "resubmits", "short")

    def __init__(self, entity: "SchedEntity", payload, deps=(), short: bool = False):
        self.entity = entity
        self.payload = payload
        self.deps = [d for d in deps if d is not None] if deps else []
        self.seq = 0
        self._scheduled = None
        self.finished = None
        self.hw_fence = None
        self.arrival_ns = self.run_ns = self.start_ns = self.end_ns = None
        self.karma = 0
        self.resubmits = 0
        self.short = short  # bounded: may run on a submitting thread (the driver's call)

    @property
    def scheduled(self) -> "SchedFence | None":
        """The scheduled fence (None before the job is pushed)."""
        f = self._scheduled
        if f is None and self.finished is not None:
            f = self._scheduled = SchedFence(self, self.finished.engine, self.seq)
            # handed to the hardware, or finished (_finish stamps it) without that
            f._signaled = self.run_ns is not None or self.finished.timestamp is not None
        return f

    def __repr__(self) -> str:
        return f"SchedJob({self.entity.name}#{self.seq})"


class SchedEntity:
    """A submission timeline on one ring (drm_sched_entity)."""

    def __init__(self, sched: "GpuScheduler", name: str, vgpu: str, priority: int = PRIORITY_NORMAL,
                 owner=None):
        if priority not in PRIORITIES:
            raise InvalidArgument(f"bad priority {priority!r}")
        self.sched = sched
        self.name = name
        self.vgpu = vgpu
        self.priority = priority
        self.owner = owner  # the driver's context
        self.jobs = collections.deque()
        self.guilty = False
        self.in_flight = 0
        self.closed = False
        self.last_finished = None  # finished fence of the last job pushed (the driver's)

    def __repr__(self) -> str:
        return f"SchedEntity({self.name!r}, vgpu={self.vgpu!r}, prio={self.priority})"


class VgpuSchedState:
    """Per-ring state of one vGPU: credit, utilisation, accounting."""

    def __init__(self, shares: VgpuShares, share: int, now: int, period: int, window: int):
        self.shares = shares
        self.share = share  # percent of this ring
        self.credit = 0  # ns, signed
        self.replenished = now  # start of the current period
        self.in_flight = 0
        self.queued = 0  # jobs waiting in its entities
        self.busy_ns = 0  # total device time
        self.jobs = 0
        self.last_job_ns = 0  # device time of its last job (0: none yet)
        self.last_active = None  # when it last had work queued or running
        self.turnaround = Turnaround(period)  # the gaps between its jobs (band's buffer)
        self._period = period
        self._buckets = collections.deque([0] * window, maxlen=window)  # busy ns per period
        self._bucket_start = now

    def _roll(self, now: int) -> None:
        n = (now - self._bucket_start) // self._period
        if n > 0:
            for _ in range(min(n, self._buckets.maxlen)):
                self._buckets.append(0)
            self._bucket_start += n * self._period

    def charge(self, busy: int, now: int) -> None:
        if now - self._bucket_start >= self._period:
            self._roll(now)
        self._buckets[-1] += busy
        self.busy_ns += busy
        self.jobs += 1
        self.credit -= busy
        self.last_job_ns = busy

    def utilisation(self, now: int) -> float:
        """Busy fraction over the window (the current, partial period included)."""
        self._roll(now)
        span = (len(self._buckets) - 1) * self._period + max(1, now - self._bucket_start)
        return min(1.0, sum(self._buckets) / span)

    def replenish(self, now: int) -> None:
        """Gdev's replenish, once per elapsed period (lazily)."""
        periods = (now - self.replenished) // self._period
        if periods <= 0:
            return
        self.replenished += periods * self._period
        add = self._period * self.share // 100
        for _ in range(min(periods, 4)):  # after a few idle periods the credit is 0 anyway
            self.credit += add
            if not -self._period <= self.credit <= self._period:
                self.credit = 0
        if periods > 4:
            self.credit = 0


class GpuScheduler:
    """The scheduler of one ring. `ops` is the driver: run_job(job) -> hardware fence."""

    def __init__(self, name: str, ops, *, engine: int = 0, policy: str = "fifo",
                 share_kind: str = "compute", hw_limit: int = DEFAULT_HW_LIMIT,
                 timeout_ns: int = DEFAULT_TIMEOUT_NS, period_ns: int = DEFAULT_PERIOD_NS,
                 time_buffer_ns: int = DEFAULT_TIME_BUFFER_NS,
                 window_periods: int = DEFAULT_WINDOW_PERIODS, now: int = 0,
                 signals: list | None = None):
        if policy not in POLICIES:
            raise InvalidArgument(f"unknown scheduling policy {policy!r} (one of {', '.join(POLICIES)})")
        if hw_limit < 1 or timeout_ns <= 0 or period_ns <= 0 or time_buffer_ns < 0:
            raise InvalidArgument("bad scheduler parameters")
        self.name = name
        self.ops = ops
        self.engine = engine
        self.policy = policy
        self.share_kind = share_kind
        self.hw_limit = hw_limit
        self.timeout_ns = timeout_ns
        self.period_ns = period_ns
        self.time_buffer_ns = time_buffer_ns
        self.window_periods = window_periods
        self.entities = []
        self.vgpus = {}  # name -> VgpuSchedState
        self.rotation = []  # vGPU names, head first (credit / band)
        self.current = None  # the vGPU owning the ring (credit / band)
        self.in_flight = collections.deque()  # jobs handed to the hardware, in ring order
        self.stopped = False
        self.hold_until = None  # band: ring held idle for a time buffer until then
        self._hold_for = None  # the vGPU the hold was taken against
        self._head_since = None  # when the current head job became the head
        self._last_end = now
        self._seq = itertools.count(1)
        # (fence, error) to signal once the lock is released (take_signals); the driver may
        # give its schedulers one list, to take them all at once
        self.signals = signals if signals is not None else []
        self._queued = {}  # owner -> jobs waiting in its entities
        self.n_queued = 0
        self.busy_ns = 0
        self.stats = Counters()
        self.created_ns = now

    def __repr__(self) -> str:
        return f"GpuScheduler({self.name!r}, {self.policy}, in_flight={len(self.in_flight)})"

    # ------------------------------------------------------------------ vGPUs, entities
    def add_vgpu(self, shares: VgpuShares, now: int) -> VgpuSchedState:
        state = self.vgpus.get(shares.name)
        if state is None:
            share = shares.compute if self.share_kind == "compute" else shares.copy
            state = VgpuSchedState(shares, share, now, self.period_ns, self.window_periods)
            state.credit = self.period_ns * share // 100
            self.vgpus[shares.name] = state
            self.rotation.append(shares.name)
        return state

    def entity(self, name: str, vgpu: VgpuShares, priority: int = PRIORITY_NORMAL, owner=None,
               now: int = 0) -> SchedEntity:
        self.add_vgpu(vgpu, now)
        ent = SchedEntity(self, name, vgpu.name, priority, owner)
        self.entities.append(ent)
        return ent

    def close_entity(self, ent: SchedEntity, cancel=None) -> None:
        """Take no more jobs on an entity (drm_sched_entity_fini). Its queued jobs still
        run, unless `cancel` (an error) is given: then they complete with it at once. The
        entity goes away once it has drained."""
        ent.closed = True
        if cancel is not None:
            self._cancel_queued(ent, cancel)
        self._drop_if_drained(ent)

    def _drop_if_drained(self, ent: SchedEntity) -> None:
        if ent.closed and ent.in_flight == 0 and not ent.jobs and ent in self.entities:
            self.entities.remove(ent)

    # ------------------------------------------------------------------ submission
    def push(self, job: SchedJob, now: int, run: bool = False) -> SchedJob:
        """drm_sched_entity_push_job: queue a job; -> it, with its fences created. With
        `run`, a job that schedule(now) would hand to the hardware at once (fifo, nothing
        queued on the ring, room in flight, no dependency) is handed over here instead,
        without going through the queue (its job.hw_fence is set on return)."""
        ent = job.entity
        if ent.sched is not self or ent.closed:
            raise InvalidArgument(f"{ent!r} is not an open entity of {self.name}")
        seq = job.seq = next(self._seq)
        job.finished = SchedFence(job, self.engine, seq)
        job.arrival_ns = now
        if ent.guilty:
            self._finish(job, ContextLost(f"{ent.name} is guilty of a GPU hang"), now)
            return job
        v = self.vgpus[ent.vgpu]
        v.last_active = now
        if v.turnaround.idle_since is not None:  # it was idle: the gap is a sample
            v.turnaround.pushed(now)
        self.stats["jobs_pushed"] += 1
        if (run and not self.n_queued and not job.deps and self.policy == "fifo"
                and len(self.in_flight) < self.hw_limit and not self.stopped):
            self._run(job, now)
            return job
        for dep in job.deps:
            if not dep.signaled:
                self.stats["dependencies"] += 1
                # if dep signals meanwhile, the callback runs after the driver's lock
                # is released, not here (host/kmd/lock.py)
                dep.add_done_callback(self._dependency_signalled)
        ent.jobs.append(job)
        self.n_queued += 1  # (_count_queued)
        v.queued += 1
        queued = self._queued
        queued[ent.owner] = queued.get(ent.owner, 0) + 1
        return job

    def _dependency_signalled(self, _fence) -> None:
        wake = getattr(self.ops, "wake", None)
        if wake is not None:
            wake(self)

    def _dep_ok(self, dep) -> bool:
        if dep.signaled:
            return True
        job = getattr(dep, "job", None)
        # same ring: in-order execution makes "scheduled" enough (drm_sched optimisation)
        return (job is not None and job.entity.sched is self and dep is job.finished
                and job.hw_fence is not None)

    # ------------------------------------------------------------------ selection
    def _pick_fifo(self, entities):
        best = best_key = None
        for ent in entities:
            jobs = ent.jobs
            if jobs:
                deps = jobs[0].deps
                if deps and not all(self._dep_ok(d) for d in deps):  # not ready
                    continue
                key = (ent.priority, jobs[0].seq)
                if best is None or key < best_key:
                    best, best_key = ent, key
        return best

    def _vgpu_has_ready(self, name: str):
        return self._pick_fifo([e for e in self.entities if e.vgpu == name])

    def _over_share(self, v: VgpuSchedState, now: int) -> bool:
        return v.utilisation(now) * 100 > v.share

    def _time_buffer_until(self, name: str, now: int) -> int | None:
        """band: until when a free ring is held against `name` (over its share) for the
        other vGPUs, or None: for each vGPU idle in a measured gap, until its next job is
        due (a vGPU that is late past its bound has gone quiet and holds nothing); for
        another one active in the last two periods, the fixed time buffer from now. Only
        a vGPU due before `name`'s job (as long as its last one) would end is waited for:
        one due later loses nothing to that job, and the ring does not idle for it."""
        horizon = now - 2 * self.period_ns
        job_ns = self.vgpus[name].last_job_ns
        until = None
        for other, v in self.vgpus.items():
            if other == name:
                continue
            due = v.turnaround.due()
            if due is None:
                if not (v.in_flight or v.queued
                        or v.last_active is not None and v.last_active >= horizon):
                    continue
                due = now + self.time_buffer_ns
            if job_ns and due - now >= job_ns:
                continue
            if until is None or due > until:
                until = due
        return until

    def _pick(self, now: int):
        """-> the entity whose head job runs next, or None."""
        if self.policy == "fifo":
            return self._pick_fifo(self.entities)
        for v in self.vgpus.values():
            v.replenish(now)
        # the owner keeps the ring while it has work in flight (Gdev: launch_instances)
        if self.current is not None and self.vgpus[self.current].in_flight:
            # ... but one with exhausted credit may not keep refilling it while others wait
            if self.vgpus[self.current].credit <= 0 and any(
                    self._vgpu_has_ready(n) for n in self.rotation if n != self.current):
                return None
            return self._vgpu_has_ready(self.current)
        # the ring is free: first vGPU in the rotation with ready work
        for name in list(self.rotation):
            ent = self._vgpu_has_ready(name)
            if ent is None:
                continue
            if self.policy == "band" and self.time_buffer_ns:
                v = self.vgpus[name]
                if self._over_share(v, now) and v.credit <= 0:
                    if self._hold_for != name or self.hold_until is None:
                        until = self._time_buffer_until(name, now)
                        if until is not None and until > now:
                            self.hold_until = until
                            self._hold_for = name
                            self.stats["time_buffer_holds"] += 1
                    if self._hold_for == name and now < self.hold_until:
                        return None
            self.hold_until = self._hold_for = None
            self.current = name
            return ent
        return None

    def _complete_owner(self, name: str, now: int) -> None:
        """A vGPU's last in-flight job completed: maybe move it to the tail (Gdev)."""
        v = self.vgpus[name]
        exhausted = v.credit <= 0
        if self.policy == "band":
            exhausted = exhausted and self._over_share(v, now)
        if exhausted and name in self.rotation:
            self.rotation.remove(name)
            self.rotation.append(name)
            self.stats["rotations"] += 1
        if self.current == name:
            self.current = None

    # ------------------------------------------------------------------ running
    def schedule(self, now: int) -> int:
        """Hand ready jobs to the hardware while there is room; -> how many."""
        if self.stopped:
            return 0
        ran = 0
        fifo = self.policy == "fifo"
        while len(self.in_flight) < self.hw_limit and self.n_queued:
            ent = self._pick_fifo(self.entities) if fifo else self._pick(now)
            if ent is None:
                break
            job = ent.jobs.popleft()
            self.n_queued -= 1  # (_count_queued)
            self.vgpus[ent.vgpu].queued -= 1
            left = self._queued[ent.owner] - 1
            if left:
                self._queued[ent.owner] = left
            else:
                del self._queued[ent.owner]
            if ent.guilty:
                self._finish(job, ContextLost(f"{ent.name} is guilty of a GPU hang"), now)
            else:
                self._run(job, now)
                ran += 1
            if ent.closed:
                self._drop_if_drained(ent)
        return ran

    def _run(self, job: SchedJob, now: int) -> None:
        ent = job.entity
        job.run_ns = now
        job.hw_fence = self.ops.run_job(job)
        if not self.in_flight:
            self._head_since = now
        self.in_flight.append(job)
        ent.in_flight += 1
        v = self.vgpus[ent.vgpu]
        v.in_flight += 1
        v.last_active = now
        self.stats["jobs_run"] += 1
        if job._scheduled is not None:
            self.signals.append((job._scheduled, None))

    def job_done(self, job: SchedJob, hw_fence, end_ns: int, now: int | None = None) -> bool:
        """The hardware fence of `job` signalled at device time end_ns; -> False if that
        fence is stale (the job was resubmitted or recovered since)."""
        in_flight = self.in_flight
        if job.hw_fence is not hw_fence:
            return False
        if in_flight and in_flight[0] is job:  # the ring completes in order
            in_flight.popleft()
        elif job in in_flight:
            in_flight.remove(job)
        else:
            return False
        if now is None:
            now = end_ns
        start = job.run_ns if job.run_ns > self._last_end else self._last_end
        end = end_ns if end_ns > start else start
        job.start_ns, job.end_ns = start, end
        self._last_end = end
        self._head_since = max(end, in_flight[0].run_ns) if in_flight else None
        busy = end - start
        self.busy_ns += busy
        ent = job.entity
        ent.in_flight -= 1
        owner_busy = getattr(ent.owner, "busy_ns", None)  # a kmd Context: a list per engine
        if owner_busy is not None:
            owner_busy[self.engine] += busy
        v = self.vgpus[ent.vgpu]
        v.in_flight -= 1
        v.charge(busy, now)
        v.last_active = now
        if v.in_flight == 0:
            if not v.queued:
                v.turnaround.idle_since = end  # (Turnaround.idle, in place: a call per job)
            if self.policy != "fifo":
                self._complete_owner(ent.vgpu, now)
        if ent.closed:
            self._drop_if_drained(ent)
        self._finish(job, getattr(hw_fence, "error", None), end)
        return True

    def _finish(self, job: SchedJob, error, timestamp: int) -> None:
        job.finished.timestamp = timestamp
        if job.run_ns is None and job._scheduled is not None:  # never run: not scheduled yet
            self.signals.append((job._scheduled, None))
        self.signals.append((job.finished, error))
        self.stats["jobs_failed" if error is not None else "jobs_completed"] += 1

    def _cancel_queued(self, ent: SchedEntity, error) -> int:
        n = 0
        while ent.jobs:
            job = ent.jobs.popleft()
            self._count_queued(ent, -1)
            self._finish(job, error, job.arrival_ns or 0)
            n += 1
        return n

    def take_signals(self) -> list:
        """-> [(fence, error)] to signal, in order, once the driver's lock is released."""
        out = self.signals.copy()
        self.signals.clear()
        return out

    # ------------------------------------------------------------------ timers
    def next_deadline(self) -> int | None:
        """The next time timed_out() or schedule() needs to be called (ns), or None."""
        deadline = self.hold_until
        if self.in_flight and self._head_since is not None and not self.stopped:
            timeout = self._head_since + self.timeout_ns
            if deadline is None or timeout < deadline:
                deadline = timeout
        return deadline

    def timed_out(self, now: int) -> SchedJob | None:
        """The head job if it has run past its timeout (drm_sched_job_timedout)."""
        if self.stopped or not self.in_flight or self._head_since is None:
            return None
        if now - self._head_since >= self.timeout_ns:
            return self.in_flight[0]
        return None

    def recover(self, guilty: SchedJob, now: int, lost_owners=(), error=None) -> list:
        """After the driver reset the engine: fail the guilty job (with `error`, by default
        JobTimedOut), cancel the jobs of lost owners (contexts) and hand every other
        in-flight job to the hardware again. -> the entities made guilty."""
        jobs = list(self.in_flight)
        self.in_flight.clear()
        self._head_since = None
        self._last_end = now
        lost = set(lost_owners)
        guilty.karma += 1
        guilty.entity.guilty = True
        lost.add(guilty.entity.owner)
        for job in jobs:
            ent = job.entity
            ent.in_flight -= 1
            v = self.vgpus[ent.vgpu]
            v.in_flight -= 1
            job.hw_fence = None
            if job is guilty:
                self._finish(job, error or JobTimedOut(
                    f"job ran past the {self.timeout_ns / 1e9:g} s timeout on {self.name} "
                    f"and was stopped by an engine reset"), now)
            elif ent.owner in lost and ent.owner is not None or ent.guilty:
                self._finish(job, ContextLost(f"{ent.name}: context lost after a GPU hang"), now)
        self.current = None
        self.hold_until = self._hold_for = None
        self.stats["timeouts" if error is None else "preemptions"] += 1
        made_guilty = []
        for ent in self.entities:
            if ent.owner in lost and ent.owner is not None or ent is guilty.entity:
                if not ent.guilty or ent is guilty.entity:
                    made_guilty.append(ent)
                ent.guilty = True
                self._cancel_queued(ent, ContextLost(f"{ent.name}: context lost after a GPU hang"))
        # resubmit the innocent ones in their original ring order (drm_sched_resubmit_jobs)
        for job in jobs:
            if job.finished.signaled or any(f is job.finished for f, _e in self.signals):
                continue
            job.resubmits += 1
            self.stats["resubmitted"] += 1
            self._run(job, now)
        for ent in list(self.entities):
            self._drop_if_drained(ent)
        return made_guilty

    def mark_lost(self, owners, now: int) -> None:
        """Another ring found these owners (contexts) guilty: cancel their queued jobs here
        and refuse new ones; their in-flight jobs here finish normally."""
        owners = set(owners)
        for ent in self.entities:
            if ent.owner in owners:
                ent.guilty = True
                self._cancel_queued(ent, ContextLost(f"{ent.name}: context lost after a GPU hang"))

    def fail_all(self, error, now: int) -> None:
        """Device stop: every queued and in-flight job completes with `error`."""
        jobs = list(self.in_flight)
        self.in_flight.clear()
        for job in jobs:
            job.entity.in_flight -= 1
            self.vgpus[job.entity.vgpu].in_flight -= 1
            job.hw_fence = None
            self._finish(job, error, now)
        for ent in self.entities:
            self._cancel_queued(ent, error)
        self.stopped = True

    # ------------------------------------------------------------------ accounting
    def _count_queued(self, ent: SchedEntity, n: int) -> None:
        self.n_queued += n
        self.vgpus[ent.vgpu].queued += n
        left = self._queued.get(ent.owner, 0) + n
        if left:
            self._queued[ent.owner] = left
        else:
            self._queued.pop(ent.owner, None)

    def queued(self, owner=None) -> int:
        """Jobs waiting in entities (of `owner`); counted, not scanned: the host's I/O
        loop asks before every chain it takes."""
        return self.n_queued if owner is None else self._queued.get(owner, 0)

    def snapshot(self, now: int) -> dict:
        span = max(1, now - self.created_ns)
        vgpus = {}
        for name, v in self.vgpus.items():
            v.replenish(now) if self.policy != "fifo" else None
            vgpus[name] = {"share": v.share, "utilisation": round(v.utilisation(now), 4),
                           "busy_ns": v.busy_ns, "jobs": v.jobs, "credit_us": v.credit // 1000,
                           "in_flight": v.in_flight, "queued": v.queued,
                           "turnaround_us": None if v.turnaround.bound() is None
                           else v.turnaround.bound() // 1000}
        return {"policy": self.policy, "busy_ns": self.busy_ns,
                "utilisation_total": round(min(1.0, self.busy_ns / span), 4),
                "in_flight": len(self.in_flight), "queued": self.queued(),
                "hw_limit": self.hw_limit, "timeout_ms": self.timeout_ns // 1_000_000,
                "stats": dict(self.stats), "vgpus": vgpus}
