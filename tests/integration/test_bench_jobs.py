"""bench/jobs.py (`pvgpu bench jobs`): each part runs through a real host (or an in-process
KMD), checks its results and reports the structure the README's table is made from. Small
counts; no timing is asserted, only that the figures exist and are positive."""

import shutil
import subprocess
import sys
import tempfile

import pytest

from pvgpu import guest
from pvgpu.bench import jobs
from pvgpu import cli


@pytest.fixture
def echo_dir():
    d = tempfile.mkdtemp(prefix="pvgpu-jobs-")  # short: ipc paths are limited to ~100 bytes
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_the_guest_figures_come_with_their_zmq_limits(shared_host, echo_dir):
    lines = []
    with guest.connect(shared_host.endpoint, mem_size=32 << 20) as conn:
        res = jobs.guest_figures(conn, echo_dir, launches=20, batch=3, reps=2, async_reps=1,
                                 host_pid=shared_host.proc.pid, out=lines.append)
    assert set(res) == {"async_launches", "launch_sync", "h2d_4KiB", "nop", "host_cpu_us",
                        "zmq_rtt_polled"}
    p = res["zmq_rtt_polled"]
    assert p["s"] > 0 and p["vs_zmq_rtt"] == pytest.approx(p["s"] / res["nop"]["zmq_rtt_s"])
    a = res["async_launches"]
    assert a["launches"] == 20 and a["per_s"] > 0 and a["zmq_msgs_per_s"] > 0
    assert a["vs_zmq"] == pytest.approx(a["per_s"] / a["zmq_msgs_per_s"])
    for name in ("launch_sync", "h2d_4KiB", "nop"):
        r = res[name]
        assert r["s"] > 0 and r["zmq_rtt_s"] > 0
        assert r["vs_zmq_rtt"] == pytest.approx(r["s"] / r["zmq_rtt_s"])
    # the host's CPU per request: ticks are coarse, so a few requests may read as 0
    assert set(res["host_cpu_us"]) == {"nop", "launch_sync", "h2d_4KiB"}
    assert all(v >= 0 for v in res["host_cpu_us"].values())
    assert len(lines) == 6


def test_the_host_cpu_figure_reads_a_thread_of_another_process():
    busy = subprocess.Popen(
        [sys.executable, "-c", "import time\nt = time.process_time()\n"
         "while time.process_time() - t < 0.3: pass\nprint('done', flush=True)\ninput()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        cpu = jobs.ThreadCpu(busy.pid)
        assert cpu.available
        assert busy.stdout.readline() == b"done\n"
        assert cpu.seconds() >= 0.3 - 2 * cpu.tick  # its main thread burnt 0.3 s of CPU
    finally:
        busy.communicate(b"\n", timeout=30)
    assert not jobs.ThreadCpu(busy.pid).available  # reaped: no such thread


def test_mixed_guests_run_together_and_are_verified(shared_host, echo_dir):
    lines = []
    res = jobs.mixed_figures(shared_host.endpoint, echo_dir, guests=2, ops=40, timeout=90,
                             out=lines.append)
    assert res["guests"] == 2 and res["ops"] == 40
    assert sum(res["counts"].values()) == 80 and set(res["counts"]) == set(jobs.MIXED_OPS)
    assert res["per_s"] > 0 and res["zmq_rtt_per_s"] > 0 and res["seconds"] > 0
    assert len(lines) == 1


def test_a_mixed_guest_checks_its_arrays_against_its_model(shared_host):
    res = jobs.run_mixed_guest(shared_host.endpoint, 60, seed=5)
    assert res["verified"] and sum(res["counts"].values()) == 60
    assert res["end"] >= res["start"]


def test_the_kmd_figures_come_with_the_thread_handoff():
    lines = []
    res = jobs.kmd_figures(jobs=4, reps=2, out=lines.append)
    assert res["jobs"] == 4 and res["us"] > 0 and res["pipelined_us"] > 0 and res["handoff_us"] > 0
    assert res["vs_handoff"] == pytest.approx(res["us"] / res["handoff_us"])
    assert res["cpu_us"] > 0  # every job costs the process some CPU
    assert f"(CPU {res['cpu_us']:5.1f} us)" in lines[0]
    assert len(lines) == 1


def test_the_summary_judges_each_figure_by_its_target():
    results = {"async_launches": {"per_s": 25_000.0}, "launch_sync": {"vs_zmq_rtt": 1.6},
               "h2d_4KiB": {"vs_zmq_rtt": 1.5}, "mixed": {"per_s": 2_999.0},
               "kmd": {"us": 40.0}}
    s = jobs.summary(results)
    assert set(s) == set(jobs.TARGETS)
    assert {k: v["met"] for k, v in s.items()} == {
        "async_launches_per_s": True, "launch_sync_vs_zmq_rtt": False,
        "h2d_4KiB_vs_zmq_rtt": True, "mixed_ops_per_s": False, "kmd_job_us": True}
    assert s["kmd_job_us"] == {"value": 40.0, "target": "<= 50", "met": True}


def test_pvgpu_bench_jobs_runs_the_part(monkeypatch):
    calls = []
    monkeypatch.setattr(jobs, "run_bench", lambda **kw: calls.append(kw) or {})
    assert cli.main(["bench", "jobs", "--quick", "--json", "out.json"]) == 0
    assert calls == [{"json_path": "out.json", "quick": True}]
