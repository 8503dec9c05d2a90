"""`pvgpu bench soak`: the host's memory after load, round after round (outside CI).

A host process is started; each round, G guest processes (default 8) run N mixed
operations each (default 2,000: bench/jobs.py's mix of tiny launches, 4 KiB copies and
synchronizations, checked against a numpy model) and disconnect; with `--workloads`
the `pvgpu run` workloads (vector-add, saxpy, gemm) then run once in each memory model.
After every round the host's resident set (VmRSS) and its peak (VmHWM) are read from
/proc once its sessions are gone. A host that releases what ended sessions owned
reaches a plateau: the last rounds add (next to) nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

from pvgpu.bench.common import write_json
from pvgpu.bench.jobs import _children
from pvgpu.procs import HostProcess, private_endpoint


def _status_mib(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def _workloads(endpoint: str) -> None:
    for memory in ("shared", "inline"):
        subprocess.run([sys.executable, "-m", "pvgpu", "run", "vector-add", "saxpy", "gemm",
                        "--connect", endpoint, "--memory", memory], check=True,
                       stdout=subprocess.DEVNULL, timeout=600)


def run_bench(*, rounds: int = 5, guests: int = 8, ops: int = 2000, vram: str = "1G",
              workloads: bool = False, json_path: str | None = None, out=print) -> dict:
    endpoint, tmp = private_endpoint("pvgpu-soak")
    try:
        host = HostProcess([endpoint], vram=vram)
    except Exception:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    pid = host.proc.pid
    try:
        time.sleep(0.5)
        start = _status_mib(pid, "VmRSS")
        out(f"host rss at start: {start:6.1f} MiB ({vram} VRAM per GPU)")
        out(f"{'round':>5} {'seconds':>8} {'rss MiB':>8} {'peak MiB':>9}")
        figures = []
        for r in range(rounds):
            t0 = time.monotonic()
            results, _wall = _children([("guest", endpoint, str(ops), str(r * guests + g))
                                        for g in range(guests)], 600.0)
            if not all(x["verified"] for x in results):
                raise AssertionError("a soak guest's arrays differ from its model")
            if workloads:
                _workloads(endpoint)
            time.sleep(0.5)  # the guests said bye; let the host reclaim and release
            rss, peak = _status_mib(pid, "VmRSS"), _status_mib(pid, "VmHWM")
            figures.append({"round": r + 1, "seconds": time.monotonic() - t0, "rss_mib": rss,
                            "peak_mib": peak})
            out(f"{r + 1:5d} {figures[-1]['seconds']:8.1f} {rss:8.1f} {peak:9.1f}")
        if not host.alive():
            raise RuntimeError("the host died during the soak")
    finally:
        code = host.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    result = {"guests": guests, "ops": ops, "vram": vram, "workloads": workloads,
              "start_rss_mib": start, "rounds": figures, "host_exit_code": code}
    if len(figures) >= 2:
        grow = figures[-1]["rss_mib"] - figures[len(figures) // 2]["rss_mib"]
        out(f"rss change over the second half of the rounds: {grow:+.1f} MiB")
        result["second_half_growth_mib"] = grow
    write_json(json_path, result, out)
    return result
