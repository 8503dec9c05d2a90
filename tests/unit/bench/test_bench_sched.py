"""bench/sched.py without processes: the utilisation series and progress lines of a run
(a fake device on a clock the test advances) and the host started ahead of each run."""

import types

import pytest

from pvgpu.bench import sched


class Clock:
    """time.monotonic / time.sleep for the code under test: sleeping advances it."""

    def __init__(self):
        self.now = 100.0

    def monotonic(self):
        return self.now

    def sleep(self, s):
        self.now += s


class FakeDevice:
    """GET_STATS of a device on which vGPU n uses rates[n] of the compute engine."""

    def __init__(self, clock, rates):
        self.clock, self.rates, self.t0 = clock, rates, clock.now

    def stats(self):
        ns = int((self.clock.now - self.t0) * 1e9)
        return {"now_ns": ns, "vgpus": {n: {"contexts": 1, "compute": {"busy_ns": int(r * ns)}}
                                         for n, r in self.rates.items()}}


def test_measure_samples_a_cumulative_series_and_prints_progress(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(sched, "time", types.SimpleNamespace(monotonic=clock.monotonic,
                                                             sleep=clock.sleep))
    dev = FakeDevice(clock, {"A": 0.75, "B": 0.25})
    clock.sleep(0.5)
    lines = []
    samples, series = sched._measure(dev, dev.stats(), ["A", "B"], 3.0, lines.append)
    n = round(3.0 / sched.SERIES_PERIOD_S)
    assert series["t_s"] == pytest.approx([sched.SERIES_PERIOD_S * (i + 1) for i in range(n)])
    for name, rate in (("A", 0.75), ("B", 0.25)):  # device time used since the start
        assert series["busy_s"][name] == pytest.approx([rate * t for t in series["t_s"]], abs=1e-8)
    assert len(samples) == 3 and all(s["A"] == pytest.approx(0.75) for s in samples)  # 1 s each
    assert len(lines) == int(3.0 / sched.PROGRESS_S) and "A 75.0%" in lines[0] and "of 3s" in lines[0]


class FakeHost:
    started, stopped = [], []

    def __init__(self, key):
        self.key = key
        FakeHost.started.append(key)

    def stop(self):
        FakeHost.stopped.append(self.key)
        return 0


def test_a_prefetched_host_is_handed_over_once_and_an_unused_one_stopped(monkeypatch):
    monkeypatch.setattr(sched, "SchedHost", FakeHost)
    FakeHost.started, FakeHost.stopped = [], []
    hosts = sched.HostPrefetch()
    hosts.prefetch("k1")
    h = hosts.take("k1")
    assert h.key == "k1" and FakeHost.started == ["k1"]  # not started twice
    assert hosts.take("k1").key == "k1" and FakeHost.started == ["k1", "k1"]  # taken: a new one
    hosts.prefetch("k2")
    assert hosts.take("k3").key == "k3"  # another key: k2 is stopped, k3 started
    assert FakeHost.stopped == ["k2"]
    hosts.prefetch("k4")
    hosts.close()
    assert FakeHost.stopped == ["k2", "k4"]


def test_a_prefetched_host_that_failed_raises_on_take(monkeypatch):
    def fail(key):
        raise RuntimeError(f"host exited with 2 before it was ready ({key})")
    monkeypatch.setattr(sched, "SchedHost", fail)
    hosts = sched.HostPrefetch()
    hosts.prefetch("k")
    with pytest.raises(RuntimeError, match="before it was ready"):
        hosts.take("k")
    hosts.close()  # nothing left to stop


def test_quick_measures_seconds_not_twenty(monkeypatch):
    seen = []
    monkeypatch.setattr(sched, "_run_parts", lambda result, runs, *a: seen.append(runs) or True)
    for quick, want in ((True, sched.QUICK_SECONDS), (False, sched.SECONDS)):
        assert sched.run_bench(quick=quick, out=lambda *a: None) == 0
        assert {r.seconds for r in seen[-1] if r.part != "alone"} == {want}
    assert sched.run_bench(seconds=7, quick=True, out=lambda *a: None) == 0
    assert {r.seconds for r in seen[-1] if r.part != "alone"} == {7}


def test_the_quick_plan_fits_its_budget():
    # what `bench sched --quick` waits for whatever the machine: warm-ups and measurements
    # (the rest is processes starting); a longer plan would not fit 30 s on a loaded machine
    runs = sched.plan(quick=True)
    assert [r.part for r in runs] == ["alone"] * 2 + ["unfair"] * 3 + ["fair"]
    assert [r.policy for r in runs if r.part == "unfair"] == ["fifo", "credit", "band"]
    assert sched.scheduled_seconds(runs) <= 9.0
    assert sched.scheduled_seconds(sched.plan()) == 2 * (5 + 1) + 4 * (20 + 1)  # the full run


def test_the_plan_runs_only_the_parts_and_policies_asked_for():
    runs = sched.plan(["unfair"], ["fifo", "band"], seconds=3, quick=True, host_args=["-x"])
    assert [(r.policy, r.seconds, r.host_args) for r in runs] == [("fifo", 3, ("-x",)),
                                                                ("band", 3, ("-x",))]
    assert dict(runs[0].tenant_extra) == {"B": ("--kernel-us", "1000")}
    assert sched.plan(["overlap"]) == []  # overlap measures repetitions, not seconds


def test_a_short_run_still_prints_progress(monkeypatch):
    # a quick run measures less than PROGRESS_S: a line halfway and one at the end
    clock = Clock()
    monkeypatch.setattr(sched, "time", types.SimpleNamespace(monotonic=clock.monotonic,
                                                             sleep=clock.sleep))
    dev = FakeDevice(clock, {"A": 0.5})
    lines = []
    sched._measure(dev, dev.stats(), ["A"], 1.0, lines.append)
    assert len(lines) == 2 and "0.5s of 1s  A 50.0%" in lines[0] and "1.0s of 1s" in lines[1]


def test_the_gap_bound_is_a_at_its_share_and_b_at_its_share_of_what_it_uses_alone():
    """B alone uses 65 % of the device: the fairest split leaves A at 50 % and B at
    32.5 %, Jain 0.958 and 8.75 pp; a B that can use the whole device reaches 1.0 and 0."""
    b = sched.gap_bound(0.65)
    assert b["jain"] == pytest.approx(1.65 ** 2 / (2 * (1 + 0.65 ** 2)))
    assert b["mean_abs_error"] == pytest.approx(0.0875)
    assert sched.gap_bound(1.0) == {"jain": pytest.approx(1.0), "mean_abs_error": pytest.approx(0.0)}
    assert sched.gap_bound(1.2) == sched.gap_bound(1.0)  # (a sampling overshoot)


def test_print_unfair_states_the_gap_bound_beside_the_runs():
    run = {"util": {"A": 0.501, "B": 0.32}, "jain": 0.954, "mean_abs_error": 0.091,
           "mean_abs_error_samples": 0.09, "turnaround_us": {"B": 900},
           "copy_util": {"A": 0.0, "B": 0.0}, "verified": True}
    lines = []
    sched.print_unfair({"band": run}, {"B": {"util": {"B": 0.652}}}, lines.append)
    text = "\n".join(lines)
    assert "B's hold (turnaround)" in text and "900 µs" in text
    assert "the best any policy can do here is Jain 0.958, 8.7 pp" in text
