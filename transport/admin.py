"""The host's admin endpoint (spec/pvgpu.md §13): a private ipc socket for the host's user.

Guests see only their own session (CMD-STATS-4); whoever may reach the admin socket sees
everything: every device and every session with its name, peer and key. The socket lives
in a directory that only the host's user may enter (`admin_directory`, [CTL-ADMIN-1]); by
default next to the host's first ipc endpoint, ``ipc://DIR/NAME`` -> ``ipc://DIR/NAME.admin/
admin.sock`` (`admin_endpoint_for`, [CTL-ADMIN-2]).

AdminServer (the host)
    One ROUTER socket in a zmq context of its own, served by a thread of its own: an
    admin request never waits for, nor delays, the guest I/O loop. A request is one
    msgpack map ``{op, seq, ...}``; `handlers` maps each op to a function ``(request) ->
    dict`` run on the admin thread, whose result is the reply's fields. A request that is
    not a map with a str op and an int seq, an op without a handler, or a handler that
    raises gets an error reply ([CTL-ADMIN-3]); nothing a client sends stops the thread.

AdminClient (`pvgpu smi`, the demo's monitor)
    ``request(op, **fields) -> dict`` with a deadline; before connecting it checks that
    the socket file exists and may be reached, so that no host, no admin socket and no
    permission each fail at once with a one-line AdminError.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading

import msgpack
import zmq

from pvgpu.spec.wire import (ADMIN_DIR_SUFFIX, ADMIN_ENDPOINT_NAME, ADMIN_ERR_FAILED,
                       ADMIN_ERR_MALFORMED, ADMIN_ERR_UNKNOWN_OP, MAX_ADMIN_REQUEST_SIZE, OP_REPLY)
from pvgpu.transport.channel import ChannelError, clear_stale_ipc, ipc_path, private_directory
from pvgpu.transport.errors import PvgpuError

log = logging.getLogger(__name__)


class AdminError(PvgpuError):
    """An admin request failed: no admin socket, no answer, or an error reply (`error`)."""

    def __init__(self, message: str, error: str | None = None):
        super().__init__(message)
        self.error = error


class AdminRequestError(PvgpuError):
    """Raised by a handler: the request is answered `failed` with this message."""


def admin_endpoint_for(endpoint: str) -> str:
    """The default admin endpoint of a host whose first ipc endpoint is `endpoint`
    ([CTL-ADMIN-2]): ``ipc://DIR/NAME`` -> ``ipc://DIR/NAME.admin/admin.sock``."""
    path = ipc_path(endpoint)
    if path is None:
        raise ValueError(f"{endpoint} is not an ipc:// endpoint with a file name; "
                         "name an admin endpoint (--admin-endpoint ipc://DIR/admin.sock)")
    return "ipc://" + os.path.join(os.path.abspath(path) + ADMIN_DIR_SUFFIX, ADMIN_ENDPOINT_NAME)


def default_admin_endpoint(endpoints) -> str | None:
    """The admin endpoint beside the first ipc endpoint of `endpoints` ([CTL-ADMIN-2]);
    None if the host serves none (tcp only: it has an admin endpoint only if named)."""
    for ep in endpoints:
        if ipc_path(ep) is not None:
            return admin_endpoint_for(ep)
    return None


def admin_directory(path: str) -> str:
    """Make sure `path` is a directory only this user may enter ([CTL-ADMIN-1]): a
    missing one is made 0700 (as an endpoint directory, [CTL-ENDPOINT-2]); an existing
    one must pass those checks and give group and others no access at all."""
    private_directory(path)
    mode = stat.S_IMODE(os.lstat(path).st_mode)
    if mode & 0o077:
        raise ChannelError(f"refusing the admin directory {path}: mode {mode:04o} lets other "
                           f"users reach the admin socket (chmod 700 {path})")
    return path


def _plain(obj):
    """msgpack `default`: numpy scalars, sets and tuples-as-keys in a handler's reply."""
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    return str(obj)


def _error(seq, error: str, message: object) -> dict:
    return {"op": OP_REPLY, "seq": seq, "ok": False, "error": error, "message": str(message)[:1024]}


def _unpack(frame: bytes) -> dict:
    """frame 0 of an admin request -> the map; AdminRequestError(message) if malformed."""
    if len(frame) > MAX_ADMIN_REQUEST_SIZE:
        raise AdminRequestError(f"request of {len(frame)} bytes (max {MAX_ADMIN_REQUEST_SIZE})")
    try:
        msg = msgpack.unpackb(frame, raw=False, strict_map_key=True,
                              max_bin_len=MAX_ADMIN_REQUEST_SIZE, max_str_len=MAX_ADMIN_REQUEST_SIZE,
                              max_array_len=4096, max_map_len=256)
    except Exception as e:
        raise AdminRequestError(f"not msgpack: {e}") from None
    if type(msg) is not dict:
        raise AdminRequestError("a request is a msgpack map")
    return msg


class AdminServer:
    """The admin socket of a host, served by its own thread (see the module docstring)."""

    def __init__(self, endpoint: str, handlers: dict):
        self.handlers = handlers  # op -> fn(request) -> dict; may grow while serving
        self.requests = 0
        self.errors = 0
        path = ipc_path(endpoint)
        if path is None:
            raise ChannelError(f"admin endpoint {endpoint}: it must be ipc://PATH (a socket "
                               "in a directory only this user may enter)")
        admin_directory(os.path.dirname(os.path.abspath(path)))
        clear_stale_ipc(path, endpoint)
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.linger = 0
        try:
            self._sock.bind(endpoint)
        except zmq.ZMQError as e:
            self._sock.close()
            self._ctx.term()
            raise ChannelError(f"cannot bind the admin endpoint {endpoint}: {e}") from None
        self.endpoint = endpoint
        self._path = path
        self._stop_r, self._stop_w = os.pipe()
        self._thread: threading.Thread | None = threading.Thread(
            target=self._serve, name="pvgpu-admin", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._stop_r, zmq.POLLIN)
        while True:
            events = dict(poller.poll())
            if self._stop_r in events:
                return
            while True:
                try:
                    parts = self._sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                reply = self.handle(parts[1:])
                try:
                    frame = msgpack.packb(reply, use_bin_type=True, default=_plain)
                except Exception as e:  # a handler's reply that does not pack
                    log.exception("admin reply does not pack")
                    frame = msgpack.packb(_error(reply.get("seq"), ADMIN_ERR_FAILED,
                                                 f"internal error: the reply does not pack: {e}"))
                try:
                    self._sock.send_multipart([parts[0], frame], zmq.NOBLOCK)
                except zmq.ZMQError:  # the client is gone or not reading: its loss
                    pass

    def handle(self, frames: list) -> dict:
        """One request's frames (without the routing identity) -> the reply map."""
        self.requests += 1
        seq = None
        try:
            if not frames:
                raise AdminRequestError("an empty request")
            msg = _unpack(frames[0])
            seq = msg.get("seq")
            if type(seq) is not int:
                seq = None
                raise AdminRequestError("the request needs an int seq")
            if len(frames) != 1:
                raise AdminRequestError(f"a request is one frame, not {len(frames)}")
            op = msg.get("op")
            if type(op) is not str:
                raise AdminRequestError("the request needs a str op")
        except AdminRequestError as e:
            self.errors += 1
            return _error(seq, ADMIN_ERR_MALFORMED, e)
        handler = self.handlers.get(op)
        if handler is None:
            self.errors += 1
            return _error(seq, ADMIN_ERR_UNKNOWN_OP, f"no admin operation {op[:64]!r} (known: "
                                                     f"{', '.join(sorted(self.handlers))})")
        try:
            fields = handler(msg)
        except AdminRequestError as e:
            self.errors += 1
            return _error(seq, ADMIN_ERR_FAILED, e)
        except Exception as e:  # a bug in a handler must not end the admin thread
            self.errors += 1
            log.exception("admin %s failed", op)
            return _error(seq, ADMIN_ERR_FAILED, f"internal error: {type(e).__name__}: {e}")
        return {**fields, "op": OP_REPLY, "seq": seq, "ok": True}

    def close(self) -> None:
        if self._thread is None:
            return
        os.write(self._stop_w, b"\0")
        self._thread.join()
        self._thread = None
        self._sock.close()
        self._ctx.term()
        os.close(self._stop_r)
        os.close(self._stop_w)
        try:
            os.unlink(self._path)
        except OSError:
            pass


class AdminClient:
    """Requests to a host's admin endpoint; raises AdminError with a one-line reason."""

    def __init__(self, endpoint: str, *, timeout: float = 5.0):
        path = ipc_path(endpoint)
        if path is None:
            raise AdminError(f"admin endpoint {endpoint}: it must be ipc://PATH")
        try:
            st = os.stat(path)
        except PermissionError:
            raise AdminError(f"permission denied: {os.path.dirname(path)} belongs to another "
                             "user (the host's admin socket is for the host's user only)") from None
        except FileNotFoundError:
            raise AdminError(f"no admin socket at {endpoint}") from None
        if not stat.S_ISSOCK(st.st_mode):
            raise AdminError(f"{path} is not a socket")
        if not os.access(path, os.R_OK | os.W_OK):
            raise AdminError(f"permission denied: {path}")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.settimeout(timeout)
            probe.connect(path)
        except ConnectionRefusedError:
            raise AdminError(f"no host is serving {endpoint} (a stale socket file)") from None
        except OSError as e:
            raise AdminError(f"cannot reach {endpoint}: {e.strerror or e}") from None
        finally:
            probe.close()
        self.endpoint = endpoint
        self.timeout = timeout
        self._seq = 0
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.linger = 0
        self._sock.connect(endpoint)

    def request(self, op: str, **fields) -> dict:
        """-> the reply's fields; AdminError on an error reply or no answer in time."""
        self._seq += 1
        seq = self._seq
        self._sock.send(msgpack.packb({**fields, "op": op, "seq": seq}, use_bin_type=True))
        deadline_ms = int(self.timeout * 1000)
        while True:
            if not self._sock.poll(deadline_ms):
                raise AdminError(f"the host did not answer on {self.endpoint} within "
                                 f"{self.timeout:g} s")
            reply = msgpack.unpackb(self._sock.recv(), raw=False, strict_map_key=False)
            if reply.get("seq") == seq:
                break
        if not reply.get("ok"):
            raise AdminError(f"{op}: {reply.get('error')}: {reply.get('message')}",
                             reply.get("error"))
        return {k: v for k, v in reply.items() if k not in ("op", "seq", "ok")}

    def close(self) -> None:
        self._sock.close()
        self._ctx.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
