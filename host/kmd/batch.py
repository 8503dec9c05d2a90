"""Submission batches: many jobs, one lock hold, one ring commit and one doorbell per engine.

    with kmd.submission_batch():
        ctx.submit_launch(...)
        ctx.submit_copy(...)

The thread that enters a batch holds the device lock until the outermost batch exits.
Submissions inside it are checked and get their fences at once, as outside (the same
errors, raised by the call that made them: a bad one leaves the others alone), and the
scheduler hands jobs to run_job as usual; but run_job only stages each job's
INDIRECT_BUFFER and FENCE packets in the open ring transaction of its engine (Ring.extend).
When the outermost batch exits, every engine's transaction is committed: one WPTR write
each. The FENCEs of short jobs raise no interrupt, but the last one of a transaction, or
of a run of short jobs before a long one, does (the interrupt retires every fence up to
its seqno, fence.py); each still writes its own completion time into its timestamp slot,
so the scheduler's accounting sees when each job ended.

An engine that was idle when the batch's first job for it ran, and whose batched jobs are
all short (job.py), gets its new WPTR written to RB_KICK_SYNC_WPTR before the lock is
released (the hold keeps anything else from publishing past it), so they run to
completion on this thread, their interrupt handled in the same hold, as a lone short
job's is; any other engine gets a doorbell. The batch stays open while the kicked jobs
run, and its thread stays the device's submission context (submit.py): a completion it
retires that leaves jobs queued behind the scheduler's hw_limit hands that scheduler to
the batch (`resume`) rather than to the submission worker; the exit then schedules it,
which stages the jobs in turn, and commits and kicks again until a round stages nothing
to kick, all in its one lock hold. So a batch of many short jobs runs them all on this
thread, hw_limit at a time, and holds the lock while they run (as a lone short job
does: they are bounded).

The batch is the device's, not the thread's: if another thread reaches run_job while the
batch is open (the batch's thread released the lock in a Condition wait), that job is not
held back behind the batch: the engine's staged transaction is committed with a doorbell
first, and the job is committed on its own.

An engine reset (TDR) drops the staged transaction with the rest of the ring; the
scheduler hands those jobs to the hardware again, as every job the reset abandoned.

Nothing inside a batch may wait for the batch's own jobs: they reach the hardware only
when it exits. The backend's I/O loop never waits (wouldblock.py), so it can batch the
chains of one kick.
"""

from __future__ import annotations

import threading

from pvgpu.host.kmd import fence as fence_mod


class EngineBatch:
    """The staged jobs of one engine in an open batch."""

    __slots__ = ("inline", "jobs", "quiet")

    def __init__(self, inline: bool):
        self.inline = inline  # idle engine, short jobs only: run them on the batch's thread
        self.jobs = []  # their SchedJobs
        self.quiet = False  # the last staged FENCE raises no interrupt (yet)

    def commit(self, device, engine: int, kick: bool) -> bool:
        """Commit the engine's transaction: its last FENCE raises the interrupt. The jobs
        reach the hardware now, so their device time starts now (the scheduler charges
        a job from its run_ns or its predecessor's end, whichever is later). With `kick`
        the new WPTR is not published: the caller publishes it and runs the jobs in one
        write (RB_KICK_SYNC_WPTR); else a doorbell publishes it. -> False if an engine
        reset dropped the transaction (TDR resubmits the jobs): nothing to commit."""
        ring = device.rings[engine]
        if not ring.in_transaction:
            return False
        if self.quiet:
            device.fences[engine].irq_on_last(ring)
        now = device.clock_ns()
        for job in self.jobs:
            job.run_ns = now
        ring.commit(publish=not kick)
        return True


class SubmissionBatch:
    """Context manager returned by KmdDevice.submission_batch() (re-entrant)."""

    __slots__ = ("device", "owner", "may_inline", "engines", "resume", "_outer")

    def __init__(self, device):
        self.device = device
        self.owner = None  # threading.get_ident() of the thread in the batch
        self.may_inline = False  # that thread held no device lock when it entered
        self.engines = {}  # engine -> EngineBatch, while its ring transaction is open
        self.resume = set()  # schedulers with jobs queued behind completions this thread retired
        self._outer = False

    def open(self) -> "SubmissionBatch":
        """Enter the batch (take the device lock); close() runs what it holds. `with` does
        both; a caller whose batch spans calls (the backend's kick) calls them itself."""
        dev = self.device
        free = dev.lock.enter()
        if dev._batch is None:
            self._outer = True
            self.owner = threading.get_ident()
            self.may_inline = free
            dev._batch = self
        return self

    __enter__ = open

    def close(self, *_exc) -> None:
        """Leave the batch: the outermost commits its rings and runs their short jobs, then
        releases the device lock and signals the fences that completed."""
        dev = self.device
        if not self._outer:
            dev.lock.release()
            return
        try:
            kicks = self._commit()
            while kicks:
                for engine in kicks:  # publish and run (nothing else publishes meanwhile)
                    dev.kick_sync_wptr[engine](dev.rings[engine].wptr)
                # the kicked jobs' completions handed the schedulers with jobs queued
                # behind them to this batch (resume): stage those jobs, commit, run them
                if not self.resume:
                    break
                self._schedule_resumed()
                kicks = self._commit()
            signals = dev._take_signals()
        finally:
            dev._batch = None
            dev.lock.release()
        if signals:
            fence_mod.signal_all((), None, signals)

    __exit__ = close

    def _schedule_resumed(self) -> None:
        """Hand the jobs queued behind this thread's completions to run_job (lock held)."""
        dev = self.device
        if dev.stopped:
            self.resume.clear()
        now = dev.clock_ns()
        while self.resume:
            sched = self.resume.pop()
            sched.schedule(now)
            dev._arm_timer(sched)

    def _commit(self) -> list:
        """Commit every staged transaction (lock held); -> the engines to kick."""
        dev = self.device
        kicks = []
        engines, self.engines = self.engines, {}
        for engine, staged in engines.items():
            kick = staged.inline and self.may_inline
            if staged.commit(dev, engine, kick) and kick:
                kicks.append(engine)
                dev.stats["jobs_inline"] += len(staged.jobs)
        return kicks

    def flush(self, engine: int) -> None:
        """Commit the engine's staged jobs now, with a doorbell (lock held)."""
        staged = self.engines.pop(engine, None)
        if staged is not None:
            staged.commit(self.device, engine, kick=False)
