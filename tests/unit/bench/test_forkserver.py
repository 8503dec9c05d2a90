"""bench/forkserver.py: `pvgpu ARGS` forked from a server that imported it, as a fresh
`python -m pvgpu ARGS` would run: output, exit status, SIGTERM, a deadline; and the bench's
hosts started that way (bench/sched.py SchedHost)."""

import os
import signal
import time

import pytest

from pvgpu.bench import forkserver, sched
from pvgpu.procs import HostStartError
from pvgpu.transport.admin import AdminClient, admin_endpoint_for


def test_every_preloaded_module_exists():
    """multiprocessing's forkserver skips a preload that fails to import, silently: a
    misnamed module would only make every child import it again."""
    import importlib
    for name in forkserver.PRELOAD:  # a bare "guest" is found in a checkout, not imported
        assert importlib.import_module(name).__name__ == name


def test_a_forked_command_writes_its_output_and_exit_status(tmp_path):
    log = tmp_path / "out.log"
    p = forkserver.Forked(["trace", "--endpoint", f"ipc://{tmp_path}/none.sock", "status"], str(log))
    code, text = p.reap(timeout=60)
    assert code == 2 and text.startswith(f"pvgpu trace: no host at ipc://{tmp_path}/none.sock")
    assert os.stat(log).st_mode & 0o077 == 0


def test_a_forked_host_serves_until_sigterm_and_exits_0():
    host = sched.SchedHost(("band", sched.UNFAIR, ("--time-buffer-us", "500"), "64M"))
    try:
        with AdminClient(admin_endpoint_for(host.endpoint)) as admin:
            dev = admin.request("stats")["devices"][0]
        assert dev["policy"] == "band" and {"A", "B"} <= set(dev["vgpus"])
        assert dev["vram_size"] == 64 << 20 and host.proc.poll() is None
    finally:
        code, text = host.stop_with_output()
    assert code == 0, text
    assert not os.path.exists(host.tmpdir)


def test_a_forked_host_that_fails_to_start_says_why():
    with pytest.raises(HostStartError, match=r"exited with 2 before it was ready: pvgpu host: .*100"):
        sched.SchedHost(("fifo", (), (), "100"))


def test_a_command_past_its_deadline_is_killed(tmp_path):
    ready = tmp_path / "ready"
    p = forkserver.Forked(["host", "--no-default", "--listen", f"ipc://{tmp_path}/h.sock",
                           "--vram", "64M", "--ready-file", str(ready)], str(tmp_path / "host.log"))
    while not ready.exists():  # its SIGTERM handler is installed by then
        assert p.poll() is None
        time.sleep(0.02)
    os.kill(p.process.pid, signal.SIGSTOP)  # it cannot act on SIGTERM now
    p.terminate()
    code, text = p.reap(timeout=0.5)
    assert code == -9 and text.endswith("[killed after 0.5s]")
