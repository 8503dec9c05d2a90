"""Process lifetimes: a guest that hangs is reclaimed, a host that dies becomes HostLost,
SIGINT/SIGTERM stop the host cleanly, and the CLI commands work end to end."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from pvgpu import guest
from pvgpu.procs import HostProcess, reap, run_guest, spawn_guest
from pvgpu.spec import wire

GUEST_HOG = """
import sys, time, numpy as np, pvgpu.guest as guest
c = guest.connect(sys.argv[1], memory=sys.argv[2], mem_size=16 << 20, heartbeat_ms=200)
ctx = c.devices[0].create_context()
bufs = [ctx.empty(16 << 20, np.uint8) for _ in range(4)]
ctx.launch("burn", 1, 1, (200000,))
print("ready", flush=True)
time.sleep(60)
"""


def _vram_free(endpoint):
    with guest.connect(endpoint, mem_size=8 << 20) as c:
        return c.devices[0].info()["vram_free"]


def _await_vram_free(endpoint, expected, timeout=10):
    """Frees are deferred until in-flight work is done: poll with a deadline."""
    deadline = time.monotonic() + timeout
    while _vram_free(endpoint) != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return _vram_free(endpoint)


def _host_maps_guest_memory(host, guest_pid) -> bool:
    """Whether the host process still maps the guest's memfd (named pvgpu-<guest pid>)."""
    with open(f"/proc/{host.proc.pid}/maps") as f:
        return f"memfd:pvgpu-{guest_pid} " in f.read()


@pytest.mark.parametrize("memory", ["shared", "inline"])
def test_a_hung_guest_is_reclaimed_by_heartbeat(host_factory, tmp_endpoint, memory):
    """SIGSTOP: the guest's connection stays open, only its silence tells (CTL-HB-3); a
    guest whose connection closes is reclaimed at once (tests/integration/test_disconnect.py)."""
    host = host_factory([tmp_endpoint], vram="256M", heartbeat_ms=200)
    before = _vram_free(host.endpoint)
    hog = subprocess.Popen([sys.executable, "-c", GUEST_HOG, host.endpoint, memory],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert hog.stdout.readline().strip() == "ready"
        assert _vram_free(host.endpoint) <= before - (64 << 20)
        if memory == "shared":
            assert _host_maps_guest_memory(host, hog.pid)
        hog.send_signal(signal.SIGSTOP)
        assert _await_vram_free(host.endpoint, before) == before
        if memory == "shared":  # the host let go of the hung guest's memory too
            deadline = time.monotonic() + 5
            while _host_maps_guest_memory(host, hog.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not _host_maps_guest_memory(host, hog.pid)
    finally:
        if hog.poll() is None:
            hog.kill()
            hog.wait()
        hog.stdout.close()
    assert host.alive()


def test_bye_reclaims_everything(host_factory, tmp_endpoint):
    # [CTL-RECLAIM-1] bye reclaims the session
    host = host_factory([tmp_endpoint], vram="128M")
    before = _vram_free(host.endpoint)
    with guest.connect(host.endpoint, mem_size=8 << 20) as c:
        ctx = c.devices[0].create_context()
        ctx.empty(32 << 20, np.uint8)
        ctx.launch("burn", 1, 1, (20000,))
    assert _await_vram_free(host.endpoint, before) == before


def test_host_death_is_a_prompt_host_lost(host_factory, tmp_endpoint):
    host = host_factory([tmp_endpoint], vram="64M", heartbeat_ms=200)
    with pytest.raises(guest.HostLost):
        with guest.connect(host.endpoint, mem_size=8 << 20, heartbeat_ms=200) as c:
            ctx = c.devices[0].create_context()
            ctx.launch("burn", 1, 1, (wire.BURN_FOREVER,))
            host.kill()
            ctx.synchronize()  # would never return: only the missed heartbeats end it


def test_connect_without_a_host_fails_clearly(tmp_endpoint):
    with pytest.raises(guest.HostLost):  # not the timeout's error
        guest.connect(tmp_endpoint, mem_size=8 << 20, heartbeat_ms=200, timeout=30)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_host_stops_cleanly_on_signals(tmp_endpoint, sig):
    host = HostProcess([tmp_endpoint], vram="64M", log_path=tmp_endpoint[6:] + ".log")
    try:
        with guest.connect(host.endpoint, mem_size=8 << 20) as c:
            c.devices[0].create_context().empty(1000)
            host.proc.send_signal(sig)
            assert host.proc.wait(10) == 0
        log = open(tmp_endpoint[6:] + ".log").read()
        assert "listening on" in log and "stopped" in log
        assert not os.path.exists(tmp_endpoint[6:])  # the ipc socket file is removed
    finally:
        host.stop()


def test_cli_info_and_run_over_tcp(host_factory, tmp_endpoint):
    host = host_factory([tmp_endpoint, "tcp://127.0.0.1:0"], vram="128M")
    tcp = next(ep for ep in host.endpoints if ep.startswith("tcp://"))
    r = run_guest(["info", "--connect", tcp, "--mem-size", "16M"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("  device ") == 2 and "VERSION_1" in r.stdout and "128 MiB" in r.stdout
    assert r.stdout.count("to device ") == 2 and "peer-to-peer (bus_addr, 4 PCIe hops)" in r.stdout
    r = run_guest(["run", "vector-add", "saxpy", "gemm", "--connect", tcp, "--memory", "inline",
                   "--size", "300", "--mem-size", "16M", "--json"], timeout=60)
    assert r.returncode == 0, r.stderr
    results = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["workload"] for x in results] == ["vector-add", "saxpy", "gemm"]
    assert all(x["ok"] and x["memory"] == "inline" for x in results)


def test_cli_info_joins_a_vgpu(host_factory, tmp_endpoint):
    host_factory([tmp_endpoint], vram="64M",
                 extra_args=["--vgpu", "A:compute=50", "--vgpu", "B:compute=50,mem=25"])
    r = run_guest(["info", "--connect", tmp_endpoint, "--mem-size", "16M", "--vgpu", "B"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert "vGPU B (compute 50%, copy 100%, mem 25%)" in r.stdout
    r = run_guest(["info", "--connect", tmp_endpoint, "--mem-size", "16M", "--vgpu", "C"], timeout=60)
    assert r.returncode == 2 and "refused" in r.stderr and "no vGPU named 'C'" in r.stderr


def test_cli_errors_are_clear(tmp_endpoint):
    r = run_guest(["info", "--connect", tmp_endpoint], timeout=60)
    assert r.returncode == 2 and f"no host at {tmp_endpoint}" in r.stderr
    r = run_guest(["run", "matmul"], timeout=30)
    assert r.returncode == 2 and "invalid choice" in r.stderr
    r = run_guest(["host", "--vram", "lots"], timeout=30)
    assert r.returncode == 2 and "not a size" in r.stderr
    r = run_guest(["host", "--vgpu", "A:compute=0"], timeout=30)
    assert r.returncode == 2 and "share" in r.stderr


def test_four_guest_processes_at_once(host_factory, tmp_endpoint):
    host = host_factory([tmp_endpoint], vram="256M")
    procs = [spawn_guest(["run", "vector-add", "saxpy", "gemm", "--connect", host.endpoint,
                          "--memory", m, "--device", str(i % 2), "--repeat", "4", "--size", "256",
                          "--mem-size", "16M"])
             for i, m in enumerate(["shared", "inline", "inline", "shared"])]
    for p in procs:
        code, out = reap(p, timeout=120)
        assert code == 0, out
        assert out.count(" OK ") == 12, out


def test_demo_runs_and_verifies():
    r = run_guest(["demo", "--vram", "256M"], timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all results match numpy" in r.stdout
    assert r.stdout.count("verified") == 4


def test_a_long_kernel_outlasts_many_heartbeat_periods(host_factory, tmp_endpoint):
    """Waiting is not silence: pings keep both sides alive while a kernel runs."""
    host = host_factory([tmp_endpoint], vram="64M", heartbeat_ms=100)
    with guest.connect(host.endpoint, mem_size=8 << 20, heartbeat_ms=100) as c:
        with c.devices[0].create_context() as ctx:
            ctx.launch("burn", 1, 1, (1_500_000,))  # 15 heartbeat periods
            ctx.synchronize()
            assert ctx.to_device(np.ones(4, np.float32)).to_host().sum() == 4


def test_thousands_of_async_launches_flow_through_the_queue(host_factory, tmp_endpoint):
    host = host_factory([tmp_endpoint], vram="64M")
    with guest.connect(host.endpoint, mem_size=16 << 20) as c:
        with c.devices[0].create_context() as ctx:
            d = ctx.zeros(4096)
            for i in range(3000):  # far more than the 256-entry virtqueue holds
                ctx.launch("fill", grid=4, block=1024, args=(d, float(i), 1 + i % 4096))
            ctx.synchronize()
            out = d.to_host()
            assert out[0] == 2999.0 and out[2999 % 4096] == 2999.0


def test_listen_adds_endpoints_to_the_default_one(monkeypatch, tmp_endpoint):
    import shutil
    import tempfile

    runtime = tempfile.mkdtemp(prefix="pvgpu-xdg-")
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
    args = [sys.executable, "-m", "pvgpu", "host", "--vram", "64M", "--listen", tmp_endpoint]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert f"ipc://{runtime}/pvgpu.sock" in line and tmp_endpoint in line
        for ep in (f"ipc://{runtime}/pvgpu.sock", tmp_endpoint):
            with guest.connect(ep, mem_size=8 << 20) as c:
                assert len(c.devices) == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        proc.stdout.close()
        shutil.rmtree(runtime, ignore_errors=True)
