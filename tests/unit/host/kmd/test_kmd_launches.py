"""Several built-in launches as one job (Context.submit_launches, host/kmd/job.py): one IB
of LAUNCH packets run in order under one fence, every launch checked before any is
submitted, a fault that skips the rest, and the short-job bound over their sum."""

import numpy as np
import pytest

from pvgpu.host.hw import regs
from pvgpu.host.kmd import InvalidArgument
from pvgpu.host.kmd import job as job_mod
from pvgpu.spec import wire

P = regs.PAGE_SIZE


@pytest.fixture
def dev(make_dev):
    return make_dev()


def f32(x: float) -> int:
    return int(np.float32(x).view(np.uint32))


def fill(va, value, n=64):
    return wire.KERNEL_FILL, 1, n, [va, f32(value), n]


def scale(va, alpha, n=64):
    return wire.KERNEL_SCALE, 1, n, [va, va, f32(alpha), n]


def read(ctx, bo, n=64):
    return np.frombuffer(ctx.device.vram.read(bo.phys, 4 * n), np.float32)


def test_launches_run_in_order_as_one_job(dev):
    ctx = dev.create_context()
    bo = ctx.alloc(P)
    f = ctx.submit_launches([fill(bo.va, 1.0), scale(bo.va, 3.0), fill(bo.va + 4, 5.0, 1),
                             scale(bo.va, 0.5)])
    assert f.wait(10) and f.error is None
    want = np.full(64, 1.5, np.float32)
    want[1] = 2.5
    np.testing.assert_array_equal(read(ctx, bo), want)
    assert ctx.stats["jobs_submitted"] == 1 and ctx.stats["launches"] == 4


def test_every_launch_is_checked_before_any_is_submitted(dev):
    ctx = dev.create_context()
    bo = ctx.alloc(P)
    bad = [(wire.KERNEL_FILL, (1, 2, 3, 4), 1, [bo.va, 0, 1]),  # a four-dimensional grid
           (-1, 1, 1, []),
           (wire.KERNEL_FILL, 1, 1, [bo.va, 1 << 64, 1])]
    for b in bad:
        with pytest.raises(InvalidArgument):
            ctx.submit_launches([fill(bo.va, 2.0), b])
    with pytest.raises(InvalidArgument):
        ctx.submit_launches([])
    with pytest.raises(InvalidArgument):
        ctx.submit_launches([fill(bo.va, 2.0)] * (job_mod.MAX_LAUNCHES_PER_JOB + 1))
    assert ctx.stats["jobs_submitted"] == 0
    assert not read(ctx, bo).any()


def test_a_fault_fails_the_job_and_skips_the_launches_after_it(dev):
    ctx = dev.create_context()
    bo = ctx.alloc(P)
    f = ctx.submit_launches([fill(bo.va, 1.0), fill(0x3000_0000_0000, 2.0), fill(bo.va, 9.0)])
    assert f.wait(10) and f.error is not None
    np.testing.assert_array_equal(read(ctx, bo), np.full(64, 1.0, np.float32))


def test_a_job_of_launches_is_short_while_their_loads_add_up_to_one(dev):
    ctx = dev.create_context()
    n = job_mod.INLINE_LAUNCH_ELEMENTS // 4
    bo = ctx.alloc(4 * n + P)
    ctx.submit_launches([fill(bo.va, 1.0, n)] * 4).wait(10)
    assert dev.stats["jobs_inline"] == 1  # four quarters: short, run on this thread
    ctx.submit_launches([fill(bo.va, 1.0, n)] * 5).wait(10)
    assert dev.stats["jobs_inline"] == 1  # five: the engine's thread runs it
    assert dev.gpu.engines[regs.ENGINE_COMPUTE].doorbells >= 1
