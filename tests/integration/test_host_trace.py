"""`pvgpu host --trace FILE`: a guest runs a known workload (launches of named kernels,
copies of known sizes), the host is stopped with SIGTERM, and the file it wrote is a
Chrome/Perfetto trace with every job of the workload on its engine's track, in order and
never overlapping, each with a flow from its submission."""

import json
import signal
import subprocess
import sys

import numpy as np

from pvgpu import guest

MiB = 1 << 20
N = 64 * 1024  # float32 elements: 256 KiB
LAUNCHES = 3


def _ns(us: float) -> int:
    return round(us * 1000)


def test_a_traced_host_writes_the_jobs_of_a_workload(host_factory, tmp_endpoint, tmp_path):
    path = tmp_path / "host.trace.json"
    host = host_factory([tmp_endpoint], extra_args=["--trace", str(path)])
    with guest.connect(host.endpoint, mem_size=8 * MiB, name="tracer") as conn:
        ctx = conn.devices[0].create_context()
        a = ctx.to_device(np.arange(N, dtype=np.float32))  # H2D 256 KiB
        out = ctx.empty(N, np.float32)
        for _ in range(LAUNCHES):
            ctx.launch("scale", N // 256, 256, (out, a, 2.0, N))
        ctx.launch("fill", N // 256, 256, (a, 1.0, N))
        result = out.get()  # D2H 256 KiB
        assert result[3] == 6.0
        ctx.synchronize()
    assert host.stop() == 0
    doc = json.loads(path.read_text())
    assert doc["displayTimeUnit"] == "ms"
    events = doc["traceEvents"]

    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    processes = {e["pid"]: e["args"]["name"] for e in events
                 if e["ph"] == "M" and e["name"] == "process_name"}
    assert len(processes) == 2 and processes[1].startswith("gpu0")
    tracks = {name: tid for (pid, tid), name in names.items() if pid == 1}
    assert set(tracks) == {"submit", "compute", "copy0", "copy1", "virtqueue"}

    mine = [e for e in events if e["ph"] == "X" and e["pid"] == 1
            and e["args"].get("session_name") == "tracer"]
    slices = {name: [e for e in mine if e["tid"] == tracks[name]]
              for name in ("compute", "copy0", "copy1")}
    # the launches were one LAUNCH_BATCH: one job, named after its runs of kernels
    assert [e["name"] for e in slices["compute"]] == [f"scale x{LAUNCHES}, fill"]
    assert slices["compute"][0]["args"]["launches"] == LAUNCHES + 1
    assert "copy H2D 256 KiB" in [e["name"] for e in slices["copy0"]]
    assert "copy D2H 256 KiB" in [e["name"] for e in slices["copy1"]]
    for track in slices.values():
        for e in track:
            assert e["dur"] > 0 and e["args"]["vgpu"] and "context" in e["args"]
        for prev, nxt in zip(track, track[1:]):  # in order, never overlapping
            assert _ns(prev["ts"]) + _ns(prev["dur"]) <= _ns(nxt["ts"])

    submits = {e["bind_id"]: e for e in mine if e.get("flow_out")}
    for track in slices.values():
        for e in track:
            submit = submits[e["bind_id"]]
            assert submit["tid"] == tracks["submit"] and submit["ts"] <= e["ts"]
    fences = [e for e in events if e["ph"] == "i" and e["name"].startswith("fence ")]
    assert len(fences) >= 3  # one per job: the H2D copy, the batch of launches, the D2H copy
    assert any(e["ph"] == "C" and e["pid"] == 1 for e in events)  # VRAM in use

    # the virtqueue: the kicks as received, and each request completed after its work
    queue = [e for e in events if e["ph"] == "i" and e["pid"] == 1
             and e["tid"] == tracks["virtqueue"] and e["args"]["session_name"] == "tracer"]
    kicks = [e for e in queue if e["name"] == "kick"]
    done = {e["name"] for e in queue if e["name"] != "kick"}
    assert kicks and {"CTX_CREATE done", "LAUNCH_BATCH done", "CTX_SYNC done"} <= done
    assert kicks[0]["ts"] <= min(submits[e["bind_id"]]["ts"] for e in slices["copy0"])
    compute_end = slices["compute"][0]["ts"] + slices["compute"][0]["dur"]
    assert any(e["name"] == "CTX_SYNC done" and e["ts"] >= compute_end for e in queue)


def test_a_trace_file_that_cannot_be_written_is_one_line(tmp_endpoint, tmp_path):
    bad = tmp_path / "no-such-dir" / "trace.json"
    proc = subprocess.run([sys.executable, "-m", "pvgpu", "host", "--no-default",
                           "--listen", tmp_endpoint, "--vram", "64M", "--trace", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("pvgpu host: cannot write the trace file")
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_ctrl_c_writes_the_trace_too(host_factory, tmp_endpoint, tmp_path):
    path = tmp_path / "host.trace.json"
    host = host_factory([tmp_endpoint], extra_args=["--trace", str(path)])
    with guest.connect(host.endpoint, mem_size=8 * MiB) as conn:
        ctx = conn.devices[1].create_context()
        ctx.launch("burn", 1, 1, (100,))
        ctx.synchronize()
    host.proc.send_signal(signal.SIGINT)
    assert host.proc.wait(60) == 0
    events = json.loads(path.read_text())["traceEvents"]
    assert [e["pid"] for e in events if e["ph"] == "X" and e["name"] == "burn"] == [2]


def test_a_guests_latency_log_splits_its_part_of_each_request(host_factory, tmp_endpoint,
                                                               tmp_path, monkeypatch, capsys):
    """PVGPU_GUEST_TRACE: the guest's stamps line up with the host's trace (one monotonic
    clock: each kick sent before the host received it), so that each synchronous request's
    completed -> next kick splits into the guest and the transport."""
    from pvgpu import trace_latency

    trace = tmp_path / "host.trace.json"
    monkeypatch.setenv("PVGPU_GUEST_TRACE", str(tmp_path / "guest-{name}.json"))
    host = host_factory([tmp_endpoint], extra_args=["--trace", str(trace)])
    with guest.connect(host.endpoint, mem_size=8 * MiB, name="timed") as conn:
        ctx = conn.devices[0].create_context()
        for _ in range(20):
            ctx.launch("burn", 1, 1, (200,))
            ctx.synchronize()
    assert host.stop() == 0
    log = tmp_path / "guest-timed.json"
    doc = json.loads(trace.read_text())
    stamps = trace_latency.guest_stamps(json.loads(log.read_text()),
                                        doc["otherData"]["monotonic_ns_at_0"])
    # every kick the guest sent, the host received, in order and after it was sent
    received = sorted(e["ts"] for e in doc["traceEvents"] if e["ph"] == "i"
                      and e["name"] == "kick" and e["args"]["session_name"] == "timed")
    assert len(received) == len(stamps["kicks"]) >= 20
    assert all(sent <= got for sent, got in zip(stamps["kicks"], received))
    session = trace_latency._sessions(doc["traceEvents"])[(1, "timed")]
    rows = trace_latency._synchronous_steps(session, stamps)
    assert len(rows) >= 15
    assert sum("kick_transit" in r for r in rows) >= len(rows) - 2  # split: the first may not be
    assert trace_latency.main([str(trace), "--guest", str(log), "--session", "timed"]) == 0
    assert "the kick's way to the host's I/O loop" in capsys.readouterr().out
