"""transport/admin.py: the admin endpoint's directory, naming rule, request handling and client."""

from __future__ import annotations

import os
import socket
import stat

import msgpack
import pytest

from pvgpu.spec import wire
from pvgpu.transport.admin import (AdminClient, AdminError, AdminRequestError, AdminServer,
                             admin_endpoint_for, default_admin_endpoint)
from pvgpu.transport.channel import ChannelError


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def server(tmp_path):
    handlers = {"echo": lambda req: {"echo": req.get("x")}}
    s = AdminServer(f"ipc://{tmp_path}/h.sock.admin/admin.sock", handlers)
    try:
        yield s
    finally:
        s.close()


def test_ctl_admin_2_the_admin_endpoint_is_beside_the_first_ipc_endpoint():
    # [CTL-ADMIN-2]
    assert admin_endpoint_for("ipc:///run/user/7/pvgpu.sock") == \
        "ipc:///run/user/7/pvgpu.sock.admin/admin.sock"
    assert wire.ADMIN_DIR_SUFFIX == ".admin" and wire.ADMIN_ENDPOINT_NAME == "admin.sock"
    with pytest.raises(ValueError, match="not an ipc"):
        admin_endpoint_for("tcp://127.0.0.1:5555")
    assert default_admin_endpoint(["tcp://0.0.0.0:1", "ipc:///a/b.sock", "ipc:///c/d.sock"]) == \
        "ipc:///a/b.sock.admin/admin.sock"  # the first ipc endpoint
    assert default_admin_endpoint(["tcp://0.0.0.0:1"]) is None  # tcp only: none unless named


def test_ctl_admin_1_a_missing_admin_directory_is_made_0700(server, tmp_path):
    # [CTL-ADMIN-1]
    d = tmp_path / "h.sock.admin"
    assert _mode(d) == 0o700 and stat.S_ISSOCK(os.lstat(d / "admin.sock").st_mode)
    server.close()
    assert not (d / "admin.sock").exists()  # close() removes its socket file


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o711, 0o701])
def test_ctl_admin_1_a_directory_others_may_enter_is_refused(tmp_path, mode):
    # [CTL-ADMIN-1]: stricter than a guest endpoint's directory: no access at all
    d = tmp_path / "adm"
    d.mkdir()
    d.chmod(mode)
    with pytest.raises(ChannelError, match="refusing the admin directory"):
        AdminServer(f"ipc://{d}/admin.sock", {})
    assert list(d.iterdir()) == [] and _mode(d) == mode


def test_ctl_admin_1_the_endpoint_directory_checks_apply(tmp_path):
    # [CTL-ADMIN-1] a symlink is refused as [CTL-ENDPOINT-2] refuses it
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(ChannelError, match="not a directory"):
        AdminServer(f"ipc://{tmp_path}/link/admin.sock", {})


def test_ctl_admin_1_only_ipc(tmp_path):
    # [CTL-ADMIN-1]
    with pytest.raises(ChannelError, match="must be ipc"):
        AdminServer("tcp://127.0.0.1:0", {})


def _handle(server, frame) -> dict:
    return server.handle([frame])


@pytest.mark.parametrize("frame, seq", [
    (b"\xc1", None),  # not msgpack
    (msgpack.packb([1, 2]), None),  # not a map
    (msgpack.packb({"op": "echo"}), None),  # no seq
    (msgpack.packb({"op": "echo", "seq": True}), None),  # a bool is not an int seq
    (msgpack.packb({"op": 7, "seq": 3}), 3),  # op not a str
    (b"\x80" + b"\0" * wire.MAX_ADMIN_REQUEST_SIZE, None),  # too large
])
def test_ctl_admin_3_a_malformed_request_gets_an_error_reply(server, frame, seq):
    # [CTL-ADMIN-3]
    r = _handle(server, frame)
    assert r["op"] == wire.OP_REPLY and r["ok"] is False and r["seq"] == seq
    assert r["error"] == wire.ADMIN_ERR_MALFORMED and r["message"]


def test_ctl_admin_3_unknown_ops_and_failing_handlers(server):
    # [CTL-ADMIN-3]
    r = _handle(server, msgpack.packb({"op": "nope", "seq": 1}))
    assert (r["ok"], r["error"], r["seq"]) == (False, wire.ADMIN_ERR_UNKNOWN_OP, 1)
    assert "echo" in r["message"]  # the known ops are named

    def refuse(_req):
        raise AdminRequestError("not now")

    def crash(_req):
        raise KeyError("bug")
    server.handlers.update(refuse=refuse, crash=crash)  # the registry may grow while serving
    r = _handle(server, msgpack.packb({"op": "refuse", "seq": 2}))
    assert (r["ok"], r["error"], r["message"]) == (False, wire.ADMIN_ERR_FAILED, "not now")
    r = _handle(server, msgpack.packb({"op": "crash", "seq": 3}))
    assert (r["ok"], r["error"]) == (False, wire.ADMIN_ERR_FAILED)
    assert "internal error" in r["message"]
    r = _handle(server, msgpack.packb({"op": "echo", "seq": 4, "x": [1, "a"]}))
    assert r == {"op": wire.OP_REPLY, "seq": 4, "ok": True, "echo": [1, "a"]}
    assert _handle(server, b"")["error"] == wire.ADMIN_ERR_MALFORMED
    assert server.handle([])["error"] == wire.ADMIN_ERR_MALFORMED  # no frame at all


def test_ctl_admin_3_over_the_socket_the_thread_survives_bad_requests(server):
    # [CTL-ADMIN-3]: a raw client sends garbage, a failing op, two frames; then a good one
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    try:
        s.connect(server.endpoint)
        s.send(b"\xc1")
        s.send_multipart([msgpack.packb({"op": "echo", "seq": 1}), b"extra"])
        s.send(msgpack.packb({"op": "echo", "seq": 2, "x": 5}))
        replies = []
        while len(replies) < 3:
            assert s.poll(10_000), "the admin thread stopped answering"
            replies.append(msgpack.unpackb(s.recv(), raw=False))
        assert [(r["ok"], r["seq"]) for r in replies] == [(False, None), (False, 1), (True, 2)]
        assert replies[2]["echo"] == 5
    finally:
        s.close()
        ctx.term()
    with AdminClient(server.endpoint) as c:
        assert c.request("echo", x="y") == {"echo": "y"}
        with pytest.raises(AdminError, match="unknown_op") as e:
            c.request("nope")
        assert e.value.error == wire.ADMIN_ERR_UNKNOWN_OP


def test_the_client_says_why_it_cannot_connect(tmp_path):
    with pytest.raises(AdminError, match="no admin socket at"):
        AdminClient(f"ipc://{tmp_path}/none/admin.sock")
    with pytest.raises(AdminError, match="must be ipc"):
        AdminClient("tcp://127.0.0.1:1")
    (tmp_path / "file").write_text("x")
    with pytest.raises(AdminError, match="not a socket"):
        AdminClient(f"ipc://{tmp_path}/file")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "stale.sock"))  # bound, never listening: what a dead host leaves
    stale.close()
    with pytest.raises(AdminError, match="no host is serving"):
        AdminClient(f"ipc://{tmp_path}/stale.sock")


def test_the_client_times_out_with_one_line(tmp_path):
    import zmq
    ctx = zmq.Context()
    mute = ctx.socket(zmq.ROUTER)  # accepts, never answers
    mute.linger = 0
    mute.bind(f"ipc://{tmp_path}/mute.sock")
    try:
        with AdminClient(f"ipc://{tmp_path}/mute.sock", timeout=0.2) as c:
            with pytest.raises(AdminError, match="did not answer"):
                c.request("stats")
    finally:
        mute.close()
        ctx.term()
