"""Black-box conformance fixtures: a real host and a raw DEALER that speaks the wire directly.

Set PVGPU_CONFORMANCE_ENDPOINT=ipc://... or tcp://... to run the suite against another
implementation of the spec instead of a `pvgpu host` started here.
"""

import os

import msgpack
import pytest
import zmq

import guest
from rawdevice import Raw


class RawPeer:
    """A bare DEALER socket: sends arbitrary frames, receives with a deadline."""

    def __init__(self, endpoint, routing_id: bytes | None = None):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        if routing_id is not None:
            self.sock.routing_id = routing_id
        self.sock.connect(endpoint)
        self.seq = 0

    def send_frames(self, frames):
        self.sock.send_multipart(frames)

    def recv(self, timeout_ms=30_000):
        if not self.sock.poll(timeout_ms):
            return None
        frames = self.sock.recv_multipart()
        return msgpack.unpackb(frames[0], raw=False), frames[1:]

    def request(self, msg, frames=(), timeout_ms=30_000):
        self.seq += 1
        msg = dict(msg, seq=self.seq)
        self.send_frames([msgpack.packb(msg, use_bin_type=True), *frames])
        while True:
            got = self.recv(timeout_ms)
            if got is None:
                return None
            if got[0].get("op") == "reply" and got[0].get("seq") == self.seq:
                return got[0]

    def close(self):
        self.sock.close()
        self.ctx.term()


class ExternalHost:
    def __init__(self, endpoint):
        self.endpoint = endpoint
        self.endpoints = [endpoint]


@pytest.fixture(scope="module")
def conformance_host(request):
    """The implementation under test: PVGPU_CONFORMANCE_ENDPOINT, or our own host."""
    endpoint = os.environ.get("PVGPU_CONFORMANCE_ENDPOINT")
    if endpoint:
        return ExternalHost(endpoint)
    return request.getfixturevalue("shared_host")


@pytest.fixture
def raw_peer(conformance_host):
    """A factory of raw DEALER peers speaking the control channel directly."""
    peers = []

    def make(endpoint=None, routing_id=None):
        p = RawPeer(endpoint or conformance_host.endpoint, routing_id)
        peers.append(p)
        return p
    try:
        yield make
    finally:
        for p in peers:
            p.close()


@pytest.fixture(params=["shared", "inline"])
def raw(request, conformance_host):
    """Raw device requests through a real driver (rawdevice.Raw), in both memory models."""
    with guest.connect(conformance_host.endpoint, memory=request.param, mem_size=32 << 20) as conn:
        yield Raw(conn)


@pytest.fixture
def two(conformance_host):
    """Two sessions (two guests, as far as the host can tell), one per memory model."""
    with guest.connect(conformance_host.endpoint, mem_size=16 << 20) as a, \
            guest.connect(conformance_host.endpoint, memory="inline", mem_size=16 << 20) as b:
        yield Raw(a), Raw(b)
