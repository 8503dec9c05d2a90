"""What a guest application sees when connecting fails or a connection is misused: an
exception of the pvgpu hierarchy whose message says what to do."""

import logging
import subprocess
import sys

import numpy as np
import pytest

from pvgpu import guest
from pvgpu.transport.channel import GuestChannel


def test_no_host_at_an_ipc_endpoint_fails_at_once(tmp_path, monkeypatch):
    """No socket file: HostNotFound before any request is sent (no wait for a reply)."""
    def request(*a, **k):
        raise AssertionError("a request was sent to an endpoint without a host")
    monkeypatch.setattr(GuestChannel, "request", request)
    endpoint = f"ipc://{tmp_path}/absent.sock"
    with pytest.raises(guest.HostNotFound) as e:
        guest.connect(endpoint)
    assert str(e.value) == f"no host at {endpoint}; start one with `pvgpu host`"
    assert isinstance(e.value, guest.HostLost) and isinstance(e.value, guest.PvgpuError)


def test_a_closed_connection_says_so(shared_host):
    for memory in ("shared", "inline"):
        conn = guest.connect(shared_host.endpoint, memory=memory, mem_size=8 << 20)
        dev = conn.devices[0]
        ctx = dev.create_context()
        a = ctx.to_device(np.arange(16, dtype=np.float32))
        conn.close()
        for call in (a.to_host, lambda: ctx.to_device(np.zeros(4, np.float32)), ctx.synchronize,
                     dev.info, dev.create_context, lambda: conn.pinned_empty(4)):
            with pytest.raises(guest.ConnectionClosedError, match="connection is closed"):
                call()


def test_values_out_of_range_are_pvgpu_errors(shared_host):
    with guest.connect(shared_host.endpoint, mem_size=8 << 20) as conn:
        with conn.devices[0].create_context() as ctx:
            x = ctx.zeros(16, np.float32)
            with pytest.raises(guest.OutOfRangeError, match="alpha"):
                ctx.launch("saxpy", grid=1, block=32, args=(1e40, x, x, 16))
            ints = ctx.zeros(4, np.int8)
            with pytest.raises(guest.OutOfRangeError) as e:
                ints.copy_from_host([1, 2, 3, 1000])
            assert isinstance(e.value, OverflowError)


def test_the_session_logs_to_pvgpu_guest(host_factory, tmp_endpoint, caplog):
    """Start and end at INFO, a lost host at WARNING, on the `pvgpu.guest` logger."""
    host = host_factory([tmp_endpoint], vram="64M")
    caplog.set_level(logging.INFO, logger="pvgpu")
    conn = guest.connect(tmp_endpoint, mem_size=8 << 20)
    sid = conn.session.session_id
    ctx = conn.devices[0].create_context()
    host.kill()
    with pytest.raises(guest.HostLost):
        while True:  # until the guest notices (the connection's close, or silence)
            ctx.synchronize()
    conn.close()
    records = [(r.name, r.levelno, r.getMessage()) for r in caplog.records
               if r.name.startswith("pvgpu")]
    assert [(name, level) for name, level, _ in records] == [
        ("pvgpu.guest", logging.INFO), ("pvgpu.guest", logging.WARNING),
        ("pvgpu.guest", logging.INFO)], records
    assert records[0][2].startswith(f"session {sid} with {tmp_endpoint}: shared memory")
    assert records[1][2].startswith(f"session {sid}: host at {tmp_endpoint}")
    assert records[2][2] == f"session {sid} with {tmp_endpoint} closed (the host was lost)"


def test_importing_logs_nothing_and_installs_no_handler():
    code = ("import logging, pvgpu.guest as guest, pvgpu.transport.channel, pvgpu.cli\n"
            "named = [n for n in logging.root.manager.loggerDict if n.split('.')[0] in "
            "('pvgpu', 'guest', 'transport')]\n"
            "handlers = [h for n in named for h in getattr(logging.getLogger(n), 'handlers', [])]\n"
            "print(len(logging.root.handlers), len(handlers))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (r.stdout, r.stderr) == ("0 0\n", "")
