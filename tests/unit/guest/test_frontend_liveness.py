"""The frontend's wait_for judges a silent host by the silence its channel has seen
(pvgpu.transport.channel.GuestChannel.silence_since), never by the clock alone: a thread that
was descheduled, or stepped aside while another thread read the socket, has not seen the
host fall silent and must not declare it lost. Silence is counted from the later of the
last message and the start of the wait: a driver that only kicked before it waits asked
the host nothing (and sent no ping), so the host's silence until then proves nothing.

Every test runs wait_for on a clock it advances itself: each wait slice of the channel
below moves it on by the slice."""

import pytest

from pvgpu.guest.frontend import session as frontend_session
from pvgpu.guest.frontend.session import FrontendSession
from pvgpu.spec.wire import HEARTBEAT_MISSES
from pvgpu.transport.channel import ChannelTimeout, HostLost

HEARTBEAT_MS = 100
WINDOW = HEARTBEAT_MISSES * HEARTBEAT_MS / 1000.0


class Clock:
    """Stands in for the time module in pvgpu.guest.frontend.session."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def monotonic(self) -> float:
        return self.now


class QuietChannel:
    """A channel whose waits time out: the host sends nothing. Each slice takes its
    timeout on the clock and, if `looks`, ends by finding the socket empty."""

    def __init__(self, clock: Clock, last_heard: float, looks: bool = True):
        self.clock = clock
        self.heartbeat_ms = HEARTBEAT_MS
        self.last_heard = last_heard
        self.looked = last_heard  # the last time the socket was found empty
        self.looks = looks
        self.waits = 0

    def recv_until(self, predicate, timeout=None):
        self.waits += 1
        self.clock.now += timeout
        if self.looks:
            self.looked = self.clock.now
        raise ChannelTimeout("no notification in this slice")

    @property
    def proven_silence(self) -> float:
        return max(0.0, self.looked - self.last_heard)

    def silence_since(self, start: float) -> float:
        return max(0.0, self.looked - max(self.last_heard, start))


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(frontend_session, "time", c)
    return c


def session(channel) -> FrontendSession:
    s = FrontendSession.__new__(FrontendSession)  # no host: only wait_for's loop is used
    s.endpoint, s.inline, s.devices, s.host_lost = "ipc://test", True, [], False
    s._wait_ewma = 0.0
    s.channel = channel
    return s


def test_time_passed_without_silence_seen_is_not_a_lost_host(clock):
    ch = QuietChannel(clock, last_heard=clock.now - 10.0, looks=False)
    s = session(ch)
    with pytest.raises(TimeoutError):
        s.wait_for(lambda: False, timeout=3 * WINDOW)
    assert not s.host_lost and ch.waits > 1


def test_silence_seen_past_the_window_is_a_lost_host(clock):
    ch = QuietChannel(clock, last_heard=clock.now)
    s = session(ch)
    start = clock.now
    with pytest.raises(HostLost):
        s.wait_for(lambda: False, timeout=30)
    assert s.host_lost
    assert WINDOW < clock.now - start <= WINDOW + FrontendSession.BLOCK_SLICE + 1e-9


def test_silence_before_the_wait_is_not_the_hosts(clock):
    """The driver kicked async launches for seconds, polling their completions, and
    heard nothing: the host had nothing to say. A wait that then sees slices pass
    without a call has not seen the host silent until it has for the window itself."""
    ch = QuietChannel(clock, last_heard=clock.now - 10.0)  # 10 s of kicks, no answer owed
    s = session(ch)
    with pytest.raises(TimeoutError):
        s.wait_for(lambda: False, timeout=WINDOW * 0.9)
    assert not s.host_lost and ch.waits > 1
    start = clock.now
    with pytest.raises(HostLost):  # a wait that itself hears nothing for the window
        s.wait_for(lambda: False, timeout=30)
    assert WINDOW < clock.now - start <= WINDOW + FrontendSession.BLOCK_SLICE + 1e-9


def test_heartbeats_disabled_never_declare_the_host_lost(clock):
    ch = QuietChannel(clock, last_heard=clock.now - 10.0)
    ch.heartbeat_ms = 0
    s = session(ch)
    with pytest.raises(TimeoutError):
        s.wait_for(lambda: False, timeout=3 * WINDOW)
    assert not s.host_lost
