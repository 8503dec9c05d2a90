"""pvgpu/plots.py: each figure renders a PNG from a small synthetic result (no bench runs),
the sliding-window utilisation, and the one-line error without matplotlib."""

import sys

import pytest

from pvgpu import plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
KiB, MiB = 1 << 10, 1 << 20


def assert_png(path, min_bytes=5_000):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == PNG_MAGIC
    assert min_bytes < len(data) < 100_000  # something drawn, and still small


def sched_run(shares, rates, seconds=4.0, period=0.25):
    """A run as pvgpu.bench.sched.run_shared returns it: vGPU n uses rates[n] of the device."""
    t_s = [period * (i + 1) for i in range(int(seconds / period))]
    util = dict(zip(shares, rates))
    return {"shares": shares, "workloads": {n: "long" for n in shares}, "util": util,
            "jain": 0.9, "mean_abs_error": 0.05,
            "series": {"t_s": t_s, "busy_s": {n: [u * t for t in t_s] for n, u in util.items()}}}


def sched_result():
    unfair = {p: sched_run({"A": 0.5, "B": 0.5}, r) for p, r in
              (("fifo", (0.9, 0.1)), ("credit", (0.85, 0.1)), ("band", (0.55, 0.3)))}
    for r in unfair.values():
        r["workloads"] = {"A": "long", "B": "short"}
    return {"gdev": {"fifo": {"A": 0.863, "B": 0.146}, "credit": {"A": 0.856, "B": 0.146},
                     "band": {"A": 0.510, "B": 0.390}},
            "unfair": unfair, "fair": sched_run({f"v{i}": 0.25 for i in range(1, 5)}, [0.24] * 4)}


def test_sched_figure(tmp_path):
    path = plots.sched_figure(sched_result(), str(tmp_path / "out"))
    assert path == str(tmp_path / "out" / "sched.png")
    assert_png(path)


def test_sched_figure_panels_follow_the_runs():
    result = sched_result()
    titles = [t for t, _run, _g in plots.sched_panels(result)]
    assert [t.split(":")[0] for t in titles] == ["fifo", "credit", "band", "band"]
    assert [g is not None for _t, _r, g in plots.sched_panels(result)] == [True, True, True, False]
    del result["fair"]
    result["unfair"]["credit"].pop("series")  # a run without a series is left out
    assert len(plots.sched_panels(result)) == 2
    with pytest.raises(ValueError):
        plots.sched_figure({"unfair": {}}, "/nonexistent")


def test_windowed_utilisation_from_cumulative_series():
    t = [0.25 * i for i in range(1, 9)]  # 0.25 .. 2.0
    busy = [0.5 * x for x in t[:4]] + [0.5 + 0.9 * (x - 1.0) for x in t[4:]]  # 50 %, then 90 %
    wt, wu = plots.windowed(t, busy, 1.0)
    assert wt == [1.0, 1.25, 1.5, 1.75, 2.0]  # the first full window ends at 1 s
    assert wu[0] == pytest.approx(0.5) and wu[-1] == pytest.approx(0.9)
    assert wu[2] == pytest.approx((0.5 * 0.5 + 0.9 * 0.5) / 1.0)  # half of each
    assert plots.windowed(t, [2 * x for x in t], 0.5)[1] == [1.0] * 7  # clamped to 1
    assert plots.windowed([0.5], [0.1], 1.0) == ([], [])  # shorter than one window


def copies_result():
    rows = []
    for n in (KiB, 64 * KiB, 4 * MiB, 16 * MiB):
        row = {"size": n, "memcpy_s": n / 10e9}
        for way in ("h2d", "d2h"):
            for path, gbs in (("pinned", 8e9), ("pageable", 5e9), ("unpipelined", 3e9)):
                row[f"{way}_{path}_s"] = n / gbs + 50e-6
        rows.append(row)
    return {"shared": rows, "inline": [dict(r) for r in rows if r["size"] >= 64 * KiB]}


def test_copies_figure(tmp_path):
    assert_png(plots.copies_figure(copies_result(), str(tmp_path)))
    with pytest.raises(ValueError):
        plots.copies_figure({"shared": []}, str(tmp_path))


def test_demo_figure(tmp_path):
    report = {"sched": "band",
              "tenants": [{"name": f"g{i}", "workload": w, "compute": 33, "copy": 33}
                          for i, w in enumerate(("long", "short", "copy"), 1)],
              "series": {"t_s": [1.0, 2.0, 3.0, 4.0],
                         "compute": {"g1": [0.3, 0.4, 0.35, 0.3], "g2": [0.2] * 4, "g3": [0.05] * 4},
                         "copy": {"g1": [0.0] * 4, "g2": [0.0] * 4, "g3": [0.6, 0.7, 0.6, 0.65]}}}
    assert_png(plots.demo_figure(report, str(tmp_path), "d.png"))
    report["series"] = {"t_s": [], "compute": {}, "copy": {}}
    with pytest.raises(ValueError):
        plots.demo_figure(report, str(tmp_path))


def test_without_matplotlib_one_line_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails
    with pytest.raises(plots.PlotUnavailable, match=r"install pvgpu\[plot\]") as e:
        plots.require()
    assert "\n" not in str(e.value)
    with pytest.raises(plots.PlotUnavailable):
        plots.copies_figure(copies_result(), "/nonexistent")
