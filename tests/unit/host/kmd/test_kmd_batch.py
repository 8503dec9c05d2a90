"""Submission batches (host/kmd/batch.py): the jobs of a batch are committed to each
engine's ring in one transaction when it exits, errors stay with their own submission,
and a job another thread submits meanwhile is not held back behind the batch."""

import itertools
import threading
import time

import numpy as np
import pytest

from pvgpu.host.hw import regs
from pvgpu.host.kmd import InvalidArgument
from pvgpu.host.kmd import job as job_mod
from pvgpu.spec import kernels

P = regs.PAGE_SIZE


@pytest.fixture
def dev(make_dev):
    return make_dev(hw_limit=32)


def fill(ctx, va, value, n=1):
    return ctx.submit_launch(kernels.KERNEL_FILL, (1,), (1,),
                             [va, int(np.float32(value).view(np.uint32)), n])


def counters(dev, engine):
    e = dev.gpu.engines[engine]
    return e.doorbells, e.sync_kicks, dev.rings[engine].packets_committed


def test_sixteen_short_launches_in_a_batch_are_one_ring_commit_run_on_this_thread(dev):
    ctx = dev.create_context()
    bo = ctx.alloc(P)
    fill(ctx, bo.va, 0.0, 1024).wait(10)
    before = counters(dev, regs.ENGINE_COMPUTE)
    with dev.submission_batch():
        fences = [fill(ctx, bo.va + 4 * i, float(i + 1)) for i in range(16)]
        assert not any(f.signaled for f in fences)  # staged until the batch exits
    assert all(f.signaled and f.error is None for f in fences)  # RB_KICK_SYNC: done here
    doorbells, kicks, commits = (a - b for a, b in zip(counters(dev, regs.ENGINE_COMPUTE),
                                                      before))
    assert (doorbells, kicks, commits) == (0, 1, 1)
    assert list(dev.vram.view(bo.phys, 64).view(np.float32)) == [float(i + 1)
                                                                    for i in range(16)]
    assert ctx.stats["jobs_completed"] == 17


def test_a_batchs_short_jobs_run_and_retire_in_its_own_lock_hold(dev):
    """The exit publishes WPTR and kicks in one register write while it still holds the
    lock, so the kicked jobs' interrupt is handled in that hold: no lock round trip for
    their retirement, none for the exit's look at what they left queued."""
    ctx = dev.create_context()
    bo = ctx.alloc(P)
    fill(ctx, bo.va, 0.0, 1024).wait(10)
    acquire = dev.lock._acquire
    acquired = []

    def counting(*args):
        acquired.append(threading.get_ident())
        return acquire(*args)
    dev.lock._acquire = counting
    try:
        with dev.submission_batch():
            fences = [fill(ctx, bo.va + 4 * i, 1.0) for i in range(2)]
    finally:
        dev.lock._acquire = acquire
    assert all(f.signaled and f.error is None for f in fences)
    mine = acquired.count(threading.get_ident())
    assert mine == 3  # the batch's hold, and each submission's re-entrant one


def test_a_batch_with_a_long_job_rings_one_doorbell(dev):
    ctx = dev.create_context()
    bo = ctx.alloc(P)
    before = counters(dev, regs.ENGINE_COMPUTE)
    with dev.submission_batch():
        fences = [fill(ctx, bo.va + 4 * i, 1.0) for i in range(4)]
        fences.append(ctx.submit_launch(kernels.KERNEL_BURN, 1, 1,
                                        [job_mod.INLINE_BURN_US + 1]))
    assert all(f.wait(10) and f.error is None for f in fences)
    doorbells, kicks, commits = (a - b for a, b in zip(counters(dev, regs.ENGINE_COMPUTE),
                                                      before))
    assert (doorbells, kicks, commits) == (1, 0, 1)


def test_an_error_in_a_batch_stays_with_its_own_submission(dev):
    ctx = dev.create_context()
    bo = ctx.alloc(P)
    with dev.submission_batch():
        first = fill(ctx, bo.va, 1.0)
        with pytest.raises(InvalidArgument):
            ctx.submit_launch(kernels.KERNEL_FILL, (1,), (1,), [bo.va, 1 << 70, 1])
        fault = fill(ctx, 1 << 40, 2.0)  # accepted; faults on the GPU
        last = fill(ctx, bo.va + 4, 3.0)
    assert first.wait(10) and first.error is None
    assert fault.wait(10) and fault.error is not None
    assert last.wait(10) and last.error is None
    assert list(dev.vram.view(bo.phys, 8).view(np.float32)) == [1.0, 3.0]


def test_batches_nest_and_commit_once_at_the_outermost_exit(dev):
    ctx = dev.create_context()
    bo = ctx.alloc(P)
    before = counters(dev, regs.ENGINE_COMPUTE)
    with dev.submission_batch():
        with dev.submission_batch():
            inner = fill(ctx, bo.va, 1.0)
        assert not inner.signaled
        outer = fill(ctx, bo.va + 4, 2.0)
    assert inner.signaled and outer.signaled
    assert counters(dev, regs.ENGINE_COMPUTE)[2] - before[2] == 1


def test_another_threads_job_is_not_held_back_behind_an_open_batch(dev):
    """The batch's thread lets go of the lock in a Condition wait; a job another thread
    submits on the same ring then commits the batch's staged jobs and its own, and both
    complete while the batch is still open."""
    ctx = dev.create_context()
    other = dev.create_context()
    bo = ctx.alloc(P)
    obo = other.alloc(P)
    submitted = []
    with dev.submission_batch():
        staged = fill(ctx, bo.va, 1.0)
        t = threading.Thread(target=lambda: submitted.append(fill(other, obo.va, 2.0)))
        t.start()
        deadline = time.monotonic() + 10
        with dev._cond:  # releases the device lock while it waits
            while not (staged.signaled and submitted and submitted[0].signaled) \
                    and time.monotonic() < deadline:
                dev._cond.wait(0.01)
        assert staged.signaled and submitted and submitted[0].signaled
    t.join(10)
    assert staged.error is None and submitted[0].error is None


def _ticking_clock(dev):
    """The compute engine's clock, strictly increasing from call to call (as a fast GPU's
    would be between two fences): each fence's completion time differs."""
    tick = itertools.count(1)
    dev.gpu.engines[regs.ENGINE_COMPUTE].cp.clock = lambda: time.monotonic_ns() + next(tick)


def test_a_batch_of_short_jobs_raises_one_interrupt_and_each_job_keeps_its_end_time(dev):
    ctx = dev.create_context()
    bo = ctx.alloc(P)
    _ticking_clock(dev)
    sched = dev.schedulers[regs.ENGINE_COMPUTE]
    irqs, busy = dev.gpu.irq.counts[regs.IRQ_FENCE], sched.busy_ns
    with dev.submission_batch():
        fences = [fill(ctx, bo.va + 4 * i, 1.0) for i in range(8)]
    assert all(f.signaled and f.error is None for f in fences)
    assert dev.gpu.irq.counts[regs.IRQ_FENCE] - irqs == 1
    jobs = [f.job for f in fences]
    hw_stamps = [j.hw_fence.timestamp for j in jobs]
    assert hw_stamps == sorted(hw_stamps) and len(set(hw_stamps)) == 8
    assert [j.end_ns for j in jobs] == hw_stamps  # the scheduler saw each job's own end
    assert [f.timestamp for f in fences] == hw_stamps
    assert sched.busy_ns - busy == sum(j.end_ns - j.start_ns for j in jobs)


def test_a_long_job_in_a_batch_keeps_its_interrupt_and_the_short_one_before_it_too(dev):
    ctx = dev.create_context()
    bo = ctx.alloc(P)
    irqs = dev.gpu.irq.counts[regs.IRQ_FENCE]
    with dev.submission_batch():
        fences = [fill(ctx, bo.va, 1.0), fill(ctx, bo.va + 4, 2.0),
                  ctx.submit_launch(kernels.KERNEL_BURN, 1, 1, [job_mod.INLINE_BURN_US + 1]),
                  fill(ctx, bo.va + 8, 3.0)]
    assert all(f.wait(10) and f.error is None for f in fences)
    # the second fill (before the long job), the long job, the last fill: not the first
    assert dev.gpu.irq.counts[regs.IRQ_FENCE] - irqs == 3


def test_short_jobs_queued_behind_hw_limit_still_run_on_the_batchs_thread(make_dev):
    """With hw_limit 2, a batch of 16 short launches stages 2; their completion hands the
    next 2 to run_job on the exiting thread, which stages and kicks them, and so on: all
    16 run there, no doorbell wakes the engine's thread."""
    dev = make_dev(hw_limit=2)
    ctx = dev.create_context()
    bo = ctx.alloc(P)
    engine = dev.gpu.engines[regs.ENGINE_COMPUTE]
    inline, doorbells = dev.stats["jobs_inline"], engine.doorbells
    with dev.submission_batch():
        fences = [fill(ctx, bo.va + 4 * i, float(i + 1)) for i in range(16)]
    assert all(f.signaled and f.error is None for f in fences)
    assert dev.stats["jobs_inline"] - inline == 16
    assert engine.doorbells == doorbells
    assert list(dev.vram.view(bo.phys, 64).view(np.float32)) == [float(i + 1)
                                                                 for i in range(16)]


def test_a_staged_jobs_device_time_starts_when_the_batch_commits_it(dev):
    """Chains decoded after a job was staged do not count as its device time: the
    scheduler charges it from the commit at the batch's exit."""
    ctx = dev.create_context()
    bo = ctx.alloc(P)
    real = dev.clock_ns
    offset = [0]
    dev.clock_ns = lambda: real() + offset[0]  # the KMD's clock, which the test moves on
    with dev.submission_batch():
        f = fill(ctx, bo.va, 1.0)
        offset[0] = 1_000_000_000  # 1 s of other chains before the batch exits
        committed_after = dev.clock_ns()
    assert f.signaled and f.error is None
    assert f.job.start_ns >= committed_after
