"""Shared fixtures: real host processes that are always reaped, private endpoints."""

import os
import shutil
import tempfile

import pytest
from hypothesis import settings

from pvgpu.procs import HostProcess

# Hypothesis's default 200 ms deadline per example is a timing assertion: on a loaded
# machine a slow example fails a correct test. Every property test runs without one.
settings.register_profile("pvgpu", deadline=None)
settings.load_profile("pvgpu")


@pytest.fixture
def tmp_endpoint():
    d = tempfile.mkdtemp(prefix="pvgpu-test-")
    try:
        yield f"ipc://{d}/host.sock"
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _start_host(endpoints, **kw):
    log = tempfile.mktemp(prefix="pvgpu-host-", suffix=".log")
    try:
        return HostProcess(endpoints, log_path=log, **kw), log
    except Exception:
        if os.path.exists(log):
            print(open(log).read())
        raise


@pytest.fixture
def host_factory():
    """Start `pvgpu host` processes; every one is stopped and reaped at teardown."""
    started = []

    def start(endpoints, **kw):
        h, log = _start_host(endpoints, **kw)
        h.log_path = log
        started.append(h)
        return h

    try:
        yield start
    finally:
        for h in started:
            h.stop()
            if os.path.exists(h.log_path):
                os.unlink(h.log_path)


@pytest.fixture(scope="module")
def shared_host():
    """One host for a whole test module (ipc + tcp), stopped and reaped at the end."""
    d = tempfile.mkdtemp(prefix="pvgpu-test-")
    h, log = _start_host([f"ipc://{d}/host.sock", "tcp://127.0.0.1:0"], vram="256M", heartbeat_ms=500)
    try:
        yield h
    finally:
        code = h.stop()
        text = open(log).read() if os.path.exists(log) else ""
        shutil.rmtree(d, ignore_errors=True)
        if os.path.exists(log):
            os.unlink(log)
        assert code == 0, f"host exited with {code}:\n{text}"
