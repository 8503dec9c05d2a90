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

    python -m pvgpu.trace_latency TRACE.json [--session NAME]
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
    ("gap", "ended -> next job started"),
)


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


def _synchronous_steps(s: dict) -> list:
    """The steps of each of the session's jobs that ran alone (see the module's doc)."""
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
        rows.append(row)
    return rows


def summarize(events: list) -> dict:
    """Trace events -> {(pid, session name): {"jobs": n, step: (median, p10, p90) in µs}}
    for the sessions with synchronous jobs."""
    out = {}
    for key, s in sorted(_sessions(events).items()):
        rows = _synchronous_steps(s)
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
    found = False
    for (pid, session), summary in summarize(events).items():
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
