"""Pictures of the benchmarks' and the demo's results (`--plot DIR`), drawn with matplotlib.

matplotlib is an optional extra (`pip install pvgpu[plot]`); it is imported only when a
plot is drawn, and then through its object-oriented API on an Agg canvas (no pyplot, no
display, no global backend switch). Every function takes the result dict its command
returns (and writes with --json) and writes one PNG:

  sched_figure     `pvgpu bench sched`: compute utilisation per vGPU over time (a sliding
                   window over the cumulative series the bench samples), one panel per
                   policy (and the four-vGPU fair run), each vGPU's share dashed and
                   Gdev's published mean for it dotted beside ours
  copies_figure    `pvgpu bench copies`: bandwidth against copy size (log-log), host->device
                   and device->host, one line per path (pinned, pageable pipelined and not,
                   inline) and numpy memcpy of the same size
  demo_figure      `pvgpu demo --guests N`: each guest's compute and copy utilisation per
                   second, its compute share dashed

require() checks that matplotlib is there before a long run; without it every entry
raises PlotUnavailable, whose message says what to install.
"""

from __future__ import annotations

import io
import os

INSTALL_HINT = "plots need matplotlib: install pvgpu[plot] (pip install 'pvgpu[plot]')"
DPI = 80
PALETTE = 64
COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
           "tab:pink", "tab:olive")
KiB, MiB = 1 << 10, 1 << 20


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def require() -> None:
    """Raise PlotUnavailable unless matplotlib can be imported."""
    _figure_factory()


def _figure_factory():
    try:
        from matplotlib.figure import Figure
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        raise PlotUnavailable(INSTALL_HINT) from None

    def figure(**kw):
        fig = Figure(**kw)
        FigureCanvasAgg(fig)
        return fig
    return figure


def _save(fig, directory: str, name: str) -> str:
    """Write `fig` as a PNG of PALETTE colours: a third of the bytes of full colour, for
    line plots that look the same."""
    from PIL import Image  # a dependency of matplotlib
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    Image.open(buf).convert("RGB").quantize(PALETTE).save(path, optimize=True)
    return path


# ---------------------------------------------------------------------- bench sched
def sched_panels(result: dict) -> list:
    """-> [(title, run, gdev means or None)] for the runs of `result` that have a series."""
    panels = []
    for policy, run in result.get("unfair", {}).items():
        if run.get("series"):
            w = run["workloads"]
            panels.append((f"{policy}: {', '.join(f'{n} {x}' for n, x in w.items())}", run,
                           result.get("gdev", {}).get(policy)))
    fair = result.get("fair")
    if fair and fair.get("series"):
        panels.append((f"band: {len(fair['shares'])} vGPUs, all long", fair, None))
    return panels


def windowed(t_s, busy_s, window: float) -> tuple:
    """Utilisation over a sliding window from cumulative series: at each point t_i whose
    window [t_i - window, t_i] starts at or after 0, (busy(t_i) - busy(t_j)) / (t_i - t_j)
    with t_j the latest point (or 0) at or before t_i - window. -> (times, utilisations)."""
    ts, us = [0.0, *t_s], [0.0, *busy_s]
    out_t, out_u = [], []
    j = 0
    for i in range(1, len(ts)):
        if ts[i] - ts[0] < window:
            continue
        while ts[j + 1] <= ts[i] - window:
            j += 1
        out_t.append(ts[i])
        out_u.append(min(1.0, max(0.0, (us[i] - us[j]) / (ts[i] - ts[j]))))
    return out_t, out_u


def sched_figure(result: dict, directory: str, name: str = "sched.png") -> str:
    """Compute utilisation per vGPU over time for each policy of a `bench sched` result,
    over a sliding window of up to one second (jobs are charged when they complete, so
    shorter windows jump by whole 20 ms kernels)."""
    from matplotlib.lines import Line2D
    panels = sched_panels(result)
    if not panels:
        raise ValueError("no run of this result has a utilisation series to plot")
    fig = _figure_factory()(figsize=(3.1 * len(panels) + 0.6, 4.8), layout="constrained")
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    windows = []
    for ax, (title, run, gdev) in zip(axes, panels):
        t = run["series"]["t_s"]
        window = min(1.0, t[-1] / 2)
        windows.append(window)
        handles = []
        for i, (n, busy) in enumerate(run["series"]["busy_s"].items()):
            c = COLOURS[i % len(COLOURS)]
            wt, wu = windowed(t, busy, window)
            handles += ax.plot(wt, [u * 100 for u in wu], color=c, lw=1.5,
                               label=f"{n} ({run['workloads'][n]}): mean {run['util'][n] * 100:.0f} %")
            ax.axhline(run["shares"][n] * 100, color=c, ls="--", lw=0.8)
            if gdev and n in gdev:
                ax.axhline(gdev[n] * 100, color=c, ls=":", lw=1.8)
        handles.append(Line2D([], [], color="grey", ls="--", lw=0.8, label="share"))
        if gdev:
            handles.append(Line2D([], [], color="grey", ls=":", lw=1.8,
                                  label="Gdev's mean (ATC 2012)"))
        ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16),
                  frameon=False)
        ax.set_title(f"{title}\nJain {run['jain']:.3f}, mean |U - share| "
                     f"{run['mean_abs_error'] * 100:.1f} pp", fontsize=9)
        ax.set_xlabel("time measured (s)")
        ax.set_ylim(0, 105)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("compute engine utilisation (%)")
    fig.suptitle("pvgpu bench sched: compute utilisation per vGPU over time (sliding window "
                 f"of {max(windows):g} s)", fontsize=10)
    return _save(fig, directory, name)


# ---------------------------------------------------------------------- bench copies
COPY_PATHS = (  # (result table, key prefix, label, line style)
    ("shared", "pinned", "pinned", "-"),
    ("shared", "pageable", "pageable, pipelined", "-"),
    ("shared", "unpipelined", "pageable, one chunk at a time", "-"),
    ("inline", "pinned", "inline memory model, pinned", "--"),
    ("inline", "pageable", "inline memory model, pageable", "--"),
)


def _size_label(n: float) -> str:
    n = int(n)
    for unit, s in (("MiB", MiB), ("KiB", KiB)):
        if n >= s:
            return f"{n // s} {unit}"
    return f"{n} B"


def copies_figure(results: dict, directory: str, name: str = "copies.png") -> str:
    """Bandwidth against size, host->device and device->host, for each copy path."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    shared = results.get("shared") or []
    if not shared:
        raise ValueError("the result has no size table to plot")
    fig = _figure_factory()(figsize=(9.6, 4.4), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    sizes = [r["size"] for r in shared]
    for ax, way, title in zip(axes, ("h2d", "d2h"), ("host → device", "device → host")):
        for i, (table, path, label, ls) in enumerate(COPY_PATHS):
            rows = results.get(table) or []
            key = f"{way}_{path}_s"
            pts = [(r["size"], r["size"] / r[key] / 1e9) for r in rows if key in r]
            if pts:
                ax.plot(*zip(*pts), ls=ls, marker="o", ms=3, color=COLOURS[i], label=label)
        ax.plot(sizes, [r["size"] / r["memcpy_s"] / 1e9 for r in shared], color="black",
                ls=":", lw=1.8, label="numpy memcpy (copyto), same size")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _p: f"{y:g}"))
        ax.xaxis.set_major_locator(FixedLocator(sizes))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _p: _size_label(x)))
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("copy size")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("bandwidth (GB/s, log scale)")
    fig.legend(handles=axes[0].get_lines(), fontsize=8, loc="outside lower center", ncols=3)
    fig.suptitle("pvgpu bench copies: bandwidth against copy size (shared memory model "
                 "unless noted)", fontsize=10)
    return _save(fig, directory, name)


# ---------------------------------------------------------------------- demo
def demo_figure(report: dict, directory: str, name: str = "demo.png") -> str:
    """Each guest's compute and copy utilisation per second of a `pvgpu demo --guests N` run.
    `report`: {sched, tenants: [{name, workload, compute, copy}], series: {t_s, compute:
    {name: [U]}, copy: {name: [U]}}}."""
    series = report["series"]
    if not series["t_s"]:
        raise ValueError("the demo recorded no utilisation samples")
    fig = _figure_factory()(figsize=(8.4, 5.0), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(2, 1))
    for i, tn in enumerate(report["tenants"]):
        c = COLOURS[i % len(COLOURS)]
        label = f"{tn['name']} ({tn['workload']}, share {tn['compute']} %)"
        top.plot(series["t_s"], [u * 100 for u in series["compute"][tn["name"]]], color=c,
                 marker="o", ms=3, label=label)
        top.axhline(tn["compute"], color=c, ls="--", lw=0.8)
        bottom.plot(series["t_s"], [u * 100 for u in series["copy"][tn["name"]]], color=c,
                    marker="o", ms=3, label=label)
    top.set_ylabel("compute engine (%)")
    bottom.set_ylabel("busier copy engine (%)")
    bottom.set_xlabel("time since the guests started (s)")
    top.set_ylim(0, 105)
    copy_max = max((u for us in series["copy"].values() for u in us), default=0.0)
    bottom.set_ylim(0, max(20.0, min(105.0, copy_max * 100 * 1.25)))
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"pvgpu demo: {len(report['tenants'])} guests share device 0 under "
                 f"{report['sched']}; utilisation over each second (dashed: compute share)",
                 fontsize=10)
    return _save(fig, directory, name)
