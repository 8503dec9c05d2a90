"""Timers and TDR (drm_sched's timeout work): the timer pass checks the job timeouts and
BAND's time-buffer timer of every ring, recover() resets an engine whose job ran past
its timeout, and preempt() resets an engine that is running a job of a context whose
owner is gone, so that its memory is freed now rather than when the job ends. All run in
the device's submission context (its worker, submit.py): the resubmission of the
innocent jobs after a reset is a run_job."""

from __future__ import annotations

import logging

from pvgpu.host.hw import regs
from pvgpu.host.kmd import errors
from pvgpu.host.kmd.sched import GpuScheduler, SchedJob

log = logging.getLogger("pvgpu.kmd")


class TdrMixin:
    """KmdDevice's timers and engine recovery."""

    TIMER_TICK_NS = 20_000_000  # the timer pass runs at least this often

    def _arm_timer(self, sched: GpuScheduler) -> None:
        """Have the timer pass run by `sched`'s next deadline (lock held). Job timeouts are
        far off and wait for the next tick (at most 20 ms late), so an ordinary submission
        does not wake a thread; time buffers are short and do."""
        deadline = sched.next_deadline()
        if deadline is not None and deadline < self.submit_wq.timer_due:  # (arm's test)
            self.submit_wq.arm(deadline)

    def _timer_pass(self) -> int | None:
        """drm_sched's timeout work and the BAND time-buffer timer, for every ring (in the
        submission worker); -> the next deadline (device ns), or None."""
        while not self.stopped:
            timed_out = None
            with self.lock:
                now = self.clock_ns()
                deadlines = []
                for sched in self.schedulers:
                    job = sched.timed_out(now)
                    if job is not None:
                        timed_out = (sched, job)
                        break
                    if sched.hold_until is not None and now >= sched.hold_until:
                        sched.schedule(now)
                    d = sched.next_deadline()
                    if d is not None:
                        deadlines.append(d)
                signals = self._take_signals()
            self._signal(signals)
            if timed_out is None:
                return min(deadlines) if deadlines else None
            try:
                self.recover(*timed_out)
            except Exception:  # noqa: BLE001 - the timers must survive anything
                log.exception("gpu%d: recovery failed", self.index)
        return None

    def recover(self, sched: GpuScheduler, job: SchedJob) -> bool:
        """TDR: `job` ran past its timeout on `sched`'s ring. Stop that ring's scheduler,
        reset the engine, force-complete its hardware fences, mark the job's context lost
        (its queued work on every ring fails with ContextLost), hand the innocent jobs
        that were in the ring to the hardware again, and restart. -> False if the job
        completed in the meantime."""
        engine = sched.engine
        with self.lock:
            now = self.clock_ns()
            if sched.timed_out(now) is not job:
                return False
            sched.stopped = True
            for j in sched.in_flight:
                j.hw_fence = None  # what the reset abandons must not complete the jobs
            ctx = job.entity.owner
            ctx.lost = True
            ctx.lost_reason = (f"a job on {sched.name} ran past the "
                               f"{sched.timeout_ns / 1e9:g} s timeout")
            timeline = ctx._timeline_of.get(job.entity, 0)
            self.stats["timeouts"] += 1
            self.stats["engine_resets"] += 1
            log.warning("gpu%d: %s timed out (context %d); resetting %s", self.index, job,
                        ctx.id, sched.name)
        self._reset_ring(sched, job, ctx)
        ctx.report_error(errors.JobTimedOut(ctx.lost_reason), timeline, engine)
        return True

    def preempt(self, ctx) -> int:
        """`ctx` was destroyed because its owner is gone (destroy_context with cancel):
        reset each engine whose running job (the head of its ring) is one of ctx's, so
        that the job stops and ctx's memory is released at once. The jobs behind it in
        the ring, which had not started, run again; a ring whose head is another
        context's job is left alone (its job would have to start over). -> engines reset."""
        resets = 0
        for sched in self.schedulers:
            with self.lock:
                head = sched.in_flight[0] if sched.in_flight else None
                if head is None or head.entity.owner is not ctx or sched.stopped:
                    continue
                sched.stopped = True
                for j in sched.in_flight:
                    j.hw_fence = None  # what the reset abandons must not complete the jobs
                self.stats["engine_resets"] += 1
                self.stats["preemptions"] += 1
                log.info("gpu%d: context %d is gone; resetting %s to stop %s", self.index,
                         ctx.id, sched.name, head)
            self._reset_ring(sched, head, ctx,
                             errors.ContextLost(f"context {ctx.id} was destroyed"))
            resets += 1
        return resets

    def _reset_ring(self, sched: GpuScheduler, job: SchedJob, ctx, error=None) -> None:
        """Reset `sched`'s engine (its scheduler stopped, lock not held), complete the
        hardware fences it abandoned, fail `job` and ctx's other work, resubmit the rest."""
        engine = sched.engine
        if self.trace is not None:
            with self.lock:
                self.trace.engine_reset(self, engine, job, ctx,
                                        "timeout" if error is None else str(error))
        try:
            self.mmio.write(regs.REG_ENGINE(engine, regs.RB_RESET), 1)  # waits for the engine
        finally:
            with self.lock:
                ring = self.rings[engine]
                ring.after_reset()
                fd = self.fences[engine]
                stale = fd.force_completion()
        self._retire(fd, stale, error="engine reset")
        with self.lock:
            now = self.clock_ns()
            sched.stopped = False
            sched.recover(job, now, lost_owners=[ctx], error=error)
            for other in self.schedulers:
                if other is not sched:
                    other.mark_lost([ctx], now)
            if ctx is self._move_ctx:  # its failed copies abort their moves (evict.py)
                self._move_ctx = self._new_move_context()
            for s in self.schedulers:
                s.schedule(now)
                self._arm_timer(s)
            signals = self._take_signals()
        self._signal(signals)
