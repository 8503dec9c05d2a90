"""pvgpu/conformance/runner.py and context.py without a host: a check that overruns is
reported and stopped, failures and skips are reported with their reasons, and what a
check started is closed whatever it did."""

import threading

from pvgpu.spec import wire

from pvgpu.conformance import FAIL, PASS, SKIP, Check, Skip, Target, run_case
from pvgpu.conformance.rawpeer import NoAnswer
from pvgpu.conformance.runner import Result, as_json, failure_reason, probe, run, summary


def make(fn, needs=("ctx",), feature=None, name="made_up"):
    return Check(name, ("CTL-PING-1",), fn, "test", needs, False, feature)


def silent_target(tmp_path, timeout=0.5, **kw):
    return Target(f"ipc://{tmp_path}/nobody.sock", timeout=timeout, **kw)


def test_a_check_that_overruns_fails_and_is_stopped(tmp_path):
    """The check spins until its context is cancelled: without the runner's deadline it
    would never end; with it, it FAILs, and what it started is closed."""
    started, stopped = [], threading.Event()

    def spin(ctx):
        started.append(ctx.raw_peer())
        ctx._closers.append(stopped.set)
        while not ctx.cancelled:
            stopped.wait(0.01)
        ctx.raw_peer()  # a cancelled context hands out nothing more

    result = run_case(silent_target(tmp_path), make(spin))
    assert result.status == FAIL and result.reason == "no answer within 0.5 s"
    assert stopped.is_set() and started[0].sock.closed


def test_failures_say_why_and_where(tmp_path):
    def wrong(raw_peer):
        p = raw_peer()
        assert p.recv(0) is None
        assert 1 + 1 == 3, "arithmetic"

    result = run_case(silent_target(tmp_path), make(wrong, ("raw_peer",)))
    assert result.status == FAIL and "arithmetic" in result.reason
    assert "assertion failed at test_conformance_runner.py:" in result.reason
    assert "Traceback" in result.detail
    assert failure_reason(NoAnswer("no answer within 2 s to 'hello'"), 2) == \
        "no answer within 2 s to 'hello'"
    assert failure_reason(TimeoutError("timed out waiting for the device"), 2).startswith(
        "no answer within 2 s (TimeoutError")


def test_a_silent_host_answers_no_request_and_nothing_hangs(tmp_path):
    def ask(raw_peer):
        raw_peer().request({"op": "ping"})

    result = run_case(silent_target(tmp_path), make(ask, ("raw_peer",)))
    # the request's deadline, or the check's (the same: whichever the thread sees first)
    assert result.status == FAIL and result.reason.startswith("no answer within 0.5 s")
    target = silent_target(tmp_path)
    assert probe(target) == "no answer within 0.5 s to 'hello'"
    results = run(target, [make(ask, ("raw_peer",))])
    assert [r.status for r in results] == [FAIL]
    assert results[0].reason.startswith("not run: the host did not answer hello")


def test_skips_name_their_reason(tmp_path):
    target = silent_target(tmp_path, memories=(wire.MEMORY_INLINE,))
    target.features[0] = wire.DEVICE_FEATURES & ~(1 << wire.PVGPU_F_EVENTQ)
    ran = []
    result = run_case(target, make(ran.append, feature=wire.PVGPU_F_EVENTQ))
    assert result.status == SKIP and "EVENTQ" in result.reason and ran == []

    def shared_only(ctx):
        ctx.connect(memory=wire.MEMORY_SHARED)

    result = run_case(target, make(shared_only))
    assert result.status == SKIP and "shared memory model" in result.reason

    def says_so(ctx):
        raise Skip("needs our own host")
    assert run_case(target, make(says_so)).reason == "needs our own host"


def test_json_has_every_result_and_the_counts(tmp_path):
    target = silent_target(tmp_path)
    results = [Result("a", ("CTL-PING-1",), None, PASS, 0.1),
               Result("b", ("CTL-BYE-1", "CTL-RECLAIM-1"), "inline", FAIL, 0.2, "why", "tb"),
               Result("c", ("DEV-FEAT-4",), "shared", SKIP, 0.0, "feature")]
    doc = as_json(target, results, ["CTL-*"])
    assert doc["summary"] == summary(results) == {"passed": 1, "failed": 1, "skipped": 1, "total": 3}
    assert doc["results"][1] == {"check": "b", "clauses": ["CTL-BYE-1", "CTL-RECLAIM-1"],
                                 "memory": "inline", "status": FAIL, "seconds": 0.2,
                                 "reason": "why", "detail": "tb"}
    assert doc["endpoint"] == target.endpoint and doc["clauses"] == ["CTL-*"]
    assert doc["protocol_version"] == list(wire.PROTOCOL_VERSION)
    assert results[1].line() == "FAIL  CTL-BYE-1 CTL-RECLAIM-1  b[inline]  (0.20 s)  -- why"
