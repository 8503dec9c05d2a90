"""The compute API (the user-mode driver): connections, devices, contexts, streams, events,
device arrays, launches and copies — numpy in, numpy out, in the manner of CuPy / cuda-python.

    import guest
    with guest.connect() as conn:
        ctx = conn.devices[0].create_context()
        a = ctx.to_device(np.arange(n, dtype=np.float32))
        c = ctx.empty(n, np.float32)
        ctx.launch("vector_add", grid=..., block=256, args=(a, b, c, n))
        out = c.to_host()

Copies between numpy arrays and the device go through guest memory and the host's copy
engine: host->device fills bounce chunks and submits one COPY_H2D per chunk, so the
guest's memcpy of chunk N+1 overlaps the device's DMA of chunk N (split transaction);
device->host submits the chunks ahead and copies each out as it completes
(`dev.staging_chunk`, `dev.staging_depth` and `pipeline=False` tune that). An H2D copy of
at most SMALL_H2D_MAX bytes travels inside its command's descriptor instead. Pinned host
memory (`conn.pinned_empty`, guest/api/pinned.py) lies in guest memory already: copies
from and to it are one DMA per request, no bounce chunk. Launches are
asynchronous; their errors surface at the next synchronizing call (a copy,
synchronize()), as in CUDA.

Streams and events (spec §7): a `Stream` is one timeline (ctx_id, ring_idx) of a
context; ring_idx 0 is the context's default stream, which every call uses unless given
`stream=`. Work of one stream runs in order; work of different streams may overlap.
An `Event` captures the work submitted to a stream so far (`record`); another stream can
be made to wait for it (`wait_event`) — the host's scheduler holds that stream's next
job back, the guest never blocks. Events can be exported as a small handle and imported
by another guest (or on the other device) to order work across them. Asynchronous copies
(`copy_h2d_async`, `copy_d2h_async`) stage through the same bounce chunks and return at
once; a chunk goes back (and D2H data lands in the destination array) when its request
completes, which the stream's next synchronize (or an event's) waits for. Errors of
asynchronous work are kept per stream and raised by that stream's next synchronizing
call; `Context.synchronize()` raises the first of any of its streams.

Explicit VA management (spec §6.7, like cuMemAddressReserve / cuMemMap / cuMemSetAccess):
`r = ctx.reserve_va(nbytes, alignment=...)` reserves address space (a VaRange);
`v = ctx.map(array, r, access="r")` maps a buffer of the context there a second time (a
MappedArray; access "r" or "rw"), `ctx.unmap(v)` and `ctx.release_va(r)` undo it. A write
through a read-only mapping raises PageFaultError (address, access "write").
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
import re
import struct
import threading
from dataclasses import dataclass

import msgpack
import numpy as np

from spec import wire
from guest.api import errors, lifetime, operands
from guest.api import pinned as _pinned
from guest.frontend.driver import DeviceNeedsReset as FrontendNeedsReset
from guest.frontend.driver import DeviceResponseError, command
from guest.frontend.session import FrontendSession

STAGING_CHUNK = 8 << 20
STAGING_DEPTH = 4  # bounce chunks per device: in flight at once for one copy, and the pool size
SMALL_H2D_MAX = 216  # an H2D copy this small travels in its command's descriptor (spec [CMD-H2D-1])
_EVENT = struct.Struct(wire.RESP_EVENT_FORMAT)
_HANDLE = struct.Struct(wire.RESP_EVENT_HANDLE_FORMAT)
_STATS = struct.Struct(wire.RESP_STATS_FORMAT)
_MAX_STATS_BUFFER = 16 << 20
_FAULT_EVENTS = (wire.EVTQ_PAGE_FAULT, wire.EVTQ_CODE_FAULT)  # a faulted context keeps working


def _cmd(type_: int, body=(), *, ctx_id: int = 0, ring_idx: int = 0, fence_id: int = 0,
         extra: bytes = b"") -> bytes:
    """A device command; a non-zero ring_idx also sets FLAG_INFO_RING_IDX (spec CMD-HDR-1)."""
    return command(type_, body, ctx_id=ctx_id, ring_idx=ring_idx, fence_id=fence_id,
                   flags=wire.FLAG_INFO_RING_IDX if ring_idx else 0, extra=extra)


def _api(fn):
    """One API call: serialized per connection (the frontend's rings and guest memory are
    not thread-safe; several threads may share a connection), with frontend/transport
    errors re-raised as the API's exceptions. Every public method that reaches the driver,
    the guest memory heap or state they change is wrapped (tests check it)."""
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        lock = self._conn_lock
        outermost = not lock._is_owned()
        with lock:
            try:
                if outermost:  # a safe point: free what became garbage (guest/api/lifetime.py)
                    self._releases.drain()
                return fn(self, *args, **kwargs)
            except errors.PvgpuError:
                raise
            except Exception as e:
                mapped = errors.translate(e)
                if mapped is e:
                    raise
                if isinstance(mapped, (errors.PageFaultError, errors.IllegalCodeError)):
                    _claim_fault_event(self, mapped)
                raise mapped from None
    wrapper.api_locked = True
    return wrapper


def _claim_fault_event(obj, err) -> None:
    """Attach the event-queue entry of a fault (spec §5.7) to the PageFaultError (or
    IllegalCodeError) raised for it. Every fault event of the same context received so far counts as reported with it
    (one operation, e.g. a chunked copy, may fault in several jobs), so a later
    synchronize does not raise them again."""
    ctx = obj if isinstance(obj, Context) else getattr(obj, "context", None)
    device = ctx.device if isinstance(ctx, Context) else getattr(obj, "device", obj)
    if not isinstance(device, Device):
        return
    same = (lambda ev: ev.ctx_id == ctx.ctx_id) if isinstance(ctx, Context) else \
        (lambda ev: ev.address == err.address)
    claimed = device._claim_faults(same)
    err.event = next((ev for ev in claimed if ev.address == err.address),
                     claimed[0] if claimed else None)


def connect(endpoint: str | None = None, *, memory: str = wire.MEMORY_SHARED,
            mem_size: int = wire.DEFAULT_GUEST_MEM_SIZE, name: str | None = None,
            heartbeat_ms: int | None = None, timeout: float = 10.0,
            features: int | None = None, vgpu: str | None = None) -> "Connection":
    """Open a guest session with the host at `endpoint` (default: the local ipc endpoint).

    memory: "shared" (zero-copy POSIX shared memory, same machine) or "inline" (guest
    memory mirrored through the messages; works across machines). features: the virtio
    feature bits the driver accepts (default: all it knows); VIRTIO_F_VERSION_1 is
    required. vgpu: the name of a host-configured vGPU to join (`pvgpu host --vgpu`);
    without it the host assigns one (`conn.vgpu` tells which)."""
    try:
        return Connection(FrontendSession(endpoint, memory=memory, mem_size=mem_size, name=name,
                                          heartbeat_ms=heartbeat_ms, timeout=timeout, vgpu=vgpu,
                                          features=features))
    except Exception as e:
        mapped = errors.translate(e)
        if mapped is e:
            raise
        raise mapped from None


class Connection:
    def __init__(self, session: FrontendSession):
        self.session = session
        self._conn_lock = threading.RLock()
        self._releases = lifetime.Releases(self)
        self._pinned = _pinned.PinnedAllocator(self)
        self.devices = [Device(self, drv) for drv in session.devices]

    @_api
    def pinned_empty(self, shape, dtype=np.float32) -> "_pinned.PinnedArray":
        """A numpy array in pinned memory (inside guest memory, from the session heap):
        copies between it and a DeviceArray are one DMA, no bounce (guest/api/pinned.py).
        Give it back with `free()` or a `with` block."""
        return self._pinned.empty(shape, dtype)

    @_api
    def pinned_zeros(self, shape, dtype=np.float32) -> "_pinned.PinnedArray":
        arr = self._pinned.empty(shape, dtype)
        arr.fill(0)
        return arr

    @_api
    def pinned_array(self, data, dtype=None) -> "_pinned.PinnedArray":
        """A pinned copy of `data`."""
        data = np.asarray(data, dtype=dtype)
        arr = self._pinned.empty(data.shape, data.dtype)
        arr[...] = data
        return arr

    @property
    def memory_model(self) -> str:
        return self.session.memory

    @property
    def vgpu(self) -> dict | None:
        """The vGPU the host bound this session to ({name, compute, copy, mem} shares in
        percent), or None when the host has no vGPUs configured."""
        return self.session.vgpu

    @property
    def endpoint(self) -> str:
        return self.session.endpoint

    def close(self) -> None:
        with self._conn_lock:
            self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<pvgpu.Connection {self.endpoint} {self.memory_model} devices={len(self.devices)}>"


class Device:
    def __init__(self, conn: Connection, driver):
        self.connection = conn
        self._conn_lock = conn._conn_lock
        self._releases = conn._releases
        self.driver = driver
        self.index = driver.index
        self._ctx_ids = itertools.count(1)
        self._resource_ids = itertools.count(1)
        self._event_ids = itertools.count(1)
        self._contexts = {}  # ctx_id -> live Context created through this connection
        self._staging = []  # free bounce chunks (gpa)
        self._staging_count = 0  # chunks taken from the heap and not given back to it
        self._async_held = set()  # chunks of asynchronous copies still on the device
        self._quarantine = []  # chunks of failed requests, reusable after reset()
        # Every device may hold STAGING_DEPTH chunks; keep them to half of the heap.
        heap = conn.session.heap
        share = heap.size // (2 * STAGING_DEPTH * max(1, len(conn.session.devices)))
        self._staging_chunk = max(64 << 10, min(STAGING_CHUNK, share // 4096 * 4096))
        self.staging_depth = STAGING_DEPTH  # chunks in flight for one synchronous copy
        self.small_h2d_max = SMALL_H2D_MAX  # 0: every H2D goes through a bounce chunk
        self._stale = set()  # lent chunks of an earlier staging_chunk size
        _pinned.init_device(self)  # pinned_request, pinned_depth, copy_stats
        self._unclaimed_faults = collections.deque(maxlen=256)  # fault events not yet raised
        driver.event_handler = self._on_device_event

    def _on_device_event(self, event) -> None:
        """An event-queue entry (spec §5.7), from the driver's reap."""
        ctx = self._contexts.get(event.ctx_id)
        if ctx is not None:
            ctx._device_events.append(event)
        if event.type in _FAULT_EVENTS:
            self._unclaimed_faults.append(event)

    def _claim_faults(self, match) -> list:
        """-> the unclaimed fault events that `match`, oldest first (now claimed)."""
        claimed = [ev for ev in self._unclaimed_faults if match(ev)]
        for ev in claimed:
            self._unclaimed_faults.remove(ev)
        return claimed

    @property
    @_api
    def events(self) -> list:
        """The latest events the device reported on its event queue (DeviceEvent: page
        faults and lost contexts, of every context of this connection on the device)."""
        return list(self.driver.events)

    @property
    def staging_chunk(self) -> int:
        """Bytes per bounce chunk of pageable copies. Settable (a multiple of 4 KiB): idle
        chunks of the old size go back to the heap at once, lent ones when they return."""
        return self._staging_chunk

    @staging_chunk.setter
    @_api
    def staging_chunk(self, size: int) -> None:
        size = int(size)
        if size < 4096 or size % 4096:
            raise ValueError(f"staging_chunk must be a positive multiple of 4096, not {size}")
        heap = self.connection.session.heap
        for gpa in self._staging:
            heap.free(gpa)
        self._staging_count -= len(self._staging)
        self._staging = []
        self._stale |= self._async_held
        self._staging_chunk = size

    @_api
    def pinned_empty(self, shape, dtype=np.float32) -> "_pinned.PinnedArray":
        """`Connection.pinned_empty`: pinned memory serves every device of the connection."""
        return self.connection.pinned_empty(shape, dtype)

    @_api
    def pinned_zeros(self, shape, dtype=np.float32) -> "_pinned.PinnedArray":
        return self.connection.pinned_zeros(shape, dtype)

    @_api
    def pinned_array(self, data, dtype=None) -> "_pinned.PinnedArray":
        return self.connection.pinned_array(data, dtype)

    @property
    def name(self) -> str:
        return self.driver.name

    @property
    def vram_size(self) -> int:
        return self.driver.vram_size

    @property
    def features(self) -> list:
        return [n for bit, n in sorted(wire.FEATURE_NAMES.items()) if self.driver.has(bit)]

    @property
    def memory_model(self) -> str:
        return self.connection.memory_model

    @property
    @_api
    def contexts(self) -> list:
        """The live contexts this connection created on the device."""
        return list(self._contexts.values())

    def can_access_peer(self, peer: "Device") -> bool:
        """Whether this device and `peer` reach each other peer-to-peer on the host's PCIe
        fabric (cuDeviceCanAccessPeer)."""
        from guest.api import prime
        return bool(prime.peer_info(self, peer)["p2p"])

    def peer_info(self, peer: "Device") -> dict:
        """{dev, p2p, link, distance}: the host's PCIe route between this device and peer."""
        from guest.api import prime
        return prime.peer_info(self, peer)

    @_api
    def revoke(self, handle) -> None:
        """Withdraw an export made on this device (DeviceArray.export): no new imports."""
        from guest.api import prime
        prime.revoke(self, handle)

    @_api
    def info(self) -> dict:
        _t, body = self.driver.call(command(wire.CMD_GET_DEVICE_INFO))
        vram, free, max_alloc, nctx, name = struct.unpack_from(wire.RESP_DEVICE_INFO_FORMAT, body)
        return {"vram_size": vram, "vram_free": free, "max_alloc": max_alloc,
                "contexts": nctx, "name": name.split(b"\0", 1)[0].decode()}

    @_api
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

    @_api
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

    @_api
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

    @_api
    def import_event(self, handle) -> "Event":
        """Bind a new event of this device to an exported event (`EventHandle` or its
        string form). The event has no default stream: pass one to `record`."""
        return self._import_event(handle, None)

    def _import_event(self, handle, ctx) -> "Event":
        handle = EventHandle.parse(handle)
        event_id = next(self._event_ids)
        self.driver.call(command(wire.CMD_EVENT_IMPORT, (event_id, handle.handle_id, handle.token)))
        return Event(self, event_id, ctx, recorded=True)

    @_api
    def shm_get(self, key, nbytes: int = 0):
        """Shared device memory (guest/api/shm.py): the segment of `key` (an int or a str,
        private to this guest) on this device, allocated by the first call; nbytes 0 only
        looks it up. -> SharedSegment."""
        from guest.api import shm
        return shm.get(self, key, nbytes)

    @_api
    def shm_import(self, handle):
        """A segment of this device that another guest exported (`ShmHandle` or its string
        form). -> SharedSegment."""
        from guest.api import shm
        return shm.import_(self, handle)

    @_api
    def nop(self) -> None:
        """One synchronous no-op round trip through the virtqueue (for measurements)."""
        self.driver.call(command(wire.CMD_NOP))

    @_api
    def call_raw(self, command_bytes: bytes, readable=(), writable=()) -> tuple:
        """Send an already-encoded device command and wait: -> (resp_type, body). For tools
        and conformance tests that need to speak the wire directly."""
        return self.driver.call(command_bytes, readable, writable)

    @_api
    def reset(self) -> None:
        """Reset the device after DEVICE_NEEDS_RESET; every context, stream and event on it
        is gone (their objects report errors if used)."""
        # requests still outstanding are lost to the reset: fail them (their callbacks
        # give their chunks back), so that nobody waits for them
        self.driver.fail_all(FrontendNeedsReset(f"device {self.index} was reset"))
        self.driver.initialize()  # its set_status 0 returns once no DMA is in flight
        heap = self.connection.session.heap
        for gpa in self._staging + self._quarantine + sorted(self._async_held):
            heap.free(gpa)
        self._staging, self._quarantine, self._async_held = [], [], set()
        self._staging_count = 0
        self._stale = set()
        for ctx in self._contexts.values():
            ctx._lost()
        self._contexts.clear()

    # bounce chunks of guest memory for copies
    def _take_staging(self) -> int:
        if not self._staging and self._staging_count >= self.staging_depth and self._async_held:
            # the pool is lent out to asynchronous copies: they come back as they complete
            self.connection.session.wait_for(lambda: self._staging or not self._async_held)
        self.copy_stats["staging_chunks"] += 1
        if self._staging:
            return self._staging.pop()
        gpa = self.connection.session.heap.alloc(self.staging_chunk)
        self._staging_count += 1
        return gpa

    def _give_staging(self, gpa: int) -> None:
        self._staging.append(gpa)

    def _lend_staging(self) -> int:
        """A chunk for an asynchronous copy; it comes back with _return_staging."""
        gpa = self._take_staging()
        self._async_held.add(gpa)
        return gpa

    def _return_staging(self, gpa: int) -> None:
        if gpa in self._async_held:  # (not after a reset freed it)
            self._async_held.discard(gpa)
            if gpa in self._stale:  # staging_chunk changed while it was lent
                self._stale.discard(gpa)
                self._staging_count -= 1
                self.connection.session.heap.free(gpa)
            else:
                self._staging.append(gpa)

    def _quarantine_staging(self, gpas) -> None:
        """Bounce chunks of requests that failed without coming back: the device may still
        DMA into them until it is reset, so they are reused only after reset()."""
        self._quarantine.extend(gpas)

    def __repr__(self):
        return f"<pvgpu.Device {self.index} {self.name!r} {self.vram_size >> 20} MiB>"


class Stream:
    """One timeline (ctx_id, ring_idx) of a context (spec §7.1). Work submitted to a stream
    runs in submission order; different streams of a context (and other contexts) may run
    concurrently. Errors of its asynchronous work are raised by its next synchronizing call.

    Create with `ctx.create_stream()` (ring_idx 1..MAX_RING_IDX); `ctx.default_stream` is
    ring_idx 0. `destroy()` (or leaving a `with` block) synchronizes and frees the ring_idx.
    """

    def __init__(self, ctx: "Context", ring_idx: int):
        self.context = ctx
        self.ring_idx = ring_idx
        self._conn_lock = ctx._conn_lock
        self._releases = ctx._releases
        self._driver = ctx._driver
        self._async_error = None
        self._inflight = []  # asynchronous copy requests not yet completed
        self.destroyed = False

    @property
    def device(self) -> Device:
        return self.context.device

    @property
    def is_default(self) -> bool:
        return self.ring_idx == 0

    @_api
    def launch(self, kernel, grid, block, args) -> None:
        """Launch a built-in kernel on this stream (asynchronous)."""
        self.context.launch(kernel, grid, block, args, stream=self)

    @_api
    def record_event(self, event: "Event | None" = None) -> "Event":
        """Record `event` (a new one if None) on this stream; -> the event."""
        if event is None:
            event = Event(self.device, next(self.device._event_ids), self.context)
        event.record(self)
        return event

    @_api
    def wait_event(self, event: "Event") -> None:
        """Make this stream's later work wait until `event` has completed. Returns at once:
        the host holds the stream's next job back (the guest never blocks). The event may
        belong to another stream, context or device, or be imported from another guest."""
        self.context._check_stream(self)
        if not isinstance(event, Event):
            raise TypeError(f"wait_event needs an Event, not {type(event).__name__}")
        if event.destroyed:
            raise errors.InvalidEventError(f"event {event.event_id} was destroyed",
                                           code=wire.RESP_ERR_INVALID_EVENT)
        if not event.recorded:
            return  # nothing captured: nothing to wait for (as cudaStreamWaitEvent)
        if event.device is not self.device:
            # event ids are per device: bring it over as an export, as another guest would
            local = self.device._import_event(event.export(), None)
            try:
                self._wait(local)
            finally:
                local.destroy()
        else:
            self._wait(event)
        # completions the event covers (D2H data landing) are ours to wait for too
        self._inflight += [r for r in event._requests if not r.done]

    def _wait(self, event: "Event") -> None:
        self._driver.call(_cmd(wire.CMD_EVENT_WAIT, (event.event_id,), ctx_id=self.context.ctx_id,
                               ring_idx=self.ring_idx))

    @_api
    def synchronize(self) -> None:
        """Wait for all work submitted to this stream (and the events it waits for); raises
        the first error of its earlier asynchronous work."""
        self.context._check_stream(self)
        err = None
        try:
            self._driver.call(_cmd(wire.CMD_NOP, ctx_id=self.context.ctx_id, ring_idx=self.ring_idx,
                                   fence_id=1))
        except Exception as e:
            err = e
        self._settle()
        async_err = self._take_error()
        raise_first(err, async_err)

    def _track(self, req) -> None:
        if len(self._inflight) > 64:
            self._inflight = [r for r in self._inflight if not r.done]
        self._inflight.append(req)

    def _settle(self) -> None:
        """Wait until every asynchronous request of the stream has come back."""
        pending = [r for r in self._inflight if not r.done]
        if pending:
            self._driver.session.wait_for(lambda: all(r.done for r in pending))
        self._inflight = []

    def _async_done(self, req) -> None:
        """An asynchronous request came back; keep its error for the next sync point."""
        try:
            req.response()
        except Exception as e:
            self._keep_error(e)

    def _keep_error(self, e) -> None:
        if self._async_error is None:
            self._async_error = e

    def _take_error(self):
        err, self._async_error = self._async_error, None
        return err

    def _raise_async_error(self) -> None:
        err = self._take_error()
        if err is not None:
            raise err

    @_api
    def destroy(self) -> None:
        """Synchronize, then give the ring_idx back (the default stream lives as long as its
        context: destroying it only synchronizes)."""
        if self.destroyed:
            return
        ctx = self.context
        if ctx.destroyed:
            self.destroyed = True
            ctx._streams.pop(self.ring_idx, None)
            return
        try:
            self.synchronize()
        finally:
            if not self.is_default:
                self.destroyed = True
                ctx._streams.pop(self.ring_idx, None)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if self.destroyed or self._driver.needs_reset:
            return
        if exc_type is None:
            self.destroy()
        else:  # do not hide the exception in flight behind a synchronize error
            try:
                self.destroy()
            except errors.PvgpuError:
                pass

    def __repr__(self):
        return f"<pvgpu.Stream {self.ring_idx} of context {self.context.ctx_id}>"


@dataclass(frozen=True)
class EventHandle:
    """An exported event: `str(handle)` ("evt:<id>:<token hex>") or the object itself
    (picklable) can be passed to another process, which imports it with
    `ctx.import_event(handle)`. Anyone holding it can wait on the event; keep it private."""

    handle_id: int
    token: int

    _FORM = re.compile(r"^evt:(\d+):([0-9a-fA-F]{1,16})$")

    def __str__(self) -> str:
        return f"evt:{self.handle_id}:{self.token:016x}"

    @classmethod
    def parse(cls, value) -> "EventHandle":
        if isinstance(value, EventHandle):
            return value
        m = cls._FORM.match(value) if isinstance(value, str) else None
        if m is None or int(m.group(1)) >= 1 << 64:
            raise ValueError(f"not an event handle: {value!r} (expected 'evt:<id>:<token hex>')")
        return cls(int(m.group(1)), int(m.group(2), 16))


class _DestroyedOnExit:
    """`with obj:` destroys it at the end, unless it is gone already or its device must
    be reset first (then destroying would only raise DeviceNeedsReset)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self.destroyed and not self._driver.needs_reset:
            self.destroy()


class Event(_DestroyedOnExit):
    """A marker in a stream (spec §7.5): `record(stream)` captures the work submitted to the
    stream so far; the event completes when that work has. Event ids belong to a device."""

    def __init__(self, device: Device, event_id: int, ctx: "Context | None" = None, *,
                 recorded: bool = False):
        self.device = device
        self.context = ctx
        self.event_id = event_id
        self._conn_lock = device._conn_lock
        self._releases = device._releases
        self._driver = device.driver
        self.recorded = recorded  # the device knows the id (recorded or imported)
        self.destroyed = False
        self._timestamp = None  # completion time of the current recording, once known
        self._requests = []  # async requests of the recording stream that it covers

    def _check(self) -> None:
        if self.destroyed:
            raise errors.InvalidEventError(f"event {self.event_id} was destroyed",
                                           code=wire.RESP_ERR_INVALID_EVENT)

    @_api
    def record(self, stream: Stream | None = None) -> None:
        """Capture the work submitted to `stream` (default: the default stream of the
        event's context) so far, including the events it was told to wait for."""
        self._check()
        if stream is None:
            if self.context is None:
                raise ValueError("this event has no context: pass the stream to record on")
            stream = self.context.default_stream
        if stream.device is not self.device:
            raise ValueError("an event can be recorded only on streams of its own device")
        stream.context._check_stream(stream)
        self._driver.call(_cmd(wire.CMD_EVENT_RECORD, (self.event_id,),
                               ctx_id=stream.context.ctx_id, ring_idx=stream.ring_idx))
        self.recorded = True
        self._timestamp = None
        self._requests = [r for r in stream._inflight if not r.done]

    def _query(self, wait: bool) -> tuple:
        """-> (status, error, timestamp_ns, info0, info1) from EVENT_QUERY."""
        _t, body = self._driver.call(_cmd(wire.CMD_EVENT_QUERY, (self.event_id,),
                                          fence_id=1 if wait else 0))
        status, code, ts, info0, info1 = _EVENT.unpack_from(body)
        if status != wire.EVENT_STATUS_PENDING:
            if self._requests:  # let D2H data land before reporting completion
                reqs, self._requests = self._requests, []
                self._driver.session.wait_for(lambda: all(r.done for r in reqs))
            self._timestamp = ts
        return status, code, ts, info0, info1

    def _raise_for(self, status, code, info0, info1) -> None:
        if status == wire.EVENT_STATUS_ERROR:
            if code == wire.RESP_ERR_PAGE_FAULT:
                what = (f"GPU page fault: {wire.ACCESS_NAMES.get(info1, 'access')} "
                        f"at VA {info0:#x}")
            else:
                what = wire.RESP_NAMES.get(code, hex(code))
            raise errors.error_for(code, f"event {self.event_id}: the work it captured failed: {what}",
                                   info0, info1)

    @_api
    def query(self) -> bool:
        """True once the captured work has completed (raises its error if it failed)."""
        self._check()
        if not self.recorded:
            return True
        status, code, _ts, info0, info1 = self._query(wait=False)
        self._raise_for(status, code, info0, info1)
        return status != wire.EVENT_STATUS_PENDING

    @_api
    def synchronize(self) -> None:
        """Wait until the captured work has completed (raises its error if it failed)."""
        self._check()
        if not self.recorded:
            return
        status, code, _ts, info0, info1 = self._query(wait=True)
        self._raise_for(status, code, info0, info1)

    @property
    @_api
    def timestamp_ns(self) -> int | None:
        """Device time (ns) when the captured work completed; None while pending or if never
        recorded. An event recorded on an idle stream completes at its record time."""
        if self._timestamp is None and self.recorded and not self.destroyed:
            self._query(wait=False)
        return self._timestamp

    @_api
    def elapsed_time(self, end: "Event") -> float:
        """Milliseconds of device time from this event to `end` (both must be complete)."""
        for ev in (self, end):
            ev._check()
            if not ev.recorded:
                raise errors.InvalidEventError(f"event {ev.event_id} was never recorded",
                                               code=wire.RESP_ERR_INVALID_EVENT)
            if ev.timestamp_ns is None:
                raise errors.NotReadyError(f"event {ev.event_id} has not completed yet")
        return (end._timestamp - self._timestamp) / 1e6

    @_api
    def export(self) -> EventHandle:
        """Publish the event as it is now (a snapshot: recording it again later does not
        change the export; export again to share the new recording)."""
        self._check()
        if not self.recorded:
            raise errors.InvalidEventError(f"event {self.event_id} was never recorded",
                                           code=wire.RESP_ERR_INVALID_EVENT)
        _t, body = self._driver.call(_cmd(wire.CMD_EVENT_EXPORT, (self.event_id,)))
        return EventHandle(*_HANDLE.unpack_from(body))

    @_api
    def destroy(self) -> None:
        if self.destroyed:
            return
        self.destroyed = True
        if self.recorded and not self._driver.needs_reset:
            self._driver.call(_cmd(wire.CMD_EVENT_DESTROY, (self.event_id,)))


    def __repr__(self):
        return f"<pvgpu.Event {self.event_id} on device {self.device.index}>"


def raise_first(*errs) -> None:
    for e in errs:
        if e is not None:
            raise e


class Context(_DestroyedOnExit):
    def __init__(self, device: Device, ctx_id: int):
        self.device = device
        self._conn_lock = device._conn_lock
        self._releases = device._releases
        self.ctx_id = ctx_id
        self._driver = device.driver
        self.destroyed = False
        self._streams = {}  # ring_idx -> Stream
        self.default_stream = self._streams[0] = Stream(self, 0)
        self._device_events = []  # DeviceEvents of this context (event queue)
        self._peer_access = set()  # device indices whose VRAM imports may map P2P
        self._peer_imports = {}  # (dev, ctx_id, resource_id, p2p) -> (weakref(src), ImportedArray)
        self._mapped_frees = []  # ids of dropped arrays whose MEM_FREE waits for an unmap

    @property
    @_api
    def faults(self) -> list:
        """The GPU page faults and code faults of this context's jobs, as the device
        reported them on its event queue (DeviceEvent: type, address, access or detail,
        vmid, engine, ring_idx, timestamp_ns). A faulted context keeps working (spec
        CMD-FAULT-4)."""
        return [e for e in self._device_events if e.type in _FAULT_EVENTS]

    @property
    @_api
    def faulted(self) -> bool:
        return bool(self.faults)

    # ------------------------------------------------------------------ sharing (§12)
    @_api
    def enable_peer_access(self, peer: "Device") -> None:
        """Let buffers of device `peer` imported into this context be mapped peer-to-peer
        (cuCtxEnablePeerAccess); PvgpuError if the host's fabric cannot route it."""
        from guest.api import prime
        prime.enable_peer_access(self, peer)

    @_api
    def disable_peer_access(self, peer: "Device") -> None:
        from guest.api import prime
        prime.disable_peer_access(self, peer)

    @_api
    def import_array(self, handle, shape=None, dtype=np.float32, *, peer2peer=None):
        """Import a buffer another context, device or guest exported (DeviceArray.export)
        -> ImportedArray (guest/api/prime.py)."""
        from guest.api import prime
        return prime.import_(self, handle, shape, dtype, peer2peer=peer2peer)

    @_api
    def memcpy_peer(self, dst: "DeviceArray", src: "DeviceArray", nbytes: int | None = None,
                    **kw) -> str:
        """Copy from `src` (any context or device of this connection) into `dst` (of this
        context), like cuMemcpyPeer; -> "d2d", "local", "peer", "system" or "staged"
        (guest/api/prime.py)."""
        from guest.api import prime
        return prime.memcpy_peer(self, dst, src, nbytes, **kw)

    # ------------------------------------------------------------------ streams
    @_api
    def create_stream(self) -> Stream:
        """A new stream: the lowest free ring_idx in 1..MAX_RING_IDX."""
        self._check_live()
        for ring_idx in range(1, wire.MAX_RING_IDX + 1):
            if ring_idx not in self._streams:
                s = self._streams[ring_idx] = Stream(self, ring_idx)
                return s
        raise errors.PvgpuError(f"all {wire.MAX_RING_IDX} streams of context {self.ctx_id} are "
                                "in use; destroy one first")

    @property
    @_api
    def streams(self) -> list:
        return [self._streams[i] for i in sorted(self._streams)]

    def _stream(self, stream) -> Stream:
        if stream is None:
            return self.default_stream
        self._check_stream(stream)
        return stream

    def _check_stream(self, stream) -> None:
        if not isinstance(stream, Stream):
            raise TypeError(f"stream must be a Stream, not {type(stream).__name__}")
        if stream.context is not self:
            raise ValueError(f"{stream!r} belongs to another context")
        if stream.destroyed:
            raise ValueError(f"{stream!r} was destroyed")

    def _check_live(self) -> None:
        if self.destroyed:
            raise errors.InvalidContextError(f"context {self.ctx_id} was destroyed",
                                             code=wire.RESP_ERR_INVALID_CONTEXT_ID)

    # ------------------------------------------------------------------ events
    @_api
    def create_event(self) -> Event:
        """A new event of this context's device; it exists on the device once recorded."""
        return Event(self.device, next(self.device._event_ids), self)

    @_api
    def import_event(self, handle) -> Event:
        """An event bound to an exported one (`EventHandle` or its string form), from
        another guest, another context or the other device."""
        return self.device._import_event(handle, self)

    # ------------------------------------------------------------------ shared device memory
    @_api
    def shm_get(self, key, nbytes: int = 0):
        """The shared segment of `key` on this context's device (Device.shm_get)."""
        return self.device.shm_get(key, nbytes)

    @_api
    def shm_import(self, handle):
        """Import an exported segment on this context's device (Device.shm_import)."""
        return self.device.shm_import(handle)

    @_api
    def shm_attach(self, seg, shape=None, dtype=np.float32, *, readonly: bool = False):
        """Map shared segment `seg` into this context; -> a SharedArray (a DeviceArray of
        `shape`, default the whole segment) at the attachment's VA (guest/api/shm.py)."""
        from guest.api import shm
        return shm.attach(self, seg, shape, dtype, readonly)

    @_api
    def shm_detach(self, seg) -> None:
        """End this context's attachment of `seg` (a SharedSegment or SharedArray)."""
        from guest.api import shm
        shm.detach(self, seg)

    # ------------------------------------------------------------------ explicit VA management
    @_api
    def reserve_va(self, nbytes: int, alignment: int = 0) -> "VaRange":
        """Reserve `nbytes` (page rounded) of this context's device address space,
        `alignment`-aligned (0: a page; else a power of two up to 1 GiB), with nothing
        mapped in it (VA_RESERVE, like cuMemAddressReserve); -> a VaRange. Map buffers
        into it with `map`; give it back with `release_va`."""
        self._check_live()
        for what, v in (("nbytes", nbytes), ("alignment", alignment)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"{what} must be an int >= 0, not {v!r}")
        if nbytes == 0:
            raise ValueError("nbytes must be > 0")
        if alignment and (alignment < wire.PAGE_SIZE or alignment & (alignment - 1)
                          or alignment > wire.MAX_VA_ALIGN):
            raise ValueError(f"alignment {alignment:#x} must be 0 or a power of two in "
                             f"[{wire.PAGE_SIZE}, {wire.MAX_VA_ALIGN:#x}]")
        _t, body = self._driver.call(_cmd(wire.CMD_VA_RESERVE, (int(nbytes), int(alignment)),
                                          ctx_id=self.ctx_id))
        va, size = struct.unpack_from(wire.RESP_VA_FORMAT, body)
        return VaRange(self, va, size)

    @_api
    def release_va(self, va_range) -> None:
        """Give a reservation back (VA_RELEASE, like cuMemAddressFree): `va_range` is the
        VaRange or its start VA. Everything mapped in it must be unmapped first
        (InvalidParameterError otherwise)."""
        self._check_live()
        va = va_range.va if isinstance(va_range, VaRange) else va_range
        self._driver.call(_cmd(wire.CMD_VA_RELEASE, (int(va),), ctx_id=self.ctx_id))
        if isinstance(va_range, VaRange):
            va_range.released = True

    @_api
    def map(self, array, va, access: str = "rw", *, offset: int = 0, nbytes: int | None = None,
            shape=None, dtype=None) -> "MappedArray":
        """Map (part of) a buffer of this context a second time, at `va` inside a
        reservation (MEM_MAP, like cuMemMap + cuMemSetAccess); the buffer's own address
        stays valid. `array`: a DeviceArray of this context or a resource id; `va`: an int
        or a VaRange (its start); `access`: "rw" or "r" (a write through a read-only
        mapping raises PageFaultError, access "write"); `offset`/`nbytes`: page-aligned
        byte range of the buffer (default: from `offset` to its end). -> a MappedArray
        (a DeviceArray view at `va`, of `shape`/`dtype`, default the array's dtype and as
        many elements as fit); unmap it with `unmap` (or its `unmap()`). Errors: a bad
        access string or misaligned range -> ValueError / InvalidParameterError, not this
        context's buffer -> InvalidResourceError, outside a reservation or overlapping
        another mapping -> InvalidAddressError."""
        self._check_live()
        if access not in ("rw", "r"):
            raise ValueError(f"access must be 'rw' or 'r', not {access!r}")
        if isinstance(array, DeviceArray):
            array._check_usable()
            if array.context is not self:
                raise ValueError(f"{array!r} belongs to another context")
            if array.resource_id == 0:
                raise ValueError(f"{array!r} is not an allocation of this context (MEM_ALLOC)")
            rid, base_dtype = array.resource_id, array.dtype
            buf_bytes = -(-max(array.nbytes, 1) // wire.PAGE_SIZE) * wire.PAGE_SIZE
        elif isinstance(array, (int, np.integer)) and not isinstance(array, bool):
            rid, base_dtype, buf_bytes = int(array), np.dtype(np.uint8), None
        else:
            raise TypeError(f"map needs a DeviceArray or a resource id, not {type(array).__name__}")
        if isinstance(va, VaRange):
            if va.context is not self:
                raise ValueError(f"{va!r} is a reservation of another context")
            va = va.va
        if nbytes is None:
            if buf_bytes is None:
                raise ValueError("nbytes is needed when mapping by resource id")
            nbytes = buf_bytes - int(offset)
        flags = wire.MEM_MAP_ACCESS_READ | (wire.MEM_MAP_ACCESS_WRITE if access == "rw" else 0)
        self._driver.call(_cmd(wire.CMD_MEM_MAP, (int(va), int(offset), int(nbytes), rid, flags),
                               ctx_id=self.ctx_id))
        dtype = np.dtype(dtype if dtype is not None else base_dtype)
        if shape is None:
            shape = (int(nbytes) // dtype.itemsize,)
        shape, dtype, _n = operands.allocation(shape, dtype)
        return MappedArray(self, int(va), shape, dtype, readonly=access == "r", nbytes=int(nbytes))

    @_api
    def unmap(self, va) -> None:
        """End a `map` (MEM_UNMAP, like cuMemUnmap): `va` is the MappedArray or its VA. Work
        submitted before still sees the mapping; later work faults at that address."""
        self._check_live()
        arr = va if isinstance(va, MappedArray) else None
        addr = arr.ptr if arr is not None else va
        self._driver.call(_cmd(wire.CMD_MEM_UNMAP, (int(addr),), ctx_id=self.ctx_id))
        if arr is not None:
            arr.freed = True
        if self._mapped_frees:  # dropped arrays that were mapped here may be freed now
            self._releases.retry_mapped(self)

    # ------------------------------------------------------------------ memory
    @_api
    def alloc(self, nbytes: int, *, executable: bool = False) -> tuple:
        """Raw device memory (MEM_ALLOC of 1 <= nbytes < 2**64; `executable`: with
        MEM_ALLOC_FLAG_EXEC, for a code object); -> (resource_id, va, size).
        Nothing frees it but `_free(resource_id)` (or a DeviceArray made over it, which
        then owns it) and the context's end. Out of device memory, garbage collection runs
        and frees dropped arrays before one more try (guest/api/lifetime.py)."""
        self._check_live()
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)):
            raise TypeError(f"nbytes must be an int, not {nbytes!r}")
        if not 0 < nbytes <= operands.MAX_NBYTES:
            raise ValueError(f"nbytes must be in [1, 2**64), not {nbytes}")
        rid = next(self.device._resource_ids)
        flags = wire.MEM_ALLOC_FLAG_EXEC if executable else 0
        cmd = command(wire.CMD_MEM_ALLOC, (rid, flags, int(nbytes)), ctx_id=self.ctx_id)
        try:
            _t, body = self._driver.call(cmd)
        except DeviceResponseError as e:
            if e.resp != wire.RESP_ERR_OUT_OF_MEMORY or not self._releases.collect():
                raise
            _t, body = self._driver.call(cmd)
        va, size = struct.unpack_from(wire.RESP_MEM_ALLOC_FORMAT, body)
        return rid, va, size

    @_api
    def empty(self, shape, dtype=np.float32) -> "DeviceArray":
        """A DeviceArray of `shape` and `dtype`, contents unspecified. Its memory is freed by
        `free()`, or when the array becomes garbage (guest/api/lifetime.py)."""
        shape, dtype, nbytes = operands.allocation(shape, dtype)
        rid, va, _size = self.alloc(max(nbytes, 1))
        return DeviceArray(self, rid, va, shape, dtype)

    @_api
    def zeros(self, shape, dtype=np.float32) -> "DeviceArray":
        arr = self.empty(shape, dtype)
        arr.copy_from_host(np.zeros(arr.shape, arr.dtype))
        return arr

    @_api
    def to_device(self, array) -> "DeviceArray":
        array = np.ascontiguousarray(array)
        out = self.empty(array.shape, array.dtype)
        out.copy_from_host(array)
        return out

    @_api
    def _free(self, rid: int) -> None:
        self._driver.call(command(wire.CMD_MEM_FREE, (rid,), ctx_id=self.ctx_id))

    # ------------------------------------------------------------------ copies
    @_api
    def copy_h2d(self, va: int, src: np.ndarray, stream: Stream | None = None, *,
                 pipeline: bool = True) -> None:
        """Copy a host array to device address `va` and wait for it (in `stream`'s order).
        Pinned memory goes in one DMA per request (no bounce); any other array through
        bounce chunks, `dev.staging_depth` in flight (one at a time with pipeline=False)."""
        s = self._stream(stream)
        pin = _pinned.extent(src, self.device.connection)
        if pin is not None:
            return _pinned.copy(self, s, "h2d", va, pin, pipeline=pipeline)
        src = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
        n = src.nbytes
        if n == 0:
            return
        dev, drv = self.device, self._driver
        if n <= dev.small_h2d_max:  # header, body and data in one descriptor, no bounce
            dev.copy_stats["small_copies"] += 1
            drv.call(_cmd(wire.CMD_COPY_H2D, (va, n), ctx_id=self.ctx_id, ring_idx=s.ring_idx,
                          extra=src.tobytes()))
            s._raise_async_error()
            return
        depth = max(1, dev.staging_depth) if pipeline else 1
        inflight = collections.deque()
        first_error = None

        def settle(req):
            nonlocal first_error
            dev._give_staging(req.bounce)
            try:
                req.response()
            except Exception as e:
                first_error = first_error or e

        chunk = dev.staging_chunk
        try:
            for off in range(0, n, chunk):
                size = min(chunk, n - off)
                if len(inflight) >= depth:
                    old = inflight[0]
                    drv.session.wait_for(lambda: old.done)
                    settle(inflight.popleft())
                gpa = dev._take_staging()
                try:
                    req = self._stage_h2d(s, va + off, src[off:off + size], gpa)
                except BaseException:
                    dev._give_staging(gpa)  # never reached the device
                    raise
                inflight.append(req)
            while inflight:
                old = inflight[0]
                drv.session.wait_for(lambda: old.done)
                settle(inflight.popleft())
        except BaseException:
            dev._quarantine_staging(r.bounce for r in inflight)
            raise
        if first_error is not None:
            raise first_error
        s._raise_async_error()

    def _stage_h2d(self, s: "Stream", va: int, chunk: np.ndarray, gpa: int):
        """Copy one chunk into the bounce buffer at `gpa` and submit its COPY_H2D."""
        mem, drv = self._driver.mem, self._driver
        mem.view(gpa, chunk.nbytes)[:] = chunk
        if drv.session.inline:
            mem.mark_dirty(gpa, chunk.nbytes)
        req = drv.submit(_cmd(wire.CMD_COPY_H2D, (va, chunk.nbytes), ctx_id=self.ctx_id,
                              ring_idx=s.ring_idx), readable=[(gpa, chunk.nbytes)])
        req.bounce = gpa
        return req

    @_api
    def copy_h2d_async(self, va: int, src: np.ndarray, stream: Stream | None = None) -> None:
        """Start copying a host array to device address `va` on `stream` and return without
        waiting for the device. `src` is staged into bounce chunks before this returns (it
        may be reused at once); when every chunk of the device's pool is in flight, the call
        waits for the oldest to complete. Errors surface at the stream's next synchronize."""
        s = self._stream(stream)
        pin = _pinned.extent(src, self.device.connection)
        if pin is not None:  # one DMA per request; `src` must stay unchanged until synchronized
            return _pinned.copy_async(self, s, "h2d", va, pin)
        src = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
        n = src.nbytes
        dev = self.device
        if 0 < n <= dev.small_h2d_max:  # the data travels in the command's descriptor
            dev.copy_stats["small_copies"] += 1
            req = self._driver.submit(_cmd(wire.CMD_COPY_H2D, (va, n), ctx_id=self.ctx_id,
                                           ring_idx=s.ring_idx, extra=src.tobytes()))
            req.on_done = s._async_done
            s._track(req)
            return
        chunk = dev.staging_chunk
        for off in range(0, n, chunk):
            size = min(chunk, n - off)
            gpa = dev._lend_staging()
            try:
                req = self._stage_h2d(s, va + off, src[off:off + size], gpa)
            except BaseException:
                dev._return_staging(gpa)  # never reached the device
                raise
            req.on_done = functools.partial(self._async_copy_done, s, None, 0, 0)
            s._track(req)

    def _async_copy_done(self, s: Stream, out, off: int, size: int, req) -> None:
        """An asynchronous copy chunk came back: D2H data lands in `out`, the chunk goes
        back to the pool, an error is kept for the stream's next synchronize."""
        try:
            req.response()
            if out is not None:
                out[off:off + size] = self._driver.mem.view(req.bounce, size)
        except Exception as e:
            s._keep_error(e)
        finally:
            self.device._return_staging(req.bounce)

    @_api
    def copy_d2h(self, va: int, dst: np.ndarray, stream: Stream | None = None, *,
                 pipeline: bool = True) -> np.ndarray:
        """Copy from device address `va` into the host array `dst` and wait (in `stream`'s
        order); -> dst. Pinned memory is written in place by the device (no bounce); any
        other array through bounce chunks, `dev.staging_depth` in flight (one at a time
        with pipeline=False)."""
        s = self._stream(stream)
        pin = _pinned.extent(dst, self.device.connection)
        if pin is not None:
            _pinned.copy(self, s, "d2h", va, pin, pipeline=pipeline)
            return dst
        if not dst.flags.c_contiguous or not dst.flags.writeable:
            raise ValueError("dst must be a writable C-contiguous array")
        out = dst.reshape(-1).view(np.uint8)
        n = out.nbytes
        if n == 0:
            return dst
        dev, drv, mem = self.device, self._driver, self._driver.mem
        pending = collections.deque()
        chunk = dev.staging_chunk
        offsets = iter(range(0, n, chunk))
        first_error = None

        def submit_next() -> bool:
            off = next(offsets, None)
            if off is None:
                return False
            size = min(chunk, n - off)
            req = self._stage_d2h(s, va + off, size, dev._take_staging, dev._give_staging)
            pending.append((req, off, size))
            return True

        try:
            for _ in range(max(1, dev.staging_depth) if pipeline else 1):
                if not submit_next():
                    break
            while pending:
                req, off, size = pending[0]
                drv.session.wait_for(lambda: req.done)
                pending.popleft()
                try:
                    req.response()
                    out[off:off + size] = mem.view(req.bounce, size)
                except Exception as e:
                    first_error = first_error or e
                dev._give_staging(req.bounce)
                submit_next()
        except BaseException:
            dev._quarantine_staging(r.bounce for r, _o, _s in pending)
            raise
        if first_error is not None:
            raise first_error
        s._raise_async_error()
        return dst

    def _stage_d2h(self, s: "Stream", va: int, size: int, take, give):
        """Submit COPY_D2H of `size` bytes at va into a bounce chunk from take() (given
        back with give() if the request never reaches the device); -> the request."""
        gpa = take()
        try:
            req = self._driver.submit(_cmd(wire.CMD_COPY_D2H, (va, size), ctx_id=self.ctx_id,
                                           ring_idx=s.ring_idx), writable=[(gpa, size)])
        except BaseException:
            give(gpa)
            raise
        req.bounce = gpa
        return req

    @_api
    def copy_d2h_async(self, va: int, dst: np.ndarray, stream: Stream | None = None) -> np.ndarray:
        """Start copying from device address `va` into the host array `dst` on `stream`;
        -> dst, whose contents are valid after the stream's next synchronize (or after an
        event recorded behind the copy completes). When every chunk of the device's pool is
        in flight, the call waits for the oldest to complete."""
        s = self._stream(stream)
        pin = _pinned.extent(dst, self.device.connection)
        if pin is not None:  # the device writes into `dst` itself
            _pinned.copy_async(self, s, "d2h", va, pin)
            return dst
        if not dst.flags.c_contiguous or not dst.flags.writeable:
            raise ValueError("dst must be a writable C-contiguous array")
        out = dst.reshape(-1).view(np.uint8)
        n = out.nbytes
        dev = self.device
        chunk = dev.staging_chunk
        for off in range(0, n, chunk):
            size = min(chunk, n - off)
            req = self._stage_d2h(s, va + off, size, dev._lend_staging, dev._return_staging)
            req.on_done = functools.partial(self._async_copy_done, s, out, off, size)
            s._track(req)
        return dst

    @_api
    def copy_d2d(self, dst_va: int, src_va: int, nbytes: int, stream: Stream | None = None) -> None:
        s = self._stream(stream)
        self._driver.call(_cmd(wire.CMD_COPY_D2D, (src_va, dst_va, nbytes), ctx_id=self.ctx_id,
                               ring_idx=s.ring_idx))

    # ------------------------------------------------------------------ launches
    @_api
    def load_module(self, src):
        """Load kernels of one's own (guest/api/module.py): PTX text or bytes, a path to a
        .ptx or .cu file, CUDA C source (with NVRTC: pip install 'pvgpu[cuda]'), or a code
        object. -> Module (get_function, get_global, unload)."""
        from guest.api import module as _module
        return _module.load(self, src)

    @_api
    def launch(self, kernel: str, grid, block, args, stream: Stream | None = None) -> None:
        """Launch a built-in kernel asynchronously on `stream` (default: the default stream)."""
        s = self._stream(stream)
        sig = wire.KERNELS_BY_NAME.get(kernel) if isinstance(kernel, str) else wire.BUILTIN_KERNELS.get(kernel)
        if sig is None:
            raise errors.InvalidKernelError(
                f"no built-in kernel {kernel!r}; available: {', '.join(sorted(wire.KERNELS_BY_NAME))}",
                code=wire.RESP_ERR_INVALID_KERNEL)
        if len(args) != len(sig.args):
            raise TypeError(f"{sig.name}({', '.join(n for n, _ in sig.args)}) takes "
                            f"{len(sig.args)} arguments, got {len(args)}")
        slots = b"".join(operands.kernel_argument(self, sig, name, kind, value)
                         for (name, kind), value in zip(sig.args, args))
        g, b = _dim3(grid), _dim3(block)
        s._raise_async_error()
        req = self._driver.submit(_cmd(wire.CMD_LAUNCH, (sig.kernel_id, *g, *b, len(args)),
                                       ctx_id=self.ctx_id, ring_idx=s.ring_idx, extra=slots))
        req.on_done = s._async_done

    @_api
    def synchronize(self) -> None:
        """Wait for all work of this context, on every stream (CTX_SYNC); raises the first
        error of earlier asynchronous work on any of them."""
        self._check_live()
        err = None
        try:
            self._driver.call(command(wire.CMD_CTX_SYNC, ctx_id=self.ctx_id))
        except Exception as e:
            err = e
        streams = self.streams
        for s in streams:
            s._settle()
        raise_first(err, *[s._take_error() for s in streams])
        # faults whose jobs' errors nobody has seen (they came only on the event queue)
        claimed = self.device._claim_faults(lambda ev: ev.ctx_id == self.ctx_id)
        if claimed:
            ev = claimed[0]
            more = f" (and {len(claimed) - 1} more)" if len(claimed) > 1 else ""
            if ev.type == wire.EVTQ_CODE_FAULT:
                e = errors.IllegalCodeError(f"{ev}{more}", info0=ev.address, info1=ev.detail)
            else:
                e = errors.PageFaultError(f"{ev}{more}", info0=ev.address, info1=ev.access)
            e.event = ev
            raise e

    @_api
    def destroy(self) -> None:
        if not self.destroyed:
            self._lost()
            self.device._contexts.pop(self.ctx_id, None)
            self._driver.call(command(wire.CMD_CTX_DESTROY, ctx_id=self.ctx_id))

    def _lost(self) -> None:
        """The context is gone (destroyed, or its device was reset)."""
        self.destroyed = True
        for s in self._streams.values():
            s.destroyed = True
        self._streams = {0: self.default_stream}


    def __repr__(self):
        return f"<pvgpu.Context {self.ctx_id} on device {self.device.index}>"


class DeviceArray:
    """A buffer in device memory that knows its shape, dtype and device VA (`ptr`). Copies
    to and from it and launches taking it check the dtype (guest/api/operands.py).

    An array with a resource id owns its memory: `free()` gives it back, and so does
    dropping the last reference to the array (guest/api/lifetime.py). Using an array after
    `free()` raises InvalidResourceError ("... was freed"); after its context was destroyed
    (or its device reset), InvalidContextError."""

    _ended = "freed"  # what free() did, for the use-after-free error

    def __init__(self, ctx: Context, resource_id: int, va: int, shape, dtype):
        self.context = ctx
        self._conn_lock = ctx._conn_lock
        self._releases = ctx._releases
        self.resource_id = resource_id
        self.ptr = va
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.freed = False
        self._finalizer = ctx._releases.track(self) if resource_id else None

    def _check_usable(self) -> None:
        if self.freed:
            raise errors.InvalidResourceError(f"{self!r} was {self._ended}",
                                              code=wire.RESP_ERR_INVALID_RESOURCE_ID)
        self.context._check_live()

    @property
    def va(self) -> int:
        return self.ptr

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __len__(self):
        return self.shape[0] if self.shape else 1

    @_api
    def to_host(self, out: np.ndarray | None = None, stream: Stream | None = None, *,
                pipeline: bool = True) -> np.ndarray:
        """-> the contents as a numpy array (`out` if given: an ndarray of this array's
        dtype and shape, guest/api/operands.py; a pinned `out` is filled by the device
        directly)."""
        self._check_usable()
        return self.context.copy_d2h(self.ptr, operands.host_destination(self, out), stream,
                                     pipeline=pipeline)

    @_api
    def to_host_async(self, out: np.ndarray | None = None, stream: Stream | None = None) -> np.ndarray:
        """-> the array the data will land in (valid after `stream`'s next synchronize)."""
        self._check_usable()
        return self.context.copy_d2h_async(self.ptr, operands.host_destination(self, out), stream)

    @_api
    def copy_from_host(self, array, stream: Stream | None = None, *, pipeline: bool = True) -> None:
        """Copy `array` (an ndarray of this array's dtype and shape: nothing is cast or
        reshaped, guest/api/operands.py) to the device and wait."""
        self._check_usable()
        self.context.copy_h2d(self.ptr, operands.host_source(self, array), stream, pipeline=pipeline)

    @_api
    def copy_from_host_async(self, array, stream: Stream | None = None) -> None:
        self._check_usable()
        self.context.copy_h2d_async(self.ptr, operands.host_source(self, array), stream)

    @_api
    def export(self):
        """Publish this buffer for other contexts, devices and guests -> BufferHandle (a
        capability: keep it private). Importers keep the memory alive after free()."""
        from guest.api import prime
        return prime.export(self)

    @_api
    def free(self) -> None:
        """Give the memory back now (MEM_FREE; work submitted before still completes).
        Refused (InvalidParameterError, the array stays live) while the buffer is still
        mapped elsewhere by Context.map. A second free() does nothing, and so does free()
        after the context was destroyed, its device reset or the connection closed: they
        freed the memory already."""
        if self.freed:
            return
        ctx = self.context
        session = ctx.device.connection.session
        if not (ctx.destroyed or session.closed or session.host_lost):
            ctx._free(self.resource_id)
        self.freed = True
        if self._finalizer is not None:
            self._finalizer.detach()

    def __repr__(self):
        return f"<pvgpu.DeviceArray shape={self.shape} dtype={self.dtype} ptr={self.ptr:#x}>"


@dataclass
class VaRange:
    """A reserved range of a context's device address space (Context.reserve_va): `va`,
    `size` (page rounded). Nothing is mapped in it until Context.map."""

    context: "Context"
    va: int
    size: int
    released: bool = False

    @property
    def end(self) -> int:
        return self.va + self.size

    def __contains__(self, addr) -> bool:
        return isinstance(addr, (int, np.integer)) and self.va <= addr < self.end

    @property
    def _conn_lock(self):
        return self.context._conn_lock

    @property
    def _releases(self):
        return self.context._releases

    @_api
    def release(self) -> None:
        if not self.released:
            self.context.release_va(self)

    def __repr__(self) -> str:
        return f"<pvgpu.VaRange {self.va:#x}+{self.size:#x} of context {self.context.ctx_id}>"


class MappedArray(DeviceArray):
    """A DeviceArray view of a buffer mapped a second time at a reserved VA (Context.map);
    `readonly` for access "r". `unmap()` (or `free()`, or leaving a `with` block) ends the
    mapping; the buffer itself lives on. The view owns nothing: dropping it leaves the
    mapping in place (until unmap or the context's end), and a buffer whose own array was
    dropped is freed once its last mapping is gone. unmap() twice does nothing."""

    _ended = "unmapped"

    def __init__(self, ctx: Context, va: int, shape, dtype, *, readonly: bool = False,
                 nbytes: int = 0):
        super().__init__(ctx, 0, va, shape, dtype)
        self.readonly = readonly
        self.mapped_bytes = nbytes

    @_api
    def unmap(self) -> None:
        if not self.freed:
            self.context.unmap(self)

    @_api
    def free(self) -> None:
        self.unmap()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self.freed and not self.context.destroyed and not self.context._driver.needs_reset:
            self.unmap()

    def __repr__(self) -> str:
        return (f"<pvgpu.MappedArray shape={self.shape} dtype={self.dtype} ptr={self.ptr:#x}"
                f"{' read-only' if self.readonly else ''}>")


def _dim3(v) -> tuple:
    if np.isscalar(v):
        v = (int(v),)
    v = tuple(int(x) for x in v) + (1, 1, 1)
    return v[:3]
