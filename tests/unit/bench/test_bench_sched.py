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
    monkeypatch.setattr(sched, "_run_parts", lambda result, parts, policies, seconds, *a:
                        seen.append(seconds) or True)
    for quick, want in ((True, sched.QUICK_SECONDS), (False, sched.SECONDS)):
        assert sched.run_bench(quick=quick, out=lambda *a: None) == 0
        assert seen[-1] == want
    assert sched.run_bench(seconds=7, quick=True, out=lambda *a: None) == 0 and seen[-1] == 7
