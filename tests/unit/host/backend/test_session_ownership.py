"""Who owns a session (spec [CTL-ENDPOINT-4], [CTL-ENDPOINT-5]), through Backend.handle
with sans-IO guests: a session belongs to the connection that said hello, whatever routing
identity a later connection presents."""

import struct
import time

import pytest

from spec import wire
from transport import codec
from transport.peer import Peer

from test_backend import Guest, _backend, cmd


@pytest.fixture
def backend():
    yield from _backend()


def request(backend, peer, op, seq=1, **fields):
    """-> the reply to one request from `peer`, and everything else sent (to anyone)."""
    out = backend.handle(peer, codec.encode({"op": op, "seq": seq, **fields}), 0.0)
    replies = [codec.decode(f)[0] for p, f in out if p == peer]
    (reply,) = [r for r in replies if r.get("op") == wire.OP_REPLY and r["seq"] == seq]
    return reply, out


HELLO = dict(version=list(wire.PROTOCOL_VERSION), name="t", memory=wire.MEMORY_INLINE,
             mem_size=4 << 20)


def test_a_later_connection_with_the_same_identity_gets_no_session(backend):
    first, later = Peer(0, b"guest", "c1"), Peer(0, b"guest", "c2")
    reply, _ = request(backend, first, wire.OP_HELLO, **HELLO)
    sid = reply["session"]
    assert request(backend, first, wire.OP_GET_STATUS, seq=2, dev=0)[0]["ok"]
    # the takeover: same route, another connection (the first one has closed)
    reply, _ = request(backend, later, wire.OP_GET_STATUS, seq=1, dev=0)
    assert reply["ok"] is False and reply["error"] == wire.CTL_ERR_NO_SESSION
    # ... and the old session is over, not merely hidden ([CTL-ENDPOINT-5])
    assert not any(s.sid == sid for s in backend.sessions.values())
    assert backend.stats["replaced_connections"] == 1
    reply, _ = request(backend, later, wire.OP_HELLO, seq=2, **HELLO)
    assert reply["ok"] and reply["session"] != sid


def test_a_later_connection_cannot_say_hello_into_the_old_session(backend):
    first, later = Peer(0, b"guest", "c1"), Peer(0, b"guest", "c2")
    request(backend, first, wire.OP_HELLO, **HELLO)
    reply, _ = request(backend, later, wire.OP_HELLO, **HELLO)
    assert reply["ok"]  # a session of its own, not bad_state for the old one's
    (session,) = backend.sessions.values()
    assert session.peer == later


def test_notifications_of_a_replaced_session_are_never_sent(backend):
    victim = Guest(backend, name=b"victim")
    victim.init()
    ctx = 1
    victim.call(cmd(wire.CMD_CTX_CREATE, (0, b"v"), ctx_id=ctx))
    # a held chain: a fenced 50 ms burn whose completion would be sent to the route
    victim.submit(cmd(wire.CMD_LAUNCH, (wire.KERNEL_BURN, 1, 1, 1, 1, 1, 1, 1), ctx_id=ctx,
                      flags=wire.FLAG_FENCE, fence_id=1, extra=struct.pack("<Q", 50_000)))
    thief = Peer(victim.peer.socket, victim.peer.identity, "thief")
    reply, out = request(backend, thief, wire.OP_GET_STATUS, dev=0)
    assert reply["error"] == wire.CTL_ERR_NO_SESSION
    assert [p for p, _f in out] == [thief]  # only the refusal
    sent = []
    deadline = time.monotonic() + 0.5  # ten times the burn: whatever it posts, we see
    while time.monotonic() < deadline:
        sent += backend.run_completions()
        time.sleep(0.005)
    assert sent == []  # nothing of the old session, to anyone


def test_connections_with_other_routes_are_left_alone(backend):
    a, b = Peer(0, b"a", "c1"), Peer(1, b"a", "c2")  # same identity on another endpoint
    request(backend, a, wire.OP_HELLO, **HELLO)
    request(backend, b, wire.OP_HELLO, **HELLO)
    assert len(backend.sessions) == 2
    assert request(backend, a, wire.OP_GET_STATUS, seq=2, dev=0)[0]["ok"]
