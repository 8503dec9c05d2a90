"""A connection: one guest session with the host (guest/frontend) and its devices, the
pinned host memory it hands out (guest/api/pinned.py) and the lock every API call on its
objects takes (guest/api/locking.py).

    from pvgpu import guest
    with guest.connect() as conn:
        ctx = conn.devices[0].create_context()
        a = ctx.to_device(np.arange(n, dtype=np.float32))
        c = ctx.empty(n, np.float32)
        ctx.launch("vector_add", grid=..., block=256, args=(a, b, c, n))
        out = c.to_host()
"""

from __future__ import annotations

import threading

import numpy as np

from pvgpu.guest.api import errors, lifetime, pinned
from pvgpu.guest.api.device import Device
from pvgpu.guest.api.locking import ApiObject, unlocked
from pvgpu.guest.frontend.session import FrontendSession
from pvgpu.spec import wire


def connect(endpoint: str | None = None, *, memory: str = wire.MEMORY_SHARED,
            mem_size: int = wire.DEFAULT_GUEST_MEM_SIZE, name: str | None = None,
            heartbeat_ms: int | None = None, timeout: float = 10.0,
            features: int | None = None, vgpu: str | None = None,
            server_key=None, client_key=None) -> "Connection":
    """Open a guest session with the host at `endpoint` (default: $PVGPU_ENDPOINT if set,
    else the local ipc endpoint). No host at an ipc endpoint raises HostNotFound at once.

    memory: "shared" (zero-copy POSIX shared memory, same machine) or "inline" (guest
    memory mirrored through the messages; works across machines). features: the virtio
    feature bits the driver accepts (default: all it knows); VIRTIO_F_VERSION_1 is
    required. vgpu: the name of a host-configured vGPU to join (`pvgpu host --vgpu`);
    without it the host assigns one (`conn.vgpu` tells which).

    server_key, client_key: CURVE keys for a tcp endpoint (spec §2.13; ignored on ipc):
    the host's public key (a `.key` file or its 40-character Z85 text) and this guest's
    key pair (a `.key_secret` file from `pvgpu keygen`, or the Z85 text of the secret
    key). Default: the environment variables PVGPU_SERVER_KEY and PVGPU_CLIENT_KEY,
    which take the same values. A host that refuses the keys raises
    AuthenticationError at once."""
    try:
        return Connection(FrontendSession(endpoint, memory=memory, mem_size=mem_size, name=name,
                                          heartbeat_ms=heartbeat_ms, timeout=timeout, vgpu=vgpu,
                                          features=features, server_key=server_key,
                                          client_key=client_key))
    except Exception as e:
        mapped = errors.translate(e)
        if mapped is e:
            raise
        raise mapped from None


class Connection(ApiObject):
    """One guest session with a pvgpu host, as `guest.connect()` returns it.

    `devices` lists the host's GPUs (Device objects, index order). The connection owns
    the session's guest memory and pinned memory; every API call on any of its objects
    holds its lock, so threads may share it. `close()` (or leaving a `with` block) ends the
    session: the host reclaims every context, buffer and event it created."""

    def __init__(self, session: FrontendSession):
        self.session = session
        self._conn_lock = threading.RLock()
        self._releases = lifetime.Releases(self)
        self._pinned = pinned.PinnedAllocator(self)
        self.devices = [Device(self, drv) for drv in session.devices]

    def pinned_empty(self, shape, dtype=np.float32) -> "pinned.PinnedArray":
        """A numpy array in pinned memory (inside guest memory, from the session heap):
        copies between it and a DeviceArray are one DMA, no bounce (guest/api/pinned.py).
        Give it back with `free()` or a `with` block."""
        return self._pinned.empty(shape, dtype)

    def pinned_zeros(self, shape, dtype=np.float32) -> "pinned.PinnedArray":
        """`pinned_empty(shape, dtype)` filled with zeros."""
        arr = self._pinned.empty(shape, dtype)
        arr.fill(0)
        return arr

    def pinned_array(self, data, dtype=None) -> "pinned.PinnedArray":
        """A pinned copy of `data`."""
        data = np.asarray(data, dtype=dtype)
        arr = self._pinned.empty(data.shape, data.dtype)
        arr[...] = data
        return arr

    @property
    @unlocked("a session field fixed at connect")
    def memory_model(self) -> str:
        """"shared" (guest memory mapped by the host) or "inline" (carried in messages)."""
        return self.session.memory

    @property
    @unlocked("a session field fixed at connect")
    def vgpu(self) -> dict | None:
        """The vGPU the host bound this session to ({name, compute, copy, mem} shares in
        percent), or None when the host has no vGPUs configured."""
        return self.session.vgpu

    @property
    @unlocked("a session field fixed at connect")
    def endpoint(self) -> str:
        """The host endpoint this session is connected to (ipc:// or tcp://)."""
        return self.session.endpoint

    @unlocked("takes the connection lock itself")
    def close(self) -> None:
        """End the session (BYE): the host frees everything it holds for it. Objects of
        this connection are unusable afterwards; a second close() does nothing."""
        with self._conn_lock:
            self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<pvgpu.Connection {self.endpoint} {self.memory_model} devices={len(self.devices)}>"
