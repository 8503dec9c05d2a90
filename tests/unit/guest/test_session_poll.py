"""The shared-model wait of FrontendSession (guest/frontend/session.py `wait_for`): it
polls the used rings without a message from the host, and between two looks it yields
the core (sched_yield), so that host threads sharing the core can produce what it waits
for. Sans-IO: a stand-in device whose request completes at its third reap, no channel.
A wait expected to be long blocks until shortly before its expected end and polls from
there (stand-ins for the session's clock and for a channel that stays silent)."""

import os

import pytest

from pvgpu.guest.frontend import session as session_mod
from pvgpu.guest.frontend.session import FrontendSession
from pvgpu.spec import wire
from pvgpu.transport.errors import ChannelTimeout


class SlowDevice:
    """Completes its one request at the `done_at`-th reap."""

    deferred = 0  # nothing for flush() to kick
    queue = None

    def __init__(self, done_at: int):
        self.reaps = 0
        self.done_at = done_at

    def reap(self) -> int:
        self.reaps += 1
        return int(self.reaps == self.done_at)

    @property
    def done(self) -> bool:
        return self.reaps >= self.done_at


def _polling_session(devices) -> FrontendSession:
    s = FrontendSession.__new__(FrontendSession)
    s.endpoint, s.memory, s.inline, s.timeout = "none", wire.MEMORY_SHARED, False, 5.0
    s.devices, s.closed, s.host_lost = devices, False, False
    s._wait_ewma, s._kicks = 0.0, {}
    s.POLL_SECONDS = s.POLL_MAX = 3600.0  # the poll window never runs out in this test
    s.channel = None  # a poll that finds its answer never touches the channel
    return s


def test_a_polling_wait_yields_the_core_between_two_looks_at_the_rings(monkeypatch):
    yields = []
    monkeypatch.setattr(os, "sched_yield", lambda: yields.append(len(yields)))
    dev = SlowDevice(done_at=3)
    s = _polling_session([dev])
    s.wait_for(lambda: dev.done)
    assert dev.reaps == 3
    assert len(yields) == 2  # after the first and the second look, not after the last


def test_a_wait_already_satisfied_does_not_yield(monkeypatch):
    yields = []
    monkeypatch.setattr(os, "sched_yield", lambda: yields.append(1))
    dev = SlowDevice(done_at=1)
    _polling_session([dev]).wait_for(lambda: dev.done)
    assert yields == []


# ------------------------------------------------------- long waits: block, then poll
class Clock:
    """The session's time source (its module's `time`), advanced by the test's stand-ins."""

    def __init__(self):
        self.now = 100.0
        self.sleeps = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class TimedDevice:
    """Completes its one request at clock time `done_at`."""

    deferred = 0
    queue = None

    def __init__(self, clock: Clock, done_at: float):
        self.clock, self.done_at = clock, done_at

    def reap(self) -> int:
        return 0

    @property
    def done(self) -> bool:
        return self.clock.now >= self.done_at


class CallingChannel:
    """A host whose `call` arrives at clock time `call_at` (a receive blocked then ends)."""

    heartbeat_ms = 0

    def __init__(self, clock: Clock, call_at: float):
        self.clock, self.call_at = clock, call_at
        self.timeouts = []

    def recv_until(self, _pred, timeout):
        self.timeouts.append(timeout)
        if self.clock.now + timeout < self.call_at:
            self.clock.now += timeout
            raise ChannelTimeout("nothing")
        self.clock.now = self.call_at
        return {"op": wire.OP_CALL, "dev": 0, "queue": wire.CONTROLQ}, []


class SilentChannel:
    """A host that sends no `call`: each blocking receive times out after its timeout."""

    heartbeat_ms = 0  # no liveness check

    def __init__(self, clock: Clock):
        self.clock = clock
        self.timeouts = []

    def recv_until(self, _pred, timeout):
        self.timeouts.append(timeout)
        self.clock.now += timeout
        raise ChannelTimeout("nothing")


def _timed_session(monkeypatch, clock, ewma: float) -> FrontendSession:
    monkeypatch.setattr(session_mod, "time", clock)
    monkeypatch.setattr(os, "sched_yield", lambda: setattr(clock, "now", clock.now + 20e-6))
    s = FrontendSession.__new__(FrontendSession)
    s.endpoint, s.memory, s.inline, s.timeout = "none", wire.MEMORY_SHARED, False, 5.0
    s.closed, s.host_lost = False, False
    s._wait_ewma, s._kicks, s._kind_waits = ewma, {}, {}
    s.channel = SilentChannel(clock)
    return s


def test_a_long_wait_blocks_until_shortly_before_its_expected_end_then_polls(monkeypatch):
    clock = Clock()
    s = _timed_session(monkeypatch, clock, ewma=0.010)  # recent waits took 10 ms
    dev = TimedDevice(clock, done_at=100.0098)
    s.devices = [dev]
    s.wait_for(lambda: dev.done)
    # one block, up to a lead of a quarter of the expected 10 ms (at most POLL_MAX / 2),
    # asked a channel tick shorter (its receive ends on a whole millisecond), the rest slept
    lead = min(s.POLL_MAX / 2, 0.010 / 4)
    assert s.channel.timeouts == [pytest.approx(0.010 - lead - s.CHANNEL_TICK)]
    assert clock.sleeps[0] == pytest.approx(s.CHANNEL_TICK)
    # then it looked every POLL_NAP (sleeping between looks) and saw the completion
    # within one nap, without waiting for a `call`
    assert clock.sleeps[1:] and all(t == s.POLL_NAP for t in clock.sleeps[1:])
    assert clock.now - dev.done_at <= s.POLL_NAP + 1e-9


def test_a_long_wait_that_the_poll_misses_blocks_again(monkeypatch):
    clock = Clock()
    s = _timed_session(monkeypatch, clock, ewma=0.010)
    dev = TimedDevice(clock, done_at=100.5)  # far longer than expected
    s.devices = [dev]
    s.wait_for(lambda: dev.done)
    lead = min(s.POLL_MAX / 2, 0.010 / 4)
    assert s.channel.timeouts[0] == pytest.approx(0.010 - lead - s.CHANNEL_TICK)
    # polled for twice the lead, then blocked in slices (a `call` would end them)
    assert s.channel.timeouts[1:] and all(t == s.BLOCK_SLICE for t in s.channel.timeouts[1:])
    assert clock.now >= dev.done_at


def test_a_wait_of_a_kind_expects_what_earlier_waits_of_that_kind_took(monkeypatch):
    clock = Clock()
    s = _timed_session(monkeypatch, clock, ewma=0.0)  # recent waits of any kind: short
    s._kind_waits[("h2d", 25)] = 0.004  # ... but copies of this kind took 4 ms
    dev = TimedDevice(clock, done_at=100.0039)
    s.devices = [dev]
    s.wait_for(lambda: dev.done, kind=("h2d", 25))
    assert s.channel.timeouts == [pytest.approx(0.004 - 0.001 - s.CHANNEL_TICK)]  # not polled through
    took = clock.now - 100.0
    assert took < 0.004  # polled: seen at once; a long wait's estimate falls at 0.7
    assert s._kind_waits[("h2d", 25)] == pytest.approx(0.004 + 0.7 * (took - 0.004))
    assert s._wait_ewma == 0.0  # the kind's waits are its own


def test_a_short_wait_is_polled_from_the_start(monkeypatch):
    clock = Clock()
    s = _timed_session(monkeypatch, clock, ewma=0.0005)
    dev = TimedDevice(clock, done_at=100.0004)
    s.devices = [dev]
    s.wait_for(lambda: dev.done)
    assert s.channel.timeouts == []


def test_a_long_wait_that_a_call_ended_before_its_poll_lowers_the_expectation_fast(monkeypatch):
    # seen through a `call`, the request completed up to a call's latency earlier: the
    # wait counts a lead less, and a long wait's estimate falls at 0.7 (rises at 0.3), so
    # the next wait of the kind begins its poll before the completion
    clock = Clock()
    s = _timed_session(monkeypatch, clock, ewma=0.0)
    s.mem = None
    s._kind_waits["d2d"] = 0.010
    s.channel = CallingChannel(clock, call_at=100.002)
    dev = TimedDevice(clock, done_at=100.0018)
    s.devices = [dev]
    s.wait_for(lambda: dev.done, kind="d2d")
    assert len(s.channel.timeouts) == 1  # ended by the call, while blocked
    lead = min(s.POLL_MAX / 2, 0.010 / 4)
    assert s._kind_waits["d2d"] == pytest.approx(0.010 + 0.7 * ((0.002 - lead) - 0.010))


def test_a_wait_of_a_kind_found_done_at_once_leaves_its_expectation_alone(monkeypatch):
    # the request completed while the caller was elsewhere: no measure of its kind
    clock = Clock()
    s = _timed_session(monkeypatch, clock, ewma=0.0)
    s._kind_waits["d2d"] = 0.002
    dev = TimedDevice(clock, done_at=0.0)
    s.devices = [dev]
    s.wait_for(lambda: dev.done, kind="d2d")
    assert s._kind_waits["d2d"] == 0.002 and s.channel.timeouts == []
