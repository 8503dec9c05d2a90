"""Shared device memory (spec §6.5.19–§6.5.24, §6.6): Gdev's gshmget / gshmat / gshmdt /
gshmctl(IPC_RMID) as Python objects.

    seg = ctx.shm_get("frames", 64 << 20)          # first call with the key allocates
    a = seg.attach(ctx, shape=(n,), dtype=np.float32)  # a SharedArray: a DeviceArray view
    ctx.launch("scale", n // 256, 256, (a, a, 2.0, n))
    other = ctx2.shm_attach(seg, (n,), np.float32)  # the same VRAM in another context
    handle = seg.export()                           # give str(handle) to another guest ...
    seg_b = ctx_b.shm_import(handle)                # ... which imports it and attaches
    a.detach(); seg.remove()                        # RMID: freed once everyone detached

A `SharedSegment` belongs to a device (segment ids are per session and device); keys are
private to this connection (session): another guest's key with the same value is another
segment. Only the creator removes or exports a segment; a guest that neither created nor
imported one cannot name it (InvalidSegmentError) and an import with a wrong handle is
refused (PermissionDeniedError). There is no implicit synchronization between contexts
that share a segment: order their work with events (or synchronize), as in Gdev.

Keys are ints (0 < key < 2**64; 0 is SHM_KEY_PRIVATE: a new unnamed segment every time) or
strings (hashed to 64 bits).
"""

from __future__ import annotations

import hashlib
import struct
import weakref
from typing import TYPE_CHECKING

import numpy as np

from pvgpu.guest.api import operands
from pvgpu.guest.api.array import DeviceArray
from pvgpu.guest.api.commands import ring_command
from pvgpu.guest.api.handles import ExportedHandle
from pvgpu.guest.api.locking import ApiObject, unlocked
from pvgpu.spec import wire

if TYPE_CHECKING:
    from pvgpu.guest.api.context import Context
    from pvgpu.guest.api.device import Device

_SHM = struct.Struct(wire.RESP_SHM_FORMAT)
_ATTACH = struct.Struct(wire.RESP_SHM_ATTACH_FORMAT)
_HANDLE = struct.Struct(wire.RESP_SHM_HANDLE_FORMAT)
_STAT = struct.Struct(wire.RESP_SHM_STAT_FORMAT)
PRIVATE = wire.SHM_KEY_PRIVATE

# device -> {shm_id: SharedSegment}: one object per segment and device
_segments: weakref.WeakKeyDictionary[Device, dict[int, SharedSegment]] = weakref.WeakKeyDictionary()


def key_of(key) -> int:
    """An int key as it is; a str (or bytes) key hashed to a non-zero 64-bit value."""
    if isinstance(key, str):
        key = key.encode()
    if isinstance(key, (bytes, bytearray)):
        return int.from_bytes(hashlib.blake2b(bytes(key), digest_size=8).digest(), "little") or 1
    if isinstance(key, bool) or not isinstance(key, (int, np.integer)) or not 0 <= key < 1 << 64:
        raise ValueError(f"a shared memory key is an int in [0, 2**64) or a str, not {key!r}")
    return int(key)


class ShmHandle(ExportedHandle):
    """An exported segment: `str(handle)` ("shm:<id>:<token hex>") or the object itself
    (picklable) can be passed to another guest, which imports it with
    `ctx.shm_import(handle)` on the same device. Anyone holding it can map the segment:
    keep it private."""

    PREFIX = "shm"
    WHAT = "a shared memory handle"


class SharedSegment(ApiObject):
    """A segment of shared device memory on one device, as this guest names it."""

    def __init__(self, device, shm_id: int, nbytes: int, *, key: int | None = None,
                 created: bool = False, imported: bool = False):
        self.device = device
        self._conn_lock = device._conn_lock
        self._releases = device._releases
        self._driver = device.driver
        self.shm_id = shm_id
        self.nbytes = nbytes  # page rounded
        self.key = key
        self.created = created  # this guest allocated it (SHM_FLAG_CREATED)
        self.imported = imported
        self._attached: dict[int, SharedArray] = {}  # ctx_id -> this connection's attachment

    @property
    @unlocked("a field fixed at creation")
    def size(self) -> int:
        """The segment's size in bytes (the same as `nbytes`)."""
        return self.nbytes

    # -------------------------------------------------------------- attach / detach
    def attach(self, ctx: "Context", shape=None, dtype=np.float32, *,
               readonly: bool = False) -> "SharedArray":
        """Map the segment into `ctx` (SHM_ATTACH); -> a SharedArray of `shape` and
        `dtype` (default: the whole segment as a 1-D array of dtype)."""
        return ctx.shm_attach(self, shape, dtype, readonly=readonly)

    def detach(self, ctx_or_array) -> None:
        """End the attachment in a context (or of a SharedArray) (SHM_DETACH)."""
        if isinstance(ctx_or_array, SharedArray):
            ctx_or_array.detach()
        else:
            ctx_or_array.shm_detach(self)

    def remove(self) -> None:
        """Mark the segment for removal (SHM_CONTROL RMID; its creator only): no new
        attachments; the memory is freed once every context of every guest has detached."""
        self._driver.call(ring_command(wire.CMD_SHM_CONTROL, (self.shm_id, wire.SHM_CTL_RMID)))

    def export(self) -> ShmHandle:
        """A capability another guest imports with `ctx.shm_import(handle)` (creator only;
        the same handle each time)."""
        _t, body = self._driver.call(ring_command(wire.CMD_SHM_EXPORT, (self.shm_id,)))
        return ShmHandle(*_HANDLE.unpack_from(body))

    def info(self, ctx: "Context | None" = None) -> dict:
        """SHM_CONTROL STAT: {size, nattach (contexts of all guests), removed, creator,
        va (of the attachment in `ctx`, or 0)}."""
        ctx_id = ctx.ctx_id if ctx is not None else 0
        _t, body = self._driver.call(ring_command(wire.CMD_SHM_CONTROL,
                                                  (self.shm_id, wire.SHM_CTL_STAT), ctx_id=ctx_id))
        size, va, nattach, flags = _STAT.unpack_from(body)
        return {"size": size, "va": va, "nattach": nattach,
                "removed": bool(flags & wire.SHM_STAT_REMOVED),
                "creator": bool(flags & wire.SHM_STAT_CREATOR)}

    def __repr__(self) -> str:
        how = "created" if self.created else "imported" if self.imported else "found"
        return (f"<pvgpu.SharedSegment {self.shm_id} ({how}) {self.nbytes} bytes on device "
                f"{self.device.index}>")


class SharedArray(DeviceArray):
    """A DeviceArray over an attached segment (`ptr` is the attachment's VA in its
    context). `detach()` (or `free()`, or leaving a `with` block) ends the attachment; the
    segment lives on until removed. The array owns nothing: dropping it leaves the
    attachment in place (until detach or the context's end). detach() twice does nothing."""

    _ended = "detached"

    def __init__(self, ctx: "Context", segment: SharedSegment, va: int, shape, dtype,
                 readonly: bool = False):
        super().__init__(ctx, 0, va, shape, dtype)
        self.segment = segment
        self.readonly = readonly

    def detach(self) -> None:
        """End this attachment (SHM_DETACH); the segment lives on. Twice does nothing."""
        if not self.freed:
            self.context.shm_detach(self.segment)

    def free(self) -> None:
        """The same as `detach()`: an attachment owns no memory."""
        self.detach()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self.freed and not self.context.destroyed and not self.context._driver.needs_reset:
            self.detach()

    def __repr__(self) -> str:
        return (f"<pvgpu.SharedArray of segment {self.segment.shm_id} shape={self.shape} "
                f"dtype={self.dtype} ptr={self.ptr:#x}>")


# ------------------------------------------------------------------ the calls behind the methods
def _segment(device, shm_id: int, size: int, **kw) -> SharedSegment:
    known = _segments.setdefault(device, {})
    seg = known.get(shm_id)
    if seg is None or seg.nbytes != size:
        seg = known[shm_id] = SharedSegment(device, shm_id, size, **kw)
    else:
        for k, v in kw.items():
            if v and not getattr(seg, k, None):
                setattr(seg, k, v)
    return seg


def get(device, key, nbytes: int = 0) -> SharedSegment:
    """SHM_GET on `device`: the segment of `key` (allocated by the first call; nbytes 0
    only looks it up)."""
    k = key_of(key)
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
        raise ValueError(f"nbytes must be an int >= 0, not {nbytes!r}")
    _t, body = device.driver.call(ring_command(wire.CMD_SHM_GET, (k, int(nbytes), 0)))
    shm_id, flags, size = _SHM.unpack_from(body)
    return _segment(device, shm_id, size, key=k, created=bool(flags & wire.SHM_FLAG_CREATED))


def import_(device, handle) -> SharedSegment:
    """SHM_IMPORT on `device` of an exported segment (ShmHandle or its string form)."""
    h = ShmHandle.parse(handle)
    _t, body = device.driver.call(ring_command(wire.CMD_SHM_IMPORT, (h.handle_id, h.token)))
    shm_id, _flags, size = _SHM.unpack_from(body)
    return _segment(device, shm_id, size, imported=True)


def attach(ctx: "Context", seg: SharedSegment, shape=None, dtype=np.float32,
           readonly: bool = False) -> SharedArray:
    if not isinstance(seg, SharedSegment):
        raise TypeError(f"shm_attach needs a SharedSegment, not {type(seg).__name__}")
    if seg.device is not ctx.device:
        raise ValueError(f"{seg!r} is a segment of device {seg.device.index}; "
                         f"{ctx!r} is on device {ctx.device.index}")
    ctx._check_live()
    dtype = np.dtype(dtype)
    if shape is None:
        shape = (seg.nbytes // dtype.itemsize,)
    shape, dtype, nbytes = operands.allocation(shape, dtype)
    if nbytes > seg.nbytes:
        raise ValueError(f"an array of shape {shape} and dtype {dtype} ({nbytes} bytes) does "
                         f"not fit the segment's {seg.nbytes} bytes")
    flags = wire.SHM_ATTACH_RDONLY if readonly else 0
    _t, body = ctx._driver.call(ring_command(wire.CMD_SHM_ATTACH, (seg.shm_id, flags),
                                             ctx_id=ctx.ctx_id))
    va, _size = _ATTACH.unpack_from(body)
    arr = SharedArray(ctx, seg, va, shape, dtype, readonly)
    seg._attached[ctx.ctx_id] = arr
    return arr


def detach(ctx: "Context", seg_or_array) -> None:
    seg = seg_or_array.segment if isinstance(seg_or_array, SharedArray) else seg_or_array
    if not isinstance(seg, SharedSegment):
        raise TypeError(f"shm_detach needs a SharedSegment or SharedArray, not "
                        f"{type(seg_or_array).__name__}")
    ctx._check_live()
    ctx._driver.call(ring_command(wire.CMD_SHM_DETACH, (seg.shm_id,), ctx_id=ctx.ctx_id))
    arr = seg._attached.pop(ctx.ctx_id, None)
    if arr is not None:
        arr.freed = True


__all__ = ["SharedSegment", "SharedArray", "ShmHandle", "key_of"]
