"""The KMD's scheduler on real emulated hardware: engines, vGPUs, timeouts and recovery."""

import time

import pytest

from pvgpu.host.hw import regs
from pvgpu.host.kmd.errors import ContextLost, InvalidArgument, JobTimedOut, OutOfMemory
from pvgpu.host.kmd.sched import VgpuShares
from pvgpu.spec import wire

P = regs.PAGE_SIZE
W = wire.GUEST_WINDOW_VA
MS = 1_000_000


def burn(ctx, us, wait=(), timeline=0):
    return ctx.submit_launch(wire.KERNEL_BURN, (1,), (1,), [us], wait=wait, timeline=timeline)


def test_a_hung_job_is_stopped_and_only_its_context_is_lost(make_dev):
    # [SCHED-TDR-1] the other context's job completes normally; [FENCE-LOST-2] queued work of the lost context fails ContextLost, later submissions too
    dev = make_dev(job_timeout_ns=200 * MS)
    bad, good = dev.create_context("bad"), dev.create_context("good")
    src, dst = good.alloc(P), good.alloc(P)
    hung = burn(bad, wire.BURN_FOREVER)
    queued_bad = burn(bad, 1)  # behind the hang on the same timeline
    innocent = burn(good, 1000)  # in the ring behind the hang, or queued
    copy = good.submit_copy(src.va, dst.va, P)  # another engine: not disturbed
    assert copy.wait(5) and copy.error is None
    assert hung.wait(5), "the hung job was not stopped"
    assert isinstance(hung.error, JobTimedOut)
    assert queued_bad.wait(5) and isinstance(queued_bad.error, ContextLost)
    assert innocent.wait(5) and innocent.error is None
    assert bad.lost and not good.lost
    with pytest.raises(ContextLost):
        burn(bad, 1)
    after = burn(good, 1)
    assert after.wait(5) and after.error is None
    assert dev.stats["timeouts"] == 1 and dev.gpu.engines[regs.ENGINE_COMPUTE].resets >= 1
    stats = dev.sched_stats()
    assert stats["timeouts"] == 1 and stats["contexts_lost"] == 1


def test_a_lost_context_loses_its_queued_work_on_every_ring(make_dev):
    dev = make_dev(job_timeout_ns=200 * MS)
    ctx = dev.create_context()
    a, b = ctx.alloc(P), ctx.alloc(P)
    hung = burn(ctx, wire.BURN_FOREVER)
    copy = ctx.submit_copy(a.va, b.va, P, wait=[hung], timeline=1)  # copy engine, waits
    assert copy.wait(5)
    assert isinstance(hung.error, JobTimedOut) and isinstance(copy.error, ContextLost)


def test_copies_in_each_direction_and_compute_overlap(make_dev):
    dev = make_dev()
    ctx = dev.create_context()
    a, b = ctx.alloc(P), ctx.alloc(P)
    k = burn(ctx, wire.BURN_FOREVER)  # the compute engine stays busy (until the device stops)
    h2d = ctx.submit_copy(a.va, b.va, P, direction="h2d", timeline=1)
    d2h = ctx.submit_copy(b.va, a.va, P, direction="d2h", timeline=2)
    assert h2d.wait(5) and d2h.wait(5)  # both copy engines ran while the compute engine was busy
    assert h2d.error is None and d2h.error is None and not k.signaled
    with pytest.raises(InvalidArgument):
        ctx.submit_copy(a.va, b.va, P, direction="sideways")


def test_streams_of_one_context_run_independently(make_dev):
    dev = make_dev()
    ctx = dev.create_context()
    slow = burn(ctx, 300_000, timeline=1)
    fast = burn(ctx, 1_000, timeline=2)
    assert fast.wait(5)
    # with a hardware limit of 2 the fast job is in the ring behind the slow one, or
    # queued; either way it completes after it, but it was never made to depend on it
    assert slow.wait(5)


def test_fence_timestamps_are_device_time(make_dev):
    dev = make_dev()
    ctx = dev.create_context()
    t0 = dev.clock_ns()
    f1 = burn(ctx, 20_000)
    f2 = burn(ctx, 20_000)
    assert f2.wait(5)
    assert t0 < f1.timestamp <= f2.timestamp <= dev.clock_ns()
    assert f2.timestamp - t0 >= 35 * MS  # two 20 ms burns, loosely


def test_vgpu_memory_share_is_a_quota(make_dev):
    dev = make_dev(vram_size=32 << 20)
    small = VgpuShares("small", compute=50, copy=50, mem=25)
    ctx = dev.create_context(vgpu=small)
    limit = dev.vgpu_mem_limit(small)
    bo = ctx.alloc(limit - P)
    with pytest.raises(OutOfMemory, match="share"):
        ctx.alloc(2 * P)
    ctx.free(bo)
    ctx.alloc(2 * P)
    other = dev.create_context()  # the default vGPU is not limited by "small"
    other.alloc(limit)
    with pytest.raises(InvalidArgument):
        dev.add_vgpu(VgpuShares("small", compute=10))


def test_sched_stats_account_per_vgpu(make_dev):
    dev = make_dev(policy="band")
    va, vb = VgpuShares("a", 50, 50, 50), VgpuShares("b", 50, 50, 50)
    ca, cb = dev.create_context(vgpu=va), dev.create_context(vgpu=vb)
    fa, fb = burn(ca, 30_000), burn(cb, 10_000)
    assert fa.wait(5) and fb.wait(5)
    stats = dev.sched_stats()
    assert stats["policy"] == "band"
    ea = stats["vgpus"]["a"]["compute"]
    eb = stats["vgpus"]["b"]["compute"]
    assert ea["jobs"] == 1 and eb["jobs"] == 1
    assert ea["busy_ns"] >= 25 * MS and eb["busy_ns"] >= 8 * MS
    assert stats["engines"]["compute"]["busy_ns"] >= ea["busy_ns"] + eb["busy_ns"] - 1


def test_stop_fails_queued_jobs(make_dev):
    dev = make_dev()
    ctx = dev.create_context()
    jobs = [burn(ctx, wire.BURN_FOREVER)] + [burn(ctx, 100_000) for _ in range(4)]
    dev.stop()  # the first job runs, the others are queued behind it
    assert all(j.signaled and j.error is not None for j in jobs)


def test_destroy_with_cancel_stops_its_running_job_and_drops_queued_work(make_dev, gate):
    # a job that would never end (and a job timeout far off): only a reset can stop it
    dev = make_dev(job_timeout_ns=600_000 * MS)
    ctx = dev.create_context()
    free = dev.vram_free()
    buf = ctx.alloc(1 << 20)
    on_gpu = burn(ctx, wire.BURN_FOREVER)
    queued = [burn(ctx, 50_000, wait=[gate()])] + [burn(ctx, 50_000) for _ in range(4)]
    assert buf.size and dev.vram_free() < free
    dev.destroy_context(ctx, cancel=True)
    assert all(j.wait(5) for j in [on_gpu, *queued]), "the running job was not stopped"
    assert isinstance(on_gpu.error, ContextLost) and "destroyed" in str(on_gpu.error)
    assert all(isinstance(j.error, ContextLost) for j in queued)
    deadline = time.monotonic() + 5
    while dev.vram_free() < free and time.monotonic() < deadline:
        time.sleep(0.01)
    assert dev.vram_free() >= free  # its memory came back without waiting for the job
    assert dev.stats["preemptions"] == 1 and dev.stats["timeouts"] == 0


def test_a_job_behind_the_stopped_one_runs_and_another_contexts_running_job_is_left_alone(make_dev):
    dev = make_dev(job_timeout_ns=600_000 * MS)
    gone, other = dev.create_context("gone"), dev.create_context("other")
    running = burn(gone, wire.BURN_FOREVER)
    behind = burn(other, 1000)  # in the ring behind it (hw_limit 2), not started
    dev.destroy_context(gone, cancel=True)
    assert running.wait(5) and isinstance(running.error, ContextLost)
    assert behind.wait(5) and behind.error is None  # handed to the engine again, completed
    # a ring whose running job is another context's is not reset: that job would start over
    first = burn(other, 300_000)
    gone2 = dev.create_context("gone2")
    queued = burn(gone2, 1000)
    dev.destroy_context(gone2, cancel=True)
    assert first.wait(5) and first.error is None
    assert queued.wait(5)
    assert dev.stats["preemptions"] == 1 and dev.stats["engine_resets"] == 1
