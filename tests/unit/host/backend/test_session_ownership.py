"""Who owns a session and its memory (spec [CTL-ENDPOINT-4], [CTL-ENDPOINT-5],
[CTL-MEMTABLE-3], [CTL-MEMTABLE-5]), through Backend.handle with sans-IO guests: a session
belongs to the connection that said hello, whatever routing identity a later connection
presents, and maps only memory its own peer has proven to control."""

import os
import struct
import time

import pytest

from pvgpu.spec import wire
from pvgpu.transport import codec
from pvgpu.transport.memory import SharedGuestMemory
from pvgpu.transport.peer import Peer

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
SHARED_HELLO = dict(HELLO, memory=wire.MEMORY_SHARED)


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
    # [CTL-RECLAIM-3] nothing is sent for a reclaimed session
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


# ------------------------------------------------------------------ shared memory ownership

def shared_session(backend, peer):
    reply, _ = request(backend, peer, wire.OP_HELLO, **SHARED_HELLO)
    challenge = reply["mem_challenge"]
    assert isinstance(challenge, bytes) and len(challenge) == wire.MEM_CHALLENGE_SIZE
    return challenge


def set_mem_table(backend, peer, name):
    reply, _ = request(backend, peer, wire.OP_SET_MEM_TABLE, seq=2,
                       regions=[{"gpa": 0, "size": SHARED_HELLO["mem_size"], "name": name}])
    return reply


def test_another_guests_memory_is_refused(backend):
    # [DEV-ISOLATE-2] a session cannot map another session's guest memory
    victim_peer, thief_peer = Peer(0, b"victim", "c1"), Peer(0, b"thief", "c2")
    victim_challenge = shared_session(backend, victim_peer)
    shared_session(backend, thief_peer)
    with SharedGuestMemory.create(SHARED_HELLO["mem_size"]) as victim_mem:
        victim_mem.write(wire.MEM_CHALLENGE_GPA, victim_challenge)
        assert set_mem_table(backend, victim_peer, victim_mem.name)["ok"]
        victim_mem.write(4096, b"secret")
        reply = set_mem_table(backend, thief_peer, victim_mem.name)  # its /proc path
        assert reply["ok"] is False and reply["error"] == wire.CTL_ERR_BAD_MEMORY
        assert "challenge" in reply["message"]
        (thief,) = [s for s in backend.sessions.values() if s.peer == thief_peer]
        assert thief.mem is None


def test_own_memory_needs_the_sessions_challenge(backend):
    peer = Peer(0, b"g", "c1")
    challenge = shared_session(backend, peer)
    with SharedGuestMemory.create(SHARED_HELLO["mem_size"]) as mem:
        mem.write(wire.MEM_CHALLENGE_GPA, bytes(reversed(challenge)))
        assert set_mem_table(backend, peer, mem.name)["error"] == wire.CTL_ERR_BAD_MEMORY
        mem.write(wire.MEM_CHALLENGE_GPA, challenge)  # a refused request changed nothing
        assert set_mem_table(backend, peer, mem.name)["ok"]


def test_each_session_gets_its_own_challenge(backend):
    a = shared_session(backend, Peer(0, b"a", "c1"))
    b = shared_session(backend, Peer(0, b"b", "c2"))
    assert a != b
    reply, _ = request(backend, Peer(0, b"c", "c3"), wire.OP_HELLO, **HELLO)
    assert "mem_challenge" not in reply  # inline: nothing to prove


def test_a_descriptor_that_is_not_memory_is_not_opened_for_io(backend):
    peer = Peer(0, b"g", "c1")
    shared_session(backend, peer)
    r, w = os.pipe()  # opening a FIFO read/write through /proc would have effects
    try:
        reply = set_mem_table(backend, peer, f"/proc/{os.getpid()}/fd/{r}")
        assert reply["error"] == wire.CTL_ERR_BAD_MEMORY and "not a memory file" in reply["message"]
    finally:
        os.close(r)
        os.close(w)
