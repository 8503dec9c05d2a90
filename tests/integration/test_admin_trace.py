"""Engine traces started and stopped at run time on the admin endpoint (spec [CTL-ADMIN-6]),
with a real host: the admin operations, and `pvgpu trace start/stop/status` as a user runs
them (one line and a hint for every user error, exit status 2)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from pvgpu import guest
from pvgpu.spec import wire
from pvgpu.transport.admin import AdminClient, AdminError, admin_endpoint_for

MiB = 1 << 20
N = 64 * 1024
LAUNCHES = 3


@pytest.fixture
def host(host_factory, tmp_endpoint):
    return host_factory([tmp_endpoint], vram="64M")


def _trace(host, *args, cwd=None):
    return subprocess.run([sys.executable, "-m", "pvgpu", "trace", "--endpoint", host.endpoint,
                           *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def _workload(endpoint: str) -> None:
    with guest.connect(endpoint, mem_size=8 * MiB, name="tracer") as conn:
        ctx = conn.devices[0].create_context()
        a = ctx.to_device(np.arange(N, dtype=np.float32))
        out = ctx.empty(N, np.float32)
        for _ in range(LAUNCHES):
            ctx.launch("scale", N // 256, 256, (out, a, 2.0, N))
        assert out.get()[3] == 6.0
        ctx.synchronize()


def _compute_slices(path) -> list:
    """The job slices of the session `tracer` on device 0's compute track."""
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    compute = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M"
               and e["name"] == "thread_name" and e["args"]["name"] == "compute"}
    return [e for e in events if e["ph"] == "X" and (e["pid"], e["tid"]) in compute
            and e["pid"] == 1 and e["args"].get("session_name") == "tracer"]


def _one_line_and_hint(p, text: str) -> None:
    lines = p.stderr.splitlines()
    assert p.returncode == 2, p.stdout + p.stderr
    assert len(lines) == 2 and lines[0].startswith("pvgpu trace: ") and text in lines[0], p.stderr
    assert lines[1].startswith("  hint: ") and "Traceback" not in p.stderr


def test_ctl_admin_6_trace_start_and_stop_record_a_workload(host, tmp_path):
    # [CTL-ADMIN-6] a relative FILE is the client's: resolved against its cwd, sent absolute
    p = _trace(host, "start", "run.json", cwd=tmp_path)
    assert p.returncode == 0 and str(tmp_path / "run.json") in p.stdout, p.stderr
    p = _trace(host, "status")
    assert p.returncode == 0 and p.stdout.strip() == f"pvgpu trace: recording to {tmp_path / 'run.json'}"
    _workload(host.endpoint)
    assert not (tmp_path / "run.json").exists()  # written when the trace stops
    p = _trace(host, "stop")
    assert p.returncode == 0 and f"wrote {tmp_path / 'run.json'} (" in p.stdout, p.stderr
    assert "ui.perfetto.dev" in p.stdout
    slices = _compute_slices(tmp_path / "run.json")  # complete once stop has answered
    assert [e["name"] for e in slices] == [f"scale x{LAUNCHES}"]  # one LAUNCH_BATCH: one job
    assert all(e["dur"] > 0 and e["ts"] >= 0 for e in slices)
    assert _trace(host, "status").stdout.strip() == "pvgpu trace: not recording"
    # a second trace on the same host holds only what ran while it was recorded
    with AdminClient(admin_endpoint_for(host.endpoint)) as admin:
        assert admin.request(wire.ADMIN_OP_TRACE_START, path=str(tmp_path / "b.json")) == {
            "path": str(tmp_path / "b.json")}
        assert admin.request(wire.ADMIN_OP_TRACE_STATUS) == {"tracing": True,
                                                            "path": str(tmp_path / "b.json")}
        reply = admin.request(wire.ADMIN_OP_TRACE_STOP)
    assert reply == {"path": str(tmp_path / "b.json"), "size": (tmp_path / "b.json").stat().st_size}
    assert _compute_slices(tmp_path / "b.json") == []


def test_ctl_admin_6_one_trace_at_a_time_and_stop_needs_one(host, tmp_path):
    # [CTL-ADMIN-6] stop with none running, a second start, then stop still writes the first
    _one_line_and_hint(_trace(host, "stop"), "no trace is being recorded")
    assert _trace(host, "start", str(tmp_path / "first.json")).returncode == 0
    p = _trace(host, "start", str(tmp_path / "second.json"))
    _one_line_and_hint(p, f"a trace is already being recorded to {tmp_path / 'first.json'}")
    assert "pvgpu trace stop" in p.stderr
    assert _trace(host, "stop").returncode == 0
    assert (tmp_path / "first.json").exists() and not (tmp_path / "second.json").exists()


def test_ctl_admin_6_a_path_the_host_cannot_use_is_refused_at_start(host, tmp_path):
    # [CTL-ADMIN-6] checked at once: an unwritable file, a directory, a relative or no path
    _one_line_and_hint(_trace(host, "start", str(tmp_path / "no-such-dir" / "t.json")),
                       "cannot write the trace file")
    with AdminClient(admin_endpoint_for(host.endpoint)) as admin:
        for fields, text in (({"path": str(tmp_path)}, "is a directory"),
                             ({"path": "relative.json"}, "absolute"),
                             ({"path": 7}, "absolute"), ({}, "absolute")):
            with pytest.raises(AdminError) as e:
                admin.request(wire.ADMIN_OP_TRACE_START, **fields)
            assert e.value.error == wire.ADMIN_ERR_FAILED and text in e.value.detail
        assert admin.request(wire.ADMIN_OP_TRACE_STATUS) == {"tracing": False, "path": None}


def test_ctl_admin_6_a_host_that_stops_while_recording_writes_the_file(host, tmp_path):
    # [CTL-ADMIN-6] started on the admin endpoint, never stopped: written at shutdown
    assert _trace(host, "start", str(tmp_path / "t.json")).returncode == 0
    _workload(host.endpoint)
    assert host.stop() == 0
    assert [e["name"] for e in _compute_slices(tmp_path / "t.json")] == [f"scale x{LAUNCHES}"]


def test_trace_without_a_host_is_one_line_and_a_hint(tmp_path):
    p = subprocess.run([sys.executable, "-m", "pvgpu", "trace", "--endpoint",
                        f"ipc://{tmp_path}/none.sock", "status"],
                       capture_output=True, text=True, timeout=60)
    lines = p.stderr.splitlines()
    assert p.returncode == 2 and len(lines) == 2, p.stderr
    assert lines[0] == f"pvgpu trace: no host at ipc://{tmp_path}/none.sock; start one with `pvgpu host`"
    assert lines[1].startswith("  hint: ")
