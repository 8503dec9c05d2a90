"""End to end: `pvgpu demo --guests N --sched band` and `pvgpu bench sched` as the user
runs them (real host and guest processes, reaped by the commands themselves).

Only loose checks on timing-dependent figures: utilisations are fractions, and under FIFO
the long-kernel tenant takes far more of the device than the short-kernel one (about
95 % / 5 % in the emulator). Fairness under BAND is measured by the benchmark, not
asserted here: on a loaded CI machine it is too noisy.
"""

import json
import re
import subprocess
import sys

import pytest

from pvgpu.tenant import WORKLOADS


RUN_KEYS = {"policy", "shares", "workloads", "host_exit", "guests", "window_s", "util", "copy_util",
            "samples", "series", "turnaround_us", "jain", "mean_abs_error", "mean_abs_error_samples",
            "verified"}


def _pvgpu(*args, timeout):
    return subprocess.run([sys.executable, "-m", "pvgpu", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_demo_three_guests_band_verifies_every_guest(tmp_path):
    p = _pvgpu("demo", "--guests", "3", "--sched", "band", "--seconds", "3", "--vram", "256M",
               "--plot", str(tmp_path), timeout=90)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "fairness over compute: Jain's index" in out
    assert "mean |U - share|" in out
    for i, workload in zip(range(1, 4), WORKLOADS):
        line = next((l for l in out.splitlines() if l.startswith(f"g{i} ")), None)
        assert line is not None and workload in line and "verified" in line \
            and "NOT verified" not in line, out
        util = float(re.search(r"(\d+\.\d)%", line).group(1))
        assert 0.0 <= util <= 100.0
    assert re.search(r"^\s*\d+\.\ds \*", out, re.M), out  # a live row with all guests running
    assert "every guest verified" in out and "host exited 0" in out
    assert (tmp_path / "demo.png").read_bytes()[:4] == b"\x89PNG"


def test_demo_rejects_bad_shares():
    p = _pvgpu("demo", "--shares", "60,60", timeout=30)
    assert p.returncode == 2 and "add up to 120" in p.stdout


def test_bench_sched_short_run(tmp_path):
    path = tmp_path / "sched.json"
    p = _pvgpu("bench", "sched", "--seconds", "3", "--policies", "fifo,band", "--quick",
               "--parts", "unfair", "--json", str(path), "--plot", str(tmp_path), timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "Gdev fifo" in out and "Jain (U/share)" in out
    data = json.loads(path.read_text())
    for policy in ("fifo", "band"):
        run = data["unfair"][policy]
        assert run["verified"] and run["host_exit"] == 0, run["guests"]
        assert run["window_s"] > 2.5
        for u in (*run["util"].values(), *run["copy_util"].values()):
            assert 0.0 <= u <= 1.0
        assert 0.0 < run["jain"] <= 1.0 and 0.0 <= run["mean_abs_error"] <= 1.0
        assert {g["workload"] for g in run["guests"].values()} == {"long", "short"}
        assert set(run) == RUN_KEYS  # --quick or not, the same figures
        t, busy = run["series"]["t_s"], run["series"]["busy_s"]
        assert len(t) >= 4 and t == sorted(t) and set(busy) == {"A", "B"}
        assert all(len(b) == len(t) and b == sorted(b) for b in busy.values())  # cumulative
    fifo = data["unfair"]["fifo"]["util"]
    assert fifo["A"] > fifo["B"]  # FIFO: the long-kernel tenant takes the device
    assert "fifo_skew (A > 2 B)" in data["targets"]
    assert (tmp_path / "sched.png").read_bytes()[:4] == b"\x89PNG"
    assert re.search(r"^  fifo A\+B:\s+\d\.\ds of 3s  A \d+\.\d%  B \d+\.\d%$", out, re.M), out  # progress


def test_bench_sched_overlap(tmp_path):
    path = tmp_path / "overlap.json"
    p = _pvgpu("bench", "sched", "--quick", "--parts", "overlap", "--json", str(path), timeout=90)
    assert p.returncode == 0, p.stdout + p.stderr
    o = json.loads(path.read_text())["overlap"]
    assert o["verified"] and o["gemms"] >= 1
    for key in ("copy_s", "gemm_s", "concurrent_s", "burn_s", "burn_concurrent_s",
                "concurrent_vs_max", "concurrent_vs_sum", "burn_concurrent_vs_max"):
        assert o[key] > 0  # timings only: how much they overlap depends on the machine


@pytest.mark.parametrize("args", [["--policies", "lottery"], ["--parts", "everything"]])
def test_bench_sched_rejects_unknown_names(args):
    p = _pvgpu("bench", "sched", *args, timeout=30)
    assert p.returncode == 2 and "unknown part or policy" in p.stdout
