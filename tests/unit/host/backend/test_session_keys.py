"""A session is bound to the CURVE key its connection authenticated with (spec
[CTL-AUTH-4], [CTL-AUTH-5]), through Backend.handle with sans-IO peers."""

import pytest

from pvgpu.spec import wire
from pvgpu.transport import codec
from pvgpu.transport.peer import Peer

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
    # [CTL-AUTH-5]
    peer = Peer(0, b"g", f"c1/{KEY_A}")
    assert request(backend, peer, wire.OP_HELLO, **HELLO)[0]["ok"]
    (session,) = backend.sessions.values()
    assert session.key == KEY_A


def test_revoking_a_key_closes_its_sessions_only(backend):
    # [CTL-AUTH-4]
    a, b, plain = Peer(0, b"a", f"c1/{KEY_A}"), Peer(0, b"b", f"c2/{KEY_B}"), Peer(1, b"p", "c3")
    for p in (a, b, plain):
        assert request(backend, p, wire.OP_HELLO, **HELLO)[0]["ok"]
    backend.revoke_keys({KEY_A})
    assert sorted(s.peer.connection for s in backend.sessions.values()) == [f"c2/{KEY_B}", "c3"]
    assert backend.stats["revoked_sessions"] == 1
    assert request(backend, b, wire.OP_GET_STATUS, seq=2, dev=0)[0]["ok"]


def test_a_revoked_connection_is_answered_nothing(backend):
    # [CTL-AUTH-4]
    """Its driver must see the host gone (CTL-HB-4), not a host that answers its pings."""
    a, early = Peer(0, b"a", f"c1/{KEY_A}"), Peer(0, b"e", f"c2/{KEY_A}")
    assert request(backend, a, wire.OP_HELLO, **HELLO)[0]["ok"]
    backend.revoke_keys({KEY_A})
    for peer in (a, early):  # the session's connection; one that had not said hello yet
        for op, fields in ((wire.OP_PING, {}), (wire.OP_GET_STATUS, {"dev": 0}),
                           (wire.OP_HELLO, HELLO)):
            assert backend.handle(peer, codec.encode({"op": op, "seq": 9, **fields}), 0.0) == []
        assert backend.handle(peer, [b"\x81\xa3seq\x07"], 0.0) == []  # undecodable, with a seq
    assert backend.stats["revoked_messages"] == 8 and not backend.sessions
    backend.revoke_keys(set())  # listed again
    assert request(backend, early, wire.OP_HELLO, seq=2, **HELLO)[0]["ok"]
