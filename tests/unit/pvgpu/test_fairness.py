"""pvgpu/fairness.py: Jain's index, mean error, utilisation from two GET_STATS snapshots."""

import pytest

from pvgpu import fairness


def snap(now_ns, busy, contexts=None, copy=None):
    """A GET_STATS-shaped snapshot: busy = {vgpu: compute busy_ns}, copy = {vgpu: (c0, c1)}."""
    vgpus = {}
    for name, b in busy.items():
        c0, c1 = (copy or {}).get(name, (0, 0))
        vgpus[name] = {"shares": {"compute": 50, "copy": 50, "mem": 100},
                       "contexts": (contexts or {}).get(name, 1),
                       "compute": {"busy_ns": b, "utilisation": 0.0, "jobs": 0, "credit_us": 0},
                       "copy0": {"busy_ns": c0}, "copy1": {"busy_ns": c1}}
    return {"device": 0, "policy": "band", "now_ns": now_ns, "engines": {}, "vgpus": vgpus}


def test_jain_bounds():
    assert fairness.jain([1, 1, 1, 1]) == pytest.approx(1.0)
    assert fairness.jain([1, 0, 0, 0]) == pytest.approx(0.25)  # 1/n: one takes everything
    assert fairness.jain([0, 0]) == 1.0
    assert fairness.jain([3.0]) == 1.0
    with pytest.raises(ValueError):
        fairness.jain([])
    with pytest.raises(ValueError):
        fairness.jain([1, -1])


def test_jain_reproduces_gdevs_published_figures():
    half = {"long": 0.5, "short": 0.5}
    # Gdev (ATC 2012), Figure 12's means: FIFO 14.6/86.3 -> 0.66, Credit 14.6/85.6 -> 0.67, BAND 39/51 -> 0.98
    for short, long_, j in ((0.146, 0.863, 0.66), (0.146, 0.856, 0.67), (0.390, 0.510, 0.98)):
        assert fairness.jain_over_shares({"short": short, "long": long_}, half) == pytest.approx(j, abs=0.005)


def test_jain_is_over_used_by_share():
    # 60/30 against shares 0.6/0.3 is perfectly fair; 45/45 against the same shares is not
    shares = {"a": 0.6, "b": 0.3}
    assert fairness.jain_over_shares({"a": 0.6, "b": 0.3}, shares) == pytest.approx(1.0)
    assert fairness.jain_over_shares({"a": 0.45, "b": 0.45}, shares) < 0.95
    assert fairness.normalised({"a": 0.3}, shares) == {"a": 0.5, "b": 0.0}  # missing: unused


def test_mean_abs_error():
    shares = {"a": 0.5, "b": 0.5}
    assert fairness.mean_abs_error({"a": 0.863, "b": 0.146}, shares) == pytest.approx((0.363 + 0.354) / 2)
    assert fairness.mean_abs_error({"a": 0.5, "b": 0.5}, shares) == 0.0
    assert fairness.mean_abs_error({}, shares) == 0.5
    with pytest.raises(ValueError):
        fairness.mean_abs_error({}, {})


def test_utilisation_from_two_snapshots():
    a = snap(1_000_000_000, {"g1": 100_000_000, "g2": 0})
    b = snap(3_000_000_000, {"g1": 1_100_000_000, "g2": 500_000_000})
    assert fairness.utilisation(a, b, ["g1", "g2"]) == {"g1": pytest.approx(0.5), "g2": pytest.approx(0.25)}
    assert fairness.utilisation(a, b, ["nobody"]) == {"nobody": 0.0}


def test_utilisation_clamps_jobs_charged_at_completion():
    # a 20 ms job that started before the window is charged inside it
    a = snap(0, {"g1": 0})
    b = snap(10_000_000, {"g1": 20_000_000})
    assert fairness.utilisation(a, b, ["g1"]) == {"g1": 1.0}


def test_utilisation_rejects_snapshots_out_of_order():
    a = snap(5, {"g1": 0})
    with pytest.raises(ValueError):
        fairness.utilisation(a, a, ["g1"])
    with pytest.raises(ValueError):
        fairness.utilisation(a, snap(4, {"g1": 0}), ["g1"])


def test_busy_falls_back_to_the_engine_table():
    s = {"now_ns": 0, "vgpus": {}, "engines": {"compute": {"vgpus": {"g1": {"busy_ns": 42}}}}}
    assert fairness.busy_ns(s, "g1") == 42
    assert fairness.busy_ns(s, "g1", "copy0") == 0


def test_copy_utilisation_is_the_busier_copy_engine():
    a = snap(0, {"g1": 0}, copy={"g1": (0, 0)})
    b = snap(1_000_000_000, {"g1": 0}, copy={"g1": (200_000_000, 300_000_000)})
    assert fairness.copy_utilisation(a, b, ["g1"]) == {"g1": pytest.approx(0.3)}


def test_all_active_needs_a_context_in_every_vgpu():
    s = snap(0, {"g1": 0, "g2": 0}, contexts={"g1": 1, "g2": 0})
    assert fairness.all_active(s, ["g1"]) and not fairness.all_active(s, ["g1", "g2"])
    assert not fairness.all_active(s, ["g3"])


def test_summarise():
    shares = {"a": 0.5, "b": 0.5}
    out = fairness.summarise({"a": 0.5, "b": 0.5}, shares)
    assert out == {"jain": 1.0, "mean_abs_error": 0.0, "mean_abs_error_samples": None}
    out = fairness.summarise({"a": 0.5, "b": 0.5}, shares,
                             [{"a": 0.6, "b": 0.4}, {"a": 0.4, "b": 0.6}])
    assert out["mean_abs_error_samples"] == pytest.approx(0.1)  # over time, not only the means


def test_turnaround_is_read_from_the_engines_scheduler():
    s = snap(1, {"a": 0, "b": 0})
    s["engines"] = {"compute": {"vgpus": {"a": {"turnaround_us": 420},
                                          "b": {"turnaround_us": None}}}}  # not measured yet
    assert fairness.turnaround_us(s, "a") == 420
    assert fairness.turnaround_us(s, "b") is None
    assert fairness.turnaround_us(s, "c") is None
    assert fairness.turnaround_us(s, "a", "copy0") is None
