"""The fixed cost of a job in the KMD and the hardware, counted in Python function calls
(deterministic, unlike a time): a short launch on an idle ring runs to completion on the
submitting thread (job.py), so every call it costs happens on that thread, where
sys.setprofile sees it."""

import sys

import pytest
from anymachine import python_calls_per_run

from pvgpu.spec import kernels

# Python-level calls of one burn(0) launch, submitted and its fence waited for: submission,
# scheduling, run_job, the ring, the doorbell, the command processor, the interrupt,
# retirement and signalling. 210 before issue 12's per-job cuts, 148 after them, 137 after
# submission batches, 118 after the second pass (one lock hold for retirement and
# completion, no notify without a waiter, fewer helper calls in the ring and the CP), 78
# after the third (a ring fetch runs the job's IB, FENCE and padding in one engine step,
# IB + FENCE in one ring write, no scheduled fence unless asked for, the scheduler's
# common path without helpers, fences signalled in one lock hold), 69 after the fourth
# (no reclaim pass or timer arming without a reason, the top half's clock from the
# interrupt's timestamp, no stop check before an IB's first packet or after a burn ends), 67
# with fences marked inline by signal_all, 65 with the timer's test before arm() and the
# vGPU's idle time set in place; 62 after the fifth (publish and kick in one register write
# and the interrupt retiring the job in the submission's lock hold, one signal list for the
# device, no timer pass for a ring left idle, one job object), 64 with signal_all marking
# each fence in a call (cheaper than the iterator chain it replaced), 62 with the device
# clock read through its register's reader; 55 after the sixth (the job handed to
# the hardware at push when schedule() would do it at once, the kick written through the
# register's own writer, no second signal take, the interrupt delivered without helper
# calls, the IB's space given back without a helper). (The counts above are of the job;
# the test's own wrapper adds 2.) 43 after the seventh (the command processor's packet
# lookup and call inline in the ring fetch and the IB, no stop check after a FENCE's
# write, one interrupt entry, a LAUNCH's slots decoded in launch_slots, the launch's
# arguments checked without a list, the outermost-lock test from the lock's entry, the
# entity looked up inline). (From here on, the counts include the test's wrapper: 47;
# inlining the signal take, the fence marking and the scheduler's finish as well made it
# 44, with three copies of code: not done.)
CALLS_PER_JOB = 51  # (49 counted with the entity and the ring's padding through their own
# helpers; 2 above the count, as the budgets below)
# ... of a fill of 256 elements: the MMU translation and the kernel on top (158 before the
# second pass, 133 after it: PTE permissions looked up, no floating-point state for fill;
# 93 after the third, 85 after the fourth, 83 with fences marked inline, 81 with the timer's test
# before arm(), 80 after the fifth, 78 with the clock's reader, 63 after the sixth: the
# arguments decoded by one struct, a one-page TLB hit without the walk's calls, a
# one-chunk elementwise kernel without the CU split); 55 after the seventh (with the
# test's wrapper)
CALLS_PER_FILL = 59  # (57 counted)
# ... of the same fill as one LAUNCH_BATCH job in a submission batch, as the host submits
# a kick's chains (batch.py): 123 before the sixth pass, 100 after it (the batch's kick
# and the job's retirement in its one lock hold, besides the cuts above), 94 with the
# launches checked, packed and weighed in one loop and no resume pass when none is due,
# 93 with the IB's space given back without a helper; 77 after the seventh (with the
# test's wrapper; besides the cuts above: the batch's lock entry and commit without
# helper calls, the last FENCE's interrupt flag set in its staged packet)
CALLS_PER_BATCHED_FILL = 82  # (80 counted)


@pytest.fixture
def dev(make_dev):
    return make_dev()


def test_a_short_launch_stays_within_its_call_budget(dev):
    ctx = dev.create_context()

    def launch():
        f = ctx.submit_launch(kernels.KERNEL_BURN, 1, 1, [0])
        assert f.signaled and f.error is None  # ran on this thread: all its calls counted

    for _ in range(5):  # first-use paths (entities, pools) out of the way
        launch()
    calls = python_calls_per_run(launch, 20)
    assert dev.stats["jobs_inline"] == 25
    assert calls <= CALLS_PER_JOB, f"{calls} Python calls per job (budget {CALLS_PER_JOB})"


def test_a_short_fill_stays_within_its_call_budget(dev):
    ctx = dev.create_context()
    bo = ctx.alloc(4096)
    one = 0x3F800000  # 1.0f

    def launch():
        f = ctx.submit_launch(kernels.KERNEL_FILL, 1, 256, [bo.va, one, 256])
        assert f.signaled and f.error is None

    for _ in range(5):
        launch()
    calls = python_calls_per_run(launch, 20)
    assert dev.stats["jobs_inline"] == 25
    assert calls <= CALLS_PER_FILL, f"{calls} Python calls per fill (budget {CALLS_PER_FILL})"


def test_a_short_fill_in_a_submission_batch_stays_within_its_call_budget(dev):
    ctx = dev.create_context()
    bo = ctx.alloc(4096)
    one = 0x3F800000  # 1.0f

    def kick():
        with dev.submission_batch():
            f = ctx.submit_launches([(kernels.KERNEL_FILL, 1, 256, [bo.va, one, 256])])
        assert f.signaled and f.error is None  # ran on this thread at the batch's exit

    for _ in range(5):
        kick()
    calls = python_calls_per_run(kick, 20)
    assert dev.stats["jobs_inline"] == 25
    assert calls <= CALLS_PER_BATCHED_FILL, \
        f"{calls} Python calls per batched fill (budget {CALLS_PER_BATCHED_FILL})"
