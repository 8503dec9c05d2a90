"""spec §2.1 — what a session may claim: its connection (clauses CTL-ENDPOINT-4,
CTL-ENDPOINT-5). Each test repeats an attack that once worked against the reference host."""

import os
import secrets
import shutil
import tempfile

import pytest

from pvgpu.procs import HostProcess
from spec import wire

HELLO = {"op": "hello", "version": list(wire.PROTOCOL_VERSION), "name": "conformance",
         "memory": "inline", "mem_size": 1 << 20}


@pytest.fixture(scope="module")
def patient_host():
    """-> an endpoint whose host keeps a vanished guest's session for a long while
    (heartbeat 10 s), so that a takeover attempt meets the old session still alive."""
    endpoint = os.environ.get("PVGPU_CONFORMANCE_ENDPOINT")
    if endpoint:
        yield endpoint
        return
    d = tempfile.mkdtemp(prefix="pvgpu-test-")
    h = HostProcess([f"ipc://{d}/host.sock"], vram="64M", heartbeat_ms=10_000)
    try:
        yield h.endpoint
    finally:
        h.stop()
        shutil.rmtree(d, ignore_errors=True)


def test_a_session_is_not_served_to_a_later_connection_with_its_identity(raw_peer, patient_host):
    """[CTL-ENDPOINT-4] The victim says hello and vanishes without bye; a new connection
    presenting the victim's routing identity must get no_session, not the victim's session."""
    identity = b"victim-" + secrets.token_bytes(8)
    victim = raw_peer(patient_host, identity)
    assert victim.request(HELLO)["ok"]
    assert victim.request({"op": "get_status", "dev": 0})["ok"]
    victim.close()  # no bye: the session lives on until heartbeats or [CTL-ENDPOINT-5]
    # The host learns of the close when it learns it; ZeroMQ holds back a connection that
    # presents an identity still in use and takes its first message for an identity. So
    # only a connection whose first request is answered really presents the victim's.
    for _attempt in range(30):
        thief = raw_peer(patient_host, identity)
        reply = thief.request({"op": "get_status", "dev": 0}, timeout_ms=1000)
        if reply is not None:
            break
        thief.close()
    assert reply is not None, "no connection with the victim's identity was ever served"
    assert reply["ok"] is False and reply["error"] == wire.CTL_ERR_NO_SESSION
    assert thief.request({"op": "bye"})["error"] == wire.CTL_ERR_NO_SESSION
    # the thief may start a session of its own, which holds nothing of the victim's
    assert thief.request(HELLO)["ok"]
    assert thief.request({"op": "get_status", "dev": 0})["status"] == 0
