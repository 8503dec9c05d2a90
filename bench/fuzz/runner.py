"""The fuzzing loop, its oracle and its report (`pvgpu bench fuzz`).

The loop starts a private host process (pvgpu/procs.py, its output captured in a log) and
runs `cases` cases in batches, alternating the memory model per batch. Each case is one of

  control  a mutated control message (bench/fuzz/control.py) on a session of its own, or
           one time in five on a connection without a session ("fresh"), followed by a
           `ping` probe: the replies before the probe's are the case's;
  command  a mutated device command (bench/fuzz/commands.py) in a well-formed chain on a
           prepared session, split into descriptors in one of many ways (one case in
           three, bench/fuzz/shapes.py); the used entry's response code is the case's class;
  lifecycle  up to SLOTS such commands in flight, then the device is reset or failed, the
           queue disabled, the session closed or abandoned, or all of them waited for;
  chain    an invalid chain of one §4.7 family (bench/fuzz/chains.py) on a third session;
           the device must answer with config_changed (VQ-INVALID-1), and is then reset.

Oracle: every probe, used entry and config_changed arrives within a bound (else a hang);
after each batch a fresh session of the batch's model says hello, runs NOP and a small
copy within a bound, and the host process is alive (else a crash); at the end the host's
log holds no "Traceback". Replies are counted by class (control error names, response
codes, "dropped", "session_closed", "used_len_0", "needs_reset"). The run is a function of
its seed: case i draws from random.Random(seed * 1_000_003 + i).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field

from pvgpu.bench.fuzz import chains, commands, control, shapes
from pvgpu.bench.fuzz.session import (MEM_SIZE, SCRATCH_GPA, SCRATCH_SIZE, SLOTS, WRITE_SLOT, NoReply,
                                RawSession)
from pvgpu.procs import HostProcess, private_endpoint
from pvgpu.spec import wire
from pvgpu.transport.codec import encode

BATCH = 50
KINDS = ("control", "command", "chain", "lifecycle")
WEIGHTS = (0.37, 0.43, 0.15, 0.05)
LIFECYCLE_ENDS = ("wait", "reset", "failed", "disable", "bye", "vanish")
PROBE_SEQ = 3 << 40  # probe pings count from here, clear of any seq a mutation draws
REPLY_BOUND = 10.0  # seconds: a probe, a used entry or config_changed later than this is a hang
SETUP_BOUND = 15.0  # abandoned sessions are reclaimed after 3 heartbeats (3 s by default)
USED_BOUND = 20.0  # commands may run a job up to the host's timeout (JOB_TIMEOUT_MS) first
JOB_TIMEOUT_MS = 1000


class Failure(Exception):
    """A crash, a hang or an undetected invalid chain: the run stops here."""


@dataclass
class Report:
    seed: int
    cases: int = 0
    seconds: float = 0.0
    classes: Counter = field(default_factory=Counter)
    mutations: Counter = field(default_factory=Counter)
    models: Counter = field(default_factory=Counter)  # cases per memory model
    rss_kib: dict = field(default_factory=dict)
    crashes: int = 0
    hangs: int = 0
    tracebacks: int = 0
    undetected: int = 0
    failure: str = ""
    health_checks: int = 0

    @property
    def ok(self) -> bool:
        return not (self.crashes or self.hangs or self.tracebacks or self.undetected)

    def as_dict(self) -> dict:
        return {"seed": self.seed, "cases": self.cases, "seconds": round(self.seconds, 2),
                "cases_per_s": round(self.cases / self.seconds, 1) if self.seconds else 0.0,
                "classes": dict(sorted(self.classes.items())),
                "mutations": dict(sorted(self.mutations.items())),
                "memory_models": dict(self.models),
                "host_rss_kib": self.rss_kib, "crashes": self.crashes, "hangs": self.hangs,
                "tracebacks": self.tracebacks, "undetected_invalid_chains": self.undetected,
                "health_checks": self.health_checks, "failure": self.failure, "ok": self.ok}


def proc_status(pid: int) -> dict:
    """VmRSS and VmHWM (peak) of a process, in KiB; {} if it is gone (or no /proc)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0])
    except OSError:
        return {}
    return out


class Fuzzer:
    """The cases against one host at `endpoint`; a session per kind of case, renewed per batch."""

    def __init__(self, endpoint: str, seed: int, report: Report, alive=lambda: True):
        self.endpoint = endpoint
        self.seed = seed
        self.report = report
        self.alive = alive
        self.sessions = {}
        self.target = None
        self.probes = 0

    # ------------------------------------------------------------------ sessions
    def _session(self, role: str, memory: str, features: int = wire.DEVICE_FEATURES) -> RawSession:
        s = self.sessions.get(role)
        deadline = time.monotonic() + SETUP_BOUND
        while s is None:
            s = RawSession(self.endpoint, memory, timeout=REPLY_BOUND, features=features)
            try:
                s.open()
                if role == "command":
                    self.target = commands.prepare(s)
            except NoReply as e:
                s.close(bye=False)
                raise Failure(f"hang: opening a {memory} session: {e}") from None
            except commands.SetupRefused as e:
                # the host is short of something that sessions abandoned by earlier cases
                # hold until it reclaims them (CTL-HB-3): wait for that, within a bound
                s.close()
                s = None
                self.report.classes["setup:refused"] += 1
                if time.monotonic() > deadline:
                    raise Failure(f"hang: set-up refused for {SETUP_BOUND} s: {e}") from None
                time.sleep(0.2)
        self.sessions[role] = s
        return s

    def _drop(self, role: str, bye: bool = True) -> None:
        s = self.sessions.pop(role, None)
        if s is not None:
            try:
                s.close(bye=bye)
            except NoReply:
                pass

    def close(self) -> None:
        for role in list(self.sessions):
            self._drop(role)

    # ------------------------------------------------------------------ cases
    def control_case(self, rng, memory: str) -> str:
        s = self._session("control", memory)
        seeds = control.seed_messages(s)  # values of a live session, also for a fresh one
        fresh = rng.random() < 0.2  # a connection without a session: hello first
        if fresh:
            msg, frames = seeds[0] if rng.random() < 0.7 else seeds[rng.randrange(len(seeds))]
            s = RawSession(self.endpoint, memory, timeout=REPLY_BOUND)
        else:
            msg, frames = seeds[rng.randrange(len(seeds))]
        try:
            return self._control_case(rng, s, msg, frames, fresh)
        finally:
            if fresh:
                s.close(bye=False)

    def _control_case(self, rng, s: RawSession, msg: dict, frames: list, fresh: bool) -> str:
        parts, name = control.mutate(rng, msg, frames, s.next_seq())
        self.report.mutations[("fresh:" if fresh else "control:") + name] += 1
        s.send(parts)
        self.probes += 1
        probe = PROBE_SEQ + self.probes
        s.send(encode({"op": wire.OP_PING, "seq": probe}))
        try:
            reply, before = s.await_reply(probe, REPLY_BOUND)
            if fresh and reply.get("ok"):  # the mutated hello made a session: end it
                s.request(wire.OP_BYE)
        except NoReply:
            raise Failure(f"hang: no reply to the ping after a control case ({name})") from None
        prefix = "fresh:" if fresh else "ctl:"
        if before:
            cls = prefix + ("ok" if before[0].get("ok") else before[0].get("error"))
        elif not reply.get("ok"):
            cls = (prefix + "no_session") if fresh else "ctl:session_closed"
        else:
            cls = prefix + "dropped"
        if not fresh and (not reply.get("ok") or s.needs_reset):
            self._drop("control", bye=reply.get("ok"))  # closed (bye) or broken by the case
        return cls

    def command_case(self, rng, memory: str) -> str:
        s = self._session("command", memory)
        case = commands.fuzz_case(rng, self.target)
        self.report.mutations["command:" + case.name] += 1
        for readable, wlen in case.before:
            self._used(s, readable, wlen)
        shape = shapes.random_shape(rng) if rng.random() < 0.3 else None
        if shape is not None:
            self.report.mutations["shape:indirect" if shape.indirect and s.indirect
                                  else "shape:direct"] += 1
        got = self._used(s, case.readable, case.writable_len, rng, shape)
        for readable, wlen in case.after:
            self._used(s, readable, wlen)
        if got is None:
            self._drop("command")
            return "cmd:needs_reset"
        n, data = got
        if n < wire.CTRL_HDR_SIZE:
            return f"cmd:used_len_{n}"
        code = struct.unpack_from("<I", data)[0]
        return "cmd:" + wire.RESP_NAMES.get(code, hex(code))

    def _used(self, s: RawSession, readable: bytes, wlen: int, rng=None, shape=None):
        got = s.call(readable, wlen, timeout=USED_BOUND, rng=rng, shape=shape)
        if got is None and not s.needs_reset:
            raise Failure(f"hang: no used entry within {USED_BOUND}s for {readable[:32].hex()}")
        return got

    def lifecycle_case(self, rng, memory: str) -> str:
        """Several requests in flight, then the session is reset, closed, abandoned or
        waited for: the paths that drop or complete held chains (DEV-RESET, §10.1)."""
        s = self._session("command", memory)
        n = rng.randrange(1, SLOTS + 1)
        for slot in range(n):
            case = commands.fuzz_case(rng, self.target)
            s.submit(case.readable, min(case.writable_len, WRITE_SLOT), slot=slot,
                     kick=slot == n - 1 or rng.random() < 0.3)
        end = rng.choice(LIFECYCLE_ENDS)
        self.report.mutations["lifecycle:" + end] += 1
        try:
            if end == "wait":
                if s.wait_all(n, USED_BOUND) is None and not s.needs_reset:
                    raise Failure(f"hang: {n} requests in flight not all returned")
                return "life:returned" if not s.needs_reset else "life:needs_reset"
            if end == "reset":
                reply = s.request(wire.OP_SET_STATUS, dev=0, status=0)
            elif end == "failed":
                reply = s.request(wire.OP_SET_STATUS, dev=0, status=wire.STATUS_ACKNOWLEDGE
                                  | wire.STATUS_DRIVER | wire.STATUS_FEATURES_OK
                                  | wire.STATUS_DRIVER_OK | wire.STATUS_FAILED)
            elif end == "disable":
                reply = s.request(wire.OP_ENABLE_VRING, dev=0, queue=0, enable=False)
            elif end == "bye":
                reply = s.request(wire.OP_BYE)
            else:  # vanish: the guest is gone without a word
                self.sessions.pop("command")
                s.close(bye=False)
                return "life:vanished"
        except NoReply:
            raise Failure(f"hang: no reply to {end} with {n} requests in flight") from None
        self._drop("command", bye=end != "bye")
        return "life:" + end + (":ok" if reply.get("ok") else f":{reply.get('error')}")

    def chain_case(self, rng, memory: str, indirect: bool) -> str:
        features = wire.DEVICE_FEATURES if indirect else \
            wire.DEVICE_FEATURES & ~(1 << wire.VIRTIO_F_INDIRECT_DESC)
        s = self._session("chain", memory, features)
        g = chains.Geometry(s.layout.size, MEM_SIZE, SCRATCH_GPA, SCRATCH_SIZE, s.indirect)
        bad = chains.bad_chain(rng, g)
        self.report.mutations["chain:" + bad.clause] += 1
        chains.publish(s.mem, s.layout, s.queue.avail_idx, bad)
        s.kick()
        if not s.wait_needs_reset(REPLY_BOUND):
            if self.alive():
                self.report.undetected += 1
            raise Failure(f"undetected invalid chain: {bad.clause}: {bad}")
        s.init_device()  # reset (DEV-RESET) and set the queue up again
        return "chain:needs_reset"

    # ------------------------------------------------------------------ oracle
    def health_check(self, memory: str) -> None:
        """A fresh session: hello, NOP, a context and a small copy there and back."""
        if not self.alive():
            raise Failure("crash: the host process is gone")
        try:
            with RawSession(self.endpoint, memory, timeout=REPLY_BOUND).open() as s:
                nop = s.command(wire.CMD_NOP)
                ctx = s.command(wire.CMD_CTX_CREATE, (0, b"health"), ctx_id=1)
                alloc = s.command(wire.CMD_MEM_ALLOC, (1, 0, 4096), ctx_id=1)
                va = struct.unpack_from(wire.RESP_MEM_ALLOC_FORMAT, alloc[1])[0] if alloc else 0
                data = bytes(range(256))
                s.command(wire.CMD_COPY_H2D, (va, 256), ctx_id=1, extra=data)
                back = s.command(wire.CMD_COPY_D2H, (va, 256), ctx_id=1, read_back=256)
                self.report.classes["health:" + wire.RESP_NAMES.get(ctx[0][0], "?")
                                    if ctx else "health:no_context"] += 1
        except NoReply as e:
            raise Failure(f"hang: health check ({memory}): {e}") from None
        # a context may be refused for want of memory other guests hold (then no copy)
        refused = ctx and ctx[0][0] == wire.RESP_ERR_OUT_OF_MEMORY
        good = (nop and nop[0][0] == wire.RESP_OK_NODATA and ctx
                and (refused or back and back[1][:256] == data))
        if not good:
            raise Failure(f"hang: health check ({memory}) failed: {nop} {ctx} {back and back[0]}")
        self.report.health_checks += 1

    def run(self, cases: int, progress=None) -> None:
        """Run the cases; raises Failure (counted in the report) on the first failure."""
        r = self.report
        i = kind = memory = None
        try:
            if not self.alive():
                raise Failure("crash: the host process is gone")
            for i in range(cases):
                batch = i // BATCH
                memory = wire.MEMORY_MODELS[batch % 2]
                if i % BATCH == 0 and i:
                    self.health_check(wire.MEMORY_MODELS[(batch - 1) % 2])
                    for role in list(self.sessions):
                        self._drop(role)
                    if progress:
                        progress(i)
                rng = random.Random(self.seed * 1_000_003 + i)
                kind = rng.choices(KINDS, WEIGHTS)[0]
                if kind == "control":
                    cls = self.control_case(rng, memory)
                elif kind == "command":
                    cls = self.command_case(rng, memory)
                elif kind == "lifecycle":
                    cls = self.lifecycle_case(rng, memory)
                else:
                    cls = self.chain_case(rng, memory, indirect=batch // 2 % 2 == 0)
                r.classes[cls] += 1
                r.models[memory] += 1
                r.cases = i + 1
            kind = "final health check"
            self.health_check(wire.MEMORY_MODELS[(cases // BATCH) % 2])
        except Failure as e:
            what = str(e)
            if not self.alive():
                r.crashes += 1
                what = f"crash: the host process is gone ({what})"
            elif what.startswith("hang"):
                r.hangs += 1
            raise Failure(f"case {i} (seed {self.seed}, {kind}, {memory}): {what}") from None


HOST_ARGS = ("--job-timeout-ms", str(JOB_TIMEOUT_MS))  # what `fuzz` starts its host with


def fuzz(cases: int, seed: int, *, progress=None) -> Report:
    """Start a host, fuzz it with `cases` cases, stop it; -> the Report."""
    endpoint, directory = private_endpoint("pvgpu-fuzz")
    log = tempfile.mktemp(prefix="pvgpu-fuzz-host-", suffix=".log")
    host = HostProcess([endpoint], vram="256M", log_path=log, extra_args=HOST_ARGS)
    try:
        return fuzz_host(host, log, cases, seed, progress=progress)
    finally:
        host.stop()
        if os.path.exists(log):
            os.unlink(log)
        shutil.rmtree(directory, ignore_errors=True)


def fuzz_host(host: HostProcess, log: str, cases: int, seed: int, *, progress=None) -> Report:
    """Fuzz a running host whose output goes to file `log`, then stop it; -> the Report."""
    report = Report(seed)
    fuzzer = Fuzzer(host.endpoint, seed, report, alive=host.alive)
    start = time.monotonic()
    try:
        report.rss_kib["start"] = proc_status(host.proc.pid).get("VmRSS")
        try:
            fuzzer.run(cases, progress)
        except Failure as e:
            report.failure = str(e)
        last = proc_status(host.proc.pid) if host.alive() else {}
        if last:
            report.rss_kib.update(end=last.get("VmRSS"), peak=last.get("VmHWM"))
        else:
            report.crashes = max(report.crashes, 1)
    finally:
        report.seconds = time.monotonic() - start
        fuzzer.close()
        code = host.stop()
    text = open(log).read() if os.path.exists(log) else ""
    report.tracebacks = text.count("Traceback")
    if report.tracebacks and not report.failure:
        first = text.index("Traceback")
        report.failure = "traceback in the host log:\n" + text[first:first + 4000]
    if code not in (0, None) and not report.failure:
        report.crashes += 1
        report.failure = f"host exited with {code}:\n{text[-4000:]}"
    return report


def format_report(r: Report) -> str:
    d = r.as_dict()
    lines = [f"pvgpu bench fuzz: seed {r.seed}, {r.cases} cases in {d['seconds']} s "
             f"({d['cases_per_s']} cases/s), {r.health_checks} health checks, "
             f"memory models {dict(r.models)}",
             f"  host RSS KiB: start {r.rss_kib.get('start')}, peak {r.rss_kib.get('peak')}, "
             f"end {r.rss_kib.get('end')}",
             f"  crashes {r.crashes}, hangs {r.hangs}, tracebacks {r.tracebacks}, "
             f"undetected invalid chains {r.undetected}",
             "  classes:"]
    lines += [f"    {k:32s} {v}" for k, v in sorted(r.classes.items())]
    lines.append("  mutations:")
    lines += [f"    {k:32s} {v}" for k, v in sorted(r.mutations.items())]
    if r.failure:
        lines.append(f"FAILED: {r.failure}")
    return "\n".join(lines)


def run_bench(cases: int = 10_000, seed: int = 1, json_path: str | None = None) -> int:
    """`pvgpu bench fuzz`; -> exit status (1 on any crash, hang or traceback)."""
    report = fuzz(cases, seed, progress=lambda i: print(f"  ... {i} cases", file=sys.stderr)
                  if i % 5000 == 0 else None)
    print(format_report(report))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report.as_dict(), f, indent=2)
    return 0 if report.ok and not report.failure else 1
