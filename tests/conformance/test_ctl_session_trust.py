"""spec §2.1 and §2.7 — what a session may claim: its connection and its own memory: the
checks of pvgpu/conformance/checks/ctl_session_trust.py against our own host, on each of its
endpoints (ipc and tcp), one item per check (conftest.py)."""

import os
import shutil
import tempfile

import pytest

from pvgpu.procs import HostProcess

GROUP = "ctl_session_trust"


@pytest.fixture(scope="module")
def patient_endpoint():
    """-> an endpoint whose host keeps a vanished guest's session for a long while
    (heartbeat 10 s), so that a takeover attempt meets the old session still alive."""
    if os.environ.get("PVGPU_CONFORMANCE_ENDPOINT"):
        yield None  # the host under test
        return
    d = tempfile.mkdtemp(prefix="pvgpu-test-")
    h = HostProcess([f"ipc://{d}/host.sock"], vram="64M", heartbeat_ms=10_000)
    try:
        yield h.endpoint
    finally:
        h.stop()
        shutil.rmtree(d, ignore_errors=True)


def test_ctl_session_trust(conformance_case, run_conformance_case):
    run_conformance_case(conformance_case)
