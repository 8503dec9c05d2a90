"""Device arrays: a buffer in device memory with a shape, a dtype and a device VA, numpy in
and numpy out (`to_host`/`get`, `copy_from_host`/`set` and their async forms), shaped like
CuPy's ndarray where that is cheap and exact: `ndim`, `size`, `itemsize`, `strides`,
`reshape` and slicing of contiguous ranges (views of the same memory), `copy()`,
`fill()`; an implicit conversion to numpy is refused, as CuPy refuses it. Also the
reservations of explicit VA management (`VaRange`, spec §6.7) and the views of a buffer
mapped a second time into one (`MappedArray`). Arrays that own their memory free it with
`free()` or when they become garbage (guest/api/lifetime.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pvgpu.guest.api import errors, operands
from pvgpu.guest.api.locking import ApiObject, unlocked
from pvgpu.spec import wire

if TYPE_CHECKING:
    from pvgpu.guest.api.context import Context
    from pvgpu.guest.api.stream import Stream


class DeviceArray(ApiObject):
    """A buffer in device memory that knows its shape, dtype and device VA (`ptr`). Copies
    to and from it and launches taking it check the dtype (guest/api/operands.py).

    An array with a resource id owns its memory: `free()` gives it back, and so does
    dropping the last reference to the array (guest/api/lifetime.py). Using an array after
    `free()` raises InvalidResourceError ("... was freed"); after its context was destroyed
    (or its device reset), InvalidContextError."""

    _ended = "freed"  # what free() did, for the use-after-free error

    def __init__(self, ctx: "Context", resource_id: int, va: int, shape, dtype, *, base=None):
        self.context = ctx
        # the array whose memory a view (reshape, slice) shows; the view keeps it alive
        self.base = base
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
        if self.base is not None:
            self.base._check_usable()
        self.context._check_live()

    @property
    @unlocked("a field fixed at creation")
    def va(self) -> int:
        """The array's device virtual address (the same as `ptr`)."""
        return self.ptr

    @property
    @unlocked("computed from the shape")
    def size(self) -> int:
        """The number of elements (the product of `shape`)."""
        return math.prod(self.shape)

    @property
    @unlocked("computed from the shape and dtype")
    def nbytes(self) -> int:
        """The array's size in bytes."""
        return self.size * self.dtype.itemsize

    @property
    @unlocked("computed from the shape")
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    @property
    @unlocked("computed from the dtype")
    def itemsize(self) -> int:
        """Bytes per element."""
        return self.dtype.itemsize

    @property
    @unlocked("computed from the shape and dtype")
    def strides(self) -> tuple:
        """Bytes between neighbours along each axis: device arrays are C-contiguous."""
        return _c_strides(self.shape, self.dtype.itemsize)

    @unlocked("computed from the shape")
    def __len__(self) -> int:
        """The length of the first axis; TypeError for a 0-d array."""
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    @unlocked("refuses at once")
    def __array__(self, dtype=None, copy=None):
        """Refused, as in CuPy: `np.asarray(a)` raises TypeError; `a.get()` copies the
        array to the host."""
        raise TypeError("implicit conversion to a NumPy array is not allowed; use .get()")

    # ------------------------------------------------------------------ views
    def reshape(self, *shape) -> "DeviceArray":
        """A view of the same memory with another shape of the same size (one dimension may
        be -1); like numpy's and CuPy's reshape of a contiguous array."""
        self._check_usable()
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return self._view(self.ptr, _reshaped(self.size, shape))

    def __getitem__(self, key) -> "DeviceArray":
        """A view of a contiguous range: integers on the leading axes, then at most one
        slice with step 1, then whole axes (`a[3]`, `a[2:5]`, `a[1, 4:]`, `a[2, ...]`). What
        would not be contiguous (steps, fancy indexing) raises IndexError; copy it to the
        host with get() and index there."""
        self._check_usable()
        offset, shape = _contiguous_range(self.shape, key)
        return self._view(self.ptr + offset * self.dtype.itemsize, shape)

    def _view(self, va: int, shape) -> "DeviceArray":
        return DeviceArray(self.context, 0, va, shape, self.dtype,
                           base=self if self.base is None else self.base)

    # ------------------------------------------------------------------ CuPy's names
    def get(self, stream: "Stream | None" = None, out: np.ndarray | None = None) -> np.ndarray:
        """CuPy's name of `to_host`: the contents as a new numpy array (or in `out`)."""
        return self.to_host(out, stream)

    def set(self, array, stream: "Stream | None" = None) -> None:
        """CuPy's name of `copy_from_host`: `array` (this array's dtype and shape) to the
        device."""
        self.copy_from_host(array, stream)

    def copy(self, stream: "Stream | None" = None) -> "DeviceArray":
        """A new array (its own memory, in this array's context) with the same contents:
        a device-to-device copy in `stream`'s order."""
        self._check_usable()
        out = self.context.empty(self.shape, self.dtype)
        if self.nbytes:
            self.context.copy_d2d(out.ptr, self.ptr, self.nbytes, stream)
        return out

    def fill(self, value, stream: "Stream | None" = None) -> None:
        """Set every element to `value` (cast to the dtype as numpy casts it; a value the
        dtype cannot hold raises as numpy raises). float32 arrays are filled by the built-in
        `fill` kernel; other dtypes by a copy of a host array of the value."""
        self._check_usable()
        scalar = np.array(value, dtype=self.dtype)
        if not self.size:
            return
        if self.dtype == np.float32 and self.size < 1 << 32:
            block = 256
            self.context.launch("fill", -(-self.size // block), block,
                                (self, float(scalar), self.size), stream)
        else:
            self.context.copy_h2d(self.ptr, np.full(self.shape, scalar, self.dtype), stream)

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
        """`copy_from_host(array)` on `stream` (default: the default stream), returning
        at once: do not modify `array` before the stream synchronizes."""
        self._check_usable()
        self.context.copy_h2d_async(self.ptr, operands.host_source(self, array), stream)

    def export(self):
        """Publish this buffer for other contexts, devices and guests -> BufferHandle (a
        capability: keep it private). Importers keep the memory alive after free()."""
        if self.base is not None:
            raise ValueError(f"{self!r} is a view: export the array it views")
        return self.context._export(self)

    def free(self) -> None:
        """Give the memory back now (MEM_FREE; work submitted before still completes).
        Refused (InvalidParameterError, the array stays live) while the buffer is still
        mapped elsewhere by Context.map. A second free() does nothing, and so does free()
        after the context was destroyed, its device reset or the connection closed: they
        freed the memory already."""
        if self.freed:
            return
        if self.base is not None:  # a view owns nothing: only the view ends
            self.freed = True
            return
        ctx = self.context
        session = ctx.device.connection.session
        if not (ctx.destroyed or session.closed or session.host_lost):
            ctx._free(self.resource_id)
        self.freed = True
        if self._finalizer is not None:
            self._finalizer.detach()

    def __repr__(self):
        view = " view" if self.base is not None else ""
        return f"<pvgpu.DeviceArray{view} shape={self.shape} dtype={self.dtype} ptr={self.ptr:#x}>"


def _c_strides(shape, itemsize: int) -> tuple:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _reshaped(size: int, shape) -> tuple:
    """`shape` (ints, at most one -1) checked against `size` elements."""
    if not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in shape):
        raise TypeError(f"a shape is a tuple of ints, not {shape!r}")
    shape = [int(n) for n in shape]
    if shape.count(-1) > 1 or any(n < -1 for n in shape):
        raise ValueError(f"cannot reshape to {tuple(shape)}: one dimension at most may be -1, "
                         "the others are >= 0")
    known = math.prod(n for n in shape if n != -1)
    if -1 in shape:
        if known == 0 or size % known:
            raise ValueError(f"cannot reshape an array of size {size} into shape {tuple(shape)}")
        shape[shape.index(-1)] = size // known
    elif known != size:
        raise ValueError(f"cannot reshape an array of size {size} into shape {tuple(shape)}")
    return tuple(shape)


def _contiguous_range(shape: tuple, key) -> tuple:
    """-> (offset in elements, shape) of `shape[key]` when it is one contiguous range."""
    key = key if isinstance(key, tuple) else (key,)
    if sum(k is Ellipsis for k in key) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if Ellipsis in key:
        i = key.index(Ellipsis)
        key = key[:i] + (slice(None),) * (len(shape) - len(key) + 1) + key[i + 1:]
    if len(key) > len(shape):
        raise IndexError(f"too many indices for an array of {len(shape)} dimensions")
    key = key + (slice(None),) * (len(shape) - len(key))
    strides = _c_strides(shape, 1)
    offset, out, ranged = 0, [], False
    for axis, (k, n) in enumerate(zip(key, shape)):
        if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            if ranged and n != 1:  # (the only index of an axis of length 1 strides nothing)
                raise IndexError("only contiguous ranges can be sliced on the device: an "
                                 "integer index after a range is strided; use get()")
            i = int(k) + n if k < 0 else int(k)
            if not 0 <= i < n:
                raise IndexError(f"index {int(k)} is out of bounds for axis {axis} with size {n}")
            offset += i * strides[axis]
        elif isinstance(k, slice):
            start, stop, step = k.indices(n)
            length = len(range(start, stop, step))
            if step != 1 and length > 1:
                raise IndexError(f"only contiguous ranges can be sliced on the device (step "
                                 f"{step}); use get() and slice on the host")
            if ranged and length != n:
                raise IndexError("only contiguous ranges can be sliced on the device: a range "
                                 "on one axis must be followed by whole axes; use get()")
            offset += (start if length else 0) * strides[axis]
            out.append(length)
            ranged = ranged or length > 1  # a range of one element is as good as an integer
        else:
            raise IndexError(f"only integers, slices and ... index a device array on the device, "
                             f"not {k!r}; use get() and index on the host")
    return offset, tuple(out)


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
        """The first address after the range."""
        return self.va + self.size

    def __contains__(self, addr) -> bool:
        return isinstance(addr, (int, np.integer)) and self.va <= addr < self.end

    @property  # a dataclass: its context's lock and releases, read when needed
    def _conn_lock(self):  # type: ignore[override]
        return self.context._conn_lock

    @property
    def _releases(self):  # type: ignore[override]
        return self.context._releases

    def release(self) -> None:
        """Give the range back (Context.release_va); a second release() does nothing."""
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
        """End the mapping (Context.unmap); the buffer lives on. Twice does nothing."""
        if not self.freed:
            self.context.unmap(self)

    def free(self) -> None:
        """The same as `unmap()`: a mapping owns no memory."""
        self.unmap()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self.freed and not self.context.destroyed and not self.context._driver.needs_reset:
            self.unmap()

    def __repr__(self) -> str:
        return (f"<pvgpu.MappedArray shape={self.shape} dtype={self.dtype} ptr={self.ptr:#x}"
                f"{' read-only' if self.readonly else ''}>")
