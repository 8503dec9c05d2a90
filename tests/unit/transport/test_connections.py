"""Linking socket-monitor events to the connections the ZAP handler names
(transport/connections.py; spec/pvgpu.md [CTL-HB-7]): events are fed in the order the
channel reads them, and every test checks that a connection is watched only when the
rule can prove which fd is its own."""

import os
import socket

from pvgpu.transport.connections import ConnectionWatch, matches, peer_credentials

PROC_A = {"transport": "ipc", "pid": 100, "uid": 1000, "gid": 1000}
PROC_B = {"transport": "ipc", "pid": 200, "uid": 1000, "gid": 1000}
ZAP_A = "localhost:1000:1000:100"
ZAP_B = "localhost:1000:1000:200"


def test_a_named_connection_is_reported_when_its_fd_closes():
    w = ConnectionWatch()
    w.accepted(7, 0, PROC_A)
    assert w.named(ZAP_A, "c1")
    assert w.credentials["c1"] == PROC_A
    assert w.disconnected(7) == "c1"
    assert "c1" not in w.credentials
    assert w.disconnected(7) is None  # once


def test_connections_of_different_processes_are_told_apart_in_any_order():
    w = ConnectionWatch()
    w.accepted(7, 0, PROC_A)
    w.accepted(8, 0, PROC_B)
    assert w.named(ZAP_B, "c1") and w.named(ZAP_A, "c2")
    assert w.disconnected(7) == "c2" and w.disconnected(8) == "c1"


def test_two_connections_of_one_process_handshaking_together_are_not_guessed():
    w = ConnectionWatch()
    w.accepted(7, 0, PROC_A)
    w.accepted(8, 0, PROC_A)
    assert not w.named(ZAP_A, "c1")
    assert not w.named(ZAP_A, "c2")
    assert w.disconnected(7) is None and w.disconnected(8) is None
    assert w.unwatched == 2


def test_one_process_connecting_again_later_is_watched():
    w = ConnectionWatch()
    w.accepted(7, 0, PROC_A)
    assert w.named(ZAP_A, "c1")
    w.accepted(8, 0, PROC_A)
    assert w.named(ZAP_A, "c2")
    assert w.disconnected(8) == "c2"


def test_a_connection_that_closed_before_it_was_named_keeps_its_record_from_others():
    """F closes with its ZAP request still queued; G, from the same process, is accepted.
    F's request must not take G's record (G's own request would then find none, or
    another connection's): it is F's or G's, not guessed; G's own request then has G."""
    w = ConnectionWatch()
    w.accepted(7, 0, PROC_A)  # F
    assert w.disconnected(7) is None  # a ghost until the queued ZAP requests are served
    w.accepted(8, 0, PROC_A)  # G
    assert not w.named(ZAP_A, "c1")  # F's request: F or G? not guessed
    w.forget_ghosts()
    assert w.named(ZAP_A, "c2")  # G's request: only G is left
    assert w.disconnected(8) == "c2"


def test_the_request_of_a_closed_connection_is_named_but_not_watched():
    w = ConnectionWatch()
    w.accepted(7, 0, PROC_A)
    w.disconnected(7)
    assert not w.named(ZAP_A, "c1")  # its own ghost: no fd to watch
    w.forget_ghosts()
    w.accepted(7, 0, PROC_A)  # the fd number again, a new connection
    assert w.named(ZAP_A, "c2")
    assert w.disconnected(7) == "c2"


def test_unknown_credentials_make_a_request_ambiguous():
    w = ConnectionWatch()
    w.accepted(7, 0, None)  # closed before its credentials could be read
    w.accepted(8, 0, PROC_A)
    assert not w.named(ZAP_A, "c1")


def test_tcp_peers_match_by_ip_address():
    creds = {"transport": "tcp", "address": "10.0.0.2:4000", "ip": "10.0.0.2"}
    assert matches(creds, "10.0.0.2") and not matches(creds, "10.0.0.3")
    assert matches(PROC_A, ZAP_A) and not matches(PROC_A, ZAP_B) and not matches(PROC_A, "x")


def test_peer_credentials_of_a_unix_socket_are_our_own_process():
    a, b = socket.socketpair(socket.AF_UNIX)
    try:
        creds = peer_credentials(a.fileno())
        assert (creds["pid"], creds["uid"], creds["gid"]) == (os.getpid(), os.getuid(), os.getgid())
        assert a.fileno() >= 0  # a dup was read; ours stays open
    finally:
        a.close()
        b.close()
    assert peer_credentials(a.fileno()) is None  # closed: nothing to say


def test_peer_credentials_of_a_tcp_socket_are_its_address():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    try:
        creds = peer_credentials(conn.fileno())
        assert creds["address"] == "127.0.0.1:%d" % client.getsockname()[1]
        assert creds["ip"] == "127.0.0.1"
    finally:
        for s in (conn, client, server):
            s.close()
