"""Where the time of synchronous requests goes, read from a host trace (`pvgpu host --trace
FILE`, host/kmd/trace.py).

For each guest session on each device, every job that was the session's only job in
flight from the kick that carried it to the session's next kick (the pattern of a
synchronous launch + synchronize, or of a synchronous copy) is followed along the path of
its request:

  kick received -> job submitted      the host's I/O loop: decode, checks, submission
  submitted -> started                the hand-off to the engine (the engine's thread, or
                                      the submitting thread for a short job)
  job ran                             the engine's time
  ended -> request completed          fence, interrupt, retirement, the response written
  completed -> next kick              the guest seeing the completion, its own work and
                                      the next kick's way through the transport
  ended -> next job started           the device idle between two of the session's jobs

and the medians (with the 10th and 90th percentiles) of each step are printed. Asynchronous
work (several jobs in flight) is left out: its steps overlap.

With `--guest FILE`, the log of a guest session run with PVGPU_GUEST_TRACE=FILE on the
same machine (guest/frontend/latency_log.py: its kicks sent and waits ended, on the clock of
the host's trace), that session's "completed -> next kick" is split further:

  completed -> the guest saw it       the guest's wait noticing the used entry
  the guest's own work                from there to the guest sending its next kick (the
                                      API's return, the next calls of the program)
  the kick's way to the host          the transport: from the guest's send to the host's
                                      I/O loop receiving it

The split assumes that the session drives one device (its log does not say which device
a kick was for).

    python -m pvgpu.trace_latency TRACE.json [--session NAME] [--guest FILE]
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import sys

STEPS = (
    ("kick_to_submit", "kick received -> job submitted"),
    ("submit_to_start", "submitted -> started"),
    ("run", "job ran"),
    ("end_to_done", "ended -> request completed"),
    ("done_to_kick", "completed -> next kick (guest, transport)"),
    ("done_to_seen", "  completed -> the guest saw it"),
    ("seen_to_kick", "  the guest's own work -> its next kick"),
    ("kick_transit", "  the kick's way to the host's I/O loop"),
    ("gap", "ended -> next job started"),
)


class GuestLogError(ValueError):
    pass


def guest_stamps(doc: dict, base_ns: int) -> dict:
    """A guest latency log (its JSON) -> {"session_name", "kicks": [µs], "seen": [µs]} on
    the timestamps of a trace whose timestamp 0 is host monotonic time `base_ns`."""
    def us(stamps) -> list:
        return sorted(round((int(ns) - base_ns) / 1000, 3) for ns in stamps)
    try:
        stamps = {"session_name": str(doc["session_name"]), "kicks": us(doc["kicks"]),
                  "seen": us(doc["waits_done"])}
    except (KeyError, TypeError, ValueError) as e:
        raise GuestLogError(f"not a guest latency log: {e!r}") from None
    if doc.get("clock") != "monotonic_ns":
        raise GuestLogError(f"its clock is {doc.get('clock')!r}, not monotonic_ns")
    return stamps


def _sessions(events: list) -> dict:
    """(pid, session name) -> {"jobs": [(submit, start, end)] by submit, "kicks": [ts],
    "done": [ts]}, times in µs."""
    submits = {e["bind_id"]: e["ts"] for e in events
               if e["ph"] == "X" and e.get("flow_out")}
    out: dict = {}

    def of(e) -> dict:
        key = (e["pid"], e["args"].get("session_name", ""))
        return out.setdefault(key, {"jobs": [], "kicks": [], "done": []})

    for e in events:
        if e["ph"] == "X" and e.get("flow_in") and "session" in e.get("args", {}):
            start = e["ts"]
            of(e)["jobs"].append((submits.get(e.get("bind_id"), start), start, start + e["dur"]))
        elif e["ph"] == "i" and e.get("cat") == "virtqueue":
            of(e)["kicks" if e["name"] == "kick" else "done"].append(e["ts"])
    for s in out.values():
        s["jobs"].sort()
        s["kicks"].sort()
        s["done"].sort()
    return out


def _synchronous_steps(s: dict, guest: dict | None = None) -> list:
    """The steps of each of the session's jobs that ran alone (see the module's doc);
    `guest`: the session's own stamps (guest_stamps) split its completed -> next kick."""
    jobs, kicks, done = s["jobs"], s["kicks"], s["done"]
    submits = [j[0] for j in jobs]
    rows = []
    for i, (submit, start, end) in enumerate(jobs):
        k = bisect.bisect_right(kicks, submit) - 1
        d = bisect.bisect_left(done, end)
        if k < 0 or d == len(done):
            continue
        n = bisect.bisect_right(kicks, done[d])
        if n == len(kicks):
            continue
        kick, completed, next_kick = kicks[k], done[d], kicks[n]
        # alone: no other job of the session submitted from its kick to the next kick
        if bisect.bisect_left(submits, next_kick) - bisect.bisect_left(submits, kick) != 1:
            continue
        row = {"kick_to_submit": submit - kick, "submit_to_start": start - submit,
               "run": end - start, "end_to_done": completed - end,
               "done_to_kick": next_kick - completed}
        if i + 1 < len(jobs):
            row["gap"] = jobs[i + 1][1] - end
        if guest is not None:
            _split_by_guest(row, guest, completed, next_kick)
        rows.append(row)
    return rows


def _split_by_guest(row: dict, guest: dict, completed: float, next_kick: float) -> None:
    """The first wait end of the guest's from `completed` on and its first kick sent from
    there on, if both come before the host received `next_kick`."""
    seen, sent = guest["seen"], guest["kicks"]
    j = bisect.bisect_left(seen, completed)
    if j == len(seen) or seen[j] > next_kick:
        return
    k = bisect.bisect_left(sent, seen[j])
    if k == len(sent) or sent[k] > next_kick:
        return
    row["done_to_seen"] = seen[j] - completed
    row["seen_to_kick"] = sent[k] - seen[j]
    row["kick_transit"] = next_kick - sent[k]


def summarize(events: list, guests: dict | None = None) -> dict:
    """Trace events -> {(pid, session name): {"jobs": n, step: (median, p10, p90) in µs}}
    for the sessions with synchronous jobs; `guests`: session name -> guest_stamps, for
    the sessions whose own stamps split their completed -> next kick."""
    out = {}
    for key, s in sorted(_sessions(events).items()):
        rows = _synchronous_steps(s, (guests or {}).get(key[1]))
        if not rows:
            continue
        summary: dict = {"jobs": len(rows)}
        for step, _label in STEPS:
            values = sorted(r[step] for r in rows if step in r)
            if values:
                summary[step] = (statistics.median(values), values[len(values) // 10],
                                 values[(9 * len(values)) // 10])
        out[key] = summary
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pvgpu.trace_latency",
                                 description="where the time of synchronous requests goes, "
                                             "read from a pvgpu host trace")
    ap.add_argument("trace", help="a trace file written by `pvgpu host --trace FILE`")
    ap.add_argument("--session", default=None, help="only the session of this name")
    ap.add_argument("--guest", default=None, metavar="FILE",
                    help="a guest session's latency log (PVGPU_GUEST_TRACE=FILE): split its "
                         "completed -> next kick into the guest and the transport")
    args = ap.parse_args(argv)
    try:
        with open(args.trace) as f:
            doc = json.load(f)
        events = doc["traceEvents"]
        processes = {e["pid"]: e["args"]["name"] for e in events
                     if e["ph"] == "M" and e["name"] == "process_name"}
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"trace_latency: cannot read {args.trace}: {e}", file=sys.stderr)
        return 2
    guests = None
    if args.guest is not None:
        base = doc.get("otherData", {}).get("monotonic_ns_at_0")
        if not isinstance(base, int):
            print(f"trace_latency: {args.trace} has no clock base (monotonic_ns_at_0): "
                  "written by a host older than the guest latency log", file=sys.stderr)
            return 2
        try:
            with open(args.guest) as f:
                stamps = guest_stamps(json.load(f), base)
        except (OSError, ValueError) as e:
            print(f"trace_latency: cannot read {args.guest}: {e}", file=sys.stderr)
            return 2
        guests = {stamps["session_name"]: stamps}
    found = False
    for (pid, session), summary in summarize(events, guests).items():
        if args.session is not None and session != args.session:
            continue
        found = True
        print(f"session {session or '?'} on {processes.get(pid, pid)}: "
              f"{summary['jobs']} synchronous jobs; median (p10 .. p90) in µs")
        for step, label in STEPS:
            if step in summary:
                med, p10, p90 = summary[step]
                print(f"  {label:44s} {med:9.1f}  ({p10:.1f} .. {p90:.1f})")
    if not found:
        print("trace_latency: no synchronous jobs with their kicks and completions in the trace"
              + (f" for session {args.session!r}" if args.session else "")
              + " (traces of hosts before the virtqueue track have none)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
