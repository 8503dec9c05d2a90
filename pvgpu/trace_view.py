"""Render an engine trace (`pvgpu host --trace FILE`) as a timeline picture, with matplotlib.

The trace file is meant for https://ui.perfetto.dev; this draws the same file where no
browser is at hand (and the picture in the README): one row per track of each device
(virtqueue, submit, compute, copy0, copy1), a bar per job slice coloured by what it ran
(the kernel, or the copy's direction), the arrows from each submission to its job while
there are few enough to read, the kicks received (ticks) and requests completed (dots) on
the virtqueue row, fault and reset instants in red, and the VRAM in use of each device below.

    python -m pvgpu.trace_view TRACE.json [-o TRACE.png] [--start MS] [--end MS]

matplotlib is an optional dependency (`pip install pvgpu[plot]`), imported only here.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys

MAX_ARROWS = 150  # more submission arrows than this in the window are left out


def load(path: str) -> dict:
    """The trace file -> {"tracks": [(pid, tid, label)] top to bottom, "slices": {(pid,
    tid): [(ts, dur, name, flow id)]}, "submits": {flow id: (pid, ts)}, "instants":
    [(pid, tid, ts, name)], "queue": {(pid, tid): [(ts, name)]}, "counters": {pid: [(ts,
    MiB)]}, "processes": {pid: name}}; times
    in ms."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    processes, threads, order = {}, {}, {}
    slices, submits, instants, counters, queue = {}, {}, [], {}, {}
    for e in events:
        ph, pid, tid = e["ph"], e.get("pid"), e.get("tid")
        if ph == "M":
            if e["name"] == "process_name":
                processes[pid] = e["args"]["name"]
            elif e["name"] == "thread_name":
                threads[(pid, tid)] = e["args"]["name"]
            elif e["name"] == "thread_sort_index":
                order[(pid, tid)] = e["args"]["sort_index"]
        elif ph == "X" and e.get("flow_out"):
            submits[e.get("bind_id")] = (pid, e["ts"] / 1000)
        elif ph == "X":
            slices.setdefault((pid, tid), []).append(
                (e["ts"] / 1000, e["dur"] / 1000, e["name"], e.get("bind_id")))
        elif ph == "i" and e.get("cat") == "error":
            instants.append((pid, tid, e["ts"] / 1000, e["name"]))
        elif ph == "i" and e.get("cat") == "virtqueue":
            queue.setdefault((pid, tid), []).append((e["ts"] / 1000, e["name"]))
        elif ph == "C":
            counters.setdefault(pid, []).append((e["ts"] / 1000, next(iter(e["args"].values()))))
    tracks = sorted(threads, key=lambda k: (k[0], order.get(k, k[1])))
    return {"tracks": [(pid, tid, f"{processes.get(pid, pid)}\n{threads[(pid, tid)]}")
                       for pid, tid in tracks],
            "slices": slices, "submits": submits, "instants": instants, "queue": queue,
            "counters": counters, "processes": processes}


def _category(name: str) -> str:
    """'copy H2D 16 MiB' -> 'copy H2D'; a kernel's name stays."""
    parts = name.split()
    return " ".join(parts[:2]) if parts and parts[0] in ("copy", "code") else name


def render(trace_path: str, out_path: str, *, start_ms: float | None = None,
           end_ms: float | None = None, title: str | None = None) -> str:
    """Draw the trace at trace_path into out_path (PNG); -> out_path. The window defaults
    to the first job's submission up to the last job's end."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = load(trace_path)
    ends = [ts + dur for s in t["slices"].values() for ts, dur, _n, _f in s]
    starts = [ts for _pid, ts in t["submits"].values()] or [0.0]
    lo = min(starts) if start_ms is None else start_ms
    hi = (max(ends) if ends else lo + 1) if end_ms is None else end_ms
    margin = (hi - lo) * 0.01
    rows = {(pid, tid): i for i, (pid, tid, _label) in enumerate(t["tracks"])}
    categories = sorted({_category(n) for s in t["slices"].values() for ts, d, n, _f in s
                         if ts + d >= lo and ts <= hi})
    cmap = plt.get_cmap("tab10" if len(categories) <= 10 else "tab20")
    colour = {c: cmap(i % cmap.N) for i, c in enumerate(categories)}

    fig, (ax, vram) = plt.subplots(2, 1, sharex=True, figsize=(11, 1.0 + 0.42 * len(rows) + 1.8),
                                   gridspec_kw={"height_ratios": [max(1, len(rows)), 2.2]})
    submit_row = {pid: rows[(pid, tid)] for (pid, tid) in rows if t["tracks"][rows[(pid, tid)]][2]
                  .endswith("\nsubmit")}
    arrows = []
    for key, items in t["slices"].items():
        y = rows.get(key)
        if y is None:
            continue
        shown = [(ts, dur, n, f) for ts, dur, n, f in items if ts + dur >= lo and ts <= hi]
        for cat in {_category(n) for _ts, _d, n, _f in shown}:
            bars = [(ts, max(dur, (hi - lo) / 2000)) for ts, dur, n, _f in shown
                    if _category(n) == cat]
            ax.broken_barh(bars, (y - 0.38, 0.76), facecolors=colour[cat], edgecolor="white",
                           linewidth=0.5)
        for ts, dur, name, flow in shown:
            if dur > (hi - lo) * 0.07:  # wide enough to carry its name
                ax.text(max(ts, lo) + (hi - lo) * 0.004, y, name, va="center", fontsize=7,
                        color="white", clip_on=True)
            sub = t["submits"].get(flow)
            if sub is not None and sub[0] in submit_row and lo <= sub[1]:
                arrows.append((sub[1], submit_row[sub[0]], ts, y))
    for pid, row in submit_row.items():
        ticks = [ts for p, ts in t["submits"].values() if p == pid and lo <= ts <= hi]
        ax.plot(ticks, [row] * len(ticks), "|", color="0.25", markersize=9)
    for key, marks in t["queue"].items():
        row = rows.get(key)
        if row is None:
            continue
        for marker, kicks in (("|", True), (".", False)):
            xs = [ts for ts, name in marks if (name == "kick") == kicks and lo <= ts <= hi]
            ax.plot(xs, [row] * len(xs), marker, color="0.25" if kicks else "tab:blue",
                    markersize=9 if kicks else 5)
    if len(arrows) <= MAX_ARROWS:
        for x0, y0, x1, y1 in arrows:
            ax.annotate("", xy=(x1, y1 - 0.38), xytext=(x0, y0 + 0.3),
                        arrowprops={"arrowstyle": "->", "color": "0.55", "lw": 0.6})
    for pid, tid, ts, name in t["instants"]:
        y = rows.get((pid, tid), submit_row.get(pid))
        if y is not None and lo <= ts <= hi:
            ax.plot([ts], [y], "v", color="red", markersize=8)
            ax.annotate(name, (ts, y + 0.42), color="red", fontsize=7, ha="center")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label.replace("\n", "  ") for _p, _t, label in t["tracks"]], fontsize=8)
    ax.set_ylim(len(rows) - 0.4, -0.6)
    ax.grid(axis="x", color="0.9")
    ax.set_title(title or f"pvgpu engine trace ({trace_path.rsplit('/', 1)[-1]})")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[c]) for c in categories]
    ax.legend(handles, categories, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8,
              title="job", title_fontsize=8, frameon=False)

    for pid, samples in sorted(t["counters"].items()):
        xs = [ts for ts, _v in samples]
        ys = [v for _ts, v in samples]
        if xs and xs[-1] < hi:
            xs.append(hi)
            ys.append(ys[-1])
        vram.step(xs, ys, where="post", label=t["processes"].get(pid, str(pid)))
    vram.set_ylabel("VRAM in use (MiB)", fontsize=8)
    vram.set_xlabel("time since the trace started (ms)")
    vram.grid(color="0.9")
    vram.set_ylim(bottom=0)
    if t["counters"]:
        vram.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    vram.set_xlim(lo - margin, hi + margin)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pvgpu.trace_view",
                                 description="draw the engine timeline of a pvgpu trace file")
    ap.add_argument("trace", help="a trace file written by `pvgpu host --trace FILE`")
    ap.add_argument("-o", "--output", help="the PNG to write (default: TRACE with .png)")
    ap.add_argument("--start", type=float, default=None, metavar="MS",
                    help="window start, ms since the trace started (default: the first job)")
    ap.add_argument("--end", type=float, default=None, metavar="MS",
                    help="window end in ms (default: the last job's end)")
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)
    out = args.output or (args.trace.rsplit(".", 1)[0] + ".png")
    if importlib.util.find_spec("matplotlib") is None:
        print("trace_view needs matplotlib: pip install 'pvgpu[plot]'", file=sys.stderr)
        return 2
    print(render(args.trace, out, start_ms=args.start, end_ms=args.end, title=args.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
