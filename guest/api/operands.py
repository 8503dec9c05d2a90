"""What the API accepts as the operands of copies and allocations, checked before anything
reaches the host.

DeviceArray copies are typed, as CuPy's `set()`/`get()`: the host array of
`copy_from_host` (and its async form) and the `out` of `to_host` (and its async form)
must be a numpy.ndarray (a PinnedArray is one) of exactly the DeviceArray's dtype
(TypeError otherwise: nothing is cast) and shape (ValueError otherwise: nothing is
reshaped or broadcast). Python data (scalars, nested lists) has no dtype: it is converted
to the DeviceArray's dtype as numpy's `same_kind` rule allows (ints into a float array
yes, floats into an int array no: TypeError; an int out of range: OutOfRangeError, an
OverflowError) and must have its shape. A non-contiguous source is copied to a contiguous one; `out` must be
C-contiguous and writable. The byte-address copies of a Context
(`copy_h2d/copy_d2h(va, array)`) stay untyped: any contiguous array.

Allocations (`ctx.empty/zeros`, `conn.pinned_empty`, and the shapes given to `map`,
`shm_attach` and `import_array`) take a shape of non-negative ints (TypeError for
anything else, ValueError for a negative one) whose byte size a le64 size field carries
(ValueError beyond; a size the wire carries but the device cannot hold is the device's
OutOfMemoryError); object dtypes cannot live in device memory (TypeError).

The arguments of launches are checked in guest/api/launch.py and guest/api/params.py.
"""

from __future__ import annotations

import math

import numpy as np

from pvgpu.guest.api import errors

MAX_NBYTES = (1 << 64) - 1  # the largest le64 size field


def allocation(shape, dtype) -> tuple:
    """-> (shape as a tuple of ints, np.dtype, nbytes) of an array to allocate."""
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise TypeError(f"dtype {dtype} holds Python objects, which cannot live in device or "
                        "pinned memory")
    dims = (shape,) if isinstance(shape, (int, np.integer)) else shape
    try:
        dims = tuple(dims)
    except TypeError:
        dims = None
    if dims is None or isinstance(shape, (str, bytes)) or \
            any(isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)) for d in dims):
        raise TypeError(f"a shape is an int or a sequence of ints, not {shape!r}")
    dims = tuple(int(d) for d in dims)
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimensions are not allowed: shape {dims}")
    nbytes = math.prod(dims) * dtype.itemsize
    if nbytes > MAX_NBYTES:
        raise ValueError(f"shape {dims} of {dtype} is {nbytes} bytes, more than any allocation "
                         f"can hold (2**64 - 1)")
    return dims, dtype, nbytes


def _check_like(arr, host: np.ndarray, what: str) -> None:
    if host.dtype != arr.dtype:
        raise TypeError(f"{what} has dtype {host.dtype}, {arr!r} has {arr.dtype}: copies do not "
                        f"cast (convert with .astype({str(arr.dtype)!r}))")
    if host.shape != arr.shape:
        raise ValueError(f"{what} has shape {host.shape}, {arr!r} has {arr.shape}: copies do "
                         "not reshape")


def host_source(arr, data) -> np.ndarray:
    """The host array to copy into DeviceArray `arr`: `data` itself, a contiguous copy of
    it, or (Python data) its conversion to arr's dtype."""
    if isinstance(data, (np.ndarray, np.generic)):
        data = np.asarray(data)  # a numpy scalar is a 0-d array of its dtype
        _check_like(arr, data, "the source array")
        return data if data.flags.c_contiguous else np.ascontiguousarray(data)
    try:
        kind = np.asarray(data).dtype
    except ValueError as e:  # ragged nesting
        raise ValueError(f"cannot copy {type(data).__name__} into {arr!r}: {e}") from None
    if not np.can_cast(kind, arr.dtype, "same_kind"):
        raise TypeError(f"cannot copy {type(data).__name__} data of kind {kind} into {arr!r} "
                        f"of dtype {arr.dtype} (no implicit casts beyond numpy's same_kind)")
    try:
        data = np.asarray(data, dtype=arr.dtype)
    except OverflowError as e:  # an int out of the dtype's range
        raise errors.OutOfRangeError(f"cannot copy into {arr!r}: {e}") from None
    if data.shape != arr.shape:
        raise ValueError(f"the source has shape {data.shape}, {arr!r} has {arr.shape}: copies "
                         "do not reshape")
    return data


def host_destination(arr, out) -> np.ndarray:
    """The host array a copy of DeviceArray `arr` lands in: `out`, or a new one."""
    if out is None:
        return np.empty(arr.shape, arr.dtype)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray of dtype {arr.dtype} and shape {arr.shape}, "
                        f"not {type(out).__name__}")
    _check_like(arr, out, "out")
    return out  # the copy checks that it is writable and C-contiguous (after freed pinned memory)
