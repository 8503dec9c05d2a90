"""pvgpu/trace_latency.py: the steps of synchronous requests, read from a trace file as the
host's recorder writes it, over a session whose timeline the test chooses."""

import json
import threading
from types import SimpleNamespace

import pytest

from pvgpu import trace_latency
from pvgpu.host.hw import packets, regs
from pvgpu.host.kmd.trace import TraceRecorder
from pvgpu.spec import kernels


class _Entity:  # hashable: the context's timelines are keyed by entity
    def __init__(self, ctx):
        self.sched = SimpleNamespace(engine=regs.ENGINE_COMPUTE)
        self.owner = ctx


class _Session:
    """Kicks, jobs and completions of one session on a fake device, at times (µs) given."""

    def __init__(self, rec, dev, sid, name):
        self.rec, self.dev = rec, dev
        self.session = SimpleNamespace(sid=sid, name=name)
        self.ctx = SimpleNamespace(id=1, name="c", vgpu=SimpleNamespace(name="default"),
                                   client=self.session, vm=None, _sys_maps={}, _timeline_of={})
        self.seq = 0

    def kick(self, us):
        self.rec.kick(self.dev, us * 1000, self.session)

    def job(self, submit, start, end):
        self.seq += 1
        job = SimpleNamespace(entity=_Entity(self.ctx), seq=self.seq, arrival_ns=submit * 1000,
                              start_ns=start * 1000, end_ns=end * 1000,
                              payload=packets.launch(kernels.KERNEL_BURN, (1, 1, 1), (1, 1, 1),
                                                     [5]))
        self.rec.job(self.dev, job, SimpleNamespace(seq=self.seq, error=None))

    def done(self, us, command="CTX_SYNC"):
        self.dev.now = us * 1000
        self.rec.request_completed(self.dev, self.session, command, 0)


@pytest.fixture
def recorder():
    dev = SimpleNamespace(index=0, name="emu", lock=threading.RLock(), trace=None, now=0,
                          mm=SimpleNamespace(used=0))
    dev.clock_ns = lambda: dev.now
    rec = TraceRecorder([dev], clock=lambda: 0)
    rec.attach()
    return rec, dev


def _write(rec, tmp_path) -> str:
    path = tmp_path / "t.json"
    rec.write(str(path))
    return str(path)


def test_each_step_of_a_synchronous_request(recorder, tmp_path):
    rec, dev = recorder
    s = _Session(rec, dev, "s1", "sync")
    t = 1000
    for _ in range(5):  # kick, +100 submit, +150 start, +1150 end, +1200 done, +1500 kick
        s.kick(t)
        s.done(t + 20, "LAUNCH_BATCH")  # the launch's own request: not what is waited for
        s.job(t + 100, t + 150, t + 1150)
        s.done(t + 1200)
        t += 1500
    s.kick(t)
    events = json.load(open(_write(rec, tmp_path)))["traceEvents"]
    summary = trace_latency.summarize(events)[(1, "sync")]
    assert summary["jobs"] == 5
    for step, want in {"kick_to_submit": 100, "submit_to_start": 50, "run": 1000,
                       "end_to_done": 50, "done_to_kick": 300, "gap": 500}.items():
        assert summary[step][0] == pytest.approx(want), step


def test_jobs_of_an_asynchronous_stream_are_left_out(recorder, tmp_path):
    rec, dev = recorder
    s = _Session(rec, dev, "s2", "async")
    s.kick(1000)
    for i in range(3):  # three jobs from one kick: they overlap in flight
        s.job(1010 + i, 1100 + 1000 * i, 2100 + 1000 * i)
    s.done(4200)
    s.kick(5000)
    events = json.load(open(_write(rec, tmp_path)))["traceEvents"]
    assert trace_latency.summarize(events) == {}


def test_the_command_line(recorder, tmp_path, capsys):
    rec, dev = recorder
    s = _Session(rec, dev, "s1", "sync")
    s.kick(1000)
    s.job(1100, 1150, 1150)
    s.done(1200)
    s.kick(1500)
    path = _write(rec, tmp_path)
    assert trace_latency.main([path]) == 0
    out = capsys.readouterr().out
    assert "session sync on gpu0 emu: 1 synchronous jobs" in out
    assert "kick received -> job submitted" in out and "100.0" in out
    assert trace_latency.main([path, "--session", "other"]) == 1
    assert "no synchronous jobs" in capsys.readouterr().err
    assert trace_latency.main([str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


# ----------------------------------------------- the guest's own stamps (--guest FILE)
def _guest_log(tmp_path, name, kicks_us, seen_us, base_ns=0) -> str:
    path = tmp_path / "guest.json"
    path.write_text(json.dumps({"producer": "pvgpu guest", "session_name": name,
                                "clock": "monotonic_ns", "dropped": 0,
                                "kicks": [base_ns + round(us * 1000) for us in kicks_us],
                                "waits_done": [base_ns + round(us * 1000) for us in seen_us]}))
    return str(path)


def _synchronous_loop(s, t=1000, n=5):
    """n requests: kick, +100 submit, +150 start, +1150 end, +1200 done, next kick +1500;
    -> the kick times."""
    kicks = []
    for _ in range(n):
        s.kick(t)
        kicks.append(t)
        s.job(t + 100, t + 150, t + 1150)
        s.done(t + 1200)
        t += 1500
    s.kick(t)
    return kicks + [t]


def test_the_guests_stamps_split_completed_to_next_kick(recorder, tmp_path):
    rec, dev = recorder
    s = _Session(rec, dev, "s1", "sync")
    host_kicks = _synchronous_loop(s)
    doc = json.load(open(_write(rec, tmp_path)))
    assert doc["otherData"]["monotonic_ns_at_0"] == 0  # the recorder's clock starts at 0
    # the guest saw each completion 30 µs after it, and sent its next kick 200 µs later,
    # which the host received 70 µs after that (its first kick: 70 µs before the host's)
    seen = [t + 1230 for t in host_kicks[:-1]]
    sent = [t - 70 for t in host_kicks]
    stamps = trace_latency.guest_stamps(json.load(open(_guest_log(tmp_path, "sync", sent, seen))), 0)
    summary = trace_latency.summarize(doc["traceEvents"], {"sync": stamps})[(1, "sync")]
    for step, want in {"done_to_kick": 300, "done_to_seen": 30, "seen_to_kick": 200,
                       "kick_transit": 70}.items():
        assert summary[step][0] == pytest.approx(want), step
    # another session's stamps split nothing of this one
    other = trace_latency.summarize(doc["traceEvents"], {"other": stamps})[(1, "sync")]
    assert "done_to_seen" not in other and other["done_to_kick"][0] == pytest.approx(300)


def test_stamps_that_do_not_fit_the_request_split_nothing(recorder, tmp_path):
    rec, dev = recorder
    s = _Session(rec, dev, "s1", "sync")
    host_kicks = _synchronous_loop(s, n=2)
    doc = json.load(open(_write(rec, tmp_path)))
    # seen only after the host already had the next kick: not this request's
    late = {"session_name": "sync", "kicks": [], "seen": [t + 1600 for t in host_kicks]}
    summary = trace_latency.summarize(doc["traceEvents"], {"sync": late})[(1, "sync")]
    assert "done_to_seen" not in summary and summary["jobs"] == 2


def test_a_guest_log_on_the_traces_clock(tmp_path):
    base = 5_000_000_000
    doc = json.load(open(_guest_log(tmp_path, "g", [20.5, 10], [15], base_ns=base)))
    stamps = trace_latency.guest_stamps(doc, base)
    assert stamps == {"session_name": "g", "kicks": [10.0, 20.5], "seen": [15.0]}
    with pytest.raises(trace_latency.GuestLogError, match="clock"):
        trace_latency.guest_stamps({**doc, "clock": "perf_counter"}, base)
    with pytest.raises(trace_latency.GuestLogError, match="not a guest latency log"):
        trace_latency.guest_stamps({"clock": "monotonic_ns"}, base)


def test_the_command_line_with_a_guest_log(recorder, tmp_path, capsys):
    rec, dev = recorder
    s = _Session(rec, dev, "s1", "sync")
    host_kicks = _synchronous_loop(s, n=2)
    path = _write(rec, tmp_path)
    glog = _guest_log(tmp_path, "sync", [t - 70 for t in host_kicks],
                      [t + 1230 for t in host_kicks[:-1]])
    assert trace_latency.main([path, "--guest", glog]) == 0
    out = capsys.readouterr().out
    assert "the kick's way to the host's I/O loop" in out and "70.0" in out
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert trace_latency.main([path, "--guest", str(bad)]) == 2
    assert "not a guest latency log" in capsys.readouterr().err
    assert trace_latency.main([path, "--guest", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    old = json.load(open(path))  # a trace of a host before the clock base
    del old["otherData"]["monotonic_ns_at_0"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert trace_latency.main([str(tmp_path / "old.json"), "--guest", glog]) == 2
    assert "no clock base" in capsys.readouterr().err
