"""`pvgpu bench faults`: how fast a failure on one side is seen on the other.

  guest SIGKILL   a guest process holding 64 MiB of VRAM and a context is SIGKILLed in
                  the middle of a transfer (16 MiB host->device copies in a loop) or of a
                  kernel (`burn` of KERNEL_US, back to back); measured from the kill until
                  another guest, polling the host's GET_STATS, sees the VRAM and the
                  contexts of the whole GPU back where they were before the guest came
                  (spec [CTL-HB-7]). The kernels are long (KERNEL_US): the host stops the
                  one the kill interrupted by resetting its engine (host/kmd/tdr.py
                  preempt) instead of letting it run to its end
  host SIGKILL    a guest thread blocked in `synchronize` on a kernel that never ends;
                  measured from the host's SIGKILL until synchronize raises HostLost, in
                  both memory models ([CTL-HB-6])
  host SIGTERM    the same with SIGTERM: the host's `shutdown` notice ([CTL-BYE-2]) must
                  make synchronize raise HostLost("host shut down ...")

Every host runs with the default heartbeat (1 s: three missed periods are 3 s), so a
figure under a second is the connection events' doing, not the heartbeats'. Each case
runs REPS times (--quick: QUICK_REPS) and reports the median and the maximum, against
TARGETS (seconds).
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time

from pvgpu.bench.common import write_json
from pvgpu.procs import HostProcess, private_endpoint

REPS = 10
QUICK_REPS = 2
VRAM = "256M"
VICTIM_BYTES = 64 << 20
KERNEL_US = 5_000_000  # the victim's kernels: a kill lands in one (they run back to back)
TARGETS = {  # case -> the bound (seconds) of its median and of its maximum
    "guest_kill_mid_transfer": 0.5,
    "guest_kill_mid_kernel": 0.5,
    "host_kill_shared": 0.5,
    "host_kill_inline": 0.5,
    "host_sigterm": 0.2,
}
POLL_S = 0.001  # the observer's pause between two GET_STATS
WAIT_S = 30.0  # give up on one repetition after this long (reported as a failure)

# A guest that takes VRAM and a context, says "ready" once it is busy, and keeps busy.
VICTIM = """
import sys, numpy as np, pvgpu.guest as guest
mode = sys.argv[2]
c = guest.connect(sys.argv[1], mem_size=64 << 20)
ctx = c.devices[0].create_context()
bufs = [ctx.empty(16 << 20, np.uint8) for _ in range(4)]
host = np.ones(16 << 20, np.uint8)
if mode == "kernel":  # one kernel at a time on the GPU
    ctx.launch("burn", 1, 1, (1000,))
    ctx.synchronize()
    ctx.launch("burn", 1, 1, (KERNEL_US,))
    print("ready", flush=True)  # with a long kernel on the GPU
    ctx.synchronize()
    while True:
        ctx.launch("burn", 1, 1, (KERNEL_US,))
        ctx.synchronize()
else:
    bufs[0].copy_from_host(host)
    print("ready", flush=True)
    while True:
        for b in bufs:
            b.copy_from_host(host)
"""


def _host_view(dev) -> tuple:
    """(free VRAM, number of contexts of every session) on the observer's device."""
    mem = dev.stats()["mem"]
    return mem["vram_free"], mem["contexts_total"]


def guest_kill(endpoint: str, mode: str, reps: int) -> list:
    """-> seconds from each SIGKILL of a busy guest until the host holds nothing of it."""
    from pvgpu import guest

    times = []
    with guest.connect(endpoint, mem_size=8 << 20) as observer:
        dev = observer.devices[0]
        before = _host_view(dev)
        for _ in range(reps):
            script = VICTIM.replace("KERNEL_US", str(KERNEL_US))
            victim = subprocess.Popen([sys.executable, "-c", script, endpoint, mode],
                                      stdout=subprocess.PIPE, text=True)
            try:
                if victim.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"the {mode} guest did not start")
                vram_free, contexts = _host_view(dev)
                if vram_free > before[0] - VICTIM_BYTES or contexts != before[1] + 1:
                    raise RuntimeError(f"the {mode} guest holds nothing: {(vram_free, contexts)}")
                t0 = time.perf_counter()
                victim.send_signal(signal.SIGKILL)
                while _host_view(dev) != before:
                    if time.perf_counter() - t0 > WAIT_S:
                        raise RuntimeError(f"not reclaimed after {WAIT_S} s")
                    time.sleep(POLL_S)
                times.append(time.perf_counter() - t0)
            finally:
                if victim.poll() is None:
                    victim.kill()
                victim.wait()
                victim.stdout.close()
    return times


def host_stop(memory: str, sig: int, reps: int) -> list:
    """-> seconds from each signal to a host until a guest blocked in synchronize raises
    HostLost (checked: "host shut down" after SIGTERM)."""
    from pvgpu import guest
    from pvgpu.spec import wire

    times = []
    for _ in range(reps):
        endpoint, d = private_endpoint("pvgpu-faults")
        host = HostProcess([endpoint], vram="64M")
        try:
            conn = guest.connect(host.endpoint, memory=memory, mem_size=8 << 20)
            ctx = conn.devices[0].create_context()
            ctx.launch("burn", 1, 1, (wire.BURN_FOREVER,))
            raised = {}

            def wait():
                try:
                    ctx.synchronize()
                except guest.HostLost as e:
                    raised["at"], raised["error"] = time.perf_counter(), e

            t = threading.Thread(target=wait, daemon=True)
            t.start()
            time.sleep(0.2)  # past the driver's polling: blocked on the channel
            t0 = time.perf_counter()
            host.proc.send_signal(sig)
            t.join(WAIT_S)
            if "at" not in raised:
                raise RuntimeError(f"synchronize did not raise HostLost within {WAIT_S} s")
            if sig == signal.SIGTERM and "host shut down" not in str(raised["error"]):
                raise RuntimeError(f"SIGTERM raised {raised['error']!r}, not a shutdown")
            times.append(raised["at"] - t0)
            conn.close()
        finally:
            host.stop()
            try:
                os.rmdir(d)
            except OSError:
                pass
    return times


def _summary(times: list) -> dict:
    return {"reps": len(times), "median_s": statistics.median(times), "max_s": max(times),
            "times_s": times}


def run_bench(json_path: str | None = None, quick: bool = False, out=None) -> dict:
    out = out or (lambda *a: print(*a, flush=True))
    reps = QUICK_REPS if quick else REPS
    results = {}
    out(f"pvgpu bench faults: {reps} repetition(s) each; seconds from the fault until the "
        "other side has acted on it")
    endpoint, d = private_endpoint("pvgpu-faults")
    with HostProcess([endpoint], vram=VRAM) as host:
        for mode in ("transfer", "kernel"):
            out(f"  guest_kill_mid_{mode} ...")
            results[f"guest_kill_mid_{mode}"] = _summary(guest_kill(host.endpoint, mode, reps))
    try:
        os.rmdir(d)
    except OSError:
        pass
    for memory in ("shared", "inline"):
        out(f"  host_kill_{memory} ...")
        results[f"host_kill_{memory}"] = _summary(host_stop(memory, signal.SIGKILL, reps))
    out("  host_sigterm ...")
    results["host_sigterm"] = _summary(host_stop("shared", signal.SIGTERM, reps))
    out(f"  {'case':28} {'median':>8} {'max':>8} {'target':>8}  met")
    for case, r in results.items():
        target = TARGETS[case]
        r["target_s"] = target
        r["met"] = r["median_s"] <= target and r["max_s"] <= target
        out(f"  {case:28} {r['median_s']:8.3f} {r['max_s']:8.3f} {target:8.3f}  "
            f"{'yes' if r['met'] else 'NO'}")
    write_json(json_path, results, out)
    return results
