"""`pvgpu bench jobs`: the fixed cost of a GPU job, each figure against a limit measured in
the same run.

  async launches  tiny launches (`fill` of 256 floats) queued on one stream, then one
                  `synchronize`: launches/s, against bare pyzmq messages/s (the same number
                  of kick-sized messages pipelined to an echo process, at most 256 in flight)
  launch + sync   one tiny launch and `ctx.synchronize()`, against a bare pyzmq
                  DEALER/ROUTER round trip of a kick-sized message to another process
  h2d 4 KiB       a synchronous 4 KiB host->device copy (`copy_from_host`), against the
                  same round trip
  NOP             a NOP request (`Device.nop()`), against the same round trip: the cheapest
                  request the device answers, the protocol's own floor under the two above
  polled RTT      the same bare round trip with the answer polled for (non-blocking receives,
                  sched_yield between them), as the guest waits for a short request: without
                  a blocked thread's wakeup, so never slower than the blocking one; on a
                  virtual machine whose idle cores wake slowly it is far faster
  host CPU        the CPU time the host's main thread (its I/O loop, the backend, and the
                  short jobs it runs inline) spends per NOP, launch + sync and 4 KiB copy,
                  from /proc (Linux; the host process's pid given): unlike the times, it
                  hardly depends on what else the machine runs
  mixed           G guest processes (default 8) x N operations each (default 2,000: tiny
                  launches, 4 KiB copies both ways, device-to-device copies, synchronize),
                  released together against one host: operations/s of all of them, against
                  G processes doing bare round trips to one echo process
  per-job cost    an in-process KMD on an emulated GPU (no host process, no transport):
                  `burn(0)` submitted and its fence waited for, one job at a time and 64 in
                  flight; against a bare thread handoff round trip (threading.Event to a
                  worker thread and back), the floor of a job that an engine thread runs

The round trip, the launch + sync and the 4 KiB copy run in interleaved rounds
(bench/common.py), so a drifting machine affects them alike; likewise the KMD figures and
the thread handoff. Every figure is a median; each result is checked (the stream's last
fill, the mixed guests against a numpy model of their arrays). Ratios are `pvgpu time /
limit time` for launch + sync, the 4 KiB copy and the per-job cost (lower is better) and
`pvgpu rate / limit rate` for the rates (higher is better); TARGETS are the bounds the
job path is to reach.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

import numpy as np
import zmq

from pvgpu.bench.common import rounds, write_json

TINY = 256  # floats a tiny kernel writes
COPY_BYTES = 4096
MIXED_OPS = ("fill", "scale", "add", "h2d", "d2h", "d2d", "sync")
ZMQ_WINDOW = 256  # pipelined bare messages in flight
TARGETS = {  # figure -> the bound the job path is to reach
    "async_launches_per_s": ">= 20000",
    "launch_sync_vs_zmq_rtt": "<= 1.5",
    "h2d_4KiB_vs_zmq_rtt": "<= 1.5",
    "mixed_ops_per_s": ">= 3000",
    "kmd_job_us": "<= 50",
}


def _median(times) -> float:
    return statistics.median(times)


def _met(value: float, target: str) -> bool:
    op, bound = target.split()
    return value >= float(bound) if op == ">=" else value <= float(bound)


# ---------------------------------------------------------------- the bare zmq limits
class EchoPeer:
    """A DEALER connected to a bare echo process (bench/echo.py) on `endpoint`."""

    def __init__(self, endpoint: str, msg_size: int):
        self.proc = subprocess.Popen([sys.executable, "-m", "pvgpu.bench.echo", endpoint])
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.payload = b"x" * msg_size
        try:
            self.sock.connect(endpoint)
            self.sock.send(self.payload)
            if not self.sock.poll(10000):
                raise RuntimeError("the echo process did not answer")
            self.sock.recv()
        except BaseException:
            self.close()
            raise

    def round_trips(self, n: int) -> None:
        for _ in range(n):
            self.sock.send(self.payload)
            self.sock.recv()

    def polled_round_trips(self, n: int) -> None:
        """Round trips whose answer is polled for, yielding the core between looks, as the
        guest driver waits for a short request: no wakeup of a blocked thread in them."""
        sock = self.sock
        for _ in range(n):
            sock.send(self.payload)
            while True:
                try:
                    sock.recv(zmq.NOBLOCK)
                    break
                except zmq.Again:
                    os.sched_yield()

    def pipelined(self, n: int) -> None:
        sent = received = 0
        while received < n:
            while sent < n and sent - received < ZMQ_WINDOW:
                self.sock.send(self.payload)
                sent += 1
            self.sock.recv()
            received += 1

    def close(self) -> None:
        try:
            self.sock.linger = 1000  # let the quit reach the echo process
            self.sock.send(b"quit")
        finally:
            self.sock.close()
            self.ctx.term()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ThreadCpu:
    """CPU time (user + system) of one thread of another process, read from
    /proc/PID/task/TID/stat; `available` is False where there is no such file."""

    def __init__(self, pid: int, tid: int | None = None):
        self.path = f"/proc/{pid}/task/{tid or pid}/stat"
        self.available = os.path.exists(self.path)
        self.tick = 1 / os.sysconf("SC_CLK_TCK") if self.available else 0.0

    def seconds(self) -> float:
        with open(self.path) as f:
            fields = f.read().rpartition(")")[2].split()  # fields 3.. (comm may hold spaces)
        return (int(fields[11]) + int(fields[12])) * self.tick  # utime, stime: fields 14, 15


def kick_size() -> int:
    from pvgpu.bench.hotpaths import _kick_size
    return _kick_size()


# ---------------------------------------------------------------- through a host
def guest_figures(conn, endpoint_dir: str, *, launches: int = 2000, batch: int = 50,
                  reps: int = 15, async_reps: int = 5, host_pid: int | None = None,
                  out=print) -> dict:
    """Async launches, launch + sync, the 4 KiB copy and a NOP on `conn`'s device 0, with
    the bare zmq limits measured beside them (an echo process on an ipc endpoint in
    `endpoint_dir`). Synchronous figures are per operation, timed over `batch` of them.
    With `host_pid` (a local host process), also the host main thread's CPU per operation."""
    peer = EchoPeer(f"ipc://{endpoint_dir}/echo.sock", kick_size())
    cpu = ThreadCpu(host_pid) if host_pid else None
    if cpu is not None and not cpu.available:
        cpu = None
    host_cpu = {}  # operation -> [host CPU seconds, operations]

    def on_host(name, fn):
        if cpu is None:
            return fn

        def measured():
            t0 = cpu.seconds()
            fn()
            acc = host_cpu.setdefault(name, [0.0, 0])
            acc[0] += cpu.seconds() - t0
            acc[1] += batch
        return measured

    dev = conn.devices[0]
    try:
        with dev.create_context("bench-jobs") as ctx:
            tiny = ctx.zeros(TINY, np.float32)
            host4k = np.arange(COPY_BYTES // 4, dtype=np.float32)
            dev4k = ctx.empty(COPY_BYTES // 4, np.float32)
            stream = ctx.create_stream()

            def async_launches():
                for i in range(launches):
                    stream.launch("fill", 1, TINY, (tiny, float(i % 1000), TINY))
                stream.synchronize()

            def launch_sync():
                for _ in range(batch):
                    ctx.launch("fill", 1, TINY, (tiny, 1.0, TINY))
                    ctx.synchronize()

            def h2d():
                for _ in range(batch):
                    dev4k.copy_from_host(host4k)

            def nops():
                for _ in range(batch):
                    dev.nop()

            t = rounds({"async": async_launches, "zmq_pipelined": lambda: peer.pipelined(launches)},
                       max_reps=async_reps, warmup=True)
            async_launches()
            if not np.all(tiny.to_host() == float((launches - 1) % 1000)):
                raise AssertionError("the stream's last fill is not what the device holds")
            s = rounds({"launch_sync": on_host("launch_sync", launch_sync),
                        "h2d": on_host("h2d_4KiB", h2d), "nop": on_host("nop", nops),
                        "zmq_rtt": lambda: peer.round_trips(batch),
                        "zmq_rtt_polled": lambda: peer.polled_round_trips(batch)},
                       max_reps=reps, warmup=True)
            if not np.array_equal(dev4k.to_host(), host4k):
                raise AssertionError("the 4 KiB copy did not land")
            if not np.all(tiny.to_host() == 1.0):
                raise AssertionError("the synchronized fill is not what the device holds")
            stream.destroy()
    finally:
        peer.close()
    a = launches / _median(t["async"])
    z = launches / _median(t["zmq_pipelined"])
    rtt, ls, hd, nop, polled = (_median(s[k]) / batch for k in
                                ("zmq_rtt", "launch_sync", "h2d", "nop", "zmq_rtt_polled"))
    res = {"async_launches": {"launches": launches, "per_s": a, "zmq_msgs_per_s": z,
                              "vs_zmq": a / z},
           "launch_sync": {"s": ls, "zmq_rtt_s": rtt, "vs_zmq_rtt": ls / rtt},
           "h2d_4KiB": {"s": hd, "zmq_rtt_s": rtt, "vs_zmq_rtt": hd / rtt},
           "nop": {"s": nop, "zmq_rtt_s": rtt, "vs_zmq_rtt": nop / rtt},
           "zmq_rtt_polled": {"s": polled, "vs_zmq_rtt": polled / rtt}}
    if host_cpu:
        res["host_cpu_us"] = {k: sec / n * 1e6 for k, (sec, n) in host_cpu.items()}
    out(f"async launches ({launches} on one stream): {a:8.0f}/s   bare zmq messages "
        f"(pipelined) {z:8.0f}/s   {a / z:.3f}x")
    out(f"launch + synchronize: {ls * 1e6:7.1f} us   bare zmq round trip {rtt * 1e6:6.1f} us   "
        f"{ls / rtt:.2f}x")
    out(f"synchronous 4 KiB h2d copy: {hd * 1e6:7.1f} us   bare zmq round trip   {hd / rtt:.2f}x")
    out(f"a NOP request (the protocol's floor): {nop * 1e6:7.1f} us   bare zmq round trip   "
        f"{nop / rtt:.2f}x")
    out(f"bare zmq round trip polled for: {polled * 1e6:7.1f} us ({polled / rtt:.2f}x the blocking "
        f"one); launch + sync {ls / polled:.2f}x, 4 KiB h2d {hd / polled:.2f}x, NOP {nop / polled:.2f}x it")
    if host_cpu:
        c = res["host_cpu_us"]
        out(f"host main thread CPU per request: NOP {c['nop']:6.1f} us   launch + synchronize "
            f"{c['launch_sync']:6.1f} us   4 KiB h2d {c['h2d_4KiB']:6.1f} us")
    return res


# ---------------------------------------------------------------- many guests at once
def _children(args_list: list, timeout: float) -> tuple:
    """Start one `python -m pvgpu.bench.jobs ...` child per args; once all say `ready`, release
    them together; -> (their JSON results, seconds from the first one's start to the last
    one's end: each reports both on time.monotonic(), a clock shared by processes)."""
    procs = [subprocess.Popen([sys.executable, "-m", "pvgpu.bench.jobs", *a], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for a in args_list]
    try:
        for p in procs:
            line = p.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"a benchmark child did not start (said {line!r})")
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        deadline = time.monotonic() + timeout
        results = []
        for p in procs:
            if p.wait(max(0.1, deadline - time.monotonic())) != 0:
                raise RuntimeError(f"a benchmark child failed (exit code {p.returncode})")
            results.append(json.loads(p.stdout.readline()))
        return results, max(r["end"] for r in results) - min(r["start"] for r in results)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            for f in (p.stdin, p.stdout):
                try:
                    f.close()
                except BrokenPipeError:
                    pass


def mixed_figures(endpoint: str, endpoint_dir: str, *, guests: int = 8, ops: int = 2000,
                  timeout: float = 600.0, out=print) -> dict:
    """`guests` guest processes on `endpoint` x `ops` mixed operations, then as many bare
    zmq clients x `ops` round trips to one echo process."""
    results, wall = _children([("guest", endpoint, str(ops), str(seed)) for seed in range(guests)],
                              timeout)
    bad = [r for r in results if not r["verified"]]
    if bad:
        raise AssertionError(f"a mixed guest's arrays differ from its model: {bad[0]}")
    echo_ep = f"ipc://{endpoint_dir}/echo-mixed.sock"
    echo = subprocess.Popen([sys.executable, "-m", "pvgpu.bench.echo", echo_ep])
    try:
        _zres, zwall = _children([("zmq", echo_ep, str(ops), str(kick_size()))] * guests, timeout)
    finally:
        echo.kill()
        echo.wait()
    total = guests * ops
    counts = {k: sum(r["counts"][k] for r in results) for k in MIXED_OPS}
    rate, zrate = total / wall, total / zwall
    out(f"{guests} guests x {ops} mixed operations: {rate:8.0f} ops/s   {guests} bare zmq "
        f"clients {zrate:8.0f} round trips/s   {rate / zrate:.3f}x")
    return {"guests": guests, "ops": ops, "per_s": rate, "seconds": wall, "counts": counts,
            "zmq_rtt_per_s": zrate, "vs_zmq": rate / zrate}


def run_mixed_guest(endpoint: str, ops: int, seed: int, ready=lambda: None) -> dict:
    """One guest of the mixed run: `ops` operations on 4 KiB arrays of device 0, chosen by
    `seed`, timed after `ready()` returns; every array is checked against a numpy model."""
    from pvgpu import guest
    n = COPY_BYTES // 4
    rng = np.random.default_rng(seed)
    counts = dict.fromkeys(MIXED_OPS, 0)
    with guest.connect(endpoint, mem_size=32 << 20, name=f"bench-mixed-{seed}") as conn:
        with conn.devices[0].create_context("bench-mixed") as ctx:
            model = [rng.standard_normal(n).astype(np.float32) for _ in range(4)]
            arrays = [ctx.to_device(m) for m in model]
            host = np.empty(n, np.float32)
            ctx.synchronize()
            ready()
            start = time.monotonic()
            for _ in range(ops):
                op = MIXED_OPS[int(rng.integers(len(MIXED_OPS)))]
                i, j = (int(x) for x in rng.choice(len(arrays), 2, replace=False))
                counts[op] += 1
                if op == "fill":
                    value = float(rng.integers(-4, 5))
                    ctx.launch("fill", -(-n // TINY), TINY, (arrays[i], value, n))
                    model[i][:] = value
                elif op == "scale":
                    ctx.launch("scale", -(-n // TINY), TINY, (arrays[i], arrays[i], 0.5, n))
                    model[i] *= np.float32(0.5)
                elif op == "add":
                    ctx.launch("vector_add", -(-n // TINY), TINY, (arrays[i], arrays[j], arrays[i], n))
                    model[i] += model[j]
                elif op == "h2d":
                    model[i][:] = rng.standard_normal(n).astype(np.float32)
                    arrays[i].copy_from_host(model[i])
                elif op == "d2h":
                    arrays[i].to_host(host)
                    counts["mismatches"] = counts.get("mismatches", 0) + (not _close(host, model[i]))
                elif op == "d2d":
                    ctx.copy_d2d(arrays[i].va, arrays[j].va, COPY_BYTES)
                    model[i][:] = model[j]
                else:
                    ctx.synchronize()
            ctx.synchronize()
            end = time.monotonic()
            verified = counts.pop("mismatches", 0) == 0 and all(
                _close(a.to_host(), m) for a, m in zip(arrays, model))
    return {"ops": ops, "start": start, "end": end, "counts": counts, "verified": verified}


def _close(got: np.ndarray, want: np.ndarray) -> bool:
    return bool(np.allclose(got, want, rtol=1e-5, atol=1e-6))


def _zmq_client(endpoint: str, ops: int, msg_size: int, ready) -> dict:
    with zmq.Context() as c, c.socket(zmq.DEALER) as s:
        s.linger = 0
        s.connect(endpoint)
        payload = b"x" * msg_size
        s.send(payload)
        if not s.poll(10000):
            raise RuntimeError("the echo process did not answer")
        s.recv()
        ready()
        start = time.monotonic()
        for _ in range(ops):
            s.send(payload)
            s.recv()
        return {"ops": ops, "start": start, "end": time.monotonic()}


# ---------------------------------------------------------------- the KMD alone
def kmd_figures(*, jobs: int = 64, reps: int = 15, out=print) -> dict:
    """Per-job host cost of an in-process KMD: `burn(0)` submitted and waited for, one job
    at a time and `jobs` in flight, against a bare thread handoff round trip. One at a
    time, also the CPU time of the whole process per job (every thread of the KMD and the
    emulated GPU): unlike the wall time it does not grow while the machine's other work
    holds the cores."""
    from pvgpu.host.hw.gpu import Platform
    from pvgpu.host.kmd import KmdDevice
    from pvgpu.spec import wire

    platform = Platform(1, 64 << 20)
    dev = KmdDevice(platform.gpus[0])
    dev.start()
    go, back, stop = threading.Event(), threading.Event(), []

    def worker():
        while True:
            go.wait()
            go.clear()
            if stop:
                return
            back.set()
    th = threading.Thread(target=worker, name="bench-handoff", daemon=True)
    th.start()
    try:
        ctx = dev.create_context("bench-jobs")

        cpu = []  # process CPU seconds of each one_at_a_time round

        def one_at_a_time():
            c0 = time.process_time()
            for _ in range(jobs):
                if not ctx.submit_launch(wire.KERNEL_BURN, 1, 1, [0]).wait(10):
                    raise RuntimeError("a burn(0) job did not finish in 10 s")
            cpu.append(time.process_time() - c0)

        def in_flight():
            fences = [ctx.submit_launch(wire.KERNEL_BURN, 1, 1, [0]) for _ in range(jobs)]
            if not all(f.wait(10) for f in fences):
                raise RuntimeError("a burn(0) job did not finish in 10 s")

        def handoffs():
            for _ in range(jobs):
                go.set()
                back.wait()
                back.clear()
        t = rounds({"sync": one_at_a_time, "pipelined": in_flight, "handoff": handoffs},
                   max_reps=reps, warmup=True)
        dev.destroy_context(ctx)
    finally:
        stop.append(True)
        go.set()
        th.join(5)
        dev.stop()
        platform.stop()
    sync, piped, hand = (_median(t[k]) / jobs for k in ("sync", "pipelined", "handoff"))
    sync_cpu = _median(cpu) / jobs
    out(f"per-job host cost, in-process KMD: {sync * 1e6:6.1f} us one at a time (CPU "
        f"{sync_cpu * 1e6:5.1f} us), {piped * 1e6:6.1f} us with {jobs} in flight   bare "
        f"thread handoff {hand * 1e6:5.1f} us   {sync / hand:.1f}x")
    return {"jobs": jobs, "us": sync * 1e6, "cpu_us": sync_cpu * 1e6,
            "pipelined_us": piped * 1e6, "handoff_us": hand * 1e6, "vs_handoff": sync / hand}


# ---------------------------------------------------------------- the report
def summary(results: dict) -> dict:
    """-> figure name -> {value, target, met} for the figures with a target."""
    values = {
        "async_launches_per_s": results["async_launches"]["per_s"],
        "launch_sync_vs_zmq_rtt": results["launch_sync"]["vs_zmq_rtt"],
        "h2d_4KiB_vs_zmq_rtt": results["h2d_4KiB"]["vs_zmq_rtt"],
        "mixed_ops_per_s": results["mixed"]["per_s"],
        "kmd_job_us": results["kmd"]["us"],
    }
    return {k: {"value": v, "target": TARGETS[k], "met": _met(v, TARGETS[k])}
            for k, v in values.items()}


def run_bench(json_path: str | None = None, quick: bool = False, out=print, *,
              launches: int | None = None, guests: int = 8, ops: int | None = None,
              reps: int | None = None) -> dict:
    from pvgpu import guest
    from pvgpu.procs import HostProcess, private_endpoint

    launches = launches or (500 if quick else 2000)
    ops = ops or (200 if quick else 2000)
    reps = reps or (5 if quick else 15)
    endpoint, tmp = private_endpoint("pvgpu-bench-jobs")
    results = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                           "numpy": np.__version__, "zmq": zmq.zmq_version(),
                           "loadavg_before": _loadavg()}}
    load = results["machine"]["loadavg_before"]
    out(f"{os.cpu_count()} CPUs" + (f", load average {load[0]:.1f}" if load else ""))
    out("Through a host process and the guest API (shared memory model):")
    try:
        with HostProcess([endpoint], vram="256M") as host:
            with guest.connect(endpoint, mem_size=32 << 20) as conn:
                results.update(guest_figures(conn, tmp, launches=launches, reps=reps,
                                             async_reps=max(3, reps // 3),
                                             host_pid=host.proc.pid,
                                             out=lambda s: out("  " + s)))
            results["mixed"] = mixed_figures(endpoint, tmp, guests=guests, ops=ops,
                                             out=lambda s: out("  " + s))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out("The KMD alone (an emulated GPU in this process, no host process or transport):")
    results["kmd"] = kmd_figures(reps=reps, out=lambda s: out("  " + s))
    results["targets"] = summary(results)
    results["machine"]["loadavg_after"] = _loadavg()
    out("targets: " + ", ".join(
        f"{k} {v['value']:.4g} ({v['target']}: {'met' if v['met'] else 'missed'})"
        for k, v in results["targets"].items()))
    write_json(json_path, results, out)
    return results


def _loadavg():
    """The 1, 5 and 15 minute load averages (None where the OS has none): the figures of
    a loaded machine are read beside them."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def _child(argv: list) -> int:
    """`python -m pvgpu.bench.jobs guest EP OPS SEED` / `zmq EP OPS MSG_SIZE`: one process of the
    mixed run; says `ready`, waits for a line on stdin, runs, prints its JSON result."""
    def ready():
        print("ready", flush=True)
        sys.stdin.readline()
    role, endpoint, ops, arg = argv
    if role == "guest":
        r = run_mixed_guest(endpoint, int(ops), int(arg), ready)
    elif role == "zmq":
        r = _zmq_client(endpoint, int(ops), int(arg), ready)
    else:
        raise SystemExit(f"pvgpu.bench.jobs: unknown role {role!r}")
    print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
