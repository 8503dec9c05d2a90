"""Buffers shared between devices and guests (spec §6.5.29–§6.5.31, §12), and peer copies.

DRM PRIME as Python objects, with CUDA's peer-access vocabulary:

    dev0.can_access_peer(dev1)          # the host's fabric routes P2P between them (hello)
    ctx1.enable_peer_access(dev0)       # imports in ctx1 may map dev0's VRAM over P2P
    h = a.export()                      # a BufferHandle; str(h) is "buf:<dev>:<id>:<token>:<size>"
    b = ctx1.import_array(h, (n,), np.float32)   # an ImportedArray: b.placement is
                                        # "local", "peer" (dev0's VRAM through its BAR) or
                                        # "system" (migrated to system memory)
    ctx1.memcpy_peer(dst, src)          # like cuMemcpyPeer (below)
    dev0.revoke(h)                      # no new imports with h; b keeps working

A handle is a capability: whoever holds it may import the buffer, on either device, from
any guest of the host; keep it private. Freeing the exported array, revoking the handle or
closing the exporting connection stops new imports; imports already made keep the memory
alive. The devices order the users of a shared buffer themselves (implicit sync, §12.4):
a kernel on device 1 reading an imported buffer waits for device 0's earlier writes to it.

memcpy_peer(dst, src) copies between arrays of different contexts or devices:
  - same context: one COPY_D2D;
  - otherwise, when the destination context has peer access to the source's device (or
    both are on one device): the source is imported once into the destination context
    and copied with one COPY_D2D on the destination device — peer-to-peer when the
    devices differ: the copy engine reads the other GPU's VRAM through its BAR;
  - otherwise it is staged through pinned host memory, like CUDA without peer access:
    chunks go device→host on the source device while the previous chunk goes host→device
    on the destination device (two buffers of `stage_chunk` bytes).
"""

from __future__ import annotations

import re
import struct
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pvgpu.guest.api import errors, operands
from pvgpu.guest.api.array import DeviceArray
from pvgpu.guest.api.commands import ring_command
from pvgpu.spec import wire

if TYPE_CHECKING:
    from pvgpu.guest.api.context import Context
    from pvgpu.guest.api.device import Device

_EXPORT = struct.Struct(wire.RESP_EXPORT_FORMAT)
_IMPORT = struct.Struct(wire.RESP_IMPORT_FORMAT)
STAGE_CHUNK = 8 << 20  # bytes per staging buffer of a memcpy_peer without peer access


@dataclass(frozen=True)
class BufferHandle:
    """An exported buffer: `str(handle)` or the object itself (picklable) can be passed to
    another guest, which imports it with `ctx.import_array(handle, ...)`."""

    device: int  # the exporting device's index
    handle_id: int
    token: int
    size: int

    _FORM = re.compile(r"^buf:(\d+):(\d+):([0-9a-fA-F]{1,16}):(\d+)$")

    def __str__(self) -> str:
        return f"buf:{self.device}:{self.handle_id}:{self.token:016x}:{self.size}"

    @classmethod
    def parse(cls, value) -> "BufferHandle":
        """A handle from its text form, `str(handle)` ('buf:<dev>:<id>:<token hex>:<size>');
        a BufferHandle is returned as it is. ValueError for anything else."""
        if isinstance(value, BufferHandle):
            return value
        m = cls._FORM.match(value) if isinstance(value, str) else None
        if m is None or int(m.group(2)) >= 1 << 64:
            raise ValueError(f"not a buffer handle: {value!r} "
                             "(expected 'buf:<dev>:<id>:<token hex>:<size>')")
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3), 16), int(m.group(4)))


class ImportedArray(DeviceArray):
    """A buffer of another context, device or guest, mapped into this context (§12.1).
    `placement` is where this device reached it at import time; `free()` ends the import,
    and so does dropping the array (the exporter's memory lives on while it or another
    importer holds it)."""

    def __init__(self, ctx, resource_id, va, shape, dtype, handle: BufferHandle, placement: str):
        super().__init__(ctx, resource_id, va, shape, dtype)
        self.handle = handle
        self.placement = placement

    def __repr__(self):
        return (f"<pvgpu.ImportedArray shape={self.shape} dtype={self.dtype} ptr={self.ptr:#x} "
                f"placement={self.placement} from device {self.handle.device}>")


# ---------------------------------------------------------------------- peer access
def enable_peer_access(ctx: "Context", peer: "Device") -> None:
    info = ctx.device.peer_info(peer)
    if not info["p2p"]:
        raise errors.PvgpuError(f"device {ctx.device.index} cannot reach device {peer.index} "
                                f"peer-to-peer (PCIe link: {info['link']}); copies between them "
                                "are staged through host memory")
    ctx._peer_access.add(peer.index)


def disable_peer_access(ctx: "Context", peer: "Device") -> None:
    ctx._peer_access.discard(peer.index)


# ---------------------------------------------------------------------- export / import
def export(arr: DeviceArray) -> BufferHandle:
    ctx = arr.context
    arr._check_usable()
    _t, body = ctx._driver.call(ring_command(wire.CMD_RESOURCE_EXPORT, (arr.resource_id,),
                                             ctx_id=ctx.ctx_id))
    handle_id, token, size = _EXPORT.unpack_from(body)
    return BufferHandle(ctx.device.index, handle_id, token, size)


def import_(ctx: "Context", handle, shape=None, dtype=np.float32, *,
            peer2peer: bool | None = None) -> ImportedArray:
    """RESOURCE_IMPORT into ctx. `peer2peer` (default: whether ctx has peer access to the
    exporting device) lets the device map the other device's VRAM directly."""
    ctx._check_live()
    handle = BufferHandle.parse(handle)
    dtype = np.dtype(dtype)
    if shape is None:
        shape = (handle.size // dtype.itemsize,)
    shape, dtype, nbytes = operands.allocation(shape, dtype)
    if nbytes > handle.size:
        raise ValueError(f"shape {shape} of {dtype} needs more than the buffer's {handle.size} bytes")
    if peer2peer is None:
        peer2peer = handle.device in ctx._peer_access
    rid = next(ctx.device._resource_ids)
    flags = wire.IMPORT_FLAG_PEER2PEER if peer2peer else 0
    _t, body = ctx._driver.call(ring_command(wire.CMD_RESOURCE_IMPORT,
                                             (handle.handle_id, handle.token, rid, flags),
                                             ctx_id=ctx.ctx_id))
    va, _size, placement = _IMPORT.unpack_from(body)
    return ImportedArray(ctx, rid, va, shape, dtype, handle,
                         wire.IMPORT_PLACEMENT_NAMES.get(placement, str(placement)))


def revoke(dev: "Device", handle) -> None:
    handle = BufferHandle.parse(handle)
    if handle.device != dev.index:
        raise ValueError(f"{handle} was exported on device {handle.device}, not {dev.index}")
    dev.driver.call(ring_command(wire.CMD_RESOURCE_REVOKE, (handle.handle_id,)))


# ---------------------------------------------------------------------- peer copies
def memcpy_peer(ctx: "Context", dst: DeviceArray, src: DeviceArray, nbytes: int | None = None,
                *, stage_chunk: int = STAGE_CHUNK) -> str:
    """Copy `nbytes` (default: all of src) from `src` to `dst` (an array of ctx), across
    contexts and devices; -> how: "d2d", "peer", "local" (through an import on the same
    device) or "staged" (through pinned host memory). Synchronous."""
    if dst.context is not ctx:
        raise ValueError(f"{dst!r} is not an array of {ctx!r}")
    for a in (dst, src):
        a._check_usable()
    n = src.nbytes if nbytes is None else int(nbytes)
    if n < 0 or n > src.nbytes or n > dst.nbytes:
        raise ValueError(f"cannot copy {n} bytes from {src.nbytes} into {dst.nbytes}")
    if n == 0:
        return "d2d"
    sdev, ddev = src.context.device, ctx.device
    if sdev.connection is not ddev.connection:
        raise ValueError("memcpy_peer copies between arrays of one connection; "
                         "share buffers between guests with export()/import_array()")
    if src.context is ctx:
        _copy_d2d_sync(ctx, dst.ptr, src.ptr, n)
        return "d2d"
    if sdev is ddev or sdev.index in ctx._peer_access:
        imp = _imported(ctx, src)
        _copy_d2d_sync(ctx, dst.ptr, imp.ptr, n)
        return imp.placement
    _staged(ctx, dst, src, n, stage_chunk)
    return "staged"


def _copy_d2d_sync(ctx: "Context", dst_va: int, src_va: int, n: int) -> None:
    """One fenced COPY_D2D on the default stream: answered once the copy is done."""
    ctx._check_live()
    ctx._driver.call(ring_command(wire.CMD_COPY_D2D, (src_va, dst_va, n), ctx_id=ctx.ctx_id,
                                  fence_id=1), kind=("d2d", n.bit_length()))
    ctx.default_stream._raise_async_error()


def _imported(ctx: "Context", src: DeviceArray) -> ImportedArray:
    """src imported into ctx (once per source array and context)."""
    for key, (ref, imp) in list(ctx._peer_imports.items()):  # sources freed since
        if ref() is None or ref().freed or imp.freed:
            del ctx._peer_imports[key]
            if not imp.freed:
                imp.free()  # else it would keep the freed source's memory alive
    p2p = src.context.device.index in ctx._peer_access
    key = (src.context.device.index, src.context.ctx_id, src.resource_id, p2p)
    entry = ctx._peer_imports.get(key)
    if entry is not None:
        return entry[1]
    handle = export(src)
    try:
        imp = import_(ctx, handle, (src.nbytes,), np.uint8, peer2peer=p2p)
    finally:
        revoke(src.context.device, handle)  # the import holds the buffer now
    ctx._peer_imports[key] = (weakref.ref(src), imp)
    return imp


def _staged(ctx: "Context", dst: DeviceArray, src: DeviceArray, n: int, chunk: int) -> None:
    """Device -> pinned host buffer -> device, two buffers, the two devices overlapping."""
    conn = ctx.device.connection
    chunk = max(4096, min(int(chunk), n))
    bufs = [conn.pinned_empty(chunk, np.uint8) for _ in range(2)]
    sctx = src.context
    s_in, s_out = sctx.create_stream(), ctx.create_stream()
    try:
        offsets = list(range(0, n, chunk))
        size = lambda off: min(chunk, n - off)  # noqa: E731
        sctx.copy_d2h_async(src.ptr, bufs[0][:size(0)], s_in)
        s_in.synchronize()
        for i, off in enumerate(offsets):
            ctx.copy_h2d_async(dst.ptr + off, bufs[i % 2][:size(off)], s_out)
            if i + 1 < len(offsets):
                nxt = offsets[i + 1]
                sctx.copy_d2h_async(src.ptr + nxt, bufs[(i + 1) % 2][:size(nxt)], s_in)
                s_in.synchronize()
            s_out.synchronize()
    finally:
        s_in.destroy()
        s_out.destroy()
        for b in bufs:
            b.free()
