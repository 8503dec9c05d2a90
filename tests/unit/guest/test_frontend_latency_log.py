"""guest/frontend/latency_log.py: the guest's stamps of its kicks and ended waits, kept only
when PVGPU_GUEST_TRACE names a file, bounded, and written whole at close; and the session
(guest/frontend/session.py) stamping its kicks and waits into it."""

import json
import time

from pvgpu.guest.frontend.latency_log import ENV, LatencyLog
from pvgpu.guest.frontend.session import FrontendSession


def test_no_log_without_the_variable():
    assert LatencyLog.from_env("g", env={}) is None
    assert LatencyLog.from_env("g", env={ENV: ""}) is None


def test_the_file_is_named_per_session(tmp_path):
    log = LatencyLog.from_env("tenant-a", env={ENV: str(tmp_path / "lat-{name}.json")})
    assert log.path == str(tmp_path / "lat-tenant-a.json")


def test_stamps_are_on_the_monotonic_clock_in_order(tmp_path):
    log = LatencyLog(str(tmp_path / "g.json"), "g")
    before = time.monotonic_ns()
    log.kicked()
    log.wait_done()
    log.kicked()
    after = time.monotonic_ns()
    assert before <= log.kicks[0] <= log.waits_done[0] <= log.kicks[1] <= after
    doc = json.loads(open(log.write()).read())
    assert doc == {"producer": "pvgpu guest", "session_name": "g", "clock": "monotonic_ns",
                   "kicks": log.kicks, "waits_done": log.waits_done, "dropped": 0}
    assert not (tmp_path / "g.json.tmp").exists()


def test_stamps_beyond_the_bound_are_counted_not_kept(tmp_path):
    log = LatencyLog(str(tmp_path / "g.json"), "g", max_stamps=2)
    for _ in range(5):
        log.kicked()
    log.wait_done()
    assert len(log.kicks) == 2 and len(log.waits_done) == 1 and log.dropped == 3


# ------------------------------------------------ the session's kicks and waits, stamped
class _Channel:
    def __init__(self):
        self.sent = []

    def send_encoded(self, parts):
        self.sent.append(parts)


class _DoneDevice:
    deferred = 0
    queue = None

    def reap(self) -> int:
        return 0


def _session(log) -> FrontendSession:
    s = FrontendSession.__new__(FrontendSession)
    s.inline, s.devices, s._kicks, s._wait_ewma = False, [_DoneDevice()], {}, 0.0
    s.channel = _Channel()
    s.latency_log = log
    return s


def test_a_session_stamps_each_kick_and_each_wait_that_ends_done(tmp_path):
    log = LatencyLog(str(tmp_path / "g.json"), "g")
    s = _session(log)
    s.kick(0)
    s.wait_for(lambda: True)
    s.kick(0)
    assert len(s.channel.sent) == 2
    assert len(log.kicks) == 2 and len(log.waits_done) == 1
    assert log.kicks[0] <= log.waits_done[0] <= log.kicks[1]
    s._write_latency_log()
    assert json.loads((tmp_path / "g.json").read_text())["kicks"] == log.kicks


def test_a_session_without_a_log_stamps_nothing():
    s = _session(None)
    s.kick(0)
    s.wait_for(lambda: True)
    s._write_latency_log()  # nothing to write, no error
    assert FrontendSession.latency_log is None


def test_a_log_that_cannot_be_written_does_not_fail_the_close(tmp_path, caplog):
    s = _session(LatencyLog(str(tmp_path / "missing-dir" / "g.json"), "g"))
    s.session_id = "s1"
    s._write_latency_log()
    assert "cannot write the latency log" in caplog.text
