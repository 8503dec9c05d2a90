"""HostChannel and GuestChannel with CURVE (spec §2.13): who the ZAP handler lets in, how
a connection is named, how a guest learns that its handshake failed."""

from __future__ import annotations

import os
import queue
import shutil
import threading

import pytest

from pvgpu.transport import curve
from pvgpu.transport.channel import AuthenticationFailed, GuestChannel, HostChannel
from pvgpu.transport.codec import decode, reply_ok


class HostLoop(threading.Thread):
    """The host channel on a thread of its own (it serves ZAP from poll): answers every
    request and queues the Peer it came from. Every other call goes through `call`."""

    def __init__(self, chan: HostChannel):
        super().__init__(daemon=True, name="curve-host")
        self.chan = chan
        self.peers = queue.Queue()
        self._calls = queue.Queue()
        self._halt = threading.Event()
        self.start()

    def run(self):
        while not self._halt.is_set():
            msgs, _ = self.chan.poll(10)
            for peer, frames in msgs:
                msg = decode(frames)[0]
                self.chan.send_msg(peer, reply_ok(msg["seq"]))
                self.peers.put(peer)
            while not self._calls.empty():
                fn, box = self._calls.get()
                box.put(fn())

    def call(self, fn):
        box = queue.Queue()
        self._calls.put((fn, box))
        return box.get(timeout=10)

    def stop(self):
        self._halt.set()
        self.join(10)
        self.chan.close()


@pytest.fixture
def keys(tmp_path):
    d = str(tmp_path / "keys")
    pairs = {n: curve.read_secret_key(curve.write_keypair(d, n)[1]) for n in ("host", "a", "b")}
    auth = tmp_path / "authorized"
    auth.mkdir()
    shutil.copy(os.path.join(d, "a.key"), auth / "a.key")
    pairs["dir"] = auth
    return pairs


@pytest.fixture
def host(keys, tmp_path):
    loop = HostLoop(HostChannel(
        [f"ipc://{tmp_path}/h.sock", "tcp://127.0.0.1:0"],
        curve=curve.ServerKeys(keys["host"], curve.AuthorizedKeys(str(keys["dir"])))))
    yield loop
    loop.stop()


@pytest.fixture
def guests():
    made = []

    def make(endpoint, server=None, client=None):
        g = GuestChannel(endpoint, heartbeat_ms=0, server_key=server, client_key=client)
        made.append(g)
        return g

    yield make
    for g in made:
        g.close()


def _tcp(host):
    return host.chan.endpoints[1]


def _peer_of(host, g):
    g.request({"op": "ping"}, timeout=10)
    return host.peers.get(timeout=10)


def test_an_authorized_key_connects_and_its_connection_carries_the_fingerprint(host, keys, guests):
    g = guests(_tcp(host), keys["host"].public, keys["a"])
    g.await_handshake(10)
    peer = _peer_of(host, g)
    assert peer.key == keys["a"].fingerprint == g.curve_key
    assert peer.connection == f"c1/{keys['a'].fingerprint}"


def test_ipc_connections_stay_unauthenticated(host, guests):
    g = guests(host.chan.endpoints[0])
    g.await_handshake(10)  # a no-op on ipc
    peer = _peer_of(host, g)
    assert peer.key is None and peer.connection.startswith("c")


def test_a_key_not_listed_is_refused_in_the_handshake(host, keys, guests):
    # [CTL-AUTH-2]
    g = guests(_tcp(host), keys["host"].public, keys["b"])
    with pytest.raises(AuthenticationFailed, match="not among the host's authorized keys"):
        g.await_handshake(10)
    assert host.call(lambda: host.chan.connections_refused) >= 1
    assert host.call(lambda: host.chan.connections_accepted) == 0


def test_a_guest_without_keys_is_told_the_host_requires_curve(host, guests):
    # [CTL-AUTH-6]
    g = guests(_tcp(host))
    with pytest.raises(AuthenticationFailed, match="requires CURVE"):
        g.await_handshake(10)


def test_a_wrong_server_key_fails_the_handshake(host, keys, guests):
    g = guests(_tcp(host), keys["b"].public, keys["a"])
    with pytest.raises(AuthenticationFailed, match="server key"):
        g.await_handshake(10)


def test_reload_revokes_a_removed_key_for_new_handshakes(host, keys, guests):
    os.unlink(keys["dir"] / "a.key")
    shutil.copy(keys["dir"].parent / "keys" / "b.key", keys["dir"] / "b.key")
    assert host.call(host.chan.reload_authorized_keys) == {keys["a"].fingerprint}
    with pytest.raises(AuthenticationFailed):
        guests(_tcp(host), keys["host"].public, keys["a"]).await_handshake(10)
    g = guests(_tcp(host), keys["host"].public, keys["b"])
    g.await_handshake(10)
    assert _peer_of(host, g).key == keys["b"].fingerprint


def test_curve_needs_both_keys():
    with pytest.raises(Exception, match="both"):
        GuestChannel("tcp://127.0.0.1:1", heartbeat_ms=0, server_key=curve.generate().public)


def test_a_guest_with_keys_does_not_fall_back_to_an_insecure_host(keys, guests, tmp_path):
    # [CTL-AUTH-3]
    loop = HostLoop(HostChannel(["tcp://127.0.0.1:0"]))  # --insecure: NULL on tcp
    try:
        g = guests(loop.chan.endpoints[0], keys["host"].public, keys["a"])
        with pytest.raises(AuthenticationFailed):
            g.await_handshake(10)
        assert loop.call(lambda: loop.chan.connections_accepted) == 0
    finally:
        loop.stop()
