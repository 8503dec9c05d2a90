"""Device arrays: a buffer in device memory with a shape, a dtype and a device VA, numpy in
and numpy out (`to_host`, `copy_from_host` and their async forms); the reservations of
explicit VA management (`VaRange`, spec §6.7) and the views of a buffer mapped a second
time into one (`MappedArray`). Arrays that own their memory free it with `free()` or when
they become garbage (guest/api/lifetime.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from guest.api import errors, operands
from guest.api.locking import ApiObject, unlocked
from spec import wire


class DeviceArray(ApiObject):
    """A buffer in device memory that knows its shape, dtype and device VA (`ptr`). Copies
    to and from it and launches taking it check the dtype (guest/api/operands.py).

    An array with a resource id owns its memory: `free()` gives it back, and so does
    dropping the last reference to the array (guest/api/lifetime.py). Using an array after
    `free()` raises InvalidResourceError ("... was freed"); after its context was destroyed
    (or its device reset), InvalidContextError."""

    _ended = "freed"  # what free() did, for the use-after-free error

    def __init__(self, ctx: "Context", resource_id: int, va: int, shape, dtype):
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
    @unlocked("a field fixed at creation")
    def va(self) -> int:
        return self.ptr

    @property
    @unlocked("computed from the shape")
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    @unlocked("computed from the shape and dtype")
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __len__(self):
        return self.shape[0] if self.shape else 1

    def to_host(self, out: np.ndarray | None = None, stream: "Stream | None" = None, *,
                pipeline: bool = True) -> np.ndarray:
        """-> the contents as a numpy array (`out` if given: an ndarray of this array's
        dtype and shape, guest/api/operands.py; a pinned `out` is filled by the device
        directly)."""
        self._check_usable()
        return self.context.copy_d2h(self.ptr, operands.host_destination(self, out), stream,
                                     pipeline=pipeline)

    def to_host_async(self, out: np.ndarray | None = None,
                      stream: "Stream | None" = None) -> np.ndarray:
        """-> the array the data will land in (valid after `stream`'s next synchronize)."""
        self._check_usable()
        return self.context.copy_d2h_async(self.ptr, operands.host_destination(self, out), stream)

    def copy_from_host(self, array, stream: "Stream | None" = None, *,
                       pipeline: bool = True) -> None:
        """Copy `array` (an ndarray of this array's dtype and shape: nothing is cast or
        reshaped, guest/api/operands.py) to the device and wait."""
        self._check_usable()
        self.context.copy_h2d(self.ptr, operands.host_source(self, array), stream, pipeline=pipeline)

    def copy_from_host_async(self, array, stream: "Stream | None" = None) -> None:
        self._check_usable()
        self.context.copy_h2d_async(self.ptr, operands.host_source(self, array), stream)

    def export(self):
        """Publish this buffer for other contexts, devices and guests -> BufferHandle (a
        capability: keep it private). Importers keep the memory alive after free()."""
        return self.context._export(self)

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
class VaRange(ApiObject):
    """A reserved range of a context's device address space (Context.reserve_va): `va`,
    `size` (page rounded). Nothing is mapped in it until Context.map."""

    context: "Context"
    va: int
    size: int
    released: bool = False

    @property
    @unlocked("computed from fields fixed at creation")
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

    def __init__(self, ctx: "Context", va: int, shape, dtype, *, readonly: bool = False,
                 nbytes: int = 0):
        super().__init__(ctx, 0, va, shape, dtype)
        self.readonly = readonly
        self.mapped_bytes = nbytes

    def unmap(self) -> None:
        if not self.freed:
            self.context.unmap(self)

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
