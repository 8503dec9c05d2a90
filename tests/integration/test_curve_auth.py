"""CurveZMQ on tcp endpoints (spec §2.13): a real host with keys, real guests.

Only listed client keys get a session; a wrong key, a wrong server key or no key is
refused during the handshake and raises AuthenticationError at once; what crosses the
wire is ciphertext (recorded by a relay between guest and host); SIGHUP revokes keys.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from pvgpu import guest
from pvgpu.spec import wire
from pvgpu.transport import curve

PATTERN = bytes(range(256)) * 16  # a recognisable 4 KiB


@pytest.fixture
def keys(tmp_path):
    """Host key pair, guest key pairs g1 (authorized) and g2 (not); the authorized dir."""
    d = tmp_path / "keys"
    host = curve.write_keypair(str(d), "host")
    g1 = curve.write_keypair(str(d), "g1")
    g2 = curve.write_keypair(str(d), "g2")
    auth = tmp_path / "authorized"
    auth.mkdir()
    shutil.copy(g1[0], auth / "g1.key")
    return {"host": host, "g1": g1, "g2": g2, "authorized": auth}


@pytest.fixture
def curve_host(host_factory, tmp_endpoint, keys):
    return host_factory([tmp_endpoint, "tcp://127.0.0.1:0"], vram="64M", heartbeat_ms=500,
                        extra_args=["--curve-secret-key", keys["host"][1],
                                    "--authorized-keys", str(keys["authorized"])])


def _tcp(host) -> str:
    return next(ep for ep in host.endpoints if ep.startswith("tcp://"))


def _connect(endpoint, keys, client="g1", server=None, **kw):
    return guest.connect(endpoint, memory="inline", mem_size=8 << 20, heartbeat_ms=500,
                         server_key=server or keys["host"][0], client_key=keys[client][1], **kw)


def _round_trip(conn) -> None:
    """A copy in and out and a launch, checked."""
    with conn.devices[0].create_context() as ctx:
        a = ctx.to_device(np.frombuffer(PATTERN, np.uint8).copy())
        assert a.to_host().tobytes() == PATTERN
        x = ctx.to_device(np.arange(256, dtype=np.float32))
        y = ctx.to_device(np.ones(256, dtype=np.float32))
        out = ctx.empty(256, np.float32)
        ctx.launch("vector_add", grid=1, block=256, args=(x, y, out, 256))
        assert np.array_equal(out.to_host(), np.arange(256, dtype=np.float32) + 1)


def test_a_listed_key_works_end_to_end_and_stats_show_its_fingerprint(curve_host, keys):
    # [CTL-AUTH-1] [CTL-AUTH-5]
    with _connect(_tcp(curve_host), keys) as conn:
        _round_trip(conn)
        session = conn.devices[0].stats()["session"]
        assert session["key"] == curve.read_key_file(keys["g1"][0]).fingerprint
        assert session["id"] == conn.session.session_id


def test_keys_from_the_environment_file_or_z85_text(curve_host, keys, monkeypatch):
    monkeypatch.setenv("PVGPU_SERVER_KEY", curve.read_key_file(keys["host"][0]).public.decode())
    monkeypatch.setenv("PVGPU_CLIENT_KEY", keys["g1"][1])
    with guest.connect(_tcp(curve_host), memory="inline", mem_size=8 << 20) as conn:
        assert conn.devices[0].stats()["session"]["key"] == \
            curve.read_key_file(keys["g1"][0]).fingerprint


def test_a_key_not_listed_is_refused(curve_host, keys):
    # [CTL-AUTH-2] [CTL-AUTH-6]
    with pytest.raises(guest.AuthenticationError, match="not among the host's authorized keys"):
        _connect(_tcp(curve_host), keys, client="g2")


def test_no_key_is_refused_with_a_clear_error(curve_host, keys):
    # [CTL-AUTH-6]
    with pytest.raises(guest.AuthenticationError, match="requires CURVE"):
        guest.connect(_tcp(curve_host), memory="inline", mem_size=8 << 20, heartbeat_ms=500)


def test_a_wrong_server_key_is_refused(curve_host, keys):
    # [CTL-AUTH-6]
    with pytest.raises(guest.AuthenticationError, match="server key"):
        _connect(_tcp(curve_host), keys, server=keys["g2"][0])


def test_ipc_needs_no_key_on_a_curve_host(curve_host):
    with guest.connect(curve_host.endpoints[0], mem_size=8 << 20) as conn:
        assert conn.devices[0].stats()["session"]["key"] is None


def test_the_cli_takes_keys_and_refuses_clearly(curve_host, keys):
    tcp = _tcp(curve_host)
    base = [sys.executable, "-m", "pvgpu", "info", "--connect", tcp, "--memory", "inline",
            "--mem-size", "16M"]
    ok = subprocess.run(base + ["--server-key", keys["host"][0], "--client-key", keys["g1"][1]],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "requires CURVE" in bad.stderr


# ------------------------------------------------------------------ what crosses the wire

class Relay:
    """A loopback TCP relay that forwards bytes both ways and records them."""

    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.captured = bytearray()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                t = threading.Thread(target=self._pump, args=(a, b), daemon=True)
                t.start()
                self._threads.append(t)

    def _pump(self, src, dst):
        try:
            while data := src.recv(65536):
                with self._lock:
                    self.captured += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.listener.close()

    def capture(self) -> bytes:
        with self._lock:
            return bytes(self.captured)


def _captured_session(endpoint_port, connect) -> bytes:
    relay = Relay(endpoint_port)
    try:
        with connect(f"tcp://127.0.0.1:{relay.port}") as conn:
            _round_trip(conn)
        return relay.capture()
    finally:
        relay.close()


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def test_a_capture_of_a_curve_session_holds_no_plaintext(curve_host, keys):
    # [CTL-AUTH-1]
    data = _captured_session(_port(_tcp(curve_host)), lambda ep: _connect(ep, keys))
    assert len(data) > 2 * len(PATTERN)  # the copies crossed the relay
    for plain in (b"hello", b"mem_size", b"set_vring", b"vector_add", PATTERN[:64]):
        assert plain not in data, plain


def test_the_relay_does_see_plaintext_on_an_insecure_host(host_factory, tmp_endpoint):
    """The control for the test above: without CURVE the same session is readable."""
    host = host_factory([tmp_endpoint, "tcp://127.0.0.1:0"], vram="64M")
    data = _captured_session(
        _port(_tcp(host)),
        lambda ep: guest.connect(ep, memory="inline", mem_size=8 << 20, heartbeat_ms=500))
    assert b"hello" in data and b"mem_size" in data and PATTERN[:64] in data


# ------------------------------------------------------------------ revocation, policy

def _await_log(host, text: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = open(host.log_path).read()
        if text in log:
            return log
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in the host log:\n{open(host.log_path).read()}")


def test_sighup_revokes_a_removed_key(curve_host, keys):
    # [CTL-AUTH-4]
    tcp = _tcp(curve_host)
    fp = curve.read_key_file(keys["g1"][0]).fingerprint
    with _connect(tcp, keys) as conn:
        ctx = conn.devices[0].create_context()
        ctx.launch("burn", 1, 1, (wire.BURN_FOREVER,))
        os.unlink(keys["authorized"] / "g1.key")
        curve_host.proc.send_signal(signal.SIGHUP)
        _await_log(curve_host, f"revoked: {fp}")
        with pytest.raises(guest.HostLost):  # its session is closed: not blocked forever
            ctx.synchronize()
    with pytest.raises(guest.AuthenticationError, match="not among the host's authorized"):
        _connect(tcp, keys)
    shutil.copy(keys["g1"][0], keys["authorized"] / "g1.key")  # authorized again
    curve_host.proc.send_signal(signal.SIGHUP)
    _await_log(curve_host, "revoked: none")
    with _connect(tcp, keys) as conn:
        _round_trip(conn)
    assert curve_host.alive()


def test_keyless_tcp_needs_insecure(tmp_path):
    # [CTL-AUTH-3]
    cmd = [sys.executable, "-m", "pvgpu", "host", "--no-default", "--vram", "64M",
           "--listen", "tcp://127.0.0.1:0"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--insecure" in r.stderr and "without authentication" in r.stderr
    r = subprocess.run(cmd + ["--curve-secret-key", str(tmp_path / "missing")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "go together" in r.stderr


def test_insecure_tcp_starts_with_a_warning(host_factory, tmp_endpoint):
    host = host_factory([tmp_endpoint, "tcp://127.0.0.1:0"], vram="64M")  # adds --insecure
    log = _await_log(host, "listening on")
    assert "without authentication or encryption" in log


def test_the_host_refuses_a_world_writable_endpoint_directory_clearly(tmp_path):
    # [CTL-ENDPOINT-2]
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    r = subprocess.run([sys.executable, "-m", "pvgpu", "host", "--no-default", "--vram", "64M",
                        "--listen", f"ipc://{shared}/host.sock"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "lets other users write" in r.stderr
    assert "Traceback" not in r.stderr and list(shared.iterdir()) == []
