"""End to end: `pvgpu demo p2p` and `pvgpu bench p2p` as the user runs them (real host and
guest processes, reaped by the commands themselves). Structure and verification only: the
benchmark's timing targets depend on the machine and are never asserted."""

import json
import os
import subprocess
import sys


def _pvgpu(*args, timeout):
    return subprocess.run([sys.executable, "-m", "pvgpu", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_demo_p2p_verifies_with_and_without_peer_to_peer():
    p = _pvgpu("demo", "p2p", timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    lines = {l.split()[0]: l for l in out.splitlines() if l.startswith(("switch ", "sockets "))}
    assert set(lines) == {"switch", "sockets"}, out
    assert "placement peer " in lines["switch"] and "peer access yes" in lines["switch"]
    assert "placement system " in lines["sockets"] and "peer access no" in lines["sockets"]
    for line in lines.values():
        assert " verified " in line and "NOT verified" not in line, out
    assert "both topologies verified" in out


def test_demo_p2p_rejects_vgpu_options():
    p = _pvgpu("demo", "p2p", "--guests", "2", timeout=30)
    assert p.returncode == 2 and "vGPU demo" in p.stderr


def test_bench_p2p_quick(tmp_path):
    path = tmp_path / "p2p.json"
    p = _pvgpu("bench", "p2p", "--quick", "--json", str(path), timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "this machine's memcpy" in out and "sockets host refused peer access" in out
    data = json.loads(path.read_text())
    assert data["verified"] and data["sockets_refused_peer_access"]
    assert data["host_exit"] == {"switch": 0, "sockets": 0}
    assert data["links"]["switch"]["p2p"] and not data["links"]["sockets"]["p2p"]
    assert [r["size_mib"] for r in data["sizes"]] == [16, 64]
    for r in data["sizes"]:
        assert r["verified"] and all(r["verified_by_mode"].values()), r["verified_by_mode"]
        assert set(r["modes"]) == {"memcpy", "memcpy_mt", "p2p", "bounce", "bounce_sockets",
                                   "guest"}
        assert 1 <= r["memcpy_mt_threads"] <= max(2, os.cpu_count())
        # the best memcpy by any number of threads is at least as fast as one memcpy
        assert r["modes"]["memcpy_mt"]["median_ms"] <= r["modes"]["memcpy"]["median_ms"]
        for m in r["modes"].values():
            assert m["median_ms"] > 0 and m["gbs"] > 0
        assert set(r["ratios"]) == {"p2p_vs_bounce", "p2p_vs_bounce_sockets", "p2p_vs_guest",
                                    "p2p_vs_memcpy", "p2p_vs_memcpy_mt"}
        assert all(v > 0 for v in r["ratios"].values())
        assert all(len(runs) == data["reps"] for runs in r["runs_s"].values())
        assert isinstance(r["met_targets"], bool)
