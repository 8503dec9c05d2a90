"""Which transport connection a ZeroMQ socket-monitor event is about (spec/pvgpu.md
[CTL-HB-7]), and who is at the other end of it ([CMD-STATS-1]).

The host channel names every connection while accepting it: its ZAP handler gives the
connection a User-Id ("c1", "c2", ...) that ZeroMQ attaches to every message the
connection delivers. A socket monitor reports the same connections by their file
descriptor: ``ACCEPTED`` (fd) when the listener accepts one, ``DISCONNECTED`` (fd) when it
closes. Nothing libzmq 4.3 gives carries both: the ZAP request has only the peer's
address (tcp: the IP address without the port; ipc: ``localhost:<uid>:<gid>:<pid>`` from
SO_PEERCRED), the handshake events carry no fd. ``ConnectionWatch`` links the two.

Mapping rule
    On ``ACCEPTED`` the channel reads the peer's credentials from the fd (a dup of it:
    SO_PEERCRED on ipc, getpeername on tcp) and opens a *record* for the fd. When a ZAP
    request names a connection, the candidates are the records not named yet whose
    credentials match the request's address; the connection gets the record only if
    there is exactly one candidate. Two facts make that exact:
      * a connection's ``ACCEPTED`` is emitted before its ZAP request exists, so the
        channel, which reads every monitor event before it serves ZAP, always has the
        record of the connection it names among the candidates;
      * a record that closed before its connection was named stays a candidate (a
        *ghost*) until the ZAP requests queued when its ``DISCONNECTED`` was read have
        all been served: its own request, if it ever made one, was queued before that.
    So a record is never taken by another connection's request, and a request with one
    candidate names its own connection. With several (connections from one process or,
    on tcp, one IP address, handshaking at the same time) nothing is guessed: that
    connection is not watched, and only heartbeats reclaim its session ([CTL-HB-3]).

This module has no zmq import: the channel feeds it events and ZAP addresses.
"""

from __future__ import annotations

import os
import socket
import struct

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_credentials(fd: int):
    """Who is at the other end of the connected socket `fd` -> a dict (ipc: ``pid``,
    ``uid``, ``gid`` where SO_PEERCRED exists; tcp: ``address`` "ip:port"), or None if
    the fd is closed already or says nothing. The fd itself is left alone (a dup is read)."""
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    try:
        if s.family == socket.AF_UNIX:
            opt = getattr(socket, "SO_PEERCRED", None)
            if opt is None:
                return {"transport": "ipc"}
            pid, uid, gid = _UCRED.unpack(s.getsockopt(socket.SOL_SOCKET, opt, _UCRED.size))
            return {"transport": "ipc", "pid": pid, "uid": uid, "gid": gid}
        if s.family in (socket.AF_INET, socket.AF_INET6):
            host, port = s.getpeername()[:2]
            return {"transport": "tcp", "address": f"{host}:{port}", "ip": host}
        return None
    except OSError:
        return None
    finally:
        s.close()


def matches(creds, zap_address: str) -> bool:
    """Whether a connection with credentials `creds` can be the one whose ZAP request
    gave `zap_address`. Unknown credentials match every address (they make a request
    ambiguous rather than naming the wrong record)."""
    if not creds or ("pid" not in creds and "ip" not in creds):
        return True
    if "ip" in creds:
        return zap_address == creds["ip"]
    fields = zap_address.rsplit(":", 3)
    if len(fields) != 4:
        return False
    try:
        uid, gid, pid = (int(f) for f in fields[1:])
    except ValueError:
        return False
    return (uid, gid, pid) == (creds["uid"], creds["gid"], creds["pid"])


class _Record:
    __slots__ = ("fd", "socket", "creds", "name", "closed")

    def __init__(self, fd: int, socket_index: int, creds):
        self.fd = fd
        self.socket = socket_index
        self.creds = creds
        self.name = None  # the connection's User-Id once a ZAP request named it
        self.closed = False


class ConnectionWatch:
    """Records of accepted connections, fed in event order: ``accepted`` and
    ``disconnected`` from the monitors, ``named`` from the ZAP handler. The channel calls
    ``forget_ghosts`` once it has found the ZAP socket empty after reading the monitors
    (every request queued before the disconnects it read has been served then)."""

    def __init__(self):
        self._by_fd: dict = {}  # fd -> the open record of that fd
        self._ghosts: list = []  # records closed before they were named
        self.credentials: dict = {}  # connection name -> peer credentials (watched ones)
        self.unwatched = 0  # connections named without a record of their own (ambiguous)

    @property
    def watched(self) -> int:
        """Open connections that have a name (a disconnect of one is reported)."""
        return sum(1 for r in self._by_fd.values() if r.name is not None)

    def accepted(self, fd: int, socket_index: int, creds) -> None:
        old = self._by_fd.pop(fd, None)
        if old is not None:  # its DISCONNECTED was lost: the fd number is reused
            self._close(old)
        self._by_fd[fd] = _Record(fd, socket_index, creds)

    def disconnected(self, fd: int):
        """-> the name of the watched connection that closed, or None."""
        rec = self._by_fd.pop(fd, None)
        return None if rec is None else self._close(rec)

    def _close(self, rec: _Record):
        rec.closed = True
        if rec.name is None:
            self._ghosts.append(rec)
            return None
        self.credentials.pop(rec.name, None)
        return rec.name

    def named(self, zap_address: str, name: str) -> bool:
        """The ZAP handler names a connection whose request gave zap_address. -> whether
        the connection is watched from now on (its record was the only candidate)."""
        candidates = [r for r in self._by_fd.values() if r.name is None
                      and matches(r.creds, zap_address)]
        candidates += [g for g in self._ghosts if g.name is None and matches(g.creds, zap_address)]
        if len(candidates) != 1:
            self.unwatched += 1
            return False
        rec = candidates[0]
        rec.name = name
        if rec.closed:  # the request of a connection that has closed already
            return False
        self.credentials[name] = rec.creds
        return True

    def forget_ghosts(self) -> None:
        self._ghosts = []
