"""`pvgpu smi` as a person runs it: in a terminal (tmux), beside a host with two guests.

The live view is started in a detached tmux session on a private tmux server, its pane is
captured until the table shows both guests with their PIDs, then Ctrl-C ends it and the
pane's exit status is read. The tmux server and the guests are always stopped.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from pvgpu.procs import spawn_guest
from pvgpu.transport.admin import AdminClient, admin_endpoint_for

TMUX = shutil.which("tmux") or "/usr/bin/tmux"
DEADLINE_S = 60.0


def _wait(predicate, what: str, timeout: float = DEADLINE_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
def tmux():
    """`tmux -L <private server> ...`; the server is killed at teardown, whatever happened."""
    if not os.path.exists(TMUX):
        pytest.fail(f"tmux is not installed at {TMUX}")
    sock = f"pvgpu-test-{os.getpid()}-{time.monotonic_ns()}"

    def run(*args, check=True):
        return subprocess.run([TMUX, "-L", sock, *args], capture_output=True, text=True,
                              check=check, timeout=30)
    try:
        yield run
    finally:
        run("kill-server", check=False)


@pytest.fixture
def two_guests(host_factory, tmp_endpoint):
    host = host_factory([tmp_endpoint], vram="128M")
    guests = [spawn_guest(["tenant", w, "--seconds", "120", "--connect", host.endpoint])
              for w in ("long", "copy")]
    try:
        yield host, guests
    finally:
        for g in guests:
            if g.poll() is None:
                g.kill()
            g.communicate(timeout=30)


def _sessions_working(admin_ep) -> bool:
    with AdminClient(admin_ep) as admin:
        sessions = admin.request("stats")["sessions"]
    return len(sessions) == 2 and all(any(u["contexts"] for u in s["devices"]) for s in sessions)


def test_smi_in_a_terminal_shows_both_guests_with_their_pids(two_guests, tmux):
    host, guests = two_guests
    _wait(lambda: _sessions_working(admin_endpoint_for(host.endpoint)), "both guests at work")
    cmd = f"{shlex.quote(sys.executable)} -m pvgpu smi --endpoint {shlex.quote(host.endpoint)} -l 0.5"
    tmux("new-session", "-d", "-s", "smi", "-x", "140", "-y", "40", cmd)
    tmux("set-option", "-t", "smi", "remain-on-exit", "on")
    pids = [str(g.pid) for g in guests]

    def pane():
        text = tmux("capture-pane", "-p", "-t", "smi").stdout
        rows = [line for line in text.splitlines() if any(f" {p} " in line for p in pids)]
        return text if len(rows) == 2 and "utilisation over 0." in text else None
    text = _wait(pane, "a table with both guests' PIDs")
    lines = text.splitlines()
    assert lines[0].startswith("pvgpu smi") and str(host.proc.pid) in lines[0]
    for pid, name in zip(pids, ("tenant-long", "tenant-copy")):
        (row,) = [line for line in lines if f" {pid} " in line]
        assert name in row and row.split()[0] == "0", row  # on GPU 0
    gpu0 = next(line for line in lines if line.strip().startswith("0  pvgpu"))
    assert gpu0.split()[-1] == "2"  # two sessions on GPU 0
    assert text.count("pvgpu smi") == 1  # redrawn in place, not scrolled
    tmux("send-keys", "-t", "smi", "C-c")
    status = _wait(lambda: (lambda s: s if s.startswith("1 ") else None)(
        tmux("display-message", "-p", "-t", "smi", "#{pane_dead} #{pane_dead_status}").stdout),
        "smi to exit on Ctrl-C", timeout=30)
    # exited: status 0, or (a Ctrl-C landing while the interpreter exits) ended by the signal
    assert status.split() in (["1", "0"], ["1"]), status
    assert "Traceback" not in tmux("capture-pane", "-p", "-t", "smi").stdout
