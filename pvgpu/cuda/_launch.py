"""cuLaunchKernel's arguments: the parameter buffer of a launch from `kernelParams` or
`extra`, in the forms cuda-python takes, laid out by the kernel's parameter table (the code
object's entry: offset, size, alignment and type of each parameter, spec/isa.md).

kernelParams is one of
  - None or 0: the kernel has no parameters (or `extra` gives the buffer);
  - `((values...), (types...))`: each value with its ctypes type (c_int, c_float, c_void_p,
    a Structure, ...), or None for a value that is a handle (CUdeviceptr and the like) or
    an int: a 64-bit pointer;
  - the address (an int, or an array whose data are the addresses) of an array of
    pointers, one per parameter, each to the parameter's bytes (C's `void **`).
extra is None or 0, or the address of a `void *` array of CU_LAUNCH_PARAM_BUFFER_POINTER,
buffer address, CU_LAUNCH_PARAM_BUFFER_SIZE, address of a size_t, CU_LAUNCH_PARAM_END.

Each value must have its parameter's size (CUDA would read whatever lies there; the facade
refuses with CUDA_ERROR_INVALID_VALUE). Then every 64-bit integer parameter holding an
address the kernel's context reaches only through a translation (pinned, mapped or managed
host memory; a peer device's allocation) gets the translated address
(pvgpu/cuda/_memory.py).
"""

from __future__ import annotations

import ctypes
import numbers

import numpy as np

from pvgpu.cuda import handles
from pvgpu.cuda._errors import CudaError, check
from pvgpu.cuda.enums import CUresult as R
from pvgpu.spec import isa

_PTR = ctypes.c_uint64
_CTYPES = (ctypes._SimpleCData, ctypes.Structure, ctypes.Union, ctypes.Array)


def _address(obj) -> int:
    if isinstance(obj, np.ndarray):
        check(obj.dtype.itemsize == 8 and obj.flags.c_contiguous, R.CUDA_ERROR_INVALID_VALUE,
              "a pointer array must be a contiguous array of 64-bit addresses")
        return obj.__array_interface__["data"][0]
    return handles.value_of(obj)


def _read(address: int, n: int) -> bytes:
    check(address, R.CUDA_ERROR_INVALID_VALUE, "a NULL pointer in the kernel parameters")
    return ctypes.string_at(address, n)


def _from_tuple(name: str, params, values, types) -> list:
    values, types = tuple(values), tuple(types)
    check(len(values) == len(types), R.CUDA_ERROR_INVALID_VALUE,
          f"{name}: {len(values)} values but {len(types)} types in kernelParams")
    check(len(values) == len(params), R.CUDA_ERROR_INVALID_VALUE,
          f"{name} takes {len(params)} parameters, kernelParams gives {len(values)}")
    parts = []
    for i, (p, value, ctype) in enumerate(zip(params, values, types)):
        if ctype is None:
            raw = (handles.value_of(value) & (1 << 64) - 1).to_bytes(8, "little")
        elif isinstance(ctype, type) and issubclass(ctype, _CTYPES):
            if isinstance(value, ctype):
                raw = bytes(value)
            else:
                if issubclass(ctype, ctypes._SimpleCData) and not isinstance(
                        value, (numbers.Number, np.generic, bytes)):
                    value = handles.value_of(value)  # a handle (CUdeviceptr, ...) or None
                raw = bytes(ctype(value))
        else:
            raise TypeError(f"{name}: the type of argument {i} must be a ctypes type or None, "
                            f"not {ctype!r}")
        check(len(raw) == p.size, R.CUDA_ERROR_INVALID_VALUE,
              f"{name}: argument {i} is {len(raw)} bytes, the parameter {p.size}")
        parts.append((p, raw))
    return parts


def _from_pointers(name: str, params, address: int) -> list:
    ptrs = (_PTR * max(len(params), 1)).from_address(address) if params else ()
    return [(p, _read(int(ptrs[i]), p.size)) for i, p in enumerate(params)]


def _from_extra(name: str, param_size: int, extra) -> bytes:
    address = _address(extra)
    buf = size = None
    for i in range(0, 64, 2):
        key = _PTR.from_address(address + 8 * i).value
        if key == 0:  # CU_LAUNCH_PARAM_END
            break
        value = _PTR.from_address(address + 8 * (i + 1)).value
        if key == 1:  # CU_LAUNCH_PARAM_BUFFER_POINTER
            buf = value
        elif key == 2:  # CU_LAUNCH_PARAM_BUFFER_SIZE
            check(value, R.CUDA_ERROR_INVALID_VALUE, "a NULL CU_LAUNCH_PARAM_BUFFER_SIZE")
            size = ctypes.c_size_t.from_address(value).value
        else:
            raise CudaError(R.CUDA_ERROR_INVALID_VALUE, f"unknown extra key {key}")
    else:
        raise CudaError(R.CUDA_ERROR_INVALID_VALUE, "extra has no CU_LAUNCH_PARAM_END")
    check(buf is not None and size is not None, R.CUDA_ERROR_INVALID_VALUE,
          "extra needs CU_LAUNCH_PARAM_BUFFER_POINTER and CU_LAUNCH_PARAM_BUFFER_SIZE")
    check(size == param_size, R.CUDA_ERROR_INVALID_VALUE,
          f"{name}: a parameter buffer of {size} bytes, the kernel's parameters take {param_size}")
    return _read(buf, size) if size else b""


def _is_null(obj) -> bool:
    if obj is None:
        return True
    if isinstance(obj, (tuple, list, np.ndarray)):
        return False
    return handles.value_of(obj) == 0


def parameter_buffer(fn, kernel_params, extra) -> bytearray:
    """The parameter bytes of a launch of guest Function `fn`."""
    name, params = fn.name, fn.params
    if not _is_null(extra):
        check(_is_null(kernel_params), R.CUDA_ERROR_INVALID_VALUE,
              "kernelParams and extra cannot both be given")
        return bytearray(_from_extra(name, fn.param_size, extra))
    if _is_null(kernel_params):
        check(not params, R.CUDA_ERROR_INVALID_VALUE,
              f"{name} takes {len(params)} parameters and kernelParams gives none")
        return bytearray(fn.param_size)
    if isinstance(kernel_params, (tuple, list)) and len(kernel_params) == 2 and all(
            isinstance(x, (tuple, list)) for x in kernel_params):
        parts = _from_tuple(name, params, *kernel_params)
    elif isinstance(kernel_params, (tuple, list)):
        raise TypeError("kernelParams must be ((values...), (types...)), the address of a "
                        "pointer array, or None")
    else:
        parts = _from_pointers(name, params, _address(kernel_params))
    buf = bytearray(fn.param_size)
    for p, raw in parts:
        buf[p.offset:p.offset + p.size] = raw
    return buf


def translate_pointers(memory, ctx, fn, buf: bytearray) -> None:
    """Give every 64-bit integer parameter the address ctx's kernel must use."""
    for p in fn.params:
        if p.size == 8 and p.type in isa.INT_TYPES:
            value = int.from_bytes(buf[p.offset:p.offset + 8], "little")
            if value:
                new = memory.kernel_pointer(ctx, value)
                if new != value:
                    buf[p.offset:p.offset + 8] = new.to_bytes(8, "little")
