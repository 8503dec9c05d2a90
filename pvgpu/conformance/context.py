"""What a check runs against (Target) and what it is handed (Context).

A Target is the implementation under test: its endpoint, the memory models to use, the
longest wait for any answer, and what the probe learnt of its devices. A Context is one
run of one check: it hands out raw peers, driver sessions and guest processes, and stops
every one of them in `close()`, whatever the check did.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pvgpu.spec import wire
from pvgpu.transport.curve import guest_keys

from pvgpu.conformance.rawpeer import RawPeer

MEMORY_MODELS = (wire.MEMORY_SHARED, wire.MEMORY_INLINE)


class Skip(Exception):
    """The check does not apply to this target; the message says why."""


@dataclass
class Target:
    endpoint: str
    memories: tuple = MEMORY_MODELS
    timeout: float = 60.0  # the longest a check may take, and any wait in it
    endpoints: tuple = ()  # every endpoint of the same host (default: endpoint alone)
    # a host that keeps a vanished guest's session for long (CTL-ENDPOINT-4's takeover
    # meets the old session still alive); default: endpoint
    patient_endpoint: str | None = None
    features: dict = field(default_factory=dict)  # device index -> the features it offers
    # CURVE keys for a tcp endpoint (spec §2.13): the host's public key and a client key
    # pair the host authorizes, each a key file or Z85 text (pvgpu.transport.curve.guest_keys;
    # default: $PVGPU_SERVER_KEY, $PVGPU_CLIENT_KEY)
    server_key: str | None = None
    client_key: str | None = None

    def curve_for(self, endpoint: str) -> tuple:
        """-> (host public key, client KeyPair) for a connection to endpoint, or (None, None)."""
        return guest_keys(endpoint, self.server_key, self.client_key)


class Context:
    def __init__(self, target: Target, memory: str | None = None):
        self.target = target
        self.endpoint = target.endpoint
        self.endpoints = tuple(target.endpoints) or (target.endpoint,)
        self.patient_endpoint = target.patient_endpoint or target.endpoint
        self.memory = memory or target.memories[0]
        self.timeout = target.timeout
        self._closers = []
        self.closed = False
        self.cancelled = False  # set by the runner when the check ran out of time

    # -------------------------------------------------------------- factories
    def raw_peer(self, endpoint: str | None = None, routing_id: bytes | None = None) -> RawPeer:
        """A raw DEALER peer of the control channel (rawpeer.py)."""
        self._check_open()
        endpoint = endpoint or self.endpoint
        p = RawPeer(endpoint, routing_id, timeout=self.timeout, curve=self.target.curve_for(endpoint))
        self._closers.append(p.close)
        return p

    def connect(self, endpoint: str | None = None, *, memory: str | None = None,
                mem_size: int = 16 << 20, **kw):
        """A session of our own driver (guest.connect) in `memory` (default: this run's);
        Skip when that is the shared model and it was not selected."""
        from pvgpu import guest  # (on demand: codeobj.py's users on the host side need none of it)
        self._check_open()
        memory = memory or self.memory
        if memory == wire.MEMORY_SHARED and memory not in self.target.memories:
            # (inline works anywhere; shared needs the host on this machine)
            raise Skip("needs the shared memory model, not selected (--memory)")
        endpoint = endpoint or self.endpoint
        if self.target.server_key is not None or self.target.client_key is not None:
            kw.setdefault("server_key", self.target.server_key)
            kw.setdefault("client_key", self.target.client_key)
        conn = guest.connect(endpoint, memory=memory, mem_size=mem_size,
                             timeout=self.timeout, **kw)
        self._closers.append(conn.close)
        return conn

    def raw(self):
        """Raw device requests through our driver (rawdevice.Raw), in this run's model."""
        from pvgpu.conformance.rawdevice import Raw
        return Raw(self.connect(mem_size=32 << 20))

    def two(self) -> tuple:
        """Two sessions (two guests, as far as the host can tell): one per memory model
        when both are selected."""
        from pvgpu.conformance.rawdevice import Raw
        first, second = self.target.memories[0], self.target.memories[-1]
        return Raw(self.connect(memory=first)), Raw(self.connect(memory=second))

    def spawn_guest(self, args):
        """`python -m pvgpu ARGS` as a child process, killed and reaped at close."""
        from pvgpu.procs import reap, spawn_guest
        self._check_open()
        args = list(args)
        if "--connect" in args:  # the guest sub-commands take the target's CURVE keys too
            for flag, key in (("--server-key", self.target.server_key),
                              ("--client-key", self.target.client_key)):
                if key is not None:
                    args += [flag, key]
        proc = spawn_guest(args)
        self._closers.append(lambda: proc.poll() is not None or reap(proc, 0))
        return proc

    # -------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Stop everything the check started, newest first; -> nothing, raises nothing."""
        self.closed = True
        while self._closers:
            try:
                self._closers.pop()()
            except Exception:  # noqa: BLE001 -- a close that fails must not stop the others
                pass

    def _check_open(self) -> None:
        if self.closed or self.cancelled:
            raise RuntimeError("the check ran out of time: its context is closed")

    def fixture(self, need: str):
        """The value of a check parameter named `need` (registry.NEEDS)."""
        return {"ctx": lambda: self, "raw_peer": lambda: self.raw_peer, "raw": self.raw,
                "two": self.two}[need]()
