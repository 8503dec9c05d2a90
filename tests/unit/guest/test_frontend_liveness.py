"""The frontend's wait_for judges a silent host by the silence its channel has seen
(transport.channel.GuestChannel.proven_silence), never by the clock alone: a thread that
was descheduled, or stepped aside while another thread read the socket, has not seen the
host fall silent and must not declare it lost."""

import pytest

from guest.frontend.session import FrontendSession
from transport.channel import ChannelTimeout, HostLost

HEARTBEAT_MS = 100


class QuietChannel:
    """A channel whose waits time out, with a given silence seen and a last message
    long ago on the clock."""

    def __init__(self, proven_silence: float):
        self.heartbeat_ms = HEARTBEAT_MS
        self.last_heard = -1e9
        self.proven_silence = proven_silence
        self.waits = 0

    def recv_until(self, predicate, timeout=None):
        self.waits += 1
        raise ChannelTimeout("no notification in this slice")


def session(channel) -> FrontendSession:
    s = FrontendSession.__new__(FrontendSession)  # no host: only wait_for's loop is used
    s.endpoint, s.inline, s.devices, s.host_lost = "ipc://test", True, [], False
    s._wait_ewma = 0.0
    s.channel = channel
    return s


def test_time_passed_without_silence_seen_is_not_a_lost_host():
    ch = QuietChannel(proven_silence=0.0)
    s = session(ch)
    with pytest.raises(TimeoutError):
        s.wait_for(lambda: False, timeout=0.2)
    assert not s.host_lost and ch.waits >= 1


def test_silence_seen_past_the_window_is_a_lost_host():
    ch = QuietChannel(proven_silence=10.0)
    s = session(ch)
    with pytest.raises(HostLost):
        s.wait_for(lambda: False, timeout=30)
    assert s.host_lost and ch.waits == 1


def test_heartbeats_disabled_never_declare_the_host_lost():
    ch = QuietChannel(proven_silence=10.0)
    ch.heartbeat_ms = 0
    s = session(ch)
    with pytest.raises(TimeoutError):
        s.wait_for(lambda: False, timeout=0.2)
    assert not s.host_lost
