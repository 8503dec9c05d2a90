"""`pvgpu conformance`: the conformance suite as a tool, run as a third party runs it.

Against our own host it passes, in each memory model, over ipc and over tcp, and leaves
nothing behind (each check closes the sessions and peers it opened, passed or failed; the
guest process one check spawns is reaped). Against a fake host -- a ROUTER in this test that answers hello wrongly, or says
nothing after hello -- it reports FAIL with the clause IDs and exits 1, within its
timeouts. `--json` and `--clauses` do what they say.
"""

import fnmatch
import json
import os
import shutil
import subprocess
import sys
import threading

import msgpack
import pytest
import zmq

from pvgpu import guest

from pvgpu.conformance import Check, Target, context, run_case, select
from pvgpu.conformance.rawpeer import RawPeer
from pvgpu.conformance.runner import cases

# The options a host needs to serve keyless tcp: none beyond what HostProcess adds (it
# passes --insecure for a tcp endpoint without CURVE keys, spec CTL-AUTH-3).
KEYLESS_TCP_HOST_ARGS = ()


def conformance(*args, timeout=110):
    """Run `pvgpu conformance ARGS` to completion; -> CompletedProcess (text)."""
    return subprocess.run([sys.executable, "-m", "pvgpu", "conformance", *args],
                          capture_output=True, text=True, timeout=timeout)


def processes_naming(text):
    """PIDs of live processes whose command line contains text."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


@pytest.mark.parametrize("memory", ["shared", "inline"])
@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_our_host_passes_and_nothing_is_left_behind(host_factory, tmp_endpoint, transport,
                                                     memory):
    host = host_factory([tmp_endpoint, "tcp://127.0.0.1:0"], vram="256M", heartbeat_ms=500,
                        extra_args=KEYLESS_TCP_HOST_ARGS)
    endpoint = next(e for e in host.endpoints if e.startswith(transport))
    r = conformance("--endpoint", endpoint, "--memory", memory)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    passed = [ln for ln in lines if ln.startswith("PASS")]
    if memory == "shared":  # our host offers everything: nothing to skip
        assert not [ln for ln in lines if ln.startswith(("FAIL", "SKIP"))], r.stdout
        assert lines[-1].startswith(f"{len(passed)} passed, 0 failed, 0 skipped")
    else:  # only the checks that need the shared model say so
        skips = [ln for ln in lines if ln.startswith("SKIP")]
        assert skips and all(ln.endswith("needs the shared memory model, not selected (--memory)")
                             for ln in skips), r.stdout
        assert lines[-1].startswith(f"{len(passed)} passed, 0 failed, {len(skips)} skipped")
    assert any(f"[{memory}]" in ln for ln in passed)
    assert not any(f"[{other}]" in ln for ln in passed for other in ("shared", "inline")
                   if other != memory)
    # the guest process it spawned was reaped (only the host itself names the endpoint)
    assert set(processes_naming(endpoint)) <= {host.proc.pid}


def test_each_check_closes_what_it_opened_whatever_it_did(shared_host, monkeypatch):
    """Every session and raw peer a check opens is closed when it ends, passed or failed:
    a run of many checks never piles up sessions on the host."""
    opened = []
    connect = guest.connect

    def recording_connect(*args, **kw):
        opened.append(connect(*args, **kw))
        return opened[-1]
    monkeypatch.setattr(guest, "connect", recording_connect)
    peers = []
    monkeypatch.setattr(context, "RawPeer", lambda *a, **kw: peers.append(RawPeer(*a, **kw)) or peers[-1])

    def fails_midway(ctx, raw, two, raw_peer):
        raw_peer().request({"op": "ping"})
        assert raw.context() > 0 and two[0].context() > 0
        raise AssertionError("on purpose")

    target = Target(shared_host.endpoint, timeout=60)
    checks = [Check("fails_midway", ("CTL-PING-1",), fails_midway, "test",
                    ("ctx", "raw", "two", "raw_peer"), True, None),
              *select(["ping_and_bye", "fence_export_between_sessions", "cmd_va_reserve"])]
    results = [run_case(target, c, m) for c, m in cases(checks, ("shared", "inline"))]
    assert [r.status for r in results] == ["FAIL", "FAIL", "PASS", "PASS", "PASS", "PASS"]
    assert "on purpose" in results[0].reason
    assert len(opened) == 2 * 3 + 2 + 2 and len(peers) == 2 + 1
    assert all(conn.session.closed for conn in opened)
    assert all(p.sock.closed for p in peers)


def test_json_and_clauses_select(host_factory, tmp_endpoint):
    host = host_factory([tmp_endpoint], vram="128M")
    r = conformance("--endpoint", host.endpoint, "--clauses", "CTL-HELLO-*", "--json", "-")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)  # the JSON alone on stdout; the lines on stderr
    assert set(doc) == {"tool", "endpoint", "protocol_version", "memory", "timeout_s",
                        "clauses", "results", "summary"}
    assert doc["endpoint"] == host.endpoint and doc["clauses"] == ["CTL-HELLO-*"]
    assert doc["memory"] == ["shared", "inline"]
    results = doc["results"]
    assert results and all(set(x) == {"check", "clauses", "memory", "status", "seconds",
                                      "reason", "detail"} for x in results)
    # only checks of a clause CTL-HELLO-* ran, every one of them
    assert all(any(fnmatch.fnmatchcase(c, "CTL-HELLO-*") for c in x["clauses"]) for x in results)
    assert {"CTL-HELLO-4", "CTL-HELLO-9", "CTL-HELLO-10"} <= {c for x in results for c in x["clauses"]}
    assert {x["status"] for x in results} == {"PASS"}
    assert doc["summary"] == {"passed": len(results), "failed": 0, "skipped": 0,
                              "total": len(results)}
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("PASS")] == \
        [f"PASS  {' '.join(x['clauses'])}  {x['check']}" + (f"[{x['memory']}]" if x["memory"] else "")
         + f"  ({x['seconds']:.2f} s)" for x in results]
    r = conformance("--endpoint", host.endpoint, "--clauses", "NO-SUCH-CLAUSE")
    assert r.returncode == 2 and "no check" in r.stderr


class FakeHost:
    """A ROUTER on a private endpoint in a thread of the test: answer(msg) -> the reply's
    fields, or None to stay silent."""

    def __init__(self, endpoint, answer):
        self.endpoint, self.answer = endpoint, answer
        self.seen = []
        self._stop, self._ready = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _serve(self):
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.linger = 0
        sock.bind(self.endpoint)
        self._ready.set()
        try:
            while not self._stop.is_set():
                if not sock.poll(20):
                    continue
                identity, *frames = sock.recv_multipart()
                try:
                    msg = msgpack.unpackb(frames[0], raw=False)
                except Exception:  # noqa: BLE001 -- a check sends junk on purpose
                    continue
                if not isinstance(msg, dict) or "seq" not in msg:
                    continue
                self.seen.append(msg.get("op"))
                fields = self.answer(msg)
                if fields is not None:
                    reply = dict(fields, op="reply", seq=msg["seq"])
                    sock.send_multipart([identity, msgpack.packb(reply, use_bin_type=True)])
        finally:
            sock.close()
            ctx.term()

    def close(self):
        self._stop.set()
        self._thread.join(10)


@pytest.fixture
def fake_host(tmp_endpoint):
    hosts = []

    def start(answer):
        hosts.append(FakeHost(tmp_endpoint, answer))
        return hosts[-1]
    yield start
    for h in hosts:
        h.close()


def test_a_host_that_answers_hello_wrongly_fails(fake_host):
    def answer(msg):
        if msg.get("op") == "hello":  # no devices, no max_mem_size, whatever was asked
            return {"ok": True, "session": "s", "devices": [], "heartbeat_ms": 1000}
        return {"ok": False, "error": "unknown_op", "message": "no"}

    host = fake_host(answer)
    # (the fake answers every request: no check waits for its timeout)
    r = conformance("--endpoint", host.endpoint, "--clauses", "CTL-HELLO-*", "--timeout", "30")
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    fails = [ln for ln in lines if ln.startswith("FAIL")]
    assert any(ln.startswith("FAIL  CTL-HELLO-10  ctl_hello_10_") for ln in fails), r.stdout
    assert any("CTL-HELLO-4" in ln and "assertion failed" in ln for ln in fails), r.stdout
    assert not [ln for ln in lines if ln.startswith("PASS")], r.stdout
    assert lines[-1].startswith("0 passed, ") and "0 skipped" in lines[-1]
    assert "hello" in host.seen


def test_a_host_silent_after_hello_fails_with_no_answer_and_nothing_hangs(fake_host):
    hellos = []

    def answer(msg):  # answers the tool's first hello only, then says nothing at all
        if msg.get("op") == "hello" and not hellos:
            hellos.append(msg)
            return {"ok": True, "session": "s", "devices": [], "heartbeat_ms": 1000}
        return None

    host = fake_host(answer)
    r = conformance("--endpoint", host.endpoint, "--timeout", "1", "--json", "-",
                    "--clauses", "CTL-HELLO-10,DEV-FEAT-4,CMD-CTX-CREATE-1", timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert [(x["check"], x["memory"]) for x in doc["results"]] == [
        ("ctl_hello_10_the_first_error_in_the_spec_order_wins", None),
        ("cmd_ctx_create_1_flags_beyond_a_priority_are_invalid", "shared"),
        ("cmd_ctx_create_1_flags_beyond_a_priority_are_invalid", "inline"),
        ("cmd_launch_code_needs_compute", None)]
    for x in doc["results"]:  # (or "not run": if even the probe's hello took longer)
        assert x["status"] == "FAIL" and "no answer within 1 s" in x["reason"], x


def test_nothing_at_the_endpoint_fails_every_check_without_running_it(tmp_endpoint):
    r = conformance("--endpoint", tmp_endpoint, "--timeout", "1", "--clauses", "CTL-PING-1,VQ-*",
                    timeout=60)
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert len(lines) > 10 and lines[-1].startswith(f"0 passed, {len(lines) - 1} failed")
    assert all("not run: the host did not answer hello (no answer within 1 s" in ln
               for ln in lines[:-1])


def test_the_tool_authenticates_with_curve_keys(host_factory, tmp_endpoint, tmp_path):
    """Against a host that requires CURVE on tcp (spec §2.13), the tool's raw peers and
    sessions use the keys it is given; without them its probe gets no answer."""
    from pvgpu.transport import curve
    host_pub, host_secret = curve.write_keypair(str(tmp_path / "k"), "host")
    guest_pub, guest_secret = curve.write_keypair(str(tmp_path / "k"), "guest")
    auth = tmp_path / "authorized"
    auth.mkdir()
    shutil.copy(guest_pub, auth / "guest.key")
    host = host_factory([tmp_endpoint, "tcp://127.0.0.1:0"], vram="64M",
                        extra_args=["--curve-secret-key", host_secret, "--authorized-keys", str(auth)])
    tcp = next(ep for ep in host.endpoints if ep.startswith("tcp://"))
    args = ["--endpoint", tcp, "--memory", "inline", "--clauses", "CTL-HELLO-*"]
    r = conformance(*args, "--server-key", host_pub, "--client-key", guest_secret)
    assert r.returncode == 0 and "FAIL" not in r.stdout and " 0 failed" in r.stdout, r.stdout + r.stderr
    r = conformance(*args, "--timeout", "2")
    assert r.returncode == 1 and "FAIL" in r.stdout, r.stdout + r.stderr
