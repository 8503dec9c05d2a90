"""A device of a connection (one virtio-gpu device the host emulates): its properties and
statistics, the contexts this connection created on it, its event queue (page faults and
lost contexts, spec §5.7), events imported onto it, shared device memory, exports and
peer access, and its reset after DEVICE_NEEDS_RESET.
"""

from __future__ import annotations

import collections
import itertools
import struct
from typing import TYPE_CHECKING

import msgpack
import numpy as np

from pvgpu.guest.api import copy, errors, prime, shm
from pvgpu.guest.api.context import FAULT_EVENTS, Context
from pvgpu.guest.api.event import Event, EventHandle
from pvgpu.guest.api.locking import ApiObject, unlocked
from pvgpu.guest.frontend.driver import DeviceNeedsReset as FrontendNeedsReset
from pvgpu.guest.frontend.driver import DeviceEvent, DeviceResponseError, command
from pvgpu.spec import wire

if TYPE_CHECKING:
    from pvgpu.guest.api.connection import Connection
    from pvgpu.guest.api.pinned import PinnedArray

_STATS = struct.Struct(wire.RESP_STATS_FORMAT)
_MAX_STATS_BUFFER = 16 << 20
_NOP = command(wire.CMD_NOP)  # nop()'s, encoded once


class Device(ApiObject):
    """One GPU of the host, as this connection sees it (`conn.devices[i]`), like a CUDA
    device: its properties (`name`, `vram_size`, `features`, `index`), `info()` and
    `stats()` from the host, contexts (`create_context`), pinned memory, peer access,
    exports and imports of buffers and events, and `reset()` after DeviceNeedsReset."""

    _staging: copy.StagingPool  # and the copy settings: copy.init_device

    def __init__(self, conn: "Connection", driver):
        self.connection = conn
        self._conn_lock = conn._conn_lock
        self._releases = conn._releases
        self.driver = driver
        self.index = driver.index
        self._ctx_ids = itertools.count(1)
        self._resource_ids = itertools.count(1)
        self._event_ids = itertools.count(1)
        self._contexts: dict[int, Context] = {}  # ctx_id -> live Context of this connection
        # staging_depth, small_h2d_max, pinned_request, pinned_depth, copy_stats and the
        # staging pool (_staging) of bounce chunks
        copy.init_device(self)
        # fault events not yet raised
        self._unclaimed_faults: collections.deque[DeviceEvent] = collections.deque(maxlen=256)
        driver.event_handler = self._on_device_event

    def _on_device_event(self, event) -> None:
        """An event-queue entry (spec §5.7), from the driver's reap."""
        ctx = self._contexts.get(event.ctx_id)
        if ctx is not None:
            ctx._device_events.append(event)
        if event.type in FAULT_EVENTS:
            self._unclaimed_faults.append(event)

    def _fault_scope(self) -> tuple:
        return self, None  # a fault outside any context: claimed by its address

    def _claim_faults(self, match) -> list:
        """-> the unclaimed fault events that `match`, oldest first (now claimed)."""
        if not self._unclaimed_faults:
            return []  # the common case
        claimed = [ev for ev in self._unclaimed_faults if match(ev)]
        for ev in claimed:
            self._unclaimed_faults.remove(ev)
        return claimed

    @property
    def events(self) -> list:
        """The latest events the device reported on its event queue (DeviceEvent: page
        faults and lost contexts, of every context of this connection on the device)."""
        return list(self.driver.events)

    @property
    @unlocked("the getter reads an int (the setter takes the lock)")
    def staging_chunk(self) -> int:
        """Bytes per bounce chunk of pageable copies. Settable (a multiple of 4 KiB): idle
        chunks of the old size go back to the heap at once, lent ones when they return."""
        return self._staging.chunk

    @staging_chunk.setter
    def staging_chunk(self, size: int) -> None:
        size = int(size)
        if size < 4096 or size % 4096:
            raise ValueError(f"staging_chunk must be a positive multiple of 4096, not {size}")
        self._staging.resize(size)

    def pinned_empty(self, shape, dtype=np.float32) -> "PinnedArray":
        """`Connection.pinned_empty`: pinned memory serves every device of the connection."""
        return self.connection.pinned_empty(shape, dtype)

    def pinned_zeros(self, shape, dtype=np.float32) -> "PinnedArray":
        """`Connection.pinned_zeros`: zero-filled pinned memory."""
        return self.connection.pinned_zeros(shape, dtype)

    def pinned_array(self, data, dtype=None) -> "PinnedArray":
        """`Connection.pinned_array`: a pinned copy of `data`."""
        return self.connection.pinned_array(data, dtype)

    @property
    @unlocked("device config, read at initialisation")
    def name(self) -> str:
        """The device's name, from its configuration space."""
        return self.driver.name

    @property
    @unlocked("device config, read at initialisation")
    def vram_size(self) -> int:
        """The device's VRAM in bytes."""
        return self.driver.vram_size

    @property
    @unlocked("the negotiated feature bits (an int)")
    def features(self) -> list:
        """The names of the feature bits negotiated with the device (virtio and pvgpu)."""
        return [n for bit, n in sorted(wire.FEATURE_NAMES.items()) if self.driver.has(bit)]

    @property
    @unlocked("a session field fixed at connect")
    def memory_model(self) -> str:
        """The connection's memory model: "shared" or "inline"."""
        return self.connection.memory_model

    @property
    def contexts(self) -> list:
        """The live contexts this connection created on the device."""
        return list(self._contexts.values())

    @unlocked("reads the host's hello answer only")
    def can_access_peer(self, peer: "Device") -> bool:
        """Whether this device and `peer` reach each other peer-to-peer on the host's PCIe
        fabric (cuDeviceCanAccessPeer)."""
        return bool(self.peer_info(peer)["p2p"])

    @unlocked("reads the host's hello answer only")
    def peer_info(self, peer: "Device") -> dict:
        """{dev, p2p, link, distance}: the host's PCIe route between this device and peer
        (hello `peers`)."""
        if not isinstance(peer, Device):
            raise TypeError(f"peer must be a Device, not {type(peer).__name__}")
        if peer.index == self.index:
            return {"dev": self.index, "p2p": True, "link": "local", "distance": 0}
        for p in self.driver.info.get("peers", ()):
            if p.get("dev") == peer.index:
                return dict(p)
        return {"dev": peer.index, "p2p": False, "link": "unknown", "distance": -1}

    def revoke(self, handle) -> None:
        """Withdraw an export made on this device (DeviceArray.export): no new imports."""
        prime.revoke(self, handle)

    def info(self) -> dict:
        """The device's answer to GET_DEVICE_INFO: {vram_size, vram_free, max_alloc
        (the largest single allocation), contexts (live, of every guest), name}."""
        _t, body = self.driver.call(command(wire.CMD_GET_DEVICE_INFO))
        vram, free, max_alloc, nctx, name = struct.unpack_from(wire.RESP_DEVICE_INFO_FORMAT, body)
        return {"vram_size": vram, "vram_free": free, "max_alloc": max_alloc,
                "contexts": nctx, "name": name.split(b"\0", 1)[0].decode()}

    def stats(self) -> dict:
        """The host's scheduling statistics for this device (GET_STATS): a dict decoded from
        the host's msgpack map — per engine and per vGPU utilisation, credits, policy, ...
        (host-defined keys) and `device`, this device's index."""
        heap = self.connection.session.heap
        size = wire.STATS_BUFFER_SIZE
        while True:
            gpa = heap.alloc(size)
            try:
                req = self.driver.submit(command(wire.CMD_GET_STATS), writable=[(gpa, size)])
                self.connection.session.wait_for(lambda: req.done)
                try:
                    _t, body = req.response()
                except DeviceResponseError as e:
                    # too small: the device says how many writable bytes it needs
                    need = e.info0 - wire.CTRL_HDR_SIZE
                    if e.resp == wire.RESP_ERR_INVALID_PARAMETER and size < need <= _MAX_STATS_BUFFER:
                        size = need
                        continue
                    raise
                (length,) = _STATS.unpack_from(body)
                data = self.driver.mem.read(gpa + _STATS.size, length)
            finally:
                heap.free(gpa)
            return msgpack.unpackb(data, raw=False, strict_map_key=False)

    def create_context(self, name: str = "", priority: str = "normal") -> "Context":
        """A new context; `priority` ("low", "normal" or "high") orders its jobs against
        other waiting jobs on each engine (spec CMD-CTX-CREATE-3)."""
        flags = {v: k for k, v in wire.CTX_PRIORITY_NAMES.items()}.get(priority)
        if flags is None:
            raise ValueError(f"priority must be one of {sorted(wire.CTX_PRIORITY_NAMES.values())}, "
                             f"not {priority!r}")
        ctx_id = next(self._ctx_ids)
        self.driver.call(command(wire.CMD_CTX_CREATE, (flags, name.encode()[:32]), ctx_id=ctx_id))
        ctx = Context(self, ctx_id)
        self._contexts[ctx_id] = ctx
        return ctx

    def synchronize(self) -> None:
        """Wait for the work of every live context this connection created on the device;
        raises the first error (after synchronizing all of them)."""
        first = None
        for ctx in list(self._contexts.values()):
            try:
                ctx.synchronize()
            except errors.DeviceError as e:
                first = first or e
        if first is not None:
            raise first

    def import_event(self, handle) -> "Event":
        """Bind a new event of this device to an exported event (`EventHandle` or its
        string form). The event has no default stream: pass one to `record`."""
        return self._import_event(handle, None)

    def _import_event(self, handle, ctx) -> "Event":
        handle = EventHandle.parse(handle)
        event_id = next(self._event_ids)
        self.driver.call(command(wire.CMD_EVENT_IMPORT, (event_id, handle.handle_id, handle.token)))
        return Event(self, event_id, ctx, recorded=True)

    def shm_get(self, key, nbytes: int = 0):
        """Shared device memory (guest/api/shm.py): the segment of `key` (an int or a str,
        private to this guest) on this device, allocated by the first call; nbytes 0 only
        looks it up. -> SharedSegment."""
        return shm.get(self, key, nbytes)

    def shm_import(self, handle):
        """A segment of this device that another guest exported (`ShmHandle` or its string
        form). -> SharedSegment."""
        return shm.import_(self, handle)

    def nop(self) -> None:
        """One synchronous no-op round trip through the virtqueue (for measurements)."""
        self.driver.call(_NOP)

    def call_raw(self, command_bytes: bytes, readable=(), writable=()) -> tuple:
        """Send an already-encoded device command and wait: -> (resp_type, body). For tools
        and conformance tests that need to speak the wire directly."""
        return self.driver.call(command_bytes, readable, writable)

    def reset(self) -> None:
        """Reset the device after DEVICE_NEEDS_RESET; every context, stream and event on it
        is gone (their objects report errors if used)."""
        # requests still outstanding are lost to the reset: fail them (their callbacks
        # give their chunks back), so that nobody waits for them
        self.driver.fail_all(FrontendNeedsReset(f"device {self.index} was reset"))
        self.driver.initialize()  # its set_status 0 returns once no DMA is in flight
        self._staging.reset()
        for ctx in self._contexts.values():
            ctx._lost()
        self._contexts.clear()

    def __repr__(self):
        return f"<pvgpu.Device {self.index} {self.name!r} {self.vram_size >> 20} MiB>"
