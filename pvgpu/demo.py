"""`pvgpu demo`: a host and guest processes, every result verified.

Three demos:

  pvgpu demo                          the pair: a host with two GPUs and two guests (one
                                      per memory model), vector add and gemm on each GPU
  pvgpu demo --guests N --sched band  vGPU sharing: a host whose device 0 is split into
                                      N vGPUs g1..gN (equal shares, or --shares for
                                      unequal compute shares) and N `pvgpu tenant`
                                      processes, one bound to each vGPU, running the
                                      workloads long, short, copy, mixed in turn -- all on
                                      device 0, so they compete for one compute engine
                                      and its two copy engines
  pvgpu demo p2p                      a buffer shared between guests on two GPUs: guest
                                      A (`python -m pvgpu.demo p2p-producer`) computes
                                      16 MiB on GPU 0 with a kernel and exports it; guest
                                      B (`p2p-consumer`) gets the handle through a pipe,
                                      imports it on GPU 1 (with peer access when the
                                      fabric allows it), scales and sums it there. Run on
                                      a `--topology switch` host (placement "peer": GPU 1
                                      reads GPU 0's VRAM) and a `sockets` host ("system":
                                      the buffer moved to system memory); exits 0 when
                                      both are verified against numpy with the expected
                                      placement and every process exited cleanly

In the vGPU demo, while the tenants run, the demo polls the device's scheduling statistics
on the host's admin endpoint (the `stats` of spec §13: a guest's GET_STATS shows only its
own vGPU, [CMD-STATS-4]) once a second and prints each vGPU's compute and copy utilisation over that
second. At the end it prints, per vGPU, the mean utilisation over the time all tenants
ran against the share, and the fairness figures over *compute* (pvgpu.fairness): Jain's
index over U/share and the mean |U - share|. It exits 0 only when every tenant verified
its results and the host shut down cleanly. With `--plot DIR` it also draws each vGPU's
compute and copy utilisation of every second as DIR/demo.png (pvgpu.plots).
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time

from pvgpu.spec import wire
from pvgpu import fairness

WORKLOAD_CYCLE = ("long", "short", "copy", "mixed")
MAX_GUESTS = 8
TENANT_MEM = "64M"
STARTUP_S = 30.0  # tenants that have not all started by then: give up


# ---------------------------------------------------------------------- pure helpers
def parse_shares(text: str | None, guests: int | None) -> list:
    """Compute shares in percent, one per vGPU: `text` "50,30,20" or equal shares 100//N.
    -> list of ints; ValueError with the reason when they do not fit."""
    if text is None:
        n = 4 if guests is None else guests
        if not 1 <= n <= MAX_GUESTS:
            raise ValueError(f"--guests must be 1..{MAX_GUESTS}, not {n}")
        return [100 // n] * n
    try:
        shares = [int(s.strip().rstrip("%")) for s in text.split(",")]
    except ValueError:
        raise ValueError(f"--shares {text!r}: a comma-separated list of integer percents") from None
    if not 1 <= len(shares) <= MAX_GUESTS:
        raise ValueError(f"--shares gives {len(shares)} vGPUs; 1..{MAX_GUESTS} are possible")
    if guests is not None and guests != len(shares):
        raise ValueError(f"--shares gives {len(shares)} shares for --guests {guests}")
    if any(not 1 <= s <= 100 for s in shares):
        raise ValueError(f"--shares {text!r}: every share must be 1..100")
    if sum(shares) > 100:
        raise ValueError(f"--shares {text!r}: the shares add up to {sum(shares)} % (> 100 %)")
    return shares


def plan(compute_shares) -> list:
    """-> [(vgpu name, workload, {compute, copy, mem})] for g1..gN; copy and memory shares
    are equal (100 // N), compute shares as given."""
    n = len(compute_shares)
    return [(f"g{i + 1}", WORKLOAD_CYCLE[i % len(WORKLOAD_CYCLE)],
             {"compute": c, "copy": 100 // n, "mem": 100 // n})
            for i, c in enumerate(compute_shares)]


def vgpu_arg(name: str, shares: dict) -> str:
    """The host's --vgpu value: NAME:compute=P,copy=P,mem=P (the shares given)."""
    return f"{name}:" + ",".join(f"{k}={v}" for k, v in shares.items())


def tenant_args(endpoint: str, vgpu: str, workload: str, seconds: float, seed: int,
                device: int = 0, mem_size: str = TENANT_MEM) -> list:
    """The `pvgpu tenant` command line of one guest."""
    return ["tenant", workload, "--seconds", f"{seconds:g}", "--connect", endpoint,
            "--vgpu", vgpu, "--device", str(device), "--memory", wire.MEMORY_SHARED,
            "--mem-size", mem_size, "--seed", str(seed), "--name", f"tenant-{vgpu}", "--json"]


def parse_tenant_output(out: str) -> dict | None:
    """The last JSON object line a tenant printed (its result), or None."""
    for line in reversed(out.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def stop_guests(procs, timeout: float = 10.0) -> list:
    """SIGTERM every guest still running (a tenant then finishes its iteration, verifies
    and reports), reap all. -> [(returncode, output)] in order."""
    from pvgpu.procs import reap
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    return [reap(p, timeout) for p in procs]


def _say(*args) -> None:
    print(*args, flush=True)


def _host_log_tail(path: str, lines: int = 20) -> str:
    try:
        with open(path) as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


# ---------------------------------------------------------------------- the vGPU demo
def run_sharing(guests: int | None, sched: str = "band", seconds: float = 10.0,
                vram: str = "512M", shares: str | None = None, out=None,
                plot_dir: str | None = None) -> int:
    """The multi-guest demo (module docstring); `plot_dir`: also draw each guest's
    utilisation per second there (pvgpu.plots.demo_figure). -> exit code."""
    out = out or _say
    from pvgpu.procs import HostProcess, private_endpoint, spawn_guest
    from pvgpu.smi import DeviceStats
    from pvgpu.transport.admin import admin_endpoint_for
    try:
        compute = parse_shares(shares, guests)
    except ValueError as e:
        out(f"pvgpu demo: {e}")
        return 2
    tenants = plan(compute)
    share = {name: s["compute"] / 100 for name, _w, s in tenants}
    endpoint, tmpdir = private_endpoint("pvgpu-demo")
    host_log = os.path.join(tmpdir, "host.log")
    extra = ["--sched", sched]
    for name, _w, s in tenants:
        extra += ["--vgpu", vgpu_arg(name, s)]
    t_start = time.perf_counter()
    out(f"pvgpu demo: a host with {sched} scheduling on {endpoint}; device 0 split into "
        f"{len(tenants)} vGPUs (compute/copy/mem %): "
        + ", ".join(f"{n} {s['compute']}/{s['copy']}/{s['mem']}" for n, _w, s in tenants))
    host = procs = mon = None
    interrupted = False
    results = {}
    codes = {}
    host_code = None
    report = None
    try:
        host = HostProcess([endpoint], vram=vram, extra_args=extra, log_path=host_log)
        mon = dev = DeviceStats(admin_endpoint_for(endpoint), 0)  # every vGPU: admin only
        procs = []
        for i, (name, workload, _s) in enumerate(tenants):
            procs.append(spawn_guest(tenant_args(endpoint, name, workload, seconds, seed=i)))
            out(f"pvgpu demo: guest {i + 1} runs `{workload}` for {seconds:g}s on vGPU {name}, "
                f"device 0")
        report = _monitor(dev, tenants, procs, seconds, out)
    except KeyboardInterrupt:
        interrupted = True
        out("\npvgpu demo: interrupted; stopping the guests and the host")
    except Exception as e:  # a host that did not start, a lost monitor session, ...
        out(f"pvgpu demo: {type(e).__name__}: {e}")
    finally:
        reaped = stop_guests(procs or [], timeout=15.0)
        for (name, _w, _s), (code, text) in zip(tenants, reaped):
            codes[name] = code
            r = parse_tenant_output(text)
            if r is not None:
                results[name] = r
            elif code != 0:
                results[name] = {"verified": False, "error": text.strip()[-400:] or f"exit {code}"}
        if mon is not None:
            try:
                mon.close()
            except Exception:
                pass
        if host is not None:
            host_code = host.stop()
        log_tail = _host_log_tail(host_log) if host_code not in (0, None) else ""
        shutil.rmtree(tmpdir, ignore_errors=True)
    if interrupted:
        return 130
    ok = report is not None and host_code == 0
    out("")
    if report is not None:
        ok &= _summary(tenants, share, report, results, codes, out)
    else:
        for name, _w, _s in tenants:
            r = results.get(name, {})
            out(f"  {name}: {'verified' if r.get('verified') else 'NOT verified'} {r.get('error', '')}")
    if log_tail:
        out(f"host log (tail):\n{log_tail}")
    if plot_dir is not None and report is not None and report["series"]["t_s"]:
        from pvgpu import plots
        out(f"wrote {plots.demo_figure(plot_report(sched, tenants, report), plot_dir)}")
    out(f"\npvgpu demo: {'every guest verified' if ok else 'FAILED'}; host exited {host_code}; "
        f"{time.perf_counter() - t_start:.1f}s")
    return 0 if ok else 1


def _monitor(dev, tenants, procs, seconds, out) -> dict:
    """Poll GET_STATS once a second until every tenant has exited; print the live table.
    -> {start, end (snapshots bounding the time all tenants ran, or None), samples}."""
    names = [n for n, _w, _s in tenants]
    cols = "".join(f"{f'{n} {w}':>14}" for n, w, _s in tenants)
    out(f"\n{'time':>6}  {cols}    compute% / copy% over the last second; * = all guests running")
    out(f"{'share':>6}  " + "".join(f"{'%d /%d' % (s['compute'], s['copy']):>14}" for _n, _w, s in tenants))
    first = prev = dev.stats()
    t0 = time.monotonic()
    start = end = None
    samples = []
    series = {"t_s": [], "compute": {n: [] for n in names}, "copy": {n: [] for n in names}}
    next_tick = t0 + 1.0
    deadline = t0 + seconds + STARTUP_S
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(max(0.0, next_tick - time.monotonic()))
        next_tick += 1.0
        cur = dev.stats()
        comp = fairness.utilisation(prev, cur, names)
        copy = fairness.copy_utilisation(prev, cur, names)
        full = fairness.all_active(prev, names) and fairness.all_active(cur, names)
        if fairness.all_active(cur, names) and start is None:
            start = cur
        if full:
            end = cur
            samples.append(comp)
        cells = "".join(f"{f'{comp[n] * 100:5.1f} /{copy[n] * 100:5.1f}':>14}" for n in names)
        elapsed = time.monotonic() - t0
        out(f"{elapsed:5.1f}s {'*' if full else ' '}{cells}")
        series["t_s"].append(elapsed)
        for n in names:
            series["compute"][n].append(comp[n])
            series["copy"][n].append(copy[n])
        prev = cur
    if start is None or end is None or end is start:
        start, end = first, prev  # never all running at once: the whole run
        whole = True
    else:
        whole = False
    return {"start": start, "end": end, "samples": samples, "whole_run": whole, "series": series}


def plot_report(sched: str, tenants, report: dict) -> dict:
    """What pvgpu.plots.demo_figure draws: the run's per-second series and its tenants."""
    return {"sched": sched, "series": report["series"],
            "tenants": [{"name": n, "workload": w, "compute": s["compute"], "copy": s["copy"]}
                        for n, w, s in tenants]}


def _summary(tenants, share, report, results, codes, out) -> bool:
    names = [n for n, _w, _s in tenants]
    start, end = report["start"], report["end"]
    span = (end["now_ns"] - start["now_ns"]) / 1e9
    comp = fairness.utilisation(start, end, names)
    c0 = fairness.utilisation(start, end, names, "copy0")
    c1 = fairness.utilisation(start, end, names, "copy1")
    figs = fairness.summarise(comp, share, report["samples"])
    what = ("the whole run (the guests never all ran at once)" if report["whole_run"]
            else f"the {span:.1f}s all {len(names)} guests ran")
    out(f"mean utilisation over {what}:")
    out(f"{'vGPU':<6}{'workload':<10}{'share':>6}{'compute':>9}{'U/share':>9}{'|U-share|':>11}"
        f"{'copy0 h2d':>11}{'copy1 d2h':>11}   guest")
    ok = True
    for name, workload, s in tenants:
        r = results.get(name, {})
        verified = bool(r.get("verified")) and codes.get(name) == 0
        ok &= verified
        if verified:
            res = f"verified ({r.get('kernels', 0)} kernels, {r.get('iterations', 0)} iterations)"
        else:
            res = f"NOT verified (exit {codes.get(name)}) {r.get('error', '')}".rstrip()
        out(f"{name:<6}{workload:<10}{s['compute']:>5}%{comp[name] * 100:>8.1f}%"
            f"{comp[name] / share[name]:>9.2f}{abs(comp[name] - share[name]) * 100:>8.1f} pp"
            f"{c0[name] * 100:>10.1f}%{c1[name] * 100:>10.1f}%   {res}")
    per_sample = figs["mean_abs_error_samples"]
    out(f"fairness over compute: Jain's index {figs['jain']:.3f} (over U/share; 1 = fair), "
        f"mean |U - share| {figs['mean_abs_error'] * 100:.1f} pp"
        + (f" ({per_sample * 100:.1f} pp over {len(report['samples'])} one-second samples)"
           if per_sample is not None else ""))
    out("(a tenant that cannot use its share -- short kernels with gaps, copies -- leaves "
        "device time that the others may take: U above the share is not unfair by itself)")
    return ok


# ---------------------------------------------------------------------- the pair demo
def run_pair(vram: str = "512M", out=None) -> int:
    """The original demo: a host with 2 GPUs and two guests, one per memory model."""
    out = out or _say
    from pvgpu.procs import HostProcess, private_endpoint, reap, spawn_guest
    endpoint, tmpdir = private_endpoint("pvgpu-demo")
    t0 = time.perf_counter()
    out(f"pvgpu demo: starting a host with 2 GPUs on {endpoint}")
    host = HostProcess([endpoint], vram=vram)
    results, ok = [], True
    try:
        guests = []
        for i, memory in enumerate(wire.MEMORY_MODELS):
            cmd = ["run", "vector-add", "gemm", "--connect", endpoint, "--memory", memory,
                   "--device", str(i % 2), "--json", "--mem-size", "64M"]
            guests.append((memory, spawn_guest(cmd)))
            out(f"pvgpu demo: guest {i + 1} ({memory} memory) runs vector-add and gemm on device {i % 2}")
        for memory, proc in guests:
            code, text = reap(proc, timeout=120)
            lines = [json.loads(l) for l in text.splitlines() if l.startswith("{")]
            results += lines
            if code != 0 or len(lines) != 2:
                ok = False
                out(f"pvgpu demo: guest ({memory}) failed with exit code {code}:\n{text}")
    finally:
        code = host.stop()
        shutil.rmtree(tmpdir, ignore_errors=True)
    out("")
    out(f"{'guest memory':<14}{'device':<8}{'workload':<12}{'size':>9}  {'result':<9}{'time':>9}")
    for r in results:
        ok &= r["ok"]
        out(f"{r['memory']:<14}{r['device']:<8}{r['workload']:<12}{r['size']:>9}  "
            f"{'verified' if r['ok'] else 'MISMATCH':<9}{r['seconds'] * 1e3:7.1f}ms")
    ok &= code == 0 and len(results) == 4
    out(f"\npvgpu demo: {'all results match numpy' if ok else 'FAILED'}; host exited {code}; "
        f"{time.perf_counter() - t0:.1f}s")
    return 0 if ok else 1


# ---------------------------------------------------------------------- the P2P demo
P2P_TOPOLOGIES = (("switch", "peer"), ("sockets", "system"))  # (fabric, expected placement)
P2P_N = 4 << 20  # float32 elements: 16 MiB
P2P_MEM = 64 << 20  # guest memory of each P2P guest
P2P_TIMEOUT_S = 60.0  # per guest step


def p2p_expected(n: int = P2P_N):
    """What the consumer computes from the producer's buffer: 2 * (0.5 * (i % 1000))."""
    import numpy as np
    return (np.arange(n, dtype=np.int64) % 1000).astype(np.float32)


class _Peer:
    """A guest process driven line by line (stdin/stdout); its output is read by a thread
    so that every wait has a deadline, and it is always reaped by finish()."""

    def __init__(self, args):
        self.proc = subprocess.Popen([sys.executable, "-m", "pvgpu.demo", *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines, self.output = queue.Queue(), []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)  # EOF

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def expect(self, word: str, timeout: float = P2P_TIMEOUT_S) -> str:
        """-> the rest of the next line starting with `word`; RuntimeError on exit or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"no {word!r} from the guest within {timeout:g}s") from None
            if line is None:
                raise RuntimeError(f"the guest exited ({self.proc.wait()}) before {word!r}:\n"
                                   + "".join(self.output))
            if line.split(" ", 1)[0] == word:
                return line[len(word):].strip()

    def finish(self, timeout: float = 15.0) -> int:
        """Close stdin, wait (kill on overrun), reap. -> exit code."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.reader.join(5)
        return code


def p2p_producer(endpoint: str, n: int) -> int:
    """Guest A: on device 0, computes 0.5 * (i % 1000) with a kernel, exports it and prints
    `handle <str>`; waits for `done` (or EOF) on stdin, then frees it and exits."""
    import numpy as np
    from pvgpu import guest
    with guest.connect(endpoint, memory=wire.MEMORY_SHARED, mem_size=P2P_MEM,
                       name="p2p-producer") as conn:
        with conn.devices[0].create_context("producer") as ctx:
            x = ctx.to_device((np.arange(n, dtype=np.int64) % 1000).astype(np.float32))
            a = ctx.empty(n)
            ctx.launch("scale", n // 256, 256, (a, x, 0.5, n))
            ctx.synchronize()
            x.free()
            print("handle", a.export(), flush=True)
            for line in sys.stdin:
                if line.strip() == "done":
                    break
            a.free()
    print("bye", flush=True)
    return 0


def p2p_consumer(endpoint: str, n: int) -> int:
    """Guest B: reads `handle <str>` on stdin; on device 1 enables peer access when the
    fabric allows it, imports the buffer, scales it by 2 into its own buffer and sums that
    on the device; prints `result <json>` (placement, sums, times)."""
    import numpy as np
    from pvgpu import guest
    handle = sys.stdin.readline().split(" ", 1)[1].strip()
    with guest.connect(endpoint, memory=wire.MEMORY_SHARED, mem_size=P2P_MEM,
                       name="p2p-consumer") as conn:
        d0, d1 = conn.devices
        with d1.create_context("consumer") as ctx:
            peer = d1.can_access_peer(d0)
            if peer:
                ctx.enable_peer_access(d0)
            t0 = time.perf_counter()
            src = ctx.import_array(guest.BufferHandle.parse(handle), (n,), np.float32)
            t1 = time.perf_counter()
            out, total = ctx.empty(n), ctx.empty(1)
            ctx.launch("scale", n // 256, 256, (out, src, 2.0, n))  # reads device 0's buffer
            ctx.launch("reduce_sum", 1, 1, (out, total, n))
            ctx.synchronize()
            t2 = time.perf_counter()
            got = out.to_host()
            r = {"placement": src.placement, "can_access_peer": peer,
                 "link": d1.peer_info(d0)["link"], "device_sum": float(total.to_host()[0]),
                 "checksum": float(got.sum(dtype=np.float64)),
                 "sha256": hashlib.sha256(got.tobytes()).hexdigest(),
                 "import_ms": (t1 - t0) * 1e3, "consume_ms": (t2 - t1) * 1e3}
            src.free()
    print("result", json.dumps(r), flush=True)
    return 0


def p2p_check(r: dict, n: int = P2P_N) -> tuple:
    """-> (verified, reason) of a consumer's result against numpy."""
    import numpy as np
    want = p2p_expected(n)
    checksum = float(want.sum(dtype=np.float64))
    if r["sha256"] != hashlib.sha256(want.tobytes()).hexdigest():
        return False, f"data differ (sum {r['checksum']:.6g}, numpy {checksum:.6g})"
    if abs(r["device_sum"] - checksum) > 1e-5 * checksum:  # binary32 sum: order unspecified
        return False, f"device sum {r['device_sum']:.6g}, numpy {checksum:.6g}"
    return True, f"sum {checksum:.6g}"


def _p2p_once(topology: str, vram: str) -> tuple:
    """One host of `topology`, the producer and the consumer. -> (ok, line)."""
    from pvgpu.procs import HostProcess, private_endpoint
    endpoint, tmpdir = private_endpoint(f"pvgpu-demo-p2p-{topology}")
    t0 = time.perf_counter()
    host = producer = consumer = None
    r, error, codes, host_code = None, None, [], None
    try:
        host = HostProcess([endpoint], vram=vram, extra_args=["--topology", topology])
        producer = _Peer(["p2p-producer", endpoint, str(P2P_N)])
        handle = producer.expect("handle")
        consumer = _Peer(["p2p-consumer", endpoint, str(P2P_N)])
        consumer.send(f"handle {handle}")  # the capability goes by pipe, not argv
        r = json.loads(consumer.expect("result"))
        producer.send("done")
        producer.expect("bye")
    except Exception as e:  # a guest that failed or hung, a host that did not start
        error = f"{type(e).__name__}: {e}"
    finally:
        codes = [p.finish() for p in (consumer, producer) if p is not None]
        if host is not None:
            host_code = host.stop()
        shutil.rmtree(tmpdir, ignore_errors=True)
    seconds = time.perf_counter() - t0
    if r is None:
        return False, f"{topology:<8} FAILED: {error}"
    verified, why = p2p_check(r)
    want = dict(P2P_TOPOLOGIES)[topology]
    ok = (verified and r["placement"] == want and error is None and host_code == 0
          and codes == [0, 0])
    line = (f"{topology:<8} link {r['link']:<14} peer access {'yes' if r['can_access_peer'] else 'no ':<3}"
            f"  placement {r['placement']:<7} {'verified' if verified else 'NOT verified'} ({why})"
            f"  import {r['import_ms']:6.1f} ms  consume {r['consume_ms']:6.1f} ms  total {seconds:4.1f}s")
    if r["placement"] != want:
        line += f"  -- expected placement {want}"
    if error or codes != [0, 0] or host_code != 0:
        line += f"  -- {error or ''} guests exited {codes}, host {host_code}"
    return ok, line


def run_p2p(vram: str = "512M", out=None) -> int:
    """The P2P demo: a buffer shared between two guest processes on two GPUs, once with
    peer-to-peer (switch) and once without (sockets). -> exit code."""
    out = out or _say
    t0 = time.perf_counter()
    out(f"pvgpu demo p2p: guest A computes {P2P_N * 4 >> 20} MiB on GPU 0 and exports it; "
        "guest B imports it on GPU 1, scales and sums it there; checked against numpy")
    results = []
    for topology, _want in P2P_TOPOLOGIES:
        ok, line = _p2p_once(topology, vram)
        results.append(ok)
        out(line)
    ok = all(results)
    out(f"pvgpu demo p2p: {'both topologies verified' if ok else 'FAILED'}; "
        f"{time.perf_counter() - t0:.1f}s")
    return 0 if ok else 1


def main(argv=None) -> int:
    """Entry of the P2P demo's guest processes: `python -m pvgpu.demo p2p-producer|p2p-consumer
    ENDPOINT N` (started by run_p2p, not by users)."""
    argv = sys.argv[1:] if argv is None else argv
    roles = {"p2p-producer": p2p_producer, "p2p-consumer": p2p_consumer}
    if len(argv) != 3 or argv[0] not in roles:
        print("usage: python -m pvgpu.demo p2p-producer|p2p-consumer ENDPOINT N", file=sys.stderr)
        return 2
    return roles[argv[0]](argv[1], int(argv[2]))


if __name__ == "__main__":
    raise SystemExit(main())
