"""A context (spec §6): one device address space and its work — its streams, events,
memory (allocations, explicit VA management, spec §6.7), copies (guest/api/copy.py),
launches (guest/api/launch.py, guest/api/module.py), sharing (guest/api/prime.py,
guest/api/shm.py) and the faults its jobs raised.

Explicit VA management (like cuMemAddressReserve / cuMemMap / cuMemSetAccess):
`r = ctx.reserve_va(nbytes, alignment=...)` reserves address space (a VaRange);
`v = ctx.map(array, r, access="r")` maps a buffer of the context there a second time (a
MappedArray; access "r" or "rw"), `ctx.unmap(v)` and `ctx.release_va(r)` undo it. A write
through a read-only mapping raises PageFaultError (address, access "write").
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import numpy as np

from pvgpu.guest.api import errors, launch, module, operands, prime, shm
from pvgpu.guest.api.array import DeviceArray, MappedArray, VaRange
from pvgpu.guest.api.commands import ring_command
from pvgpu.guest.api.copy import D2H, H2D, CopyPipeline
from pvgpu.guest.api.event import Event
from pvgpu.guest.api.lifetime import DestroyedOnExit
from pvgpu.guest.api.locking import ApiObject, api
from pvgpu.guest.api.stream import Stream, raise_first
from pvgpu.guest.frontend.driver import DeviceEvent, DeviceResponseError, command
from pvgpu.spec import wire

if TYPE_CHECKING:
    from pvgpu.guest.api.device import Device

FAULT_EVENTS = (wire.EVTQ_PAGE_FAULT, wire.EVTQ_CODE_FAULT)  # a faulted context keeps working


class Context(DestroyedOnExit, ApiObject):
    """A GPU context on one device (`dev.create_context()`), like a CUDA context: its
    own address space, its streams (`default_stream`, `create_stream`), the memory it
    allocates (`empty`, `zeros`, `to_device`), built-in kernel launches and modules of
    one's own, copies, VA management, shared memory and imports. `destroy()` (or leaving
    a `with` block) frees everything it holds on the device."""

    def __init__(self, device: "Device", ctx_id: int):
        self.device = device
        self._conn_lock = device._conn_lock
        self._releases = device._releases
        self.ctx_id = ctx_id
        self._driver = device.driver
        self.destroyed = False
        self._streams = {}  # ring_idx -> Stream
        self.default_stream = self._streams[0] = Stream(self, 0)
        self._device_events: list[DeviceEvent] = []  # of this context (event queue)
        self._peer_access: set[int] = set()  # device indices whose VRAM imports may map P2P
        # (dev, ctx_id, resource_id, p2p) -> (weakref(src), ImportedArray)
        self._peer_imports: dict[tuple, tuple] = {}
        self._mapped_frees: list[int] = []  # dropped arrays whose MEM_FREE waits for an unmap
        # synchronize's CTX_SYNC, encoded once
        self._sync_command = command(wire.CMD_CTX_SYNC, ctx_id=ctx_id)

    @property
    def faults(self) -> list:
        """The GPU page faults and code faults of this context's jobs, as the device
        reported them on its event queue (DeviceEvent: type, address, access or detail,
        vmid, engine, ring_idx, timestamp_ns). A faulted context keeps working (spec
        CMD-FAULT-4)."""
        return [e for e in self._device_events if e.type in FAULT_EVENTS]

    @property
    def faulted(self) -> bool:
        """Whether any job of this context has faulted (`faults` is not empty)."""
        return bool(self.faults)

    # ------------------------------------------------------------------ sharing (§12)
    def enable_peer_access(self, peer: "Device") -> None:
        """Let buffers of device `peer` imported into this context be mapped peer-to-peer
        (cuCtxEnablePeerAccess); PvgpuError if the host's fabric cannot route it."""
        prime.enable_peer_access(self, peer)

    def disable_peer_access(self, peer: "Device") -> None:
        """Undo `enable_peer_access(peer)` (cuCtxDisablePeerAccess): later imports of
        `peer`'s buffers are mapped through system memory."""
        prime.disable_peer_access(self, peer)

    def import_array(self, handle, shape=None, dtype=np.float32, *, peer2peer=None):
        """Import a buffer another context, device or guest exported (DeviceArray.export)
        -> ImportedArray (guest/api/prime.py)."""
        return prime.import_(self, handle, shape, dtype, peer2peer=peer2peer)

    def memcpy_peer(self, dst: "DeviceArray", src: "DeviceArray", nbytes: int | None = None,
                    **kw) -> str:
        """Copy from `src` (any context or device of this connection) into `dst` (of this
        context), like cuMemcpyPeer; -> "d2d", "local", "peer", "system" or "staged"
        (guest/api/prime.py)."""
        return prime.memcpy_peer(self, dst, src, nbytes, **kw)

    # ------------------------------------------------------------------ streams
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
    def streams(self) -> list:
        """The context's live streams, the default stream first."""
        return self._live_streams()

    def _live_streams(self) -> list:
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
    def create_event(self) -> Event:
        """A new event of this context's device; it exists on the device once recorded."""
        return Event(self.device, next(self.device._event_ids), self)

    def import_event(self, handle) -> Event:
        """An event bound to an exported one (`EventHandle` or its string form), from
        another guest, another context or the other device."""
        return self.device._import_event(handle, self)

    # ------------------------------------------------------------------ shared device memory
    def shm_get(self, key, nbytes: int = 0):
        """The shared segment of `key` on this context's device (Device.shm_get)."""
        return self.device.shm_get(key, nbytes)

    def shm_import(self, handle):
        """Import an exported segment on this context's device (Device.shm_import)."""
        return self.device.shm_import(handle)

    def shm_attach(self, seg, shape=None, dtype=np.float32, *, readonly: bool = False):
        """Map shared segment `seg` into this context; -> a SharedArray (a DeviceArray of
        `shape`, default the whole segment) at the attachment's VA (guest/api/shm.py)."""
        return shm.attach(self, seg, shape, dtype, readonly)

    def shm_detach(self, seg) -> None:
        """End this context's attachment of `seg` (a SharedSegment or SharedArray)."""
        shm.detach(self, seg)

    # ------------------------------------------------------------------ explicit VA management
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
        cmd = ring_command(wire.CMD_VA_RESERVE, (int(nbytes), int(alignment)), ctx_id=self.ctx_id)
        _t, body = self._driver.call(cmd)
        va, size = struct.unpack_from(wire.RESP_VA_FORMAT, body)
        return VaRange(self, va, size)

    def release_va(self, va_range) -> None:
        """Give a reservation back (VA_RELEASE, like cuMemAddressFree): `va_range` is the
        VaRange or its start VA. Everything mapped in it must be unmapped first
        (InvalidParameterError otherwise)."""
        self._check_live()
        va = va_range.va if isinstance(va_range, VaRange) else va_range
        self._driver.call(ring_command(wire.CMD_VA_RELEASE, (int(va),), ctx_id=self.ctx_id))
        if isinstance(va_range, VaRange):
            va_range.released = True

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
        self._driver.call(ring_command(wire.CMD_MEM_MAP,
                                       (int(va), int(offset), int(nbytes), rid, flags),
                                       ctx_id=self.ctx_id))
        dtype = np.dtype(dtype if dtype is not None else base_dtype)
        if shape is None:
            shape = (int(nbytes) // dtype.itemsize,)
        shape, dtype, _n = operands.allocation(shape, dtype)
        return MappedArray(self, int(va), shape, dtype, readonly=access == "r", nbytes=int(nbytes))

    def unmap(self, va) -> None:
        """End a `map` (MEM_UNMAP, like cuMemUnmap): `va` is the MappedArray or its VA. Work
        submitted before still sees the mapping; later work faults at that address."""
        self._check_live()
        arr = va if isinstance(va, MappedArray) else None
        addr = arr.ptr if arr is not None else va
        self._driver.call(ring_command(wire.CMD_MEM_UNMAP, (int(addr),), ctx_id=self.ctx_id))
        if arr is not None:
            arr.freed = True
        if self._mapped_frees:  # dropped arrays that were mapped here may be freed now
            self._releases.retry_mapped(self)

    # ------------------------------------------------------------------ memory
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

    def empty(self, shape, dtype=np.float32) -> "DeviceArray":
        """A DeviceArray of `shape` and `dtype`, contents unspecified. Its memory is freed by
        `free()`, or when the array becomes garbage (guest/api/lifetime.py)."""
        shape, dtype, nbytes = operands.allocation(shape, dtype)
        rid, va, _size = self.alloc(max(nbytes, 1))
        return DeviceArray(self, rid, va, shape, dtype)

    def zeros(self, shape, dtype=np.float32) -> "DeviceArray":
        """`empty(shape, dtype)` filled with zeros."""
        arr = self.empty(shape, dtype)
        arr.copy_from_host(np.zeros(arr.shape, arr.dtype))
        return arr

    def to_device(self, array) -> "DeviceArray":
        """A new DeviceArray holding a copy of `array` (any array-like: its shape and
        dtype), like cupy.asarray."""
        array = np.ascontiguousarray(array)
        out = self.empty(array.shape, array.dtype)
        out.copy_from_host(array)
        return out

    @api  # private, but a call of its own (DeviceArray.free, tools): it locks as one
    def _free(self, rid: int) -> None:
        self._driver.call(command(wire.CMD_MEM_FREE, (rid,), ctx_id=self.ctx_id))

    # ------------------------------------------------------------------ copies
    def copy_h2d(self, va: int, src: np.ndarray, stream: Stream | None = None, *,
                 pipeline: bool = True) -> None:
        """Copy a host array to device address `va` and wait for it (in `stream`'s order).
        Pinned memory goes in one DMA per request (no bounce); any other array through
        bounce chunks, `dev.staging_depth` in flight (one at a time with pipeline=False)."""
        CopyPipeline(self, self._stream(stream), H2D, True, pipeline=pipeline).run(va, src)

    def copy_h2d_async(self, va: int, src: np.ndarray, stream: Stream | None = None) -> None:
        """Start copying a host array to device address `va` on `stream` and return without
        waiting for the device. `src` is staged into bounce chunks before this returns (it
        may be reused at once); when every chunk of the device's pool is in flight, the call
        waits for the oldest to complete. Errors surface at the stream's next synchronize.
        Pinned memory goes in one DMA per request: it must stay unchanged until synchronized."""
        CopyPipeline(self, self._stream(stream), H2D, False).run(va, src)

    def copy_d2h(self, va: int, dst: np.ndarray, stream: Stream | None = None, *,
                 pipeline: bool = True) -> np.ndarray:
        """Copy from device address `va` into the host array `dst` and wait (in `stream`'s
        order); -> dst. Pinned memory is written in place by the device (no bounce); any
        other array through bounce chunks, `dev.staging_depth` in flight (one at a time
        with pipeline=False)."""
        CopyPipeline(self, self._stream(stream), D2H, True, pipeline=pipeline).run(va, dst)
        return dst

    def copy_d2h_async(self, va: int, dst: np.ndarray, stream: Stream | None = None) -> np.ndarray:
        """Start copying from device address `va` into the host array `dst` on `stream`;
        -> dst, whose contents are valid after the stream's next synchronize (or after an
        event recorded behind the copy completes). When every chunk of the device's pool is
        in flight, the call waits for the oldest to complete."""
        CopyPipeline(self, self._stream(stream), D2H, False).run(va, dst)
        return dst

    def copy_d2d(self, dst_va: int, src_va: int, nbytes: int, stream: Stream | None = None) -> None:
        """Copy `nbytes` from device address `src_va` to `dst_va` on `stream` (default:
        the default stream), asynchronously: an untyped cuMemcpyDtoDAsync."""
        s = self._stream(stream)
        self._driver.call(ring_command(wire.CMD_COPY_D2D, (src_va, dst_va, nbytes),
                                       ctx_id=self.ctx_id, ring_idx=s.ring_idx))

    # ------------------------------------------------------------------ launches
    def load_module(self, src):
        """Load kernels of one's own (guest/api/module.py): PTX text or bytes, a path to a
        .ptx or .cu file, CUDA C source (with NVRTC: pip install 'pvgpu[cuda]'), or a code
        object. -> Module (get_function, get_global, unload)."""
        return module.load(self, src)

    def launch(self, kernel: str, grid, block, args, stream: Stream | None = None) -> None:
        """Launch a built-in kernel asynchronously on `stream` (default: the default stream)."""
        launch.builtin(self, self.default_stream if stream is None else self._stream(stream),
                       kernel, grid, block, args)

    def synchronize(self) -> None:
        """Wait for all work of this context, on every stream (CTX_SYNC); raises the first
        error of earlier asynchronous work on any of them. When the driver still holds back
        work of one of its streams (launches gathered in the open batch, or the latest code
        launch; guest/frontend/launch_batch.py) and knows every other stream's timeline
        clean -- each work on it covered by a sync point answered OK, so it holds neither
        work nor an error (guest/frontend/timelines.py) -- that work, sent fenced, is the
        sync point instead: it waits for and reports what a CTX_SYNC would."""
        self._check_live()
        err = None
        try:
            driver = self._driver
            req = driver.send_fenced_for_context(self.ctx_id)
            if req is None:
                driver.call(self._sync_command)
            else:
                driver.wait(req)
        except Exception as e:
            err = e
        streams = self._live_streams()  # (the property would take the API lock again)
        for s in streams:
            s._settle()
        raise_first(err, *[s._take_error() for s in streams])
        # faults whose jobs' errors nobody has seen (they came only on the event queue)
        claimed = self.device._claim_faults(lambda ev: ev.ctx_id == self.ctx_id)
        if claimed:
            ev = claimed[0]
            more = f" (and {len(claimed) - 1} more)" if len(claimed) > 1 else ""
            fault: errors.IllegalCodeError | errors.PageFaultError
            if ev.type == wire.EVTQ_CODE_FAULT:
                fault = errors.IllegalCodeError(f"{ev}{more}", info0=ev.address, info1=ev.detail)
            else:
                fault = errors.PageFaultError(f"{ev}{more}", info0=ev.address, info1=ev.access)
            fault.event = ev
            raise fault

    def destroy(self) -> None:
        """Destroy the context (CTX_DESTROY): the device frees its memory, streams and
        events; its arrays are unusable afterwards. A second destroy() does nothing."""
        if not self.destroyed:
            self._lost()
            self.device._contexts.pop(self.ctx_id, None)
            self._driver.call(command(wire.CMD_CTX_DESTROY, ctx_id=self.ctx_id))

    def _export(self, arr: DeviceArray):
        """DeviceArray.export: RESOURCE_EXPORT of `arr` (guest/api/prime.py)."""
        return prime.export(arr)

    def _fault_scope(self) -> tuple:
        return self.device, self.ctx_id

    def _lost(self) -> None:
        """The context is gone (destroyed, or its device was reset)."""
        self.destroyed = True
        for s in self._streams.values():
            s.destroyed = True
        self._streams = {0: self.default_stream}

    def __repr__(self):
        return f"<pvgpu.Context {self.ctx_id} on device {self.device.index}>"
