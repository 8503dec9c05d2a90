"""Engine traces: what the engines of the devices ran, as a Chrome/Perfetto trace-event file.

A TraceRecorder is attached to devices (KmdDevice.trace); with none attached (the default)
the only cost a job pays is one attribute check when its completion reaches the scheduler.
While one is attached the devices hand it, under their lock:

- every job whose hardware fence retired (JobMixin._jobs_done_locked): its device, engine,
  scheduler times (arrival; start = when the ring reached it, max(handed to the ring,
  the previous job's completion); end = the completion time the command processor wrote
  beside the fence's sequence number, stamped fences, fence.py), its payload and its
  context's names. The payload is decoded only when the trace is written;
- GPU faults (irq.py) and engine resets (TDR and preemption, tdr.py);
- VRAM in use, after allocations and frees of buffer memory (evict.py) and after each job.

The backend adds the device's virtqueue side, without the device lock (a record made while
the trace stops may be left out): each kick of its control queue, at the time the host's
I/O loop received it, and each request it completed (its used entry written), with the
command's type. A synchronous request's latency then reads off the file: kick received ->
job submitted -> job started -> job ended -> request completed -> the guest's next kick.

Records go to a bounded deque (the oldest are dropped beyond max_records; the file says
how many). write(path) drains it into the trace-event JSON format
({"traceEvents": [...], "displayTimeUnit": "ms"}, timestamps in µs; "otherData" holds
"monotonic_ns_at_0", the host's CLOCK_MONOTONIC in ns at timestamp 0, so that a guest's
own stamps on the same machine line up with the trace: guest/frontend/latency_log.py):

- one process per device ("gpu0 <name>"), one thread per track: "submit" and one per
  engine (compute, copy0, copy1);
- one complete ("X") slice per job on its engine's track, named after the kernel
  ("fill", "code entry 0x..." for a code launch; a job of several launches, from a
  LAUNCH_BATCH, after each run of them: "scale x3, fill") or the copy ("copy H2D 16 MiB"), with
  the session, vGPU, context and stream (the context's timeline) in its args;
- a zero-length "submit" slice per job on the submit track at its arrival, and a flow
  arrow from it to the job's slice (flow_out/flow_in with a shared bind_id);
- instants ("i") for each fence signalled, for GPU faults and for engine resets;
- instants on a "virtqueue" track for each kick received ("kick") and each request
  completed ("CTX_SYNC done"), with the session in their args;
- a counter ("C") of VRAM in use per device.
"""

from __future__ import annotations

import collections
import json
import os
import struct
import time

from pvgpu.host.hw import packets, regs
from pvgpu.spec import kernels

SUBMIT_TID = 1
TRACK_NAMES = {SUBMIT_TID: "submit"}
TRACK_NAMES.update({engine + 2: name for engine, name in regs.ENGINE_NAMES.items()})
QUEUE_TID = max(TRACK_NAMES) + 1  # the virtqueue's kicks and completions, listed first
TRACK_NAMES[QUEUE_TID] = "virtqueue"
_SORT_INDEX = {QUEUE_TID: 0}
DEFAULT_MAX_RECORDS = 1 << 17  # jobs, faults, resets and VRAM samples kept (~0.4 KB a job)
_MiB = 1 << 20
_CHUNK = 4096  # events encoded at a time by write()
_COMPACT = (",", ":")
_U32 = struct.Struct("<I")
_COPY = struct.Struct("<6I")


class TraceError(RuntimeError):
    """A trace cannot be started or stopped (the message says why)."""


def engine_tid(engine: int) -> int:
    """The trace thread id of an engine's track."""
    return engine + 2


def format_size(n: int) -> str:
    """16777216 -> '16 MiB', 1536 -> '1.5 KiB', 100 -> '100 B'."""
    for unit, name in ((1 << 30, "GiB"), (_MiB, "MiB"), (1 << 10, "KiB")):
        if n >= unit:
            return f"{n / unit:.4g} {name}"
    return f"{n} B"


def _in_ranges(va: int, ranges) -> bool:
    return any(start <= va < start + size for start, size in ranges)


def _kernel_name(kernel_id: int) -> str:
    sig = kernels.BUILTIN_KERNELS.get(kernel_id)
    return sig.name if sig is not None else f"kernel {kernel_id}"


def describe(payload, engine: int, system_ranges=None) -> tuple:
    """A job's payload (its IB's packets, or a kmd.kernarg.CodeLaunch) -> (slice name,
    args). A copy's direction: D2H on copy engine 1; on copy engine 0, H2D when its source
    lies in one of `system_ranges` ((va, size) of the context's system-memory mappings,
    None for the kernel's moves, which on that engine are all restores), else D2D."""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        entry = getattr(payload, "entry_va", 0)
        return f"code entry {entry:#x}", {"kind": "code launch", "entry_va": hex(entry)}
    buf = bytes(payload)
    pos, copies, nbytes, src0, launched = 0, 0, 0, None, []
    while pos + 4 <= len(buf):
        opcode, body = packets.split_header(_U32.unpack_from(buf, pos)[0])
        if opcode == packets.PKT_COPY and pos + 4 + _COPY.size <= len(buf):
            src_lo, src_hi, _dst_lo, _dst_hi, size_lo, size_hi = _COPY.unpack_from(buf, pos + 4)
            if src0 is None:
                src0 = src_lo | src_hi << 32
            copies += 1
            nbytes += size_lo | size_hi << 32
        elif opcode == packets.PKT_LAUNCH and body >= 1 and pos + 8 <= len(buf):
            launched.append(_U32.unpack_from(buf, pos + 4)[0])
        pos += 4 + 4 * body
    if launched:  # a job of several launches (a LAUNCH_BATCH): "scale x3, fill"
        runs = []
        for kernel in launched:
            if runs and runs[-1][0] == kernel:
                runs[-1][1] += 1
            else:
                runs.append([kernel, 1])
        name = ", ".join(_kernel_name(k) + (f" x{n}" if n > 1 else "") for k, n in runs)
        args = {"kind": "launch", "kernel_id": launched[0]}
        if len(launched) > 1:
            args["launches"] = len(launched)
        return name, args
    if engine == regs.ENGINE_COPY1:
        direction = "D2H"
    elif system_ranges is None or src0 is not None and _in_ranges(src0, system_ranges):
        direction = "H2D"
    else:
        direction = "D2D"
    return (f"copy {direction} {format_size(nbytes)}",
            {"kind": "copy", "direction": direction, "bytes": nbytes, "copies": copies})


def _context_of(ctx) -> tuple:
    """What a record keeps of a job's context (a tuple: records are many)."""
    client = ctx.client
    return (ctx.id, ctx.name, ctx.vgpu.name, getattr(client, "sid", None),
            getattr(client, "name", ""))


def _context_args(context: tuple) -> dict:
    ctx_id, name, vgpu, sid, session = context
    args = {"context": ctx_id, "context_name": name, "vgpu": vgpu}
    if sid is not None:  # a guest session's context (a KMD-internal one has none)
        args["session"] = sid
        args["session_name"] = session
    return args


class TraceRecorder:
    """The records of a trace of `devices` (KmdDevices, or anything with index, name, mm
    and clock_ns()); attach() starts recording, detach() stops it, write() drains it."""

    def __init__(self, devices, *, max_records: int = DEFAULT_MAX_RECORDS,
                 clock=time.monotonic_ns):
        self.devices = list(devices)
        self.start_ns = clock()  # the device clock's base (host monotonic ns)
        self.base_ns = self.start_ns  # the written events' timestamp 0 (events())
        self._records = collections.deque(maxlen=max_records)
        self.dropped = 0  # records lost to the bound (devices may race on it: a lower bound)
        self._vram_used = {}  # device index -> the last VRAM sample recorded

    # ------------------------------------------------------------------ attaching
    def attach(self) -> None:
        for dev in self.devices:
            with dev.lock:
                self._sample_vram(dev, dev.clock_ns())
                dev.trace = self

    def detach(self) -> None:
        """Stop recording; once this returns no device adds to the records (every record
        is made under the device's lock)."""
        for dev in self.devices:
            with dev.lock:
                if dev.trace is self:
                    dev.trace = None

    # ------------------------------------------------------------------ hooks (lock held)
    def _add(self, record: tuple) -> None:
        records = self._records
        if len(records) == records.maxlen:
            self.dropped += 1
        records.append(record)

    def job(self, dev, job, hw_fence) -> None:
        """`job` (a SchedJob) completed with hardware fence `hw_fence`."""
        ent = job.entity
        ctx = ent.owner
        engine = ent.sched.engine
        ranges = None
        if engine != regs.ENGINE_COMPUTE and ctx.vm is not None:
            ranges = tuple((va, m[1]) for va, m in ctx._sys_maps.items())
        error = getattr(hw_fence, "error", None)
        self._add(("job", dev.index, engine, job.seq, job.arrival_ns, job.start_ns, job.end_ns,
                   hw_fence.seq, None if error is None else str(error), job.payload,
                   _context_of(ctx), ctx._timeline_of.get(ent, 0), ranges))
        self._sample_vram(dev, job.end_ns)

    def fault(self, dev, engine: int, error, ctx=None) -> None:
        """A GPU fault (or an illegal packet) on `engine`, attached to a job of ctx."""
        args = {"error": str(error), "kind": type(error).__name__}
        if ctx is not None:
            args.update(_context_args(_context_of(ctx)))
        self._add(("instant", dev.index, engine_tid(engine), dev.clock_ns(), "GPU fault",
                   args, "t"))

    def engine_reset(self, dev, engine: int, job, ctx, reason: str) -> None:
        """`engine` is being reset (TDR or preemption), stopping `job` of ctx."""
        args = {"engine": regs.ENGINE_NAMES.get(engine, str(engine)), "reason": reason,
                "job": job.seq}
        args.update(_context_args(_context_of(ctx)))
        self._add(("instant", dev.index, engine_tid(engine), dev.clock_ns(), "engine reset",
                   args, "p"))

    def kick(self, dev, received_ns: int, session) -> None:
        """The host's I/O loop received, at `received_ns`, a kick of `session`'s control
        queue of `dev` (called by the backend, without the device lock)."""
        self._add(("queue", dev.index, received_ns, "kick", session.sid, session.name, None))

    def request_completed(self, dev, session, command: str, head: int) -> None:
        """A request (`command`, its type's name; chain `head`) of `session` on `dev` was
        completed now: its used entry is written (called by the backend, without the
        device lock)."""
        self._add(("queue", dev.index, dev.clock_ns(), command, session.sid, session.name,
                   head))

    def vram(self, dev) -> None:
        """VRAM was allocated or freed."""
        self._sample_vram(dev, dev.clock_ns())

    def _sample_vram(self, dev, now: int) -> None:
        used = dev.mm.used
        if self._vram_used.get(dev.index) != used:
            self._vram_used[dev.index] = used
            self._add(("vram", dev.index, now, used))

    # ------------------------------------------------------------------ output
    def _drain(self) -> list:
        out = []
        records = self._records
        while True:
            try:
                out.append(records.popleft())
            except IndexError:
                return out

    def events(self) -> list:
        """Drain the records into trace events (metadata first); `base_ns` is then the host
        monotonic time of their timestamp 0."""
        records = self._drain()
        base = self.start_ns
        for r in records:
            if r[0] == "job" and r[4] is not None:
                base = min(base, r[4])
        self.base_ns = base

        def us(ns: int) -> float:
            return round((ns - base) / 1000, 3)

        meta = []
        for dev in self.devices:
            pid = dev.index + 1
            meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                         "args": {"name": f"gpu{dev.index} {dev.name}"}})
            meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                         "args": {"sort_index": dev.index}})
            for tid, name in TRACK_NAMES.items():
                meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                             "args": {"name": name}})
                meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                             "args": {"sort_index": _SORT_INDEX.get(tid, tid)}})
        events = []
        for r in records:
            kind = r[0]
            if kind == "job":
                events += self._job_events(r, us)
            elif kind == "instant":
                _, index, tid, ns, name, args, scope = r
                events.append({"ph": "i", "name": name, "cat": "error", "pid": index + 1,
                               "tid": tid, "ts": us(ns), "s": scope, "args": args})
            elif kind == "queue":
                _, index, ns, what, sid, session, head = r
                args = {"session": sid, "session_name": session}
                if head is None:
                    name = "kick"
                else:
                    name = f"{what} done"
                    args["head"] = head
                events.append({"ph": "i", "name": name, "cat": "virtqueue", "pid": index + 1,
                               "tid": QUEUE_TID, "ts": us(ns), "s": "t", "args": args})
            else:
                _, index, ns, used = r
                events.append({"ph": "C", "name": "VRAM in use", "pid": index + 1, "tid": 0,
                               "ts": us(ns), "args": {"MiB": round(used / _MiB, 3)}})
        # in time order (a job's submit slice stays before its engine slice on a tie)
        events.sort(key=lambda e: e["ts"])
        return meta + events

    @staticmethod
    def _job_events(r: tuple, us) -> list:
        (_, index, engine, seq, arrival, start, end, hw_seq, error, payload, context,
         timeline, ranges) = r
        ctx_args = _context_args(context)
        name, args = describe(payload, engine, ranges)
        args.update(ctx_args)
        args.update({"stream": timeline, "job": seq, "fence": hw_seq})
        if error is not None:
            args["error"] = error
        pid, tid = index + 1, engine_tid(engine)
        flow = f"{(index << 48) | (engine << 40) | seq:#x}"
        ts, end_ts = us(start), us(end)
        submit = us(arrival) if arrival is not None else ts
        return [
            {"ph": "X", "name": f"submit {name}", "cat": "job", "pid": pid, "tid": SUBMIT_TID,
             "ts": submit, "dur": 0, "bind_id": flow, "flow_out": True,
             "args": {"engine": regs.ENGINE_NAMES.get(engine), **ctx_args, "stream": timeline,
                      "job": seq}},
            {"ph": "X", "name": name, "cat": "job", "pid": pid, "tid": tid, "ts": ts,
             "dur": round(end_ts - ts, 3), "bind_id": flow, "flow_in": True, "args": args},
            {"ph": "i", "name": f"fence {hw_seq} signalled", "cat": "fence", "pid": pid,
             "tid": tid, "ts": end_ts, "s": "t",
             "args": {"fence": hw_seq, "job": seq, **({"error": error} if error else {})}},
        ]

    def write(self, path: str) -> int:
        """Write the trace to `path` (atomically: a temporary file, then a rename);
        -> the number of job slices written."""
        events = self.events()
        other = {"producer": "pvgpu host", "dropped_records": self.dropped,
                 "monotonic_ns_at_0": self.base_ns}
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            # json.dumps of a chunk runs in C; json.dump to a file would encode in Python
            f.write('{"displayTimeUnit":"ms","otherData":%s,"traceEvents":['
                    % json.dumps(other, separators=_COMPACT))
            for i in range(0, len(events), _CHUNK):
                if i:
                    f.write(",")
                f.write(json.dumps(events[i:i + _CHUNK], separators=_COMPACT)[1:-1])
            f.write("]}")
        os.replace(tmp, path)
        return sum(1 for e in events if e["ph"] == "X" and e["tid"] != SUBMIT_TID)
