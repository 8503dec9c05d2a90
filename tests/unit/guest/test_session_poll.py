"""The shared-model wait of FrontendSession (guest/frontend/session.py `wait_for`): it
polls the used rings without a message from the host, and between two looks it yields
the core (sched_yield), so that host threads sharing the core can produce what it waits
for. Sans-IO: a stand-in device whose request completes at its third reap, no channel."""

import os

from pvgpu.guest.frontend.session import FrontendSession
from pvgpu.spec import wire


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
