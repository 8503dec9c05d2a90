"""Job submission, run_job and job completion (drm_sched's backend ops), and flow control.

Submission (Context.submit_*): the job's packets (COPY or LAUNCH, addresses in the
context's VA space) are queued on the scheduler of the engine for that job type (COPY ->
a copy engine by direction, LAUNCH -> ENGINE_COMPUTE), on the entity of its timeline.
The scheduler hands a job over once its dependencies have signalled (one on the same
ring once it is scheduled: the ring executes in order); it hears of a dependency's
signal through the fence's callback (wake), which never runs under a device lock
(lock.py). Then run_job writes the packets into an indirect buffer taken from the IB
pool and, in one ring transaction, INDIRECT_BUFFER(ib, length, vmid) and a FENCE with
FENCE_IRQ; inside a submission batch (batch.py) the transaction stays open for the batch's
next jobs on that ring and is committed when the batch exits.

A job's life: Context.submit_* checks its arguments and calls KmdDevice._submit, which
pushes a _Job (a SchedJob) on the scheduler entity of its timeline (never waiting). The
scheduler calls run_job (lock held) once the job may run; its hardware fence retires on
the interrupt thread (_retire_fence_irq), which hands the completion to the scheduler in
the same lock hold (_jobs_done_locked); the job's finished fence signals once the lock is
released.

Short jobs run to completion on the submitting thread. A job that is bounded (at most
INLINE_COPIES copies of at most INLINE_COPY_BYTES in all, a built-in kernel over at
most INLINE_LAUNCH_ELEMENTS elements, burn for at most INLINE_BURN_US, several launches
in one job (submit_launches) whose shares of those bounds add up to at most 1; never a
code launch), submitted by a thread
that holds no device lock, and that the scheduler runs at once on an idle ring (no job
in flight there: so no unsignalled dependency, nothing queued before it), is written
into the ring without publishing WPTR; still in the same lock hold, the submitting
thread writes the new WPTR to RB_KICK_SYNC_WPTR (nothing else can publish one past it
meanwhile) and the command processor executes the job on it. Its IRQ_FENCE arrives on
that thread inside the hold, so the top half retires the fence and marks the job done
in it, without a second lock hold (_retire_fence_irq); the fences are marked signalled
there and their callbacks run once the lock is released (lock.py). So the interrupt, the
retirement and the finished fence's signal all happen before _submit returns, without
a thread handoff. The lock is held while the job runs: the thresholds below keep that
short. Everything else is unchanged: the scheduler hands the job to the
hardware and accounts for it (start at run_job, end at the fence's timestamp) exactly
as for a job the engine's thread runs; a fault is reported the same way. Long jobs keep
the engine threads, the job timeout and TDR. The thresholds bound the time the
submitting thread (the host's I/O loop) is held to about the two thread handoffs the
job saves; measured here (in-process KMD, one job at a time), a fill of 64 Ki elements,
a 64 KiB copy and burn(20) still finished sooner inline than through the engine thread,
burn(50) did not.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

import numpy as np

from pvgpu.host.hw import packets, regs
from pvgpu.host.kmd import fence as fence_mod
from pvgpu.host.kmd import lock as devlock
from pvgpu.host.kmd.batch import EngineBatch, SubmissionBatch
from pvgpu.host.kmd.errors import ContextLost, DeviceLost, InvalidArgument, InvalidContext
from pvgpu.host.kmd.fence import Fence, FenceDriver
from pvgpu.host.kmd.kernarg import CodeLaunch, KernargArea
from pvgpu.host.kmd.prime import ALL_SHARED
from pvgpu.host.kmd.resv import RESV_LOCK
from pvgpu.host.kmd.sched import GpuScheduler, SchedJob
from pvgpu.spec import isa, kernels

if TYPE_CHECKING:
    from pvgpu.host.kmd.context import Context

log = logging.getLogger("pvgpu.kmd")

# host->device copies on copy engine 0, device->host on copy engine 1, so both directions
# overlap each other and compute
ENGINE_FOR_COPY = {"h2d": regs.ENGINE_COPY0, "d2h": regs.ENGINE_COPY1, "d2d": regs.ENGINE_COPY0}
MAX_QUEUED_JOBS = 8192  # jobs queued in the schedulers of one device
MAX_CLIENT_QUEUED_JOBS = 1024  # ... of one client (a guest session)
INLINE_COPY_BYTES = 64 << 10  # bounded jobs, run on the submitting thread (see above)
INLINE_COPIES = 16  # ... of at most this many COPY packets
INLINE_LAUNCH_ELEMENTS = 1 << 16
INLINE_BURN_US = 20
MAX_LAUNCHES_PER_JOB = 1024  # LAUNCH packets in one job's IB (submit_launches)
_U64 = (1 << 64) - 1
_I64_MIN = -(1 << 63)
_U32 = (1 << 32) - 1


class _Job(SchedJob):
    """A job of this driver around the scheduler's job (amdgpu_job around drm_sched_job):
    once run_job has put it on the hardware, what its hardware fence's retirement gives
    back (set by run_job, again at each resubmission)."""

    __slots__ = ("ib", "ib_block", "kernarg")

    @property
    def context(self):
        return self.entity.owner

    @property
    def kind(self) -> int:
        """The engine."""
        return self.entity.sched.engine

    @property
    def timeline(self) -> int:
        return self.entity.owner._timeline_of.get(self.entity, 0)


def _ring_idle(sched: GpuScheduler) -> bool:
    """Whether the hardware has nothing of this ring's in-flight jobs left to run: their
    fences have all signalled (their completion may not have reached the scheduler yet)."""
    for j in sched.in_flight:
        if j.hw_fence is None or not j.hw_fence.signaled:
            return False
    return True


# built-in kernel -> (its argument count, the indices of its size (ARG_U32) arguments)
_SIZE_ARGS = {k: (len(sig.args), tuple(i for i, (_n, kind) in enumerate(sig.args)
                                       if kind == kernels.ARG_U32))
              for k, sig in kernels.BUILTIN_KERNELS.items()}


def launch_load(kernel_id: int, args) -> float:
    """A built-in launch's work as a fraction of what runs on the submitting thread: the
    product of its size arguments (n; m*n*k; rows*cols) over INLINE_LAUNCH_ELEMENTS, a
    burn's microseconds over INLINE_BURN_US. A job whose launches add up to at most 1 is
    short (module docstring)."""
    nargs, sizes = _SIZE_ARGS.get(kernel_id, (None, ()))
    if len(args) != nargs:
        return 0.0  # the hardware refuses it at once (an illegal packet)
    if kernel_id == kernels.KERNEL_BURN:
        return (args[0] & _U32) / INLINE_BURN_US
    work = 1
    for i in sizes:
        work *= args[i] & _U32
    return work / INLINE_LAUNCH_ELEMENTS


class JobMixin:
    """KmdDevice's submission, scheduler backend ops and job completion."""

    inline_jobs = True  # run short jobs on the submitting thread (see the module docstring)
    _inline_job = None  # the SchedJob _submit may run inline, while it schedules
    _inline_kick = None  # the engine whose ring _submit then runs (RB_KICK_SYNC)
    _batch = None  # the open SubmissionBatch (batch.py)
    trace = None  # the TraceRecorder while the device is traced (trace.py)

    def submission_batch(self) -> SubmissionBatch:
        """`with kmd.submission_batch():` submissions inside get their fences at once, and
        their ring writes are committed together when the outermost batch exits: one lock
        hold, one ring commit and one doorbell (or RB_KICK_SYNC) per engine (batch.py)."""
        return SubmissionBatch(self)

    # ------------------------------------------------------------------ flow control
    def has_headroom(self, client=None) -> bool:
        """Whether the schedulers take more jobs now: fewer than max_queued_jobs queued on
        this device and fewer than max_client_queued_jobs of `client` (a context's
        `client` tag, e.g. a guest session). Callers that must not block (the host's I/O
        loop) hold back new work until it is true — one client's flood holds back only
        that client."""
        with self.lock:
            if sum(s.n_queued for s in self.schedulers) >= self.max_queued_jobs:
                return False
            if client is None:
                return True
            return self._client_queued(client) < self.max_client_queued_jobs

    def _client_queued(self, client) -> int:
        return sum(s.queued(ctx) for ctx in self.contexts.values() if ctx.client is client
                   for s in self.schedulers)

    def oldest_pending_fence(self, client=None) -> Fence | None:
        """The finished fence of the oldest unfinished job (of `client`), None when idle."""
        with self.lock:
            best = None
            for s in self.schedulers:
                cands = list(s.in_flight) + [e.jobs[0] for e in s.entities if e.jobs]
                for job in cands:
                    owner = job.entity.owner
                    if client is not None and (owner is None or owner.client is not client):
                        continue
                    if best is None or job.arrival_ns < best.arrival_ns or (
                            job.arrival_ns == best.arrival_ns and job.seq < best.seq):
                        best = job
            return best.finished if best is not None else None

    # ------------------------------------------------------------------ submission
    def _submit(self, ctx: "Context", engine: int, ib: bytes, wait, timeline: int = 0,
                touches=(), short: bool = False) -> Fence:
        """Queue a job (its IB's packets) on the scheduler of `engine`, on the entity of
        timeline `timeline` of ctx; -> the job's finished fence. Never waits for other
        work: the job runs when its dependencies have signalled and the scheduler picks
        it. `touches`: the (va, size, write) ranges it accesses, for implicit sync of
        shared buffers. A `short` (bounded) job that can start at once runs to completion
        on this thread before the call returns."""
        short = short and self.inline_jobs
        deps = []
        for f in wait or ():
            if f is None:
                continue
            if not isinstance(f, Fence):
                raise InvalidArgument(f"not a fence: {f!r}")
            if not f.signaled:
                deps.append(f)
        with self.lock as free:  # (free: this thread held no device lock before)
            if ctx.device is not self or ctx.destroyed:
                raise InvalidContext("context was destroyed or belongs to another device")
            if self.stopped:
                raise DeviceLost("device stopped")
            if ctx.lost:
                raise ContextLost(f"context {ctx.id} was lost after a GPU hang "
                                  f"({ctx.lost_reason}); destroy it")
            if self._deferred or self.prime._released:  # (what _reclaim_locked looks at)
                self._reclaim_locked()
            if ctx.evicted_bos or ctx.moves:  # restores, and moves to wait for (evict.py)
                deps += self._placement_deps(ctx)
            sched = self.schedulers[engine]
            ent = ctx._entity(sched, timeline)
            now = self.clock_ns()
            if not (ctx.shared and touches):
                resvs = ()
            elif touches is ALL_SHARED:  # a code launch (spec PRIME-SYNC-2)
                resvs = self.prime.shared_resvs(ctx)
            else:
                resvs = self.prime.touched(ctx, touches)
            # a short job may run on this thread: now if it holds no device lock, or when
            # the batch it is in exits (batch.py)
            batch = self._batch
            inline = short and (free or batch is not None
                                and batch.owner == threading.get_ident())
            try:
                if resvs:
                    with RESV_LOCK:  # deps, push and fence as one step (see resv.py)
                        deps += self.prime.implicit_deps(resvs)
                        job = _Job(ent, ib, deps, short)
                        if inline:
                            self._inline_job = job
                        sched.push(job, now)
                        self.prime.add_job_fence(resvs, job.finished)
                else:
                    job = _Job(ent, ib, deps, short)
                    if inline:
                        self._inline_job = job
                    sched.push(job, now, run=True)  # (what schedule() would do at once)
                if job.hw_fence is None:
                    sched.schedule(now)
            finally:
                self._inline_job = None
                kick, self._inline_kick = self._inline_kick, None
            ent.last_finished = job.finished
            ctx.last_fence = job.finished
            ctx.last_use_ns = now
            ctx.stats["jobs_submitted"] += 1
            self.stats["jobs_submitted"] += 1
            if kick is not None:  # the engine was idle: publish and run the job here
                self.kick_sync_wptr[kick](self.rings[kick].wptr)
            signals = self._take_signals() if self._signals else None  # (an inline job's
            # were taken by its interrupt)
            if sched.in_flight or sched.hold_until is not None:  # (else no deadline)
                self._arm_timer(sched)
        if signals:
            fence_mod.signal_all((), None, signals)
        return job.finished

    # ------------------------------------------------------------------ scheduler ops
    def run_job(self, job: SchedJob) -> Fence:
        """drm_sched backend op (lock held): write the job's IB, then INDIRECT_BUFFER and
        a FENCE into its ring; -> the hardware fence."""
        ent = job.entity
        sched = ent.sched
        engine = sched.engine
        ctx = ent.owner
        ib = job.payload
        ctx.last_use_ns = job.run_ns
        if ctx.stale_imports:
            self.prime.remap_stale(ctx)  # the exporter moved a buffer this job may use
        slot = None
        if isinstance(ib, CodeLaunch):  # its parameters go into a slot of the kernarg area
            slot = ctx.kernargs.take(ib.params)
            if slot is None:  # cannot happen (slots >= hw_limit): the launch faults instead
                log.error("gpu%d: no parameter buffer free for %r", self.index, job)
            ib = ib.ib(ctx.kernargs.slot_va(slot) if slot is not None else 0)
        phys, ib_blocks = self._ib_alloc_nowait(len(ib))
        self.vram.write(phys, ib)
        ring = self.rings[engine]
        fd = self.fences[engine]
        batch = self._batch
        if batch is not None and batch.owner != threading.get_ident():
            batch.flush(engine)  # not the batch's thread: not held back behind it
            batch = None
        if batch is None:  # one ring transaction: INDIRECT_BUFFER and FENCE (never waits:
            # hw_limit jobs fit many times over)
            inline = job is self._inline_job and not sched.in_flight
            fence = fd.emit_with(ring, packets.indirect_buffer(phys, len(ib) // 4, ctx.vmid),
                                 publish=not inline)  # (_submit publishes and runs it)
            job.ib, job.ib_block, job.kernarg = phys, ib_blocks, slot
            self._jobs[fence] = job
            if inline:
                self._inline_kick = engine
                self.stats["jobs_inline"] += 1
            return fence
        short = job.short
        ndw = 5 + fd.packet_dw
        # inside a batch: stage it in the batch's transaction on this ring
        staged = batch.engines.get(engine)
        if staged is not None and not ring.in_transaction:  # an engine reset dropped it
            staged = None
        if staged is not None and not ring.extend(ndw):
            batch.flush(engine)  # the ring is too full to hold more: publish them
            staged = None
        if staged is None:
            ring.alloc(ndw)
            staged = batch.engines[engine] = EngineBatch(short and _ring_idle(sched))
        else:
            staged.inline = staged.inline and short
        staged.jobs.append(job)
        ring.write(packets.indirect_buffer(phys, len(ib) // 4, ctx.vmid))
        if short:  # its interrupt waits for the last of a run of short jobs (batch.py)
            fence = fd.emit(ring, flags=0)
            staged.quiet = True
        else:  # a long job's fence interrupts, and so does the short one before it
            if staged.quiet:
                fd.irq_on_last(ring)
            fence = fd.emit(ring)
            staged.quiet = False
        job.ib, job.ib_block, job.kernarg = phys, ib_blocks, slot
        self._jobs[fence] = job
        return fence

    def _jobs_done_locked(self, finished, now: int) -> list:
        """The hardware fences of jobs signalled (top half, lock held): mark the jobs done
        with their schedulers; -> the schedulers with jobs queued behind them, which run in
        the submission context (submit.py, _resume), never here."""
        done_scheds = []
        trace = self.trace
        for job, hw_fence in finished:
            sched = job.entity.sched
            end = hw_fence.timestamp if hw_fence.timestamp is not None else now
            if sched.job_done(job, hw_fence, end, now):
                if trace is not None:
                    trace.job(self, job, hw_fence)
                if sched not in done_scheds:
                    done_scheds.append(sched)
        resume = []
        for sched in done_scheds:
            # a completion moves the head job's timeout later, never earlier: only BAND's
            # time buffer (hold_until) may need the timer pass sooner
            if sched.hold_until is not None:
                self._arm_timer(sched)
            if sched.n_queued:
                resume.append(sched)
        return resume

    def _resume(self, scheds) -> None:
        """Hand schedulers with queued jobs to the submission context (no lock held): the
        open batch if this thread is its owner (batch.py), else the submission worker."""
        if not scheds:
            return
        batch = self._batch
        if batch is not None and batch.owner == threading.get_ident():
            batch.resume.update(scheds)
        else:
            for sched in scheds:
                self.submit_wq.queue(sched)

    def wake(self, sched: GpuScheduler) -> None:
        """A dependency of a queued job signalled (any thread, no lock held): the
        submission context schedules the ring."""
        if not self.stopped:
            self.submit_wq.queue(sched)

    def _take_signals(self) -> list:
        """The schedulers' queued (fence, error) signals, in the order they were queued
        (the schedulers share one list, KmdDevice._signals)."""
        signals = self._signals
        if not signals:
            return []
        out = signals.copy()
        signals.clear()
        return out

    @staticmethod
    def _signal(signals) -> None:
        if signals:
            fence_mod.signal_all((), None, signals)

    # ------------------------------------------------------------------ completion
    def _retire(self, fd: FenceDriver, done: list, error=None, timestamp=None) -> None:
        """Bookkeeping for completed fences, then signal them (outside the lock)."""
        if not done:
            return
        with self.lock:
            finished = self._retire_locked(fd, done, error, timestamp)
        self._retired(done, error, finished)

    def _retire_fence_irq(self, fd: FenceDriver, seq: int, timestamp=None) -> None:
        """IRQ_FENCE: retire what the write-back slot (or `seq`) covers and mark those jobs
        done with the scheduler, in one lock hold: the top half's own, or, for an inline
        job, the hold of the _submit that kicked it on this thread (the fences are then
        marked under it, their callbacks wait for its release)."""
        held = self.lock.owned()
        if not held:
            self.lock.acquire()
        try:
            done = fd.retire_locked(seq)
            if not done:
                return
            # now: the interrupt's time, as the top half runs when it is raised
            now = self.clock_ns() if timestamp is None else timestamp
            finished = self._retire_locked(fd, done, None, now)
            resume = self._jobs_done_locked(finished, now)
            signals = self._take_signals()
        finally:
            if not held:
                self.lock.release()
        if resume:
            fence_mod.signal_all(done)
            self._resume(resume)
            self._signal(signals)
        else:  # the hardware fences, then the jobs', in one go
            fence_mod.signal_all(done, None, signals)

    def _retire_locked(self, fd: FenceDriver, done: list, error, timestamp) -> list:
        """Give back the jobs' IB space and parameter slots, count them; -> [(SchedJob,
        hardware fence)] for the scheduler."""
        if timestamp is None:
            timestamp = self.clock_ns()
        if error is not None:
            for f in done:
                if fd.pending and fd.pending[0] is f:
                    fd.pending.popleft()
                elif f in fd.pending:
                    fd.pending.remove(f)
        finished = []
        jobs = self._jobs
        for f in done:
            if f.timestamp is None:
                f.timestamp = timestamp
            job = jobs.pop(f, None)
            if job is None:
                continue
            if job.ib_block is None:  # from the IB pool (else its own VRAM blocks)
                self.ib_pool.free(job.ib)
            else:
                self._release_vram(job.ib_block)
            ctx = job.entity.owner
            if job.kernarg is not None:
                ctx.kernargs.give_back(job.kernarg)
            stats = ctx.stats
            stats["jobs_completed"] += 1
            if f.error is not None or error is not None:
                stats["jobs_failed"] += 1
            finished.append((job, f))
        if self._cond.waiting:
            self._cond.notify_all()
        return finished

    def _retired(self, done: list, error, finished: list) -> None:
        """After _retire_locked, no lock held: signal the hardware fences, then hand the
        jobs to the scheduler."""
        fence_mod.signal_all(done, error)
        if finished:
            devlock.call_soon(self._jobs_done, finished)

    def _jobs_done(self, finished) -> None:
        with self.lock:
            resume = self._jobs_done_locked(finished, self.clock_ns())
            signals = self._take_signals()
        self._resume(resume)
        self._signal(signals)


class ContextSubmitMixin:
    """Context's submission entry points: copies, built-in and code launches."""

    @staticmethod
    def _check_u64(*values) -> None:
        for v in values:
            if not isinstance(v, (int, np.integer)) or not 0 <= v <= _U64:
                raise InvalidArgument(f"bad address or size {v!r}")

    def submit_copy(self, src_va: int, dst_va: int, size: int, wait=(), *,
                    direction: str = "d2d", timeline: int = 0) -> Fence:
        """Copy `size` bytes from src_va to dst_va (this context's VAs) on a copy engine."""
        return self.submit_copies([(src_va, dst_va, size)], wait, direction=direction,
                                  timeline=timeline)

    def submit_copies(self, copies, wait=(), *, direction: str = "h2d", timeline: int = 0) -> Fence:
        """Several copies in one job (one IB of COPY packets, one fence)."""
        copies = list(copies)
        if not copies:
            raise InvalidArgument("no copies")
        parts = []
        total = 0
        for item in copies:
            try:
                src, dst, size = item
            except (TypeError, ValueError):
                raise InvalidArgument(f"bad copy {item!r}") from None
            self._check_u64(src, dst, size)
            if size == 0:
                continue
            parts.append(packets.copy(int(src), int(dst), int(size)))
            total += int(size)
        if not parts:
            parts.append(packets.nop(1))
        engine = ENGINE_FOR_COPY.get(direction)
        if engine is None:
            raise InvalidArgument(f"bad copy direction {direction!r}")
        touches = [t for src, dst, size in copies if size
                   for t in ((int(src), int(size), False), (int(dst), int(size), True))] \
            if self.shared else ()
        fence = self.device._submit(self, engine, b"".join(parts), wait, timeline, touches,
                                    short=len(parts) <= INLINE_COPIES
                                    and total <= INLINE_COPY_BYTES)
        self.stats["copies"] += len(copies)
        self.stats["copy_bytes"] += total
        return fence

    def submit_launch(self, kernel_id: int, grid, block, args, wait=(), *,
                      timeline: int = 0) -> Fence:
        """Run built-in kernel `kernel_id` on the compute engine; pointer args are VAs."""
        kernel_id, grid, block, args = self._check_launch(kernel_id, grid, block, args)
        ib = packets.launch(kernel_id, grid, block, args)
        touches = self._launch_touches(kernel_id, args) if self.shared else ()
        fence = self.device._submit(self, regs.ENGINE_COMPUTE, ib, wait, timeline, touches,
                                    short=launch_load(kernel_id, args) <= 1.0)
        self.stats["launches"] += 1
        return fence

    def submit_launches(self, launches, wait=(), *, timeline: int = 0) -> Fence:
        """Several built-in launches, each (kernel_id, grid, block, args), as ONE job: one
        IB of LAUNCH packets that the compute engine runs in order, and one fence (as an
        amdgpu command submission carries several IBs). All are checked before any is
        submitted. A fault in one skips the rest of the IB (the command processor's rule),
        so the job fails with that fault and the launches after it do not run. The job is
        short when the launches' loads add up to at most 1 (launch_load)."""
        parts = []  # each launch checked, packed and weighed in one pass
        touches = [] if self.shared else ()
        load = 0.0
        for launch in launches:
            k, g, b, a = self._check_launch(*launch)
            parts.append(packets.launch(k, g, b, a))
            load += launch_load(k, a)
            if self.shared:
                touches += self._launch_touches(k, a)
        if not parts:
            raise InvalidArgument("no launches")
        if len(parts) > MAX_LAUNCHES_PER_JOB:
            raise InvalidArgument(f"{len(parts)} launches in one job "
                                  f"(at most {MAX_LAUNCHES_PER_JOB})")
        ib = parts[0] if len(parts) == 1 else b"".join(parts)
        fence = self.device._submit(self, regs.ENGINE_COMPUTE, ib, wait, timeline, touches,
                                    short=load <= 1.0)
        self.stats["launches"] += len(parts)
        return fence

    def _check_launch(self, kernel_id, grid, block, args) -> tuple:
        """A built-in launch's parameters checked -> (kernel_id, grid, block, args) as
        ints; raises InvalidArgument."""
        grid = (grid, 1, 1) if type(grid) is int and 0 <= grid <= _U32 \
            else self._dim3(grid, "grid")  # (its common case, without the call)
        block = (block, 1, 1) if type(block) is int and 0 <= block <= _U32 \
            else self._dim3(block, "block")
        args = list(args)
        if len(args) > self.limits.max_kernel_args:
            raise InvalidArgument(f"{len(args)} kernel arguments "
                                  f"(max {self.limits.max_kernel_args})")
        if not isinstance(kernel_id, (int, np.integer)) or not 0 <= kernel_id <= _U32:
            raise InvalidArgument(f"bad kernel id {kernel_id!r}")
        for a in args:
            if type(a) is not int or not _I64_MIN <= a <= _U64:  # numpy integers, or bad
                for a in args:
                    if not isinstance(a, (int, np.integer)) or not _I64_MIN <= a <= _U64:
                        raise InvalidArgument(f"bad kernel argument {a!r}")
                args = list(map(int, args))
                break
        return int(kernel_id), grid, block, args

    @staticmethod
    def _launch_touches(kernel_id: int, args) -> list:
        """The buffers a built-in launch touches, for implicit synchronisation (prime.py):
        [(va, 1, written)] per pointer argument."""
        sig = kernels.BUILTIN_KERNELS.get(kernel_id)
        if sig is None:
            return []
        return [(a, 1, name in kernels.KERNEL_WRITTEN_ARGS)
                for (name, kind), a in zip(sig.args, args) if kind == kernels.ARG_PTR]

    def submit_launch_code(self, object_va: int, entry_va: int, grid, block, dyn_shared: int,
                           params: bytes, wait=(), *, timeline: int = 0) -> Fence:
        """Launch the entry whose record is at `entry_va` of the code object at `object_va`
        (this context's VAs) on the compute engine, with `params` as its parameter buffer
        (written into this context's kernarg area when the job runs, kernarg.py). The KMD
        never reads the object: the SMs validate it (a CodeFault otherwise). The launch
        may touch any buffer: it waits for, and is waited for by, every job using a
        shared buffer of this context (spec PRIME-SYNC-2)."""
        self._check_u64(object_va, entry_va)
        grid = self._dim3(grid, "grid")
        block = self._dim3(block, "block")
        if isinstance(dyn_shared, bool) or not isinstance(dyn_shared, (int, np.integer)) \
                or not 0 <= dyn_shared <= _U32:
            raise InvalidArgument(f"bad dynamic shared memory size {dyn_shared!r}")
        if not isinstance(params, (bytes, bytearray, memoryview)):
            raise InvalidArgument("parameters must be bytes")
        params = bytes(params)
        if len(params) > isa.MAX_PARAM_SIZE:
            raise InvalidArgument(f"{len(params)} parameter bytes (at most {isa.MAX_PARAM_SIZE})")
        dev = self.device
        with dev.lock:
            self._check()
            if self.lost:  # before anything is allocated for it (spec CMD-LAUNCH-CODE-1)
                raise ContextLost(f"context {self.id} was lost after a GPU hang "
                                  f"({self.lost_reason}); destroy it")
            if self.kernargs is None:
                dev._reclaim_locked()
                self.kernargs = KernargArea(dev, self, dev.schedulers[regs.ENGINE_COMPUTE].hw_limit)
        job = CodeLaunch(int(object_va), int(entry_va), grid, block, int(dyn_shared), params)
        fence = dev._submit(self, regs.ENGINE_COMPUTE, job, wait, timeline, ALL_SHARED)
        self.stats["launches"] += 1
        self.stats["code_launches"] += 1
        return fence

    @staticmethod
    def _dim3(dim, what) -> tuple:
        if type(dim) is int and 0 <= dim <= _U32:
            return (dim, 1, 1)
        if type(dim) is tuple and len(dim) == 3:  # a triple decoded from the wire
            x, y, z = dim
            if type(x) is type(y) is type(z) is int and 0 <= x <= _U32 and 0 <= y <= _U32 \
                    and 0 <= z <= _U32:
                return dim
        if isinstance(dim, (int, np.integer)):
            dim = (dim,)
        dim = tuple(int(d) for d in dim)
        if not 1 <= len(dim) <= 3 or any(not 0 <= d <= _U32 for d in dim):
            raise InvalidArgument(f"bad {what} {dim!r}")
        return dim + (1,) * (3 - len(dim))
