"""guest/frontend/session.py: its timeouts are PvgpuErrors that are TimeoutErrors too, and
say what to do; the endpoint is the argument, else $PVGPU_ENDPOINT, else the default."""

import pytest

from pvgpu.guest.frontend import session as session_mod
from pvgpu.guest.frontend.session import FrontendSession, resolve_endpoint
from pvgpu.spec import wire
from pvgpu.transport.errors import ChannelTimeout, PvgpuError


class SilentChannel:
    """A host that is alive but never answers in time."""
    heartbeat_ms = 0

    def request(self, msg, frames=(), timeout=None):
        raise ChannelTimeout(f"no answer from loopback within {timeout} s")

    def recv_until(self, predicate, timeout=None):
        raise ChannelTimeout("nothing queued")


@pytest.fixture
def session():
    s = FrontendSession.__new__(FrontendSession)
    s.endpoint, s.memory, s.inline, s.timeout = "loopback", wire.MEMORY_INLINE, True, 2.5
    s.devices, s.closed, s.host_lost, s._wait_ewma = [], False, False, 0.0
    s.channel = SilentChannel()
    return s


def test_a_control_request_timeout_says_to_allow_longer(session):
    with pytest.raises(ChannelTimeout) as e:
        session.control(wire.OP_BYE)
    assert isinstance(e.value, TimeoutError) and isinstance(e.value, PvgpuError)
    assert str(e.value) == (f"{wire.OP_BYE}: no answer from loopback within 2.5 s: the host is "
                            "alive but slow to answer; connect with a longer timeout (now 2.5 s)")


def test_a_wait_that_times_out_is_a_pvgpu_timeout(session):
    with pytest.raises(ChannelTimeout, match="the device did not finish within 0 s"):
        session.wait_for(lambda: False, timeout=0)


def test_the_endpoint_is_the_argument_else_the_environment_else_the_default(monkeypatch):
    monkeypatch.setattr(session_mod, "default_endpoint", lambda: "ipc:///default.sock")
    monkeypatch.delenv("PVGPU_ENDPOINT", raising=False)
    assert resolve_endpoint() == "ipc:///default.sock"
    monkeypatch.setenv("PVGPU_ENDPOINT", "")  # set but empty: not set
    assert resolve_endpoint() == "ipc:///default.sock"
    monkeypatch.setenv("PVGPU_ENDPOINT", "tcp://gpuhost:5555")
    assert resolve_endpoint() == "tcp://gpuhost:5555"
    assert resolve_endpoint("ipc:///given.sock") == "ipc:///given.sock"
