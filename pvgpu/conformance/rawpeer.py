"""A raw peer of the control channel: a bare DEALER socket that sends any frames at all.

The project's own transport never sends an undecodable frame, a request without `seq` or
another session's routing identity; a conformance check has to. Every receive has a
deadline: a host that does not answer makes `request` raise NoAnswer, never hang.
"""

from __future__ import annotations

import msgpack
import zmq


class NoAnswer(AssertionError):
    """The host sent no reply within the deadline."""


class RawPeer:
    """A bare DEALER socket: sends arbitrary frames, receives with a deadline."""

    def __init__(self, endpoint: str, routing_id: bytes | None = None, *, timeout: float = 30.0,
                 curve=(None, None)):
        """curve: (the host's public key, a client pvgpu.transport.curve.KeyPair) to be a CURVE
        client (spec §2.13), or (None, None)."""
        self.timeout_ms = int(timeout * 1000)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        if routing_id is not None:
            self.sock.routing_id = routing_id
        server_key, client = curve
        if server_key is not None:
            self.sock.curve_serverkey = server_key
            self.sock.curve_publickey = client.public
            self.sock.curve_secretkey = client.secret
        self.sock.connect(endpoint)
        self.seq = 0

    def send_frames(self, frames) -> None:
        self.sock.send_multipart(frames)

    def recv(self, timeout_ms: int | None = None):
        """-> (decoded frame 0, the other frames), or None when nothing came in time."""
        if not self.sock.poll(self.timeout_ms if timeout_ms is None else timeout_ms):
            return None
        frames = self.sock.recv_multipart()
        return msgpack.unpackb(frames[0], raw=False), frames[1:]

    def request(self, msg: dict, frames=(), timeout_ms: int | None = None) -> dict:
        """Send msg with the next seq; -> its reply. NoAnswer when none came in time."""
        timeout_ms = self.timeout_ms if timeout_ms is None else timeout_ms
        self.seq += 1
        msg = dict(msg, seq=self.seq)
        self.send_frames([msgpack.packb(msg, use_bin_type=True), *frames])
        while True:
            got = self.recv(timeout_ms)
            if got is None:
                raise NoAnswer(f"no answer within {timeout_ms / 1000:g} s to {msg.get('op')!r}")
            if got[0].get("op") == "reply" and got[0].get("seq") == self.seq:
                return got[0]

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()
