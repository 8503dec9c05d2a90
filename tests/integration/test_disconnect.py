"""Connection loss is seen at once (spec [CTL-HB-7], [CTL-HB-6], [CTL-BYE-2]): the host
reclaims a guest that died as soon as its connection closes, a guest blocked in a call
raises HostLost as soon as the host's connection closes, and a host stopped by a signal
tells its guests first ("host shut down"). Every host here runs with a heartbeat of a minute,
so heartbeats (3 missed periods: 3 minutes) cannot explain what the tests see; no test
asserts a duration."""

import os
import subprocess
import sys
import threading
import time

import pytest

from pvgpu import guest
from pvgpu.spec import wire

HEARTBEAT_MS = 60_000  # a heartbeat expiry takes 3 minutes: far beyond every wait here
WAIT = 30.0  # how long a test waits for what the disconnect must bring about

GUEST_HOG = """
import sys, time, numpy as np, pvgpu.guest as guest
c = guest.connect(sys.argv[1], memory=sys.argv[2], mem_size=16 << 20, heartbeat_ms=60000)
ctx = c.devices[0].create_context()
bufs = [ctx.empty(16 << 20, np.uint8) for _ in range(4)]
ctx.launch("burn", 1, 1, (200000,))
print("ready", flush=True)
time.sleep(600)
"""


def _host_view(endpoint) -> tuple:
    """What the host holds on GPU 0, seen by another guest (GET_STATS):
    (free VRAM, the number of contexts of every session: a device-wide total)."""
    with guest.connect(endpoint, mem_size=8 << 20, heartbeat_ms=HEARTBEAT_MS) as c:
        mem = c.devices[0].stats()["mem"]
        return mem["vram_free"], mem["contexts_total"]


@pytest.mark.parametrize("memory", ["shared", "inline"])
def test_a_killed_guest_is_reclaimed_on_disconnect(host_factory, tmp_endpoint, memory):
    host = host_factory([tmp_endpoint], vram="256M", heartbeat_ms=HEARTBEAT_MS)
    before = _host_view(host.endpoint)
    hog = subprocess.Popen([sys.executable, "-c", GUEST_HOG, host.endpoint, memory],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert hog.stdout.readline().strip() == "ready"
        vram_free, contexts = _host_view(host.endpoint)
        assert vram_free <= before[0] - (64 << 20) and contexts == before[1] + 1
        hog.kill()
        hog.wait(10)
        killed = time.monotonic()
        while time.monotonic() < killed + WAIT and _host_view(host.endpoint) != before:
            time.sleep(0.05)
        assert _host_view(host.endpoint) == before
    finally:
        if hog.poll() is None:
            hog.kill()
            hog.wait()
        hog.stdout.close()
    assert host.alive()


def test_a_session_s_stats_show_its_peer(host_factory, tmp_endpoint):
    """ipc: the guest process's pid and uid (SO_PEERCRED); tcp: its address."""
    host = host_factory([tmp_endpoint, "tcp://127.0.0.1:0"], vram="64M", heartbeat_ms=HEARTBEAT_MS)
    ipc, tcp = host.endpoints
    with guest.connect(ipc, mem_size=8 << 20) as c:
        peer = c.devices[0].stats()["session"]["peer"]
        assert (peer["transport"], peer["pid"], peer["uid"]) == ("ipc", os.getpid(), os.getuid())
    with guest.connect(tcp, mem_size=8 << 20) as c:
        peer = c.devices[0].stats()["session"]["peer"]
        assert peer["transport"] == "tcp" and peer["address"].startswith("127.0.0.1:")


def _blocked_synchronize(endpoint, memory):
    """A guest thread blocked in synchronize on a kernel that never ends -> (thread,
    outcome): outcome["error"] is what synchronize raised."""
    c = guest.connect(endpoint, memory=memory, mem_size=8 << 20, heartbeat_ms=HEARTBEAT_MS)
    ctx = c.devices[0].create_context()
    ctx.launch("burn", 1, 1, (wire.BURN_FOREVER,))
    outcome = {}

    def wait():
        try:
            ctx.synchronize()
            outcome["error"] = None
        except Exception as e:  # what the test checks
            outcome["error"] = e

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    time.sleep(0.3)  # past the driver's polling: blocked on the channel
    assert t.is_alive()
    return c, t, outcome


@pytest.mark.parametrize("memory", ["shared", "inline"])
def test_a_guest_blocked_in_a_call_raises_host_lost_when_the_host_dies(host_factory, tmp_endpoint,
                                                                        memory):
    host = host_factory([tmp_endpoint], vram="64M", heartbeat_ms=HEARTBEAT_MS)
    c, t, outcome = _blocked_synchronize(host.endpoint, memory)
    host.kill()
    t.join(WAIT)
    assert not t.is_alive()
    assert isinstance(outcome["error"], guest.HostLost)
    with pytest.raises(guest.HostLost):  # and the session is not used again ([CTL-HB-5])
        c.devices[0].info()
    c.close()


def test_a_host_stopped_by_sigterm_tells_its_guests_first(host_factory, tmp_endpoint):
    host = host_factory([tmp_endpoint], vram="64M", heartbeat_ms=HEARTBEAT_MS)
    c, t, outcome = _blocked_synchronize(host.endpoint, "shared")
    host.proc.terminate()
    t.join(WAIT)
    assert not t.is_alive()
    assert isinstance(outcome["error"], guest.HostLost)
    assert "host shut down" in str(outcome["error"])
    assert host.proc.wait(WAIT) == 0
    c.close()
