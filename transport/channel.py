"""The control channel over ZeroMQ (spec/pvgpu.md §2) — the only module that moves
messages with zmq (transport/curve.py handles CURVE keys).

Shape, modelled on vhost-user: the host binds one ROUTER socket per endpoint; each
guest connects one DEALER socket, and one connection is one guest session. A message
is ``[msgpack map, *raw frames]`` (see transport/codec.py, which does all encoding and
validation; this module only moves frames).

HostChannel (host main loop, one thread)
    ``poll(timeout_ms, extra_fds)`` waits for traffic on every ROUTER socket *and* on
    extra file descriptors (a ``Waker`` that engine threads signal), then drains what
    is ready, at most ``max_batch`` messages per socket per call so one chatty guest
    cannot starve the others or the engines. Messages come back raw, as
    ``(peer, [frame0, *extra])`` with ``peer`` a ``pvgpu.transport.peer.Peer(socket_index,
    identity, connection)``; the loop decodes them and answers a ``CodecError`` with
    ``codec.reply_error`` if it has a seq. ``send`` never blocks: the ROUTER is
    ROUTER_MANDATORY, so a message for a guest that is gone (EHOSTUNREACH) or whose
    pipe is full (EAGAIN) is dropped and counted in ``dropped_sends`` instead of
    stalling every other session.

    Connections (spec [CTL-ENDPOINT-4]). A routing identity is chosen by the peer and
    outlives its connection: a new connection may present the identity of one that
    closed. So the channel names connections itself. Its ROUTER sockets run ZeroMQ's
    authentication protocol (ZAP, RFC 27) with the channel as the handler, served from
    ``poll`` on the loop's own thread: every connection is accepted during its
    handshake, before it can deliver a message, and given a fresh name ("c1", "c2",
    ... never reused) as its ZAP User-Id, which ZeroMQ then attaches to every message
    that connection delivers. The channel owns its zmq context (one ZAP handler per
    context).

    Connection events (spec [CTL-HB-7]). A socket monitor on every ROUTER socket, in
    the same poll set, reports accepts and closes by file descriptor;
    transport/connections.py links a descriptor to the connection's name (the rule is
    written there) and reads the peer's credentials from it. ``take_disconnected()``
    gives the loop the names of the connections that closed, ``peer_credentials(name)``
    who is at the other end of one. ``close(linger_ms)`` lets messages already sent
    (the ``shutdown`` notices, [CTL-BYE-2]) leave first.

    Authentication (spec §2.13). Given `curve` (pvgpu.transport.curve.ServerKeys), every tcp
    endpoint is a CURVE server: the handshake encrypts the connection, and the ZAP
    handler accepts only client keys of the authorized-keys directory, naming such a
    connection "c<n>/<key fingerprint>" (``Peer.key``); other keys are refused during
    the handshake. ipc endpoints stay unauthenticated: their directory guards them
    (`private_directory`). ``reload_authorized_keys`` re-reads the directory.

GuestChannel (any guest thread)
    Given the host's public key and a client key pair the DEALER is a CURVE client. A
    socket monitor on the DEALER reports the connection's handshake and its close: on a
    tcp endpoint ``await_handshake`` raises AuthenticationFailed as soon as the
    handshake fails (ZeroMQ would otherwise retry silently and deliver nothing), and a
    close after a successful handshake loses the session ([CTL-HB-6]).

    A thin pump around ``pvgpu.transport.channel_protocol.ChannelProtocol``, which holds
    the protocol state (seq matching, replies, notifications, pings, liveness) and
    decides everything protocol-wise; this class only moves frames, keeps the time
    and hands events to threads. The calling thread does its own I/O: ``request``
    encodes, sends and polls the DEALER socket directly until the reply with its seq
    arrives — no helper thread, no queue handoff on the hot path.
    ``recv_until(predicate, timeout)`` is the one receive loop. Of the protocol's
    events, a reply goes to the thread that waits for it, a ``Transmit`` (ping, or
    the answer to the host's ping) is sent at once, and a notification (``call``,
    ``config_changed``, a stale reply) goes to a ``recv_until`` caller whose
    predicate takes it, else to the handler set with ``set_notification_handler``,
    else to a bounded queue that later ``recv_until`` calls look at first.

    Threads. A re-entrant lock guards the socket (a zmq socket may move between
    threads given a full memory barrier; the lock is that barrier); a condition
    variable guards the protocol object and the waiters. A waiting thread holds the
    socket while it polls; a thread that wants to send meanwhile bumps ``_want`` and
    signals a ``Waker`` that is in the waiter's poll set, so the waiter steps aside
    at once instead of at the end of its poll slice. Replies for other waiters are
    handed over through the condition variable. A handler runs on whichever thread
    received the message (the heartbeat thread included); it may ``send`` but not
    wait (``request``/``recv_until`` raise ChannelError there).

    Heartbeats. Whoever holds the socket runs the protocol's timers: a waiting
    thread polls until the protocol's ``next_deadline``; a background thread wakes
    for it when the socket is free, drains pending messages and ticks. A ping goes
    out when nothing has been sent for one period (keep-alive for the host, which
    reaps silent sessions). A wait that has heard nothing from the host for
    ``HEARTBEAT_MISSES`` periods (counted from the later of the last message heard
    and the start of the wait, and proven by finding the socket empty) raises
    ``HostLost``. ``heartbeat_ms <= 0`` disables both (then only ``timeout`` ends a
    wait).

    Connection. A socket monitor on the DEALER reports the connection's handshakes and
    closes; it is in every waiter's poll set and the heartbeat thread reads it too.
    A close after a handshake succeeded loses the host at once (spec [CTL-HB-6]): the
    messages received before it are dispatched, then every wait raises ``HostLost``,
    and so does every later request or send (the DEALER reconnects by itself, but a
    new connection would be a new session).

Timeouts: HostChannel takes milliseconds (like zmq); GuestChannel takes seconds.
Sockets are closed with linger=0. Zero-copy: frames sent with ``copy=False`` (the
default) and larger than zmq's copy threshold are not copied; such a buffer must
not change until the peer has it (a ``request`` returning guarantees that; after a
plain ``send`` use ``copy=True`` if you are going to modify the buffer).
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import secrets
import socket
import stat
import tempfile
import threading
import time
from typing import Any, Literal

import zmq

from pvgpu.spec.wire import DEFAULT_ENDPOINT_NAME, DEFAULT_HEARTBEAT_MS
from pvgpu.transport.channel_protocol import (
    ChannelProtocol,
    ConnectionLost,
    HostSilent,
    Malformed,
    Notification,
    Reply,
    RequestFailed,
    Transmit,
)
from pvgpu.transport.codec import ZERO_COPY_MIN, encode
from pvgpu.transport.connections import ConnectionWatch, peer_credentials
from pvgpu.transport.curve import fingerprint
from pvgpu.transport.errors import (AuthenticationFailed, ChannelError, ChannelTimeout,  # noqa: F401
                              HostLost, HostNotFound)
from pvgpu.transport.peer import Peer

log = logging.getLogger(__name__)

_monotonic = time.monotonic
# Plain ints: pyzmq's enum members and option attributes (sock.rcvmore) cost microseconds.
_NOBLOCK = int(zmq.NOBLOCK)
# Frames smaller than codec.ZERO_COPY_MIN are copied when sent; larger ones go zero-copy.
# pyzmq applies its own copy_threshold only when `copy` is left unset: with copy=False even
# a 2-byte view is read later by ZeroMQ's I/O thread, after the caller may have changed it.


def _copy_flag(frame, copy: bool) -> bool:
    """Copy small frames always; large ones only if asked (zero-copy: the caller must not
    modify a large frame's memory until the peer has it)."""
    size = len(frame) if type(frame) is bytes else memoryview(frame).nbytes
    return copy or size < ZERO_COPY_MIN
_SNDMORE = int(zmq.SNDMORE)
_RCVMORE = int(zmq.RCVMORE)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_HANDSHAKE_SUCCEEDED = int(zmq.EVENT_HANDSHAKE_SUCCEEDED)
_HANDSHAKE_EVENTS = int(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                        | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                        | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
_MECHANISM_MISMATCH = int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
_ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq looks for the ZAP handler (RFC 27)
_ZAP_DOMAIN = b"pvgpu"
_USER_ID = "User-Id"  # message property: the User-Id the ZAP handler gave the connection
_ACCEPTED = int(zmq.EVENT_ACCEPTED)
_DISCONNECTED = int(zmq.EVENT_DISCONNECTED)


# --------------------------------------------------------------------------- helpers

def default_endpoint() -> str:
    """The default host endpoint ([CTL-ENDPOINT-2]): ``ipc://$XDG_RUNTIME_DIR/pvgpu.sock``
    if that variable is set and names a writable directory, else
    ``ipc://<tmp>/pvgpu-<uid>/pvgpu.sock`` in a directory of pvgpu's own, created 0700
    and kept so; either directory must pass `private_directory`."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg) and os.access(xdg, os.W_OK | os.X_OK):
        return "ipc://" + os.path.join(private_directory(xdg, create=False), DEFAULT_ENDPOINT_NAME)
    d = os.path.join(tempfile.gettempdir(), f"pvgpu-{os.getuid()}")
    return "ipc://" + os.path.join(private_directory(d, own=True), DEFAULT_ENDPOINT_NAME)


def private_directory(path: str, *, create: bool = True, own: bool = False) -> str:
    """Make sure `path` is a directory that no other user can write in, as the directory
    of an ipc endpoint must be ([CTL-ENDPOINT-2]) -> path. Missing and `create`: made
    with mode 0700 by one mkdir, which fails rather than follow anything an attacker put
    there (its parent must exist). Existing: it must be a real directory (not a symlink)
    owned by this uid and not writable by group or others, else ChannelError; if it is
    pvgpu's `own` directory, read and search bits for others are taken away too."""
    uid = os.getuid()
    if create:
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            pass
        except OSError as e:
            raise ChannelError(f"cannot create the endpoint directory {path}: {e.strerror}") from None
    try:
        st = os.lstat(path)
    except OSError as e:
        raise ChannelError(f"endpoint directory {path}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ChannelError(f"refusing the endpoint directory {path}: it is not a directory "
                           "(a symlink or a file)")
    if st.st_uid != uid:
        raise ChannelError(f"refusing the endpoint directory {path}: it belongs to uid "
                           f"{st.st_uid}, not to this user (uid {uid})")
    if st.st_mode & 0o022:
        raise ChannelError(f"refusing the endpoint directory {path}: mode "
                           f"{stat.S_IMODE(st.st_mode):04o} lets other users write in it "
                           f"(chmod 700 {path}, or use another directory)")
    if own and st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def ipc_path(endpoint: str):
    """File-system path of an ipc:// endpoint (None for tcp, abstract or wildcard)."""
    if not endpoint.startswith("ipc://"):
        return None
    path = endpoint[len("ipc://"):]
    if not path or path.startswith("@") or path == "*":
        return None
    return path


def clear_stale_ipc(path: str, endpoint: str) -> None:
    """Remove a socket file left by a dead host; refuse if a live process answers on it
    or if the path is not a socket at all."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ChannelError(f"cannot bind {endpoint}: {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        try:
            os.unlink(path)
            log.info("removed stale socket file %s", path)
        except FileNotFoundError:
            pass
        return
    except OSError as e:
        raise ChannelError(f"cannot bind {endpoint}: probing {path} failed: {e}") from None
    finally:
        probe.close()
    raise ChannelError(f"cannot bind {endpoint}: another process is serving it")


class Waker:
    """A self-pipe another thread signals to wake a poll: ``wake()`` from any thread,
    ``fileno()`` in the poll set, ``clear()`` by the poller *before* it looks at the
    work it was woken for (so a wake that races with the clear is never lost).

    ``wake()`` writes only when no wake is pending. ``clear()`` therefore drains the pipe
    before it resets the flag: the other order lets a wake that lands between the two
    write a byte the drain then swallows, leaving the flag set over an empty pipe, and
    every later wake would be skipped until a poll timed out."""

    def __init__(self):
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._pending = False

    def fileno(self) -> int:
        return self._r

    def wake(self) -> None:
        if self._pending:
            return
        self._pending = True
        try:
            os.write(self._w, b"\0")
        except (BlockingIOError, OSError):  # pipe full (already signalled) or closed
            pass

    def clear(self) -> None:
        try:
            while os.read(self._r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass
        self._pending = False

    def close(self) -> None:
        fds = (self._r, self._w)
        self._r = self._w = -1  # before closing: a late wake() must not hit a reused fd
        for fd in fds:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass


def _monitor_event(parts: list) -> tuple:
    """A socket-monitor message -> (event, value): frame 0 is le16 event, le32 value."""
    head = parts[0]
    return int.from_bytes(head[:2], "little"), int.from_bytes(head[2:6], "little")


def _fingerprint(raw_key: bytes) -> str:
    return fingerprint(raw_key) if len(raw_key) == 32 else "(none)"


def _handshake_failure(endpoint: str, kind: int, value: int, key) -> str:
    """What a failed handshake most likely means, for the person who reads it. (A host
    may close a mismatched connection before the guest has seen why: then the event
    has no detail.)"""
    how = f"{zmq.Event(kind).name}, {value}"
    if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return (f"the host at {endpoint} refused this guest's CURVE key {key} ({how}): it "
                f"is not among the host's authorized keys")
    if key is None:
        return (f"the handshake with {endpoint} failed ({how}): the host requires CURVE "
                f"authentication; give the host's public key and this guest's key pair "
                f"(server_key/client_key, PVGPU_SERVER_KEY/PVGPU_CLIENT_KEY, "
                f"--server-key/--client-key)")
    if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == _MECHANISM_MISMATCH:
        return f"the host at {endpoint} does not use CURVE, but this guest does ({how})"
    return (f"the CURVE handshake with {endpoint} failed ({how}): is the server key the "
            f"host's public key?")


def _recv_rest(sock, more: bool) -> list:
    """The remaining parts of a message whose last part received said `more`: frame 0 as
    bytes (small, the codec reads it), the raw frames after it as zero-copy memoryviews.
    (A frame's `more` is what getsockopt(RCVMORE) would say, without an option lookup.)"""
    if not more:
        return []
    frame = sock.recv(copy=False)
    parts = [frame.bytes]
    while frame.more:
        frame = sock.recv(copy=False)
        parts.append(frame.buffer)
    return parts


# --------------------------------------------------------------------------- host side

class HostChannel:
    """ROUTER sockets, one per endpoint, driven by the host main loop (one thread).

    An ipc:// endpoint's directory is created 0700 if missing and refused if another
    user owns it or may write in it (`private_directory`). A socket file that exists is
    probed first: if nobody accepts a connection on it the file is stale and is removed;
    if someone does, binding fails with ChannelError. ``close()`` removes the socket files this channel created.
    ``tcp://127.0.0.1:0`` binds a random port; ``endpoints`` lists what was bound.
    """

    def __init__(self, endpoints, context=None, *, max_batch: int = 64, curve=None):
        self._own_ctx = context is None  # a private context: its own ZAP handler
        self._ctx = zmq.Context() if context is None else context
        self.max_batch = max_batch
        self.endpoints: list = []
        self.dropped_sends = 0  # messages for a vanished or saturated guest
        self.connections_accepted = 0
        self.connections_refused = 0  # CURVE handshakes with a key not authorized
        self.curve = curve  # pvgpu.transport.curve.ServerKeys: CURVE on every tcp endpoint
        self._sockets: list = []
        self._ipc_files: list = []  # (path, inode) that close() removes
        self._closed = False
        # the ZAP ROUTER socket, with CURVE (Any: pyzmq types getsockopt as int | bytes)
        self._zap: Any = None
        self._monitors: list = []  # one PAIR per ROUTER socket: its connection events
        self._watch = ConnectionWatch()
        self._ended: list = []  # names of watched connections that closed (take_disconnected)
        try:
            self._zap = self._ctx.socket(zmq.ROUTER)
            self._zap.linger = 0
            try:
                self._zap.bind(_ZAP_ENDPOINT)
            except zmq.ZMQError as e:
                raise ChannelError(f"cannot serve ZAP in this zmq context ({e}): a host "
                                   "channel needs a context of its own") from None
            for ep in endpoints:
                s = self._ctx.socket(zmq.ROUTER)
                self._sockets.append(s)
                s.linger = 0
                s.setsockopt(zmq.ROUTER_MANDATORY, 1)
                s.zap_domain = _ZAP_DOMAIN  # every connection is accepted by _serve_zap
                self._monitor(s)  # before bind: no connection's ACCEPTED may be missed
                if curve is not None and ep.startswith("tcp://"):
                    s.curve_server = True
                    s.curve_secretkey = curve.pair.secret
                    s.curve_publickey = curve.pair.public
                path = ipc_path(ep)
                if path is not None:
                    private_directory(os.path.dirname(os.path.abspath(path)))
                    clear_stale_ipc(path, ep)
                try:
                    s.bind(ep)
                except zmq.ZMQError as e:
                    raise ChannelError(f"cannot bind {ep}: {e}") from None
                actual = s.getsockopt_string(zmq.LAST_ENDPOINT)
                self.endpoints.append(actual)
                path = ipc_path(actual)
                if path is not None:
                    try:
                        self._ipc_files.append((path, os.stat(path).st_ino))
                    except OSError:
                        pass
        except BaseException:
            self.close()
            raise
        self._poller = zmq.Poller()
        for s in self._sockets:
            self._poller.register(s, zmq.POLLIN)
        self._poller.register(self._zap, zmq.POLLIN)
        for m in self._monitors:
            self._poller.register(m, zmq.POLLIN)
        self._handshakes = frozenset([self._zap, *self._monitors])  # _serve_connections
        self._extra: tuple = ()
        self._extra_nos: list = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def poll(self, timeout_ms=None, extra_fds=()) -> tuple:
        """Wait up to timeout_ms (None: until something happens) for a message on any
        socket or for one of extra_fds (ints or objects with fileno()) to be readable.
        -> (messages, ready_fds): messages as in recv(), ready_fds the extra_fds
        entries that are readable (the caller clears them)."""
        if self._closed:
            raise ChannelError("host channel is closed")
        extra = tuple(extra_fds)
        if extra != self._extra:
            for fd in self._extra:
                self._poller.unregister(fd)
            for fd in extra:
                self._poller.register(fd, zmq.POLLIN)
            self._extra = extra
            self._extra_nos = [fd if isinstance(fd, int) else fd.fileno() for fd in extra]
        events = dict(self._poller.poll(timeout_ms))  # keyed by socket or by fd number
        messages: list = []
        if events:
            if not self._handshakes.isdisjoint(events):
                self._serve_connections()
            for i, s in enumerate(self._sockets):
                if s in events:
                    self._drain(i, s, messages)
        ready = [fd for fd, no in zip(extra, self._extra_nos) if no in events] if extra else []
        return messages, ready

    def recv(self, timeout_ms=None) -> list:
        """-> [(peer, [frame0, *extra]), ...] for every message ready now (waiting up to
        timeout_ms for the first), at most max_batch per socket. peer is
        (socket_index, identity); frame0 is bytes, extra frames memoryviews."""
        return self.poll(timeout_ms)[0]

    def _drain(self, index: int, s, out: list) -> None:
        """Receive up to max_batch messages from socket `s`, which poll found readable."""
        for n in range(self.max_batch):
            # the poll vouches for the first message; later ones are asked for (cheaper
            # than ending on zmq.Again)
            if n and not s.getsockopt(_EVENTS) & _POLLIN:
                return
            try:
                head = s.recv(_NOBLOCK, copy=False)  # the identity, with the connection's metadata
            except zmq.Again:
                return
            out.append((Peer(index, head.bytes, head.get(_USER_ID)), _recv_rest(s, head.more)))

    # ----------------------------------------------------------------- connections
    def _monitor(self, s) -> None:
        """Watch the accepts and disconnects of ROUTER socket s (a socket monitor)."""
        self._monitors.append(s.get_monitor_socket(_ACCEPTED | _DISCONNECTED))

    def _serve_connections(self) -> None:
        """Read every connection event, serving ZAP requests in between: each request is
        served only after every monitor event emitted before it has been read
        (transport/connections.py, the mapping rule)."""
        zap = self._zap
        while True:
            self._read_monitors()
            if not zap.getsockopt(_EVENTS) & _POLLIN:
                break
            self._serve_zap()
        self._watch.forget_ghosts()  # their requests, if any, were queued before: served

    def _read_monitors(self) -> None:
        watch = self._watch
        for index, mon in enumerate(self._monitors):
            while mon.getsockopt(_EVENTS) & _POLLIN:
                event, fd = _monitor_event(mon.recv_multipart(_NOBLOCK))
                if event == _ACCEPTED:
                    watch.accepted(fd, index, peer_credentials(fd))
                elif event == _DISCONNECTED:
                    name = watch.disconnected(fd)
                    if name is not None:
                        log.debug("connection %s closed", name)
                        self._ended.append(name)

    def take_disconnected(self) -> list:
        """-> the names of the connections seen to close since the last call (only
        connections the channel could map to their fd; transport/connections.py)."""
        ended, self._ended = self._ended, []
        return ended

    def peer_credentials(self, connection: str):
        """Who is at the other end of an open connection: ipc ``{transport, pid, uid,
        gid}``, tcp ``{transport, address, ip}``; None if not known."""
        return self._watch.credentials.get(connection)

    @property
    def connections_unwatched(self) -> int:
        """Connections whose closing cannot be seen (ambiguous; heartbeats reclaim them)."""
        return self._watch.unwatched

    def _serve_zap(self) -> None:
        """Answer the next connection that is handshaking (a ZAP request, RFC 27): accept
        it with a fresh User-Id, "c<n>", or "c<n>/<key fingerprint>" on a CURVE endpoint,
        whose client key must be authorized ([CTL-AUTH-2]; refused with status 400
        otherwise). Runs on the loop's thread: a connection delivers no message before
        its request has been answered here."""
        zap = self._zap
        parts = zap.recv_multipart(_NOBLOCK)
        try:
            delim = parts.index(b"")
            envelope, request = parts[:delim + 1], parts[delim + 1:]
            version, request_id, _domain, address, _identity, mechanism = request[:6]
        except ValueError:
            log.warning("dropped a malformed ZAP request")
            return
        if version != b"1.0":
            zap.send_multipart(envelope + [b"1.0", request_id, b"400", b"bad ZAP version",
                                           b"", b""])
            return
        peer = address.decode(errors="replace")
        key = None
        if mechanism == b"CURVE":
            authorized = self.curve.authorized if self.curve is not None else None
            client = request[6] if len(request) > 6 else b""
            key = authorized.lookup(client) if authorized is not None else None
            if key is None:
                self.connections_refused += 1
                log.warning("refused a connection from %s: its CURVE key %s is not "
                            "authorized", peer, _fingerprint(client))
                zap.send_multipart(envelope + [b"1.0", request_id, b"400",
                                               b"key not authorized", b"", b""])
                return
        elif mechanism != b"NULL":
            zap.send_multipart(envelope + [b"1.0", request_id, b"400",
                                           b"unsupported mechanism", b"", b""])
            return
        self.connections_accepted += 1
        conn = f"c{self.connections_accepted}" + (f"/{key}" if key else "")
        watched = self._watch.named(peer, conn)
        log.debug("accepted connection %s from %s%s", conn, peer,
                  "" if watched else " (not watched: ambiguous)")
        zap.send_multipart(envelope + [b"1.0", request_id, b"200", b"OK", conn.encode(), b""])

    def reload_authorized_keys(self) -> set:
        """Re-read the authorized-keys directory ([CTL-AUTH-4]); from now on a handshake
        with a key no longer listed is refused. -> the fingerprints of every key
        authorized since the start and not now (the revoked ones). Raises
        pvgpu.transport.curve.CurveKeyError if the directory cannot be read (the keys stay as
        they were)."""
        if self.curve is None:
            return set()
        self.curve.authorized.reload()
        return self.curve.authorized.revoked

    def send(self, peer, frames, *, copy: bool = False) -> bool:
        """Send [frame0, *extra] (see codec.encode) to peer (a Peer, or its route
        (socket_index, identity)) without ever blocking.
        -> False (and dropped_sends += 1) if the guest is gone or its pipe is full."""
        index, identity = peer[0], peer[1]
        s = self._sockets[index]
        try:
            last = len(frames) - 1
            if last < 0:
                raise ValueError("a message needs at least frame 0")
            s.send(identity, _SNDMORE | _NOBLOCK)
            for i, f in enumerate(frames):
                s.send(f, _NOBLOCK if i == last else _SNDMORE | _NOBLOCK, copy=_copy_flag(f, copy))
        except zmq.Again:
            self.dropped_sends += 1
            log.debug("dropped a message for peer %r: its pipe is full", peer)
            return False
        except zmq.ZMQError as e:
            if e.errno != errno.EHOSTUNREACH:
                raise
            self.dropped_sends += 1
            log.debug("dropped a message for peer %r: not connected", peer)
            return False
        return True

    def send_msg(self, peer, msg: dict, frames=(), *, copy: bool = False) -> bool:
        """send(peer, codec.encode(msg, frames))"""
        return self.send(peer, encode(msg, frames), copy=copy)

    def close(self, linger_ms: int = 0) -> None:
        """Close every socket and remove the ipc socket files we created. linger_ms: how
        long messages already sent may take to leave (0: dropped at once)."""
        if self._closed:
            return
        self._closed = True
        for s in self._sockets:
            try:
                s.disable_monitor()
            except zmq.ZMQError:
                pass
        for m in self._monitors:
            m.close(linger=0)
        for s in self._sockets:
            s.close(linger=linger_ms)
        if self._zap is not None:
            self._zap.close(linger=0)
        if self._own_ctx:
            self._ctx.term()
        for path, ino in self._ipc_files:
            try:
                if os.stat(path).st_ino == ino:  # not a successor's socket
                    os.unlink(path)
            except OSError:
                pass
        self._sockets = []


# --------------------------------------------------------------------------- guest side

class _Waiter:
    __slots__ = ("predicate", "result", "error")

    def __init__(self, predicate=None):
        self.predicate = predicate
        self.result = None  # (msg, frames) once satisfied
        self.error = None  # an exception to raise instead

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None


class GuestChannel:
    """One DEALER socket connected to a host endpoint (one guest session), pumping a
    ``ChannelProtocol``."""

    def __init__(self, endpoint: str, *, heartbeat_ms: int = DEFAULT_HEARTBEAT_MS,
                 context=None, max_queued: int = 4096, server_key: bytes | None = None,
                 client_key=None):
        """server_key (the host's public key, Z85) and client_key (a pvgpu.transport.curve
        KeyPair with its secret): CURVE on this connection ([CTL-AUTH-1]), both or
        neither. On a tcp endpoint the handshake is watched until `await_handshake`."""
        self.endpoint = endpoint
        self._hb_thread: threading.Thread | None = None
        self._closed = False
        self._stop = threading.Event()
        self._proto = ChannelProtocol(heartbeat_ms, _monotonic())
        self.overflowed = 0  # notifications dropped because the queue was full
        self.curve_key = None  # fingerprint of the client key, on a CURVE connection
        if (server_key is None) != (client_key is None):
            raise ChannelError("CURVE needs both the host's public key and a client key pair")
        self._ctx = context if context is not None else zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.linger = 0
        # An identity nobody can guess ([CTL-ENDPOINT-5]); a leading zero byte is libzmq's.
        self._sock.routing_id = bytes([1 + secrets.randbelow(255)]) + secrets.token_bytes(15)
        # before connect: the connection's events, none missed: its handshake
        # ([CTL-AUTH-6], await_handshake) and its close ([CTL-HB-6])
        self._monitor = self._sock.get_monitor_socket(_HANDSHAKE_EVENTS | _DISCONNECTED)
        # None until the handshake ended: True, or (event, value) of its failure
        self._handshake: Literal[True] | tuple | None = None
        self._watch_handshake = endpoint.startswith("tcp://")  # await_handshake waits only there
        try:
            if server_key is not None:
                self._sock.curve_serverkey = server_key
                self._sock.curve_publickey = client_key.public
                self._sock.curve_secretkey = client_key.secret
                self.curve_key = client_key.fingerprint
            self._sock.connect(endpoint)
        except zmq.ZMQError as e:
            self._close_sockets()
            raise ChannelError(f"cannot connect to {endpoint}: {e.strerror}; an endpoint "
                               "is tcp://HOST:PORT or ipc://PATH") from None
        self._sock_lock = threading.RLock()
        self._cv = threading.Condition(threading.Lock())  # guards _proto and everything below
        self._want = 0  # threads blocked waiting for the socket
        self._sleepers = 0  # threads in _cv.wait (notify only if there are any)
        self._waiters: list = []  # predicate waiters (recv_until)
        self._queue: collections.deque = collections.deque()
        self._max_queued = max_queued
        self._handler: Any = None  # fn(msg, frames): set_notification_handler
        self._local = threading.local()
        self._waker = Waker()
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._waker, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        self._start_heartbeat()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ----------------------------------------------------------------- public API

    def await_handshake(self, timeout: float) -> None:
        """Wait until the connection's ZMTP handshake (CURVE or NULL) has succeeded, at
        most timeout seconds ([CTL-AUTH-6]). Raises AuthenticationFailed at once if it
        failed, HostLost if it did not happen in time. On an ipc endpoint (whose
        directory, not a handshake, keeps others out) it only checks that the socket file
        exists: HostNotFound at once if not, since no host serves it."""
        if not self._watch_handshake:
            path = ipc_path(self.endpoint)
            if path is not None and not os.path.exists(path):
                raise HostNotFound(f"no host at {self.endpoint}; start one with `pvgpu host`")
            return
        deadline = _monotonic() + timeout
        while True:
            with self._sock_lock:  # the heartbeat thread may be reading the monitor too
                self._read_monitor()
                outcome = self._handshake
                if outcome is None:
                    left = deadline - _monotonic()
                    if left <= 0:
                        raise HostLost(f"no host completed a handshake at {self.endpoint} "
                                       f"within {timeout:g} s: is a host listening there?")
                    self._monitor.poll(max(1, int(min(left, 0.05) * 1000)))
                    continue
            if outcome is True:
                return
            kind, value = outcome
            raise AuthenticationFailed(_handshake_failure(self.endpoint, kind, value,
                                                          self.curve_key))

    @property
    def heartbeat_ms(self) -> int:
        """The heartbeat period; settable (e.g. to the period the host announces in its
        hello reply). 0 or less disables pings and HostLost detection."""
        return self._proto.heartbeat_ms

    @heartbeat_ms.setter
    def heartbeat_ms(self, ms: int) -> None:
        with self._cv:
            self._proto.heartbeat_ms = ms
        self._start_heartbeat()

    @property
    def last_heard(self) -> float:
        """time.monotonic() of the last message from the host."""
        return self._proto.last_heard

    @property
    def proven_silence(self) -> float:
        """Seconds from the last message to the last time the socket was found empty."""
        return self._proto.proven_silence

    def silence_since(self, start: float) -> float:
        """The silence the socket has proven for a wait that began at start
        (time.monotonic()), counted from the later of the last message and start."""
        with self._cv:
            return self._proto.silence_since(start)

    @property
    def malformed(self) -> int:
        """Messages from the host that did not decode."""
        return self._proto.malformed

    def next_seq(self) -> int:
        with self._cv:
            return self._proto.next_seq()

    def set_notification_handler(self, fn) -> None:
        """fn(msg, frames) receives every message nobody waits for (call,
        config_changed, stale replies), on the thread that received it. None: queue
        them for recv_until instead."""
        with self._cv:
            self._handler = fn

    def send(self, msg: dict, frames=(), *, copy: bool = False) -> None:
        """Send a notification (or a request carrying its own seq) without waiting."""
        self.send_encoded(self._proto.send(msg, frames), copy=copy)  # pure: encodes

    def send_encoded(self, parts: list, *, copy: bool = False) -> None:
        """`send` of a message already encoded (pvgpu.transport.codec.encode), e.g. a constant
        notification encoded once."""
        wanted = self._acquire()
        try:
            if self._closed:
                self._check_open()
            if self._proto.lost is not None:
                self._check_alive()
            self._send_locked(parts, copy)
        finally:
            self._release(wanted)

    def request(self, msg: dict, frames=(), timeout=None, *, copy: bool = False) -> tuple:
        """Send msg with a fresh seq and wait for its reply -> (reply, reply_frames).
        A reply with ok=false is returned as it is. timeout in seconds (None: wait
        while the host is alive). Raises ChannelTimeout, HostLost, ChannelError."""
        w = _Waiter()
        with self._cv:
            seq, parts = self._proto.send_request(msg, frames, w)
        try:
            return self._wait(w, timeout, parts, copy)
        finally:
            if w.result is None:
                with self._cv:
                    self._proto.cancel_request(seq)

    def recv_until(self, predicate, timeout=None) -> tuple:
        """Receive until a message with predicate(msg) true arrives (queued messages
        are looked at first) -> (msg, frames). Everything else is dispatched as
        described in the module comment. timeout in seconds (0: only what is there)."""
        w = _Waiter(predicate)
        with self._cv:
            for i, (m, f) in enumerate(self._queue):
                if predicate(m):
                    del self._queue[i]
                    return m, f
            self._waiters.append(w)
        try:
            return self._wait(w, timeout)
        finally:
            with self._cv:
                try:
                    self._waiters.remove(w)
                except ValueError:
                    pass

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop the heartbeat thread, fail current waits, close the socket (linger=0)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._waker.wake()
        if self._hb_thread is not None and self._hb_thread is not threading.current_thread():
            self._hb_thread.join(timeout=5)
        got = self._sock_lock.acquire(timeout=5)
        try:
            self._close_sockets()
        finally:
            if got:
                self._sock_lock.release()
        with self._cv:
            self._cv.notify_all()
        self._waker.close()

    # ----------------------------------------------------------------- internals

    def _close_sockets(self) -> None:
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._monitor.close(linger=0)
        self._sock.close(linger=0)

    def _check_alive(self) -> None:
        """Refuse to use a session whose host is lost ([CTL-HB-5]). (One attribute read,
        without _cv: `lost` only ever goes from None to a reason.)"""
        if self._proto.lost is not None:
            raise HostLost(f"host at {self.endpoint} is lost: {self._proto.lost}")

    def _read_monitor(self) -> None:
        """Feed the connection's events to the protocol; socket lock held. Before a close
        is reported, the messages received until then are handed over."""
        mon = self._monitor
        while mon.getsockopt(_EVENTS) & _POLLIN:
            event, value = _monitor_event(mon.recv_multipart(_NOBLOCK))
            if event == _HANDSHAKE_SUCCEEDED:
                self._handshake = True
                with self._cv:
                    self._proto.handshake_succeeded()
            elif event != _DISCONNECTED:  # a failed handshake (_HANDSHAKE_EVENTS)
                if self._handshake is None:
                    self._handshake = (event, value)
            else:
                self._drain()
                with self._cv:
                    self._fail(self._proto.disconnected())

    def _fail(self, events: list) -> None:
        """Deliver ConnectionLost events; _cv held."""
        for e in events:
            if isinstance(e, ConnectionLost):
                e.token.error = HostLost(f"host at {self.endpoint} is lost: {e.reason}")
        if events and self._sleepers:
            self._cv.notify_all()

    def _start_heartbeat(self) -> None:
        if self._proto.period is not None and self._hb_thread is None and not self._closed:
            self._hb_thread = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                               name=f"pvgpu-heartbeat {self.endpoint}")
            self._hb_thread.start()

    def _check_open(self):
        if self._closed:
            raise ChannelError(f"channel to {self.endpoint} is closed")

    def _acquire(self) -> bool:
        """Take the socket lock; if a waiter holds it, ask it to step aside.
        -> True if we registered in _want (pass it to _release)."""
        if self._sock_lock.acquire(blocking=False):
            return False
        with self._cv:
            self._want += 1
        self._waker.wake()
        self._sock_lock.acquire()
        return True

    def _release(self, wanted: bool) -> None:
        self._sock_lock.release()
        if wanted:
            with self._cv:
                self._want -= 1
                if not self._want and self._sleepers:
                    self._cv.notify_all()

    def _send_locked(self, parts: list, copy: bool) -> None:
        sock = self._sock
        try:
            self._send_parts(sock, parts, copy)
        except zmq.Again:
            # The send queue is full: the host is not reading. Give it the liveness window.
            silence_ms = int(self._proto.silence * 1000)
            if not sock.poll(silence_ms, zmq.POLLOUT):
                raise HostLost(f"host at {self.endpoint} stopped answering (send queue full "
                               f"for {silence_ms} ms)") from None
            self._send_parts(sock, parts, copy)
        # no _cv: one float stored under the socket lock, which every timer run holds
        self._proto.sent(_monotonic())

    @staticmethod
    def _send_parts(sock, parts: list, copy: bool) -> None:
        if len(parts) == 1:
            sock.send(parts[0], _NOBLOCK)
            return
        last = len(parts) - 1
        for i, f in enumerate(parts):
            sock.send(f, _NOBLOCK if i == last else _SNDMORE | _NOBLOCK, copy=_copy_flag(f, copy))

    def _transmit(self, parts: list) -> None:
        """Send a protocol message (ping, ping answer); socket lock held. A full queue
        drops it: the liveness rules tell whether the host is still there."""
        try:
            self._send_parts(self._sock, parts, True)
        except zmq.Again:
            pass

    def _tick(self, now: float):
        """Run the protocol's timers; socket lock held. -> the protocol's next deadline."""
        with self._cv:
            events = self._proto.tick(now)
            for e in events:
                if isinstance(e, HostSilent):
                    e.token.error = HostLost(f"host at {self.endpoint} stopped answering "
                                             f"(no message for {int(e.silent * 1000)} ms)")
                    if self._sleepers:
                        self._cv.notify_all()
            due = self._proto.next_deadline(now)
        for e in events:
            if isinstance(e, Transmit):
                self._transmit(e.parts)
        return due

    def _wait(self, w: _Waiter, timeout, parts=None, copy=False) -> tuple:
        if getattr(self._local, "in_handler", False):
            raise ChannelError("cannot wait on the channel from inside a notification handler")
        start = _monotonic()
        deadline = None if timeout is None else start + timeout
        with self._cv:
            self._check_alive()
            self._proto.begin_wait(w, start)
        try:
            return self._wait_loop(w, timeout, deadline, parts, copy)
        finally:
            with self._cv:
                self._proto.end_wait(w)

    def _wait_loop(self, w: _Waiter, timeout, deadline, parts, copy) -> tuple:
        sock = self._sock
        while True:
            if w.result is not None:
                return w.result
            if w.error is not None:
                raise w.error
            wanted = self._acquire()
            step_aside = False
            try:
                self._check_open()
                if parts is not None:
                    self._send_locked(parts, copy)
                    parts = None
                while not w.done:
                    self._check_open()  # a handler may have closed the channel
                    now = _monotonic()
                    target = self._tick(now)
                    if w.done:
                        break
                    if deadline is not None:
                        target = deadline if target is None else min(target, deadline)
                    slice_ms = None if target is None else max(0, int((target - now) * 1000) + 1)
                    if deadline is not None and now >= deadline:
                        slice_ms = 0
                    if self._want > (1 if wanted else 0):
                        # another thread wants the socket and its wake may have been taken
                        # by the holder before us (the Waker signals once until cleared)
                        step_aside = True
                        break
                    events = self._poller.poll(slice_ms)
                    readable = not events  # timed out: look once, so silence is proven
                    for obj, _ in events:
                        if obj is sock:
                            readable = True
                        elif obj is self._monitor:
                            self._read_monitor()
                        else:
                            self._waker.clear()
                            self._check_open()
                            with self._cv:
                                step_aside = self._want > (1 if wanted else 0)
                    if readable:
                        self._drain(w)
                    if w.done or step_aside:
                        break
                    if deadline is not None and _monotonic() >= deadline:
                        raise ChannelTimeout(f"no answer from {self.endpoint} within {timeout} s")
            finally:
                self._release(wanted)
            if step_aside:
                # Another thread needs the socket: let it in, unless it hands us our result
                # (or finds the host lost for us, which only a holder of the socket can).
                with self._cv:
                    while self._want and not w.done and not self._closed:
                        now = _monotonic()
                        if deadline is not None and now >= deadline:
                            raise ChannelTimeout(
                                f"no answer from {self.endpoint} within {timeout} s")
                        self._sleepers += 1
                        limit = 1.0 if deadline is None else min(1.0, deadline - now)
                        try:
                            self._cv.wait(limit)
                        finally:
                            self._sleepers -= 1

    def _drain(self, w=None) -> None:
        """Receive every message ready now and dispatch it; stop once w is satisfied.
        Socket lock held."""
        sock = self._sock
        while not self._closed:
            looked = _monotonic()
            try:
                f0 = sock.recv(_NOBLOCK)
            except zmq.Again:
                with self._cv:
                    self._proto.input_empty(looked)
                return
            frames = [f0]
            while sock.getsockopt(_RCVMORE):
                frames.append(sock.recv(copy=False).buffer)
            self._dispatch(frames)
            if w is not None and w.done:
                return

    def _dispatch(self, raw: list) -> None:
        """Feed one message to the protocol and deliver its events."""
        for_handler: list = []
        with self._cv:
            events = self._proto.receive(raw, _monotonic())
            handler = self._handler
            for e in events:
                if isinstance(e, Reply):
                    e.token.result = (e.msg, e.frames)
                elif isinstance(e, RequestFailed):
                    e.token.error = ChannelError(
                        f"malformed reply from host at {self.endpoint}: {e.error}")
                elif isinstance(e, ConnectionLost):
                    e.token.error = HostLost(f"host at {self.endpoint} is lost: {e.reason}")
                elif isinstance(e, Notification) and not self._claim(e):
                    if handler is not None:
                        for_handler.append(e)
                        continue
                    if len(self._queue) >= self._max_queued:
                        self._queue.popleft()
                        self.overflowed += 1
                    self._queue.append((e.msg, e.frames))
                    continue
                else:
                    continue
                if self._sleepers:
                    self._cv.notify_all()
        for e in events:
            if isinstance(e, Transmit):
                self._transmit(e.parts)
            elif isinstance(e, Malformed):
                log.warning("dropped a malformed message from host at %s: %s",
                            self.endpoint, e.error)
        for e in for_handler:
            self._local.in_handler = True
            try:
                handler(e.msg, e.frames)
            except Exception:
                log.exception("notification handler failed on %r", e.msg.get("op"))
            finally:
                self._local.in_handler = False

    def _claim(self, e: Notification) -> bool:
        """Hand a notification to a recv_until waiter that wants it; _cv held."""
        for w in self._waiters:
            if not w.done and self._matches(w, e.msg):
                w.result = (e.msg, e.frames)
                if self._sleepers:
                    self._cv.notify_all()
                return True
        return False

    @staticmethod
    def _matches(w: _Waiter, msg: dict) -> bool:
        try:
            return bool(w.predicate(msg))
        except Exception:
            log.exception("recv_until predicate failed")
            return False

    def _heartbeat_loop(self) -> None:
        """Drain and run the protocol's timers whenever no waiter holds the socket."""
        try:
            while True:
                with self._cv:
                    period = self._proto.period
                    due = self._proto.next_deadline(_monotonic())
                if period is None:  # disabled after start
                    if self._stop.wait(0.5):
                        return
                    continue
                if self._stop.wait(max(due - _monotonic(), period / 10)):
                    return
                if not self._sock_lock.acquire(blocking=False):
                    continue  # a waiter holds the socket and runs the timers itself
                try:
                    if self._closed:
                        return
                    self._read_monitor()
                    self._drain()
                    self._tick(_monotonic())
                finally:
                    self._sock_lock.release()
        except Exception:  # never raise from here; a closed socket ends the thread
            if not self._closed:
                log.warning("heartbeat thread for %s stopped", self.endpoint, exc_info=True)
