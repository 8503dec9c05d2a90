"""pvgpu/demo.py and the tenant/demo/bench command lines: the pure parts (the processes run
in tests/integration/test_demo_sched.py)."""

import pytest

from pvgpu import demo
from pvgpu.cli import TENANT_WORKLOADS, build_parser
from pvgpu.tenant import WORKLOADS


def test_parse_shares_equal_by_default():
    assert demo.parse_shares(None, None) == [25] * 4
    assert demo.parse_shares(None, 3) == [33] * 3
    assert demo.parse_shares(None, 8) == [12] * 8
    for bad in (0, 9):
        with pytest.raises(ValueError):
            demo.parse_shares(None, bad)


def test_parse_shares_given():
    assert demo.parse_shares("50,30,20", None) == [50, 30, 20]
    assert demo.parse_shares("50%, 50%", 2) == [50, 50]
    for text, guests in (("50,30,20", 2), ("60,60", None), ("0,50", None), ("a,b", None),
                         (",".join(["10"] * 9), None)):
        with pytest.raises(ValueError):
            demo.parse_shares(text, guests)


def test_plan_cycles_workloads_with_equal_copy_and_memory_shares():
    p = demo.plan([40, 20, 20, 10, 10])
    assert [(n, w) for n, w, _s in p] == [("g1", "long"), ("g2", "short"), ("g3", "copy"),
                                          ("g4", "mixed"), ("g5", "long")]
    assert p[0][2] == {"compute": 40, "copy": 20, "mem": 20}
    assert demo.vgpu_arg("g1", p[0][2]) == "g1:compute=40,copy=20,mem=20"


def test_vgpu_arg_is_what_the_host_parses():
    from pvgpu.host.config import parse_vgpu
    v = parse_vgpu(demo.vgpu_arg("g2", {"compute": 33, "copy": 33, "mem": 33}))
    assert (v.name, v.compute, v.copy, v.mem) == ("g2", 33, 33, 33)


def test_tenant_args_parse_as_a_tenant_command():
    a = build_parser().parse_args(demo.tenant_args("ipc:///tmp/x", "g3", "copy", 2.5, seed=7))
    assert (a.command, a.workload, a.seconds, a.vgpu, a.device, a.seed, a.json) == \
        ("tenant", "copy", 2.5, "g3", 0, 7, True)
    assert a.connect == "ipc:///tmp/x" and a.mem_size == 64 << 20 and a.name == "tenant-g3"


def test_parse_tenant_output_takes_the_last_json_line():
    assert demo.parse_tenant_output('noise\n{"verified": true}\n') == {"verified": True}
    assert demo.parse_tenant_output('{"a": 1}\n{broken\n') == {"a": 1}
    assert demo.parse_tenant_output("Traceback ...") is None


def test_cli_workloads_match_the_tenant_module():
    assert TENANT_WORKLOADS == WORKLOADS


def test_demo_and_bench_options():
    a = build_parser().parse_args(["demo"])
    assert a.guests is None and a.sched is None and a.shares is None  # the two-guest demo
    a = build_parser().parse_args(["demo", "--guests", "3", "--sched", "band", "--seconds", "3"])
    assert (a.guests, a.sched, a.seconds) == (3, "band", 3.0)
    a = build_parser().parse_args(["bench"])
    assert a.which == "hotpaths" and not a.quick
    a = build_parser().parse_args(["bench", "sched", "--seconds", "3", "--policies", "fifo,band",
                                   "--json", "x.json"])
    assert (a.which, a.seconds, a.policies, a.json) == ("sched", 3.0, "fifo,band", "x.json")


class _FakeArray:
    def __init__(self, data):
        self.data = data

    def to_host(self, out=None):
        return self.data.copy()

    def free(self):
        pass


class _FakeContext:
    """Just enough of guest.Context for the long/short workloads and their final check."""

    def __init__(self, stop_after=None):
        self.launches = []
        self.stop_after = stop_after

    def to_device(self, x):
        return _FakeArray(x.copy())

    def empty(self, n, dtype):
        import numpy as np
        return _FakeArray(np.zeros(n, dtype))

    def launch(self, kernel, grid, block, args):
        self.launches.append((kernel, args))
        if kernel == "scale":
            dy, dx, alpha, _n = args
            dy.data[:] = dx.data * alpha

    def synchronize(self):
        pass


@pytest.mark.parametrize("workload", ["long", "short"])
def test_tenant_stops_when_told_and_still_verifies(workload):
    from pvgpu import tenant
    ctx = _FakeContext()
    r = tenant.run(ctx, workload, seconds=60, stop=lambda: len(ctx.launches) >= 3)
    assert r["kernels"] == 3 and r["verified"] and r["stopped"]
    assert [k for k, _a in ctx.launches] == ["burn"] * 3 + ["scale"]
    us = tenant.LONG_US if workload == "long" else tenant.SHORT_US
    assert all(a == (us,) for k, a in ctx.launches if k == "burn")


def test_tenant_rejects_unknown_workloads():
    from pvgpu import tenant
    with pytest.raises(ValueError):
        tenant.run(_FakeContext(), "bogus", 1)


def test_monitor_keeps_each_seconds_utilisation_for_the_plot(monkeypatch):
    import types
    clock = types.SimpleNamespace(now=50.0)
    monkeypatch.setattr(demo, "time", types.SimpleNamespace(
        monotonic=lambda: clock.now, sleep=lambda s: setattr(clock, "now", clock.now + s)))

    class Dev:  # g1 uses 60 % of the compute engine, g2 30 % of copy0
        def stats(self):
            ns = int((clock.now - 50.0) * 1e9)
            return {"now_ns": ns, "vgpus": {
                "g1": {"contexts": 1, "compute": {"busy_ns": int(0.6 * ns)}},
                "g2": {"contexts": 1, "copy0": {"busy_ns": int(0.3 * ns)}}}}

    class Proc:  # a tenant that runs for 3 s
        def poll(self):
            return None if clock.now < 53.0 else 0

    tenants = demo.plan([50, 50])
    lines = []
    report = demo._monitor(Dev(), tenants, [Proc(), Proc()], 3.0, lines.append)
    s = report["series"]
    assert s["t_s"] == pytest.approx([1.0, 2.0, 3.0])
    assert s["compute"]["g1"] == pytest.approx([0.6] * 3) and s["compute"]["g2"] == [0.0] * 3
    assert s["copy"]["g2"] == pytest.approx([0.3] * 3)
    figure = demo.plot_report("band", tenants, report)
    assert figure["sched"] == "band" and figure["series"] is s
    assert [t["name"] for t in figure["tenants"]] == ["g1", "g2"]
    assert figure["tenants"][0] == {"name": "g1", "workload": "long", "compute": 50, "copy": 50}
