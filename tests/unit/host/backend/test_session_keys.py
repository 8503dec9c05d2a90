"""A session is bound to the CURVE key its connection authenticated with (spec
[CTL-AUTH-4], [CTL-AUTH-5]), through Backend.handle with sans-IO peers."""

import pytest

from spec import wire
from transport.peer import Peer

from test_backend import _backend
from test_session_ownership import HELLO, request


@pytest.fixture
def backend():
    yield from _backend()


KEY_A, KEY_B = "1f2e3d4c5b6a7988", "0011223344556677"


def test_the_session_records_its_connection_key():
    assert Peer(0, b"g", f"c3/{KEY_A}").key == KEY_A
    assert Peer(0, b"g", "c3").key is None and Peer(0, b"g", None).key is None


def test_hello_records_the_key(backend):
    peer = Peer(0, b"g", f"c1/{KEY_A}")
    assert request(backend, peer, wire.OP_HELLO, **HELLO)[0]["ok"]
    (session,) = backend.sessions.values()
    assert session.key == KEY_A


def test_revoking_a_key_closes_its_sessions_only(backend):
    a, b, plain = Peer(0, b"a", f"c1/{KEY_A}"), Peer(0, b"b", f"c2/{KEY_B}"), Peer(1, b"p", "c3")
    for p in (a, b, plain):
        assert request(backend, p, wire.OP_HELLO, **HELLO)[0]["ok"]
    backend.revoke_keys({KEY_A})
    assert sorted(s.peer.connection for s in backend.sessions.values()) == [f"c2/{KEY_B}", "c3"]
    assert backend.stats["revoked_sessions"] == 1
    reply, _ = request(backend, a, wire.OP_GET_STATUS, seq=2, dev=0)
    assert reply["error"] == wire.CTL_ERR_NO_SESSION


def test_a_connection_of_a_revoked_key_cannot_say_hello(backend):
    early = Peer(0, b"e", f"c1/{KEY_A}")  # handshake done before the revocation
    backend.revoke_keys({KEY_A})
    reply, _ = request(backend, early, wire.OP_HELLO, **HELLO)
    assert reply["ok"] is False and reply["error"] == wire.CTL_ERR_UNAUTHORIZED
    backend.revoke_keys(set())  # listed again
    assert request(backend, early, wire.OP_HELLO, seq=2, **HELLO)[0]["ok"]
