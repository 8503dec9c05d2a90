"""Short jobs run to completion on the submitting thread (host/kmd/job.py): which jobs
do, which do not, and that the scheduler accounts for them exactly as for the others."""

import threading

import numpy as np
import pytest

from pvgpu.host.hw import gpu as gpu_mod
from pvgpu.host.hw import regs
from pvgpu.host.kmd import GpuFault
from pvgpu.host.kmd import job as job_mod
from pvgpu.host.kmd import lock as devlock
from pvgpu.host.kmd.sched import VgpuShares
from pvgpu.spec import wire

P = regs.PAGE_SIZE


@pytest.fixture
def dev(make_dev):
    return make_dev()


def fill(ctx, bo, value, n, wait=(), timeline=0):
    return ctx.submit_launch(wire.KERNEL_FILL, (1,), (1,),
                             [bo.va, int(np.float32(value).view(np.uint32)), n],
                             wait=wait, timeline=timeline)


def test_a_short_job_on_an_idle_ring_is_done_when_submit_returns(dev):
    ctx = dev.create_context()
    bo = ctx.alloc(P)
    seen = []
    f = fill(ctx, bo, 2.5, 64)
    assert f.signaled and f.error is None  # no wait: it ran on this thread
    f.add_done_callback(lambda fence: seen.append(threading.current_thread()))
    assert seen == [threading.current_thread()]
    c = ctx.submit_copy(bo.va, bo.va + 2048, 256)
    assert c.signaled and c.error is None
    assert dev.stats["jobs_inline"] == 2 and ctx.stats["jobs_completed"] == 2
    assert dev.gpu.engines[regs.ENGINE_COMPUTE].sync_kicks == 1
    assert dev.gpu.engines[regs.ENGINE_COMPUTE].doorbells == 0


def test_long_jobs_go_to_the_engine_thread(dev):
    ctx = dev.create_context()
    bo = ctx.alloc(4 * job_mod.INLINE_LAUNCH_ELEMENTS + 4 * P)
    big = ctx.alloc(job_mod.INLINE_COPY_BYTES + P)
    jobs = [fill(ctx, bo, 1.0, job_mod.INLINE_LAUNCH_ELEMENTS + 1),
            ctx.submit_launch(wire.KERNEL_BURN, (1,), (1,), [job_mod.INLINE_BURN_US + 1]),
            ctx.submit_copy(big.va, big.va, 0),  # no bytes: a NOP job, short
            ctx.submit_copy(bo.va, big.va, job_mod.INLINE_COPY_BYTES + 4, timeline=1)]
    assert all(f.wait(10) and f.error is None for f in jobs)
    assert dev.stats["jobs_inline"] == 1  # the NOP copy
    assert dev.gpu.engines[regs.ENGINE_COMPUTE].doorbells >= 1
    assert dev.gpu.engines[regs.ENGINE_COPY0].doorbells >= 1


def test_launch_bounds():
    def short(kernel_id, args):
        return job_mod.launch_load(kernel_id, args) <= 1.0
    n = job_mod.INLINE_LAUNCH_ELEMENTS
    assert short(wire.KERNEL_FILL, [0, 0, n]) and not short(wire.KERNEL_FILL, [0, 0, n + 1])
    assert short(wire.KERNEL_GEMM, [0, 0, 0, 16, 16, n // 256])
    assert not short(wire.KERNEL_GEMM, [0, 0, 0, 64, 64, 64])
    assert short(wire.KERNEL_BURN, [0]) and not short(wire.KERNEL_BURN, [wire.BURN_FOREVER])
    assert short(999, [])  # refused by the hardware at once


def test_a_job_with_a_dependency_or_behind_work_is_not_run_inline(dev, gate):
    ctx = dev.create_context()
    bo = ctx.alloc(P)
    g = gate()
    waiting = ctx.submit_copy(bo.va, bo.va + 2048, 64, wait=[g])
    behind = ctx.submit_copy(bo.va, bo.va + 1024, 64)  # queued behind it, same timeline
    ctx.submit_launch(wire.KERNEL_BURN, (1,), (1,), [wire.BURN_FOREVER], timeline=1)
    fill(ctx, bo, 3.0, 16, timeline=2)  # short, but the ring is busy (until the device stops)
    assert not waiting.signaled and not behind.signaled
    g.signal()  # the dependency's callback runs them, on this thread, through the engine
    assert waiting.wait(10) and behind.wait(10)
    assert waiting.error is None and behind.error is None
    assert dev.stats["jobs_inline"] == 0


def test_no_job_runs_inline_under_a_device_lock(dev):
    ctx = dev.create_context()
    bo = ctx.alloc(P)
    with dev.lock:
        f = fill(ctx, bo, 1.0, 16)
    assert f.wait(10) and f.error is None
    assert dev.stats["jobs_inline"] == 0


def test_a_fault_in_an_inline_job_is_reported_as_on_the_engine(dev):
    ctx = dev.create_context()
    bo = ctx.alloc(P)
    f = ctx.submit_copy(bo.va, bo.va + P, 8)  # the guard page after every BO
    assert f.signaled and dev.stats["jobs_inline"] == 1
    assert isinstance(f.error, GpuFault) and f.error.address == bo.va + P
    assert f.error.access == wire.ACCESS_WRITE and ctx.faults == [f.error]
    ok = fill(ctx, bo, 1.0, 16)  # the context keeps working
    assert ok.signaled and ok.error is None
    bad = ctx.submit_launch(999, (1,), (1,), [])
    assert bad.signaled and "illegal packet" in bad.error


class StepClock:
    """The device clock for the test: +1 µs on every read, from any thread."""

    def __init__(self):
        self.now = 10 ** 12
        self.lock = threading.Lock()

    def __call__(self):
        with self.lock:
            self.now += 1000
            return self.now


@pytest.mark.parametrize("inline", [True, False])
@pytest.mark.parametrize("policy", ["fifo", "credit", "band"])
def test_the_scheduler_accounts_for_both_paths_exactly(make_dev, monkeypatch, inline, policy):
    """Each job's device time (end - start, end = its fence's timestamp) is charged once
    to its vGPU and its ring, inline or not; the vGPU's credit drops by it."""
    monkeypatch.setattr(gpu_mod.Gpu, "clock_ns", staticmethod(StepClock()))
    vgpus = [VgpuShares("a", compute=70), VgpuShares("b", compute=30)]
    dev = make_dev(policy=policy, time_buffer_ns=0, vgpus=vgpus)
    dev.inline_jobs = inline
    ctxs = [dev.create_context(v.name, vgpu=v) for v in vgpus]
    bos = [c.alloc(P) for c in ctxs]
    fences = []
    for i in range(12):
        c = i % 2
        fences.append(fill(ctxs[c], bos[c], float(i), 32))
        assert fences[-1].wait(10) and fences[-1].error is None
    assert dev.stats["jobs_inline"] == (12 if inline else 0)
    sched = dev.schedulers[regs.ENGINE_COMPUTE]
    total = 0
    for name, c in (("a", 0), ("b", 1)):
        jobs = [f.job for f in fences[c::2]]
        busy = sum(j.end_ns - j.start_ns for j in jobs)
        assert all(j.run_ns <= j.start_ns < j.end_ns == f.timestamp
                   for j, f in zip(jobs, fences[c::2]))
        v = sched.vgpus[name]
        assert (v.jobs, v.busy_ns, v.in_flight) == (6, busy, 0)
        if policy != "fifo":
            assert v.credit == sched.period_ns * v.share // 100 - busy
        total += busy
    assert sched.busy_ns == total


def test_threads_submitting_short_jobs_at_once_all_complete(dev):
    """Submitters race for the idle ring: some kick it, the others find it busy and leave
    their jobs to the engine's thread (or to the kick in progress). Every job completes,
    once, with its own result."""
    n_threads, n_jobs = 4, 100
    ctxs = [dev.create_context(f"t{i}") for i in range(n_threads)]
    bos = [c.alloc(P) for c in ctxs]
    errors = []

    def submitter(i):
        try:
            for k in range(n_jobs):
                f = fill(ctxs[i], bos[i], float(k), 16, timeline=k % 2)
                if not f.wait(30) or f.error is not None:
                    errors.append((i, k, f))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((i, e))

    threads = [threading.Thread(target=submitter, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and not any(t.is_alive() for t in threads)
    sched = dev.schedulers[regs.ENGINE_COMPUTE]
    assert not sched.in_flight and sched.queued() == 0
    assert sched.stats["jobs_completed"] == n_threads * n_jobs
    assert dev.stats["jobs_inline"] >= 1  # the first submission found the ring idle
    assert all(c.stats["jobs_completed"] == n_jobs for c in ctxs)
    for bo in bos:  # each thread waited for each job: its last fill (one thread) is there
        assert dev.vram.view(bo.phys, 4).view(np.float32)[0] == n_jobs - 1


def test_a_fence_interrupt_retires_and_completes_its_job_in_one_lock_hold(dev):
    """The top half retires the hardware fence and marks the job done with the scheduler
    under one hold of the device lock; for a short job that hold is its submission's (it is
    kicked with RB_KICK_SYNC_WPTR inside it, and its interrupt arrives there): one hold of
    the device lock on its thread in all."""
    ctx = dev.create_context()
    bo = ctx.alloc(P)
    fill(ctx, bo, 1.0, 64)  # first-use paths (entity, pools) out of the way
    me = threading.get_ident()
    holds = []
    acquire = dev.lock._acquire

    def counting_acquire(*args):
        if threading.get_ident() == me:
            holds.append(1)
        return acquire(*args)
    dev.lock._acquire = counting_acquire
    try:
        f = fill(ctx, bo, 2.0, 64)
    finally:
        dev.lock._acquire = acquire
    assert f.signaled and f.error is None and dev.stats["jobs_inline"] == 2
    assert len(holds) == 1
    sched = dev.schedulers[regs.ENGINE_COMPUTE]
    assert not sched.in_flight and f.job.end_ns is not None  # accounted before it signalled


def test_a_short_job_that_faults_tells_its_error_listener_once_the_lock_is_released(dev):
    """A short job runs, and raises its interrupts, inside its submission's lock hold; the
    context's error listener (code outside the KMD) still runs with no device lock held."""
    ctx = dev.create_context()
    bo = ctx.alloc(P)
    fill(ctx, bo, 1.0, 64)
    seen = []
    ctx.error_listener = lambda c, err, timeline, engine: seen.append((err, devlock.held()))
    f = ctx.submit_launch(wire.KERNEL_FILL, (1,), (1,), [0x7000_0000_0000, 0, 64])  # unmapped
    assert f.signaled and isinstance(f.error, GpuFault) and dev.stats["jobs_inline"] == 2
    assert seen == [(f.error, False)]
