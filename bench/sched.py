"""`pvgpu bench sched`: the GPU scheduler's fairness, Gdev's experiment (ATC 2012, §6.3).

  alone    each of the two tenants below alone on the device (fifo, no competition):
           how much device time it can use at all -- a tenant whose jobs come with gaps
           cannot reach its share even when the scheduler holds the device for it
  unfair   for each policy (fifo, credit, band): a fresh host with two vGPUs of 50 %
           compute and copy each on device 0; guest A runs `long` (20 ms kernels back to
           back), guest B runs `short` (1 ms kernels, `--short-us`, each launched when the
           previous one is synchronized: its turnaround is the gap). Utilisation per
           vGPU from the host's statistics (admin `stats` busy time deltas) over `seconds`,
           measured after both guests have started and a warm-up.
  fair     band, four vGPUs of 25 % each, four guests all running `long`.
  overlap  one guest, two streams: a 64 MiB host->device copy alone, gemms of about
           the same device time alone, and both at once on different streams; again with
           a burn kernel of the copy's length instead of the gemms (device time without
           host CPU: the engines' concurrency without the CPU contention of emulation).

Figures (pvgpu/fairness.py: Jain's index and Gdev's mean error): utilisation U per
vGPU, Jain's index over U/share, mean |U - share| in percentage points (of the run's
means; also over one-second samples). Gdev's published means are printed beside ours.
The hosts and guests are `pvgpu host` and `pvgpu tenant` processes, forked from a server
that has imported them (bench/forkserver.py); `burn` kernels occupy the compute engine
without host CPU, so even a 2-core machine measures the scheduler, not the CPU.

While a run is measured the bench polls the statistics every SERIES_PERIOD_S and keeps
the series (device time and each vGPU's cumulative busy time): `--plot DIR` draws it as
utilisation per vGPU over time (pvgpu.plots), and a progress line comes every PROGRESS_S
(twice in a shorter run). `plan()` lists the shared runs with their warm-up and measured
seconds; `--quick` measures QUICK_SECONDS per run (QUICK_ALONE_S alone), and each run's
host is started while the previous run shuts down (HostPrefetch), since a quick run is
mostly processes starting.

Targets: FIFO shows the skew (the short-kernel vGPU starved); BAND Jain >= 0.98 and
mean |U - share| <= 7 pp; four fair vGPUs each within 25 +- 3 %. Overlap: concurrent /
max(alone) near 1 means the copy and compute engines overlap; concurrent / sum(alone)
near 1 means they do not.
"""

from __future__ import annotations

import os
import platform
import shutil
import threading
import time
from dataclasses import dataclass

import numpy as np

from pvgpu.bench import forkserver
from pvgpu.bench.common import write_json
from pvgpu import guest
from pvgpu.bench.hotpaths import _median_time
from pvgpu import fairness
from pvgpu.demo import parse_tenant_output, tenant_args, vgpu_arg
from pvgpu.procs import HostStartError, private_endpoint
from pvgpu.smi import DeviceStats
from pvgpu.transport.admin import admin_endpoint_for
from pvgpu.spec import wire

MiB = 1 << 20
STARTUP_S = 30.0  # every guest must have a context by then
TENANT_SLACK_S = 60.0  # tenants are told to run this much longer and stopped by SIGTERM
PARTS = ("alone", "unfair", "fair", "overlap")

# Gdev, ATC 2012, Figure 12 (the means of the paper's measurements):
# the short-kernel vGPU is the one FIFO starves, so FIFO's 14.6 % is the short tenant.
GDEV = {"fifo": {"A": 0.863, "B": 0.146}, "credit": {"A": 0.856, "B": 0.146},
        "band": {"A": 0.510, "B": 0.390}}
UNFAIR = (("A", "long", {"compute": 50, "copy": 50}), ("B", "short", {"compute": 50, "copy": 50}))
TARGET_JAIN = 0.98
TARGET_ERROR = 0.07
FAIR_N = 4
FAIR_TOLERANCE = 0.03
SERIES_PERIOD_S = 0.25  # the utilisation series (--plot) and the polling period
SAMPLE_NS = 1_000_000_000  # the samples of the per-sample mean error: one second each
SECONDS, QUICK_SECONDS = 20.0, 1.5  # measured per run
ALONE_S, QUICK_ALONE_S = 5.0, 0.5  # at most, per tenant alone
WARMUP_S, QUICK_WARMUP_S = 1.0, 0.25
VRAM = "512M"  # per device, of every shared run's host
OVERLAP_HOST = ("fifo", (), (), "1G")  # the overlap run's host: no vGPUs
PROGRESS_S = 1.5  # a progress line this often while a run is measured


@dataclass(frozen=True)
class Run:
    """One shared-device run: a host with `policy` and one vGPU per tenant (name, workload,
    shares) on device 0, `warmup` seconds once every tenant runs, then `seconds` measured.
    `tenant_extra`: (name, extra `pvgpu tenant` args) pairs."""

    part: str
    policy: str
    tenants: tuple
    seconds: float
    warmup: float
    host_args: tuple = ()
    tenant_extra: tuple = ()
    vram: str = VRAM

    @property
    def host_key(self) -> tuple:
        """What SchedHost starts for this run (runs with the same key need the same host)."""
        return (self.policy, self.tenants, self.host_args, self.vram)


FAIR_TENANTS = tuple((f"v{i + 1}", "long", {"compute": 100 // FAIR_N, "copy": 100 // FAIR_N,
                                            "mem": 100 // FAIR_N}) for i in range(FAIR_N))


def plan(parts=PARTS, policies=tuple(GDEV), seconds: float | None = None, quick: bool = False,
         host_args=(), short_us: int = 1000) -> list:
    """The shared runs of `parts` in the order they run (overlap, which has no measured
    seconds, is not one): pure, so that the quick plan's length is checked by a test."""
    if seconds is None:
        seconds = QUICK_SECONDS if quick else SECONDS
    warmup = QUICK_WARMUP_S if quick else WARMUP_S
    alone_s = min(seconds, QUICK_ALONE_S if quick else ALONE_S)
    short_extra = (("B", ("--kernel-us", str(short_us))),)
    host_args = tuple(host_args)
    runs = []
    if "alone" in parts:
        runs += [Run("alone", "fifo", (t,), alone_s, warmup, (), short_extra) for t in UNFAIR]
    if "unfair" in parts:
        runs += [Run("unfair", p, UNFAIR, seconds, warmup, host_args, short_extra) for p in policies]
    if "fair" in parts:
        runs.append(Run("fair", "band", FAIR_TENANTS, seconds, warmup, host_args))
    return runs


def scheduled_seconds(runs) -> float:
    """The warm-up and measured seconds of `runs`: the part of a bench's time that does
    not depend on how fast processes start."""
    return sum(r.warmup + r.seconds for r in runs)


class SchedHost:
    """A private `pvgpu host` (forked, bench/forkserver.py) with a scheduling policy and
    vGPUs on device 0: `key` is Run.host_key, (policy, tenants, host_args, vram)."""

    def __init__(self, key, ready_timeout: float = 30.0):
        policy, tenants, host_args, vram = key
        self.key = key
        self.endpoint, self.tmpdir = private_endpoint("pvgpu-bench-sched")
        ready = os.path.join(self.tmpdir, "ready")
        args = ["host", "--no-default", "--listen", self.endpoint, "--vram", vram,
                "--ready-file", ready, "--sched", policy, *host_args]
        for n, _w, s in tenants:
            args += ["--vgpu", vgpu_arg(n, s)]
        self.proc = forkserver.Forked(args, os.path.join(self.tmpdir, "host.log"))
        deadline = time.monotonic() + ready_timeout
        while not os.path.exists(ready):
            exited = self.proc.poll()
            if exited is not None or time.monotonic() > deadline:
                text = self.stop_with_output()[1].strip()
                why = (f"exited with {exited} before it was ready" if exited is not None
                       else f"was not ready after {ready_timeout:g} s")
                raise HostStartError(f"the bench's host {why}: "
                                     f"{text.splitlines()[-1] if text else '(it wrote nothing)'}")
            time.sleep(0.02)

    def stop_with_output(self) -> tuple:
        """SIGTERM, SIGKILL after 10 s; -> (exit status, what the host wrote)."""
        try:
            self.proc.terminate()
            return self.proc.reap(timeout=10.0)
        finally:
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    def stop(self) -> int:
        return self.stop_with_output()[0]


class HostPrefetch:
    """Starts the next run's host in a thread while the current run shuts down its
    guests and host (a quick run spends much of its time waiting for processes to
    start); take() hands it over, or starts one if none of that key was prefetched."""

    def __init__(self):
        self._key = self._thread = None
        self._box = []

    def prefetch(self, key) -> None:
        self.close()
        self._key, self._box = key, []
        self._thread = threading.Thread(target=self._start, args=(key, self._box), daemon=True)
        self._thread.start()

    @staticmethod
    def _start(key, box):
        try:
            box.append(SchedHost(key))
        except Exception as e:  # reported by take()
            box.append(e)

    def take(self, key) -> SchedHost:
        if self._thread is None or self._key != key:
            self.close()
            return SchedHost(key)
        self._thread.join()
        got, self._thread, self._key = self._box[0], None, None
        if isinstance(got, Exception):
            raise got
        return got

    def close(self) -> None:
        """Stop a prefetched host nobody took."""
        if self._thread is not None:
            self._thread.join()
            if isinstance(self._box[0], SchedHost):
                self._box[0].stop()
            self._thread = self._key = None


def run_shared(spec: Run, out=None, hosts: HostPrefetch | None = None, then=None) -> dict:
    """Run `spec` on a fresh host, a `pvgpu tenant` bound to each vGPU; -> utilisation and
    fairness of the run, with the utilisation series sampled every SERIES_PERIOD_S.
    `out`: progress lines; `hosts`: where the host comes from, and where the host of the
    next run (`then`: its host_key) is started once this one's measurement ended."""
    policy, tenants, seconds, warmup = spec.policy, spec.tenants, spec.seconds, spec.warmup
    tenant_extra = dict(spec.tenant_extra)
    label = f"  {policy} {'+'.join(n for n, _w, _s in tenants)}:"

    def progress(text):
        if out is not None:
            out(f"{label} {text}")
    names = [n for n, _w, _s in tenants]
    share = {n: s["compute"] / 100 for n, _w, s in tenants}
    hosts = hosts or HostPrefetch()
    host = mon = None
    procs = []
    run = {"policy": policy, "shares": share, "workloads": {n: w for n, w, _s in tenants}}
    try:
        host = hosts.take(spec.host_key)
        endpoint = host.endpoint
        mon = dev = DeviceStats(admin_endpoint_for(endpoint), 0)  # every vGPU: admin only
        progress("host up, starting the guests")
        for i, (n, w, _s) in enumerate(tenants):
            args = tenant_args(endpoint, n, w, warmup + seconds + TENANT_SLACK_S, seed=i)
            procs.append(forkserver.Forked(args + list(tenant_extra.get(n, ())),
                                           os.path.join(host.tmpdir, f"tenant-{n}.log")))
        deadline = time.monotonic() + STARTUP_S
        snap = dev.stats()
        while not fairness.all_active(snap, names):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError("a guest did not start (or ended at once)")
            time.sleep(0.05)
            snap = dev.stats()
        progress(f"guests running; {warmup:g}s warm-up, then {seconds:g}s measured")
        time.sleep(warmup)
        start = dev.stats()
        samples, series = _measure(dev, start, names, seconds, progress)
        end = dev.stats()
        if not fairness.all_active(end, names):
            raise RuntimeError("a guest ended before the measurement did")
        if then is not None:
            hosts.prefetch(then)
    finally:
        for p in procs:
            p.terminate()
        reaped = [p.reap(timeout=15.0) for p in procs]
        if mon is not None:
            try:
                mon.close()
            except Exception:
                pass
        run["host_exit"] = host.stop() if host is not None else None
    run["guests"] = {}
    for (n, _w, _s), (code, text) in zip(tenants, reaped):
        r = parse_tenant_output(text) or {"verified": False, "error": text.strip()[-400:]}
        r["exit"] = code
        run["guests"][n] = r
    util = fairness.utilisation(start, end, names)
    run.update(window_s=(end["now_ns"] - start["now_ns"]) / 1e9, util=util,
               turnaround_us={n: fairness.turnaround_us(end, n) for n in names},
               copy_util=fairness.copy_utilisation(start, end, names),
               samples=samples, series=series, **fairness.summarise(util, share, samples),
               verified=all(g.get("verified") and g["exit"] == 0 for g in run["guests"].values()))
    return run


def _measure(dev, start: dict, names, seconds: float, progress) -> tuple:
    """Poll the device's statistics every SERIES_PERIOD_S for `seconds` from snapshot
    `start`. -> (samples: {name: U} over about one second each, series: {t_s, busy_s:
    {name: [s]}}: at each poll the device time since `start`, and the device time each
    vGPU used since then: the utilisation over any window is d busy_s / d t_s); a
    progress line every PROGRESS_S, or twice in a shorter run."""
    samples, t_s, busy_s = [], [], {n: [] for n in names}
    prev_sample = prev_line = start
    every_ns = min(PROGRESS_S, seconds / 2) * 1e9
    t_end = time.monotonic() + seconds
    while (left := t_end - time.monotonic()) > 0:
        time.sleep(min(SERIES_PERIOD_S, left))
        cur = dev.stats()
        t_s.append((cur["now_ns"] - start["now_ns"]) / 1e9)
        for n in names:
            busy_s[n].append((fairness.busy_ns(cur, n) - fairness.busy_ns(start, n)) / 1e9)
        if cur["now_ns"] - prev_sample["now_ns"] >= SAMPLE_NS:
            samples.append(fairness.utilisation(prev_sample, cur, names))
            prev_sample = cur
        if cur["now_ns"] - prev_line["now_ns"] >= every_ns:
            u = fairness.utilisation(prev_line, cur, names)
            progress(f"{t_s[-1]:4.1f}s of {seconds:g}s  "
                     + "  ".join(f"{n} {_pct(x)}" for n, x in u.items()))
            prev_line = cur
    return samples, {"t_s": t_s, "busy_s": busy_s}


def bench_overlap(reps: int, size: int = 64 * MiB, out=None, hosts: HostPrefetch | None = None) -> dict:
    """Copy and compute engines at once: one guest, a copy stream and a compute stream.
    `out`: a progress line before each measurement; `hosts`: where its host comes from."""
    def progress(text):
        if out is not None:
            out(f"  overlap: {text} x{reps} ...")
    host = (hosts or HostPrefetch()).take(OVERLAP_HOST)
    try:
        with guest.connect(host.endpoint, memory=wire.MEMORY_SHARED, mem_size=192 * MiB) as conn:
            with conn.devices[0].create_context("overlap") as ctx:
                rng = np.random.default_rng(3)
                buf = rng.integers(0, 255, size, dtype=np.uint8)
                d = ctx.empty(size, np.uint8)
                m = 1024
                A = rng.standard_normal((m, m)).astype(np.float32)
                B = rng.standard_normal((m, m)).astype(np.float32)
                dA, dB, dC = ctx.to_device(A), ctx.to_device(B), ctx.empty((m, m))
                s_copy, s_comp = ctx.create_stream(), ctx.create_stream()

                def copy():
                    d.copy_from_host(buf, stream=s_copy)

                def gemms(k):
                    for _ in range(k):
                        s_comp.launch("gemm", grid=(4, m), block=256, args=(dA, dB, dC, m, m, m))

                def gemm_alone(k):
                    gemms(k)
                    s_comp.synchronize()

                def both(k):
                    gemms(k)  # queued on the compute engine first, then the copy
                    copy()
                    s_comp.synchronize()

                progress(f"{size >> 20} MiB host->device copy alone")
                t_copy = _median_time(copy, reps)
                progress("one gemm alone")
                t_one = _median_time(lambda: gemm_alone(1), reps)
                k = max(1, round(t_copy / t_one))
                progress(f"{k} gemms alone")
                t_gemm = _median_time(lambda: gemm_alone(k), reps)
                progress(f"{k} gemms and the copy at once")
                t_both = _median_time(lambda: both(k), reps)
                # the same with a burn kernel of the copy's length: device time without
                # host CPU, so what remains is the engines' own concurrency
                burn_us = max(1, int(t_copy * 1e6))

                def burn():
                    s_comp.launch("burn", grid=1, block=1, args=(burn_us,))

                def burn_alone():
                    burn()
                    s_comp.synchronize()

                def burn_both():
                    burn()
                    copy()
                    s_comp.synchronize()

                progress("burn kernel alone")
                t_burn = _median_time(burn_alone, reps)
                progress("burn kernel and the copy at once")
                t_burn_both = _median_time(burn_both, reps)
                ok = bool(np.array_equal(d.to_host(), buf)) and bool(
                    np.allclose(dC.to_host(), A @ B, rtol=1e-4, atol=1e-3))
                s_copy.destroy()
                s_comp.destroy()
    finally:
        host.stop()
    return {"copy_s": t_copy, "gemm_s": t_gemm, "gemms": k, "concurrent_s": t_both,
            "concurrent_vs_max": t_both / max(t_copy, t_gemm),
            "concurrent_vs_sum": t_both / (t_copy + t_gemm),
            "burn_s": t_burn, "burn_concurrent_s": t_burn_both,
            "burn_concurrent_vs_max": t_burn_both / max(t_copy, t_burn),
            "burn_concurrent_vs_sum": t_burn_both / (t_copy + t_burn), "verified": ok}


def _pct(x) -> str:
    return "—" if x is None else f"{x * 100:.1f}%"


def gap_bound(b_alone: float) -> dict:
    """The fairest split any policy can reach when B, alone on the device, uses only
    `b_alone` of it (the device idles in B's gaps, which no scheduler can fill for B): A
    at its 50 % share, B at 50 % x b_alone. -> {"jain", "mean_abs_error"} over U/share."""
    share = {"A": 0.5, "B": 0.5}
    best = {"A": 0.5, "B": 0.5 * min(1.0, b_alone)}
    return {"jain": fairness.jain_over_shares(best, share),
            "mean_abs_error": fairness.mean_abs_error(best, share)}


def print_unfair(runs: dict, alone=None, out=print, short_us: int = 1000) -> None:
    cols = list(runs) + [f"Gdev {p}" for p in GDEV]
    w = 12
    out(f"\nunfair load, two vGPUs of 50 %: A runs `long` (20 ms kernels), B runs `short` "
        f"({short_us / 1000:g} ms kernels, its turnaround as the gap); compute utilisation")
    out(f"{'':<22}" + "".join(f"{c:>{w}}" for c in cols))

    def row(label, ours, gdev):
        out(f"{label:<22}" + "".join(f"{ours(r):>{w}}" for r in runs.values())
            + "".join(f"{gdev(g):>{w}}" for g in GDEV.values()))

    share = {"A": 0.5, "B": 0.5}
    row("util A (long)", lambda r: _pct(r["util"]["A"]), lambda g: _pct(g["A"]))
    row("util B (short)", lambda r: _pct(r["util"]["B"]), lambda g: _pct(g["B"]))
    row("Jain (U/share)", lambda r: f"{r['jain']:.3f}",
        lambda g: f"{fairness.jain_over_shares(g, share):.3f}")
    row("mean |U-share|", lambda r: f"{r['mean_abs_error'] * 100:.1f} pp",
        lambda g: f"{fairness.mean_abs_error(g, share) * 100:.1f} pp")
    row("  per 1 s sample", lambda r: f"{(r['mean_abs_error_samples'] or 0) * 100:.1f} pp",
        lambda g: "")
    row("B's hold (turnaround)", lambda r: "—" if r.get("turnaround_us", {}).get("B") is None
        else f"{r['turnaround_us']['B']} µs", lambda g: "")
    row("copy util A / B", lambda r: f"{r['copy_util']['A'] * 100:.0f}/{r['copy_util']['B'] * 100:.0f}%",
        lambda g: "")
    row("guests verified", lambda r: "yes" if r["verified"] else "NO", lambda g: "")
    if alone:
        bound = gap_bound(alone["B"]["util"]["B"])
        out(f"(B alone on the device uses {_pct(alone['B']['util']['B'])}: between its kernels "
            f"the device idles; a scheduler that holds the device for B cannot give it more: "
            f"the best any policy can do here is Jain {bound['jain']:.3f}, "
            f"{bound['mean_abs_error'] * 100:.1f} pp)")
    out("(Gdev: means from the paper's raw data; its short-kernel vGPU is the one FIFO starves)")


def targets(result: dict) -> dict:
    """-> {target: bool} for the parts that ran."""
    t = {}
    unfair = result.get("unfair", {})
    if "fifo" in unfair:
        u = unfair["fifo"]["util"]
        t["fifo_skew (A > 2 B)"] = u["A"] > 2 * u["B"]
    if "band" in unfair:
        b = unfair["band"]
        t[f"band_jain >= {TARGET_JAIN}"] = b["jain"] >= TARGET_JAIN
        t[f"band_mean_error <= {TARGET_ERROR * 100:.0f} pp"] = b["mean_abs_error"] <= TARGET_ERROR
    if "fair" in result:
        f = result["fair"]
        t[f"fair_{FAIR_N}_within_25+-{FAIR_TOLERANCE * 100:.0f}"] = all(
            abs(u - 1 / FAIR_N) <= FAIR_TOLERANCE for u in f["util"].values())
    return t


def run_bench(seconds: float | None = None, policies=("fifo", "credit", "band"), json_path=None,
              quick: bool = False, parts=PARTS, time_buffer_us: int | None = None,
              out=None, short_us: int = 1000, plot_dir: str | None = None) -> int:
    """The parts of the module docstring; `seconds` measured per run (default SECONDS, or
    QUICK_SECONDS with `quick`); `plot_dir`: also draw the utilisation series there
    (pvgpu.plots). -> exit code."""
    out = out or (lambda *a: print(*a, flush=True))
    if seconds is None:
        seconds = QUICK_SECONDS if quick else SECONDS
    parts = [p.strip() for p in parts if p.strip()]
    policies = [p.strip() for p in policies if p.strip()]
    bad = [p for p in parts if p not in PARTS] + [p for p in policies if p not in GDEV]
    if bad:
        out(f"pvgpu bench sched: unknown part or policy {bad[0]!r} (parts: {', '.join(PARTS)}; "
            f"policies: {', '.join(GDEV)})")
        return 2
    host_args = [] if time_buffer_us is None else ["--time-buffer-us", str(time_buffer_us)]
    runs = plan(parts, policies, seconds, quick, host_args, short_us)
    result = {"machine": {"python": platform.python_version(), "numpy": np.__version__,
                          "cpus": os.cpu_count()},
              "seconds": seconds, "warmup_s": QUICK_WARMUP_S if quick else WARMUP_S,
              "time_buffer_us": time_buffer_us, "short_us": short_us,
              "gdev": GDEV}
    if runs:
        forkserver.start()  # it imports the tenants' modules while the first host starts
    hosts = HostPrefetch()
    try:
        ok = _run_parts(result, runs, "overlap" in parts, quick, short_us, out, hosts)
    finally:
        hosts.close()
    t = targets(result)
    result["targets"] = t
    if t:
        out("\ntargets: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in t.items()))
    write_json(json_path, result, out)
    if plot_dir is not None and (result.get("unfair") or result.get("fair")):
        from pvgpu import plots
        out(f"wrote {plots.sched_figure(result, plot_dir)}")
    if not ok:
        out("pvgpu bench sched: a guest failed verification or the host did not exit cleanly")
    return 0 if ok else 1


def _run_parts(result, runs, overlap: bool, quick: bool, short_us: int, out, hosts) -> bool:
    """Run the shared `runs` (plan()) part by part into `result`, then the overlap part if
    `overlap`; each run's host starts while the run before it shuts down. -> all verified."""
    ok = True
    keys = [r.host_key for r in runs] + ([OVERLAP_HOST] if overlap else [])

    def shared(k: int) -> dict:
        nonlocal ok
        r = run_shared(runs[k], out=out, hosts=hosts, then=keys[k + 1] if k + 1 < len(keys) else None)
        ok &= r["verified"] and r["host_exit"] == 0
        return r
    index = {part: [k for k, r in enumerate(runs) if r.part == part] for part in PARTS}
    if index["alone"]:
        alone_s = runs[index["alone"][0]].seconds
        out(f"alone: each tenant by itself on the device, {alone_s:g}s measured ...")
        result["alone"] = {runs[k].tenants[0][0]: shared(k) for k in index["alone"]}
        out(f"alone ({alone_s:g}s each, nothing else on the device): A `long` uses "
            f"{_pct(result['alone']['A']['util']['A'])} of the compute engine, B `short` "
            f"{_pct(result['alone']['B']['util']['B'])}")
    if index["unfair"]:
        result["unfair"] = {}
        for k in index["unfair"]:
            policy, seconds = runs[k].policy, runs[k].seconds
            out(f"{policy}: A long, B short, {seconds:g}s measured ...")
            r = result["unfair"][policy] = shared(k)
            out(f"{policy}: A {_pct(r['util']['A'])}  B {_pct(r['util']['B'])}  Jain {r['jain']:.3f}  "
                f"mean |U-share| {r['mean_abs_error'] * 100:.1f} pp")
        if "alone" in result:
            result["unfair_bound"] = gap_bound(result["alone"]["B"]["util"]["B"])
        print_unfair(result["unfair"], result.get("alone"), out, short_us)
    for k in index["fair"]:
        out(f"\nfair load under band: {FAIR_N} vGPUs of {100 // FAIR_N} %, every guest `long`, "
            f"{runs[k].seconds:g}s measured ...")
        r = result["fair"] = shared(k)
        out("  " + "   ".join(f"{n} {_pct(u)}" for n, u in r["util"].items())
            + f"   Jain {r['jain']:.3f}   mean |U-share| {r['mean_abs_error'] * 100:.1f} pp"
            f"   (Gdev: about 24 % each)")
    if overlap:
        out("\ncopy/compute overlap ...")
        o = bench_overlap(reps=3 if quick else 7, out=out, hosts=hosts)
        result["overlap"] = o
        ok &= o["verified"]
        out(f"copy/compute overlap, two streams of one guest: 64 MiB host->device "
            f"{o['copy_s'] * 1e3:.1f} ms alone, {o['gemms']} gemm 1024^3 {o['gemm_s'] * 1e3:.1f} ms "
            f"alone, both {o['concurrent_s'] * 1e3:.1f} ms: {o['concurrent_vs_max']:.2f}x the longer "
            f"alone (1 = full overlap), {o['concurrent_vs_sum']:.2f}x the sum (1 = none)")
        out(f"  with a burn kernel of the copy's length instead (device time, no host CPU): "
            f"burn {o['burn_s'] * 1e3:.1f} ms alone, both {o['burn_concurrent_s'] * 1e3:.1f} ms: "
            f"{o['burn_concurrent_vs_max']:.2f}x the longer, {o['burn_concurrent_vs_sum']:.2f}x the sum"
            f" (burn uses no host CPU; gemm and the copy both do, on {os.cpu_count()} CPUs here)")
    return ok
