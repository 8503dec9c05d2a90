"""Who a control message came from, as the host sees it (spec/pvgpu.md [CTL-ENDPOINT-4]).

ZeroMQ's ROUTER socket routes replies by *routing identity*, a name the connecting peer
may choose itself. A name is not a connection: once a guest's connection closes, any new
connection may present the same identity. The host channel therefore tags every message
with the transport **connection** it arrived on as well (a name the host assigns when it
accepts the connection and never reuses), and a session belongs to that connection.
On a CURVE endpoint the name also carries the fingerprint of the client key the
connection authenticated with ("c7/1f2e3d4c5b6a7988", spec [CTL-AUTH-5]).

This module has no zmq import, so the sans-IO backend can use it.
"""

from __future__ import annotations

from typing import NamedTuple


class Peer(NamedTuple):
    socket: int  # index of the host's ROUTER socket (endpoint) the message arrived on
    identity: bytes  # the ZeroMQ routing identity: where replies to this peer are routed
    connection: str  # the transport connection, unique for the host channel's lifetime

    @property
    def key(self):
        """Fingerprint of the CURVE key the connection authenticated with, or None."""
        conn = self.connection
        if conn is None or "/" not in conn:
            return None
        return conn.partition("/")[2]

    @property
    def route(self) -> tuple:
        """Where messages for this peer go: (socket, identity). Two connections may share
        a route one after the other, never at the same time."""
        return (self.socket, self.identity)
