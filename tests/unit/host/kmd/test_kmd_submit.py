"""The submission context (host/kmd/submit.py): run_job happens only on a submitting thread
or on the device's submission worker, never on an engine (interrupt) thread."""

import threading

from pvgpu.host.hw import regs
from pvgpu.host.kmd.errors import JobTimedOut
from pvgpu.host.kmd.job import INLINE_BURN_US, INLINE_COPY_BYTES
from pvgpu.spec import kernels

P = regs.PAGE_SIZE
MS = 1_000_000


def burn(ctx, us, wait=(), timeline=0):
    return ctx.submit_launch(kernels.KERNEL_BURN, (1,), (1,), [us], wait=wait,
                             timeline=timeline)


def record_run_job(dev) -> list:
    """-> [(job, thread)] of every run_job from now on."""
    ran = []
    run_job = dev.run_job

    def recording(job):
        ran.append((job, threading.current_thread()))
        return run_job(job)
    dev.run_job = recording  # the schedulers call ops.run_job: the instance attribute wins
    return ran


def threads_of(ran, fence) -> list:
    return [t for job, t in ran if job.finished is fence]


def engine_threads(dev) -> set:
    return {e.name for e in dev.gpu.engines}


def test_a_job_queued_behind_a_completing_one_runs_in_the_submission_worker(make_dev, gate):
    dev = make_dev(hw_limit=1)
    ctx = dev.create_context()
    ran = record_run_job(dev)
    g = gate()
    first = burn(ctx, 100, wait=[g])
    second = burn(ctx, 0)  # behind `first` on its timeline: it runs once `first` completed
    g.signal()  # the dependency's wake queues the ring to the worker
    assert second.wait(5) and first.error is None and second.error is None
    worker = dev.submit_wq.thread
    assert threads_of(ran, first) == [worker]
    assert threads_of(ran, second) == [worker]  # not the engine thread that completed `first`


def test_a_dependency_signalled_on_an_engine_thread_does_not_run_the_job_there(make_dev, gate):
    dev = make_dev()
    ctx = dev.create_context()
    ran = record_run_job(dev)
    g0, g1 = gate(), gate()
    first = burn(ctx, 100, wait=[g0])
    signalled_on = []

    def on_first(_f):  # on the engine thread that raised first's interrupt
        signalled_on.append(threading.current_thread().name)
        g1.signal()
    first.add_done_callback(on_first)
    waiter = burn(ctx, 0, wait=[g1], timeline=1)
    g0.signal()
    assert waiter.wait(5) and waiter.error is None
    assert signalled_on and signalled_on[0] in engine_threads(dev)
    assert threads_of(ran, waiter) == [dev.submit_wq.thread]


def test_jobs_queued_behind_a_full_hw_limit_all_complete_and_never_run_on_an_engine(make_dev):
    dev = make_dev(hw_limit=1)
    ctx = dev.create_context()
    size = 2 * INLINE_COPY_BYTES  # jobs too long to run on the submitting thread
    a, b = ctx.alloc(size), ctx.alloc(size)
    ran = record_run_job(dev)
    fences = []
    for i in range(40):
        fences.append(burn(ctx, 2 * INLINE_BURN_US, timeline=i % 3))
        fences.append(ctx.submit_copy(a.va, b.va, size, timeline=3 + i % 2))
    assert all(f.wait(10) for f in fences)
    assert all(f.error is None for f in fences)
    assert len(ran) == len(fences)
    engines = engine_threads(dev)
    assert not [t.name for _job, t in ran if t.name in engines]
    assert {t for _job, t in ran} <= {threading.current_thread(), dev.submit_wq.thread}


def test_a_completion_with_nothing_queued_hands_nothing_to_the_worker(make_dev):
    dev = make_dev()
    ctx = dev.create_context()
    before = dev.submit_wq.handoffs
    for _ in range(5):
        f = burn(ctx, 100)
        assert f.wait(5) and f.error is None
    assert dev.submit_wq.handoffs == before


def test_recovery_resubmits_the_innocent_jobs_in_the_submission_worker(make_dev):
    dev = make_dev(job_timeout_ns=200 * MS)
    bad, good = dev.create_context("bad"), dev.create_context("good")
    ran = record_run_job(dev)
    hung = burn(bad, kernels.BURN_FOREVER)
    innocent = burn(good, 1000)  # in the ring behind the hang: resubmitted after the reset
    assert hung.wait(5) and isinstance(hung.error, JobTimedOut)
    assert innocent.wait(5) and innocent.error is None
    threads = threads_of(ran, innocent)
    assert len(threads) == 2 and threads[1] is dev.submit_wq.thread
    assert dev.stats["timeouts"] == 1
