"""pvgpu.host.kmd.lock: no fence callback runs while its thread holds a device lock, so two
devices with dependencies on each other's fences never take their locks in both orders.

The deadlock tests bound every wait by a timeout and fail instead of hanging; after a
deadlock they leave the (daemon) threads and the devices behind rather than stop them,
since stopping takes the locks that stay held."""

import threading
import time

import pytest

from pvgpu.host.hw.gpu import Platform
from pvgpu.host.kmd import KmdDevice
from pvgpu.host.kmd.fence import Fence, signal_all
from pvgpu.host.kmd.lock import DeviceCondition, DeviceLock
from pvgpu.spec import kernels

TIMEOUT = 30.0  # seconds: far beyond what the work needs, only there to end a deadlock


class RacingFence(Fence):
    """A dependency that signals exactly while a scheduler registers its callback on it:
    the moment between the scheduler's `signaled` check and add_done_callback, in which
    the engine thread of the dependency may signal it. After arm(barrier), the next
    registration first meets `barrier` (so that both submitters are inside their device's
    submission at once), then signals the fence, then registers."""

    __slots__ = ("_barrier",)

    def __init__(self):
        super().__init__(-1, 1)
        self._barrier = None

    def arm(self, barrier: threading.Barrier) -> None:
        self._barrier = barrier

    def add_done_callback(self, fn) -> None:
        barrier, self._barrier = self._barrier, None
        if barrier is not None:
            barrier.wait()
            self.signal()
        super().add_done_callback(fn)


def nop(ctx, wait=()):
    """A job that touches no memory (one NOP packet); -> its finished fence."""
    return ctx.submit_copies([(0, 0, 0)], wait)


def run_bounded(targets) -> list:
    """Run each target on its own daemon thread; -> the targets still running after
    TIMEOUT (deadlocked). Exceptions of the targets are raised here."""
    errors = []

    def guard(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported to the test
            errors.append(e)
    threads = [threading.Thread(target=guard, args=(t,), daemon=True) for t in targets]
    for t in threads:
        t.start()
    deadline = time.monotonic() + TIMEOUT
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [t for t in threads if t.is_alive()]
    if errors and not stuck:
        raise errors[0]
    return stuck


@pytest.fixture
def two_devices():
    """Two started KMD devices on one platform; stopped at teardown unless the test
    deadlocked them (then they are left to the daemon threads)."""
    platform = Platform(2, 32 << 20)
    devs = [KmdDevice(g) for g in platform.gpus]
    for d in devs:
        d.start()
    state = {"deadlocked": False}
    yield devs, state
    if not state["deadlocked"]:
        for d in devs:
            d.stop()
        platform.stop()


def test_cross_device_dependencies_signalled_during_submission_do_not_deadlock(two_devices):
    """Device A's submitter holds A's lock when the dependency it registers on signals;
    the dependency's callbacks include device B's scheduler (a job of B waits for it).
    At the same moment B's submitter, holding B's lock, sees the mirror image. If the
    callbacks ran under the submitters' locks, each would wait for the other's lock."""
    (a, b), state = two_devices
    ca, cb = a.create_context("a"), b.create_context("b")
    x, y = RacingFence(), RacingFence()
    queued = [nop(cb, [x]), nop(ca, [y])]  # B's scheduler waits for x, A's for y
    assert not any(f.signaled for f in queued)
    barrier = threading.Barrier(2, timeout=TIMEOUT)
    x.arm(barrier)
    y.arm(barrier)
    done = {}
    stuck = run_bounded([lambda: done.setdefault("a", nop(ca, [x])),
                         lambda: done.setdefault("b", nop(cb, [y]))])
    if stuck:
        state["deadlocked"] = True
        pytest.fail(f"the two submitters deadlocked: {len(stuck)} of 2 still waiting after "
                    f"{TIMEOUT:g} s (a fence callback ran under a device lock)")
    for f in queued + [done["a"], done["b"]]:
        assert f.wait(TIMEOUT) and f.error is None, f


# ---------------------------------------------------------------------- DeviceLock itself
def test_callbacks_of_a_fence_signalled_under_the_lock_run_after_release():
    lock = DeviceLock()
    f = Fence(-1, 1)
    seen = []
    f.add_done_callback(lambda _f: seen.append(("callback", lock._is_owned())))
    with lock:
        with lock:  # nested: still held after the inner release
            f.signal()
            seen.append(("signalled", f.signaled))
        assert seen == [("signalled", True)]  # marked at once, callback not yet run
    assert seen == [("signalled", True), ("callback", False)]


def test_entering_the_lock_says_whether_the_thread_held_no_device_lock():
    """`with lock as outermost`: what a short job's submission asks before it runs the job
    on its own thread (job.py, batch.py), without a separate call."""
    a, b = DeviceLock(), DeviceLock()
    with a as outer_a:
        with a as again:
            with b as outer_b:
                assert (outer_a, again, outer_b) == (True, False, False)
    with b as outer_b:
        assert outer_b is True


def test_a_callback_added_to_a_signalled_fence_under_the_lock_runs_after_release():
    lock = DeviceLock()
    f = Fence.signaled_fence()
    seen = []
    with lock:
        f.add_done_callback(lambda _f: seen.append(lock._is_owned()))
        assert seen == []
    assert seen == [False]


def test_callbacks_wait_for_every_device_lock_of_the_thread_and_keep_their_order():
    a, b = DeviceLock(), DeviceLock()
    fences = [Fence(-1, i) for i in range(3)]
    seen = []
    for f in fences:
        f.add_done_callback(lambda f: seen.append((f.seq, a._is_owned(), b._is_owned())))
    with a:
        with b:
            signal_all(fences[:2])
        fences[2].signal()
        assert seen == []  # a is still held
    assert seen == [(0, False, False), (1, False, False), (2, False, False)]


def test_callbacks_run_when_a_condition_wait_releases_the_lock():
    """A thread waiting on a Condition of the lock holds no lock: what it queued runs."""
    lock = DeviceLock()
    cond = threading.Condition(lock)
    f = Fence(-1, 1)
    seen = []
    f.add_done_callback(lambda _f: seen.append(lock._is_owned()))
    with lock:
        with lock:
            f.signal()
            assert seen == []
            cond.wait(0)  # releases both levels, then takes them back
            assert seen == [False] and lock._is_owned()
    assert seen == [False]


def test_a_callback_that_takes_the_lock_and_signals_again_is_run_too():
    lock = DeviceLock()
    first, second = Fence(-1, 1), Fence(-1, 2)
    seen = []

    def chain(_f):
        with lock:
            second.signal()
            seen.append("chain")
    first.add_done_callback(chain)
    second.add_done_callback(lambda _f: seen.append(("second", lock._is_owned())))
    with lock:
        first.signal()
    assert seen == ["chain", ("second", False)]


def test_other_threads_are_not_affected():
    """Deferral is per thread: a fence signalled on a thread without a device lock runs
    its callbacks at once, even while another thread holds one."""
    lock = DeviceLock()
    f = Fence(-1, 1)
    seen = []
    f.add_done_callback(lambda _f: seen.append(threading.current_thread().name))
    with lock:
        t = threading.Thread(target=f.signal, name="signaller")
        t.start()
        t.join(TIMEOUT)
        assert seen == ["signaller"]


def test_a_device_condition_counts_its_waiters_and_a_retirement_wakes_them(make_dev):
    """The device's condition counts the threads in wait(), so a job's retirement notifies
    only when one waits; one that does is woken by the retirement."""
    dev = make_dev()
    assert isinstance(dev._cond, DeviceCondition)
    ctx = dev.create_context()
    woken = threading.Event()

    def waiter():
        with dev.lock:
            jobs = ctx.stats["jobs_completed"]
            dev._cond.wait_for(lambda: ctx.stats["jobs_completed"] > jobs, 2 * TIMEOUT)
        woken.set()
    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    deadline = time.monotonic() + TIMEOUT
    while dev._cond.waiting != 1 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert dev._cond.waiting == 1
    assert ctx.submit_launch(kernels.KERNEL_BURN, 1, 1, [0]).wait(TIMEOUT)
    assert woken.wait(TIMEOUT)  # by the notification, not its own timeout
    t.join(TIMEOUT)
    assert dev._cond.waiting == 0
