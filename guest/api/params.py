"""The parameter buffer of a code launch, marshalled from Python values by the entry's
parameter table (spec/isa.md [COBJ-PARAM-1]) before anything reaches the host.

Each parameter is (offset, size, align, type); the buffer is `param_size` bytes, zero
where no parameter lies. What a parameter accepts follows its declared type:

  64-bit integers   a DeviceArray of the launching context (its device address), or an
                    integer (a raw device pointer, or a count): Python or numpy
  integers          a Python or numpy integer (or bool) that fits the type's width, signed
                    or unsigned: compilers declare C's `int` parameters `.u32` (nvcc
                    does), so the PTX type cannot say whether -1 is meant
  f16, f32, f64     a Python or numpy real number, converted to the type (a finite value
                    beyond the type's range is refused rather than made infinite)
  byte arrays       (TYPE_B8, size > 1: a struct passed by value) a ctypes Structure,
                    Union or array, bytes-like data or a numpy void/structured scalar of
                    exactly that size

A wrong count, a wrong kind of value or a wrong size is a TypeError, a value out of the
type's range an OutOfRangeError (an OverflowError), a DeviceArray of another context a
ValueError, a freed one InvalidResourceError: all raised before the launch is sent.

`ParamBuffer(raw)` in place of the argument sequence is a parameter buffer marshalled
already (the bytes cuLaunchKernel's `kernelParams` or `extra` describe, pvgpu/cuda): it is
sent as it is, if it is exactly `param_size` bytes.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from pvgpu.guest.api import errors
from pvgpu.guest.api.array import DeviceArray
from pvgpu.spec import isa

_INT_DTYPES = {isa.TYPE_U8: "<u1", isa.TYPE_S8: "<i1", isa.TYPE_B8: "<u1",
               isa.TYPE_U16: "<u2", isa.TYPE_S16: "<i2", isa.TYPE_B16: "<u2",
               isa.TYPE_U32: "<u4", isa.TYPE_S32: "<i4", isa.TYPE_B32: "<u4",
               isa.TYPE_U64: "<u8", isa.TYPE_S64: "<i8", isa.TYPE_B64: "<u8"}
_FLOAT_DTYPES = {isa.TYPE_F16: "<f2", isa.TYPE_F32: "<f4", isa.TYPE_F64: "<f8"}


def type_name(param) -> str:
    """The declared type of a parameter as PTX spells it (.u64, .f32, .align 8 .b8 x[24])."""
    if param.type == isa.TYPE_B8 and param.size > 1:
        return f".align {param.align} .b8 [{param.size}]"
    return "." + isa.TYPE_NAMES.get(param.type, f"type{param.type}")


class ParamBuffer(bytes):
    """A whole parameter buffer, laid out by the entry's parameter table already."""


def marshal(fn, ctx, args) -> bytes:
    """The parameter buffer of a launch of Function `fn` in `ctx` with `args`."""
    if isinstance(args, ParamBuffer):
        if len(args) != fn.param_size:
            raise TypeError(f"{fn.name}: a parameter buffer of {len(args)} bytes, the kernel's "
                            f"parameters take {fn.param_size}")
        return bytes(args)
    params = fn.params
    if isinstance(args, (str, bytes)) or not hasattr(args, "__len__"):
        raise TypeError(f"{fn.name}: args must be a sequence of {len(params)} values, not "
                        f"{type(args).__name__}")
    if len(args) != len(params):
        raise TypeError(f"{fn.name}({', '.join(type_name(p) for p in params)}) takes "
                        f"{len(params)} arguments, got {len(args)}")
    buf = bytearray(fn.param_size)
    for i, (p, value) in enumerate(zip(params, args)):
        raw = _one(fn.name, i, p, ctx, value)
        buf[p.offset:p.offset + p.size] = raw
    return bytes(buf)


def _one(kernel: str, i: int, p, ctx, value) -> bytes:
    what = f"{kernel}: argument {i} ({type_name(p)})"
    if p.type == isa.TYPE_B8 and p.size > 1:
        return _by_value(what, p.size, value)
    if isinstance(value, DeviceArray):
        if p.size != 8 or p.type not in isa.INT_TYPES:
            raise TypeError(f"{what} cannot take a DeviceArray: a device address needs a 64-bit "
                            "integer parameter")
        value._check_usable()
        if value.context is not ctx:
            raise ValueError(f"{what}: {value!r} belongs to context {value.context.ctx_id}, the "
                             f"launch runs in context {ctx.ctx_id} (device addresses are per "
                             "context)")
        return value.ptr.to_bytes(8, "little")
    if p.type in _INT_DTYPES:
        return _integer(what, p.type, value)
    if p.type in _FLOAT_DTYPES:
        return _real(what, p.type, value)
    raise TypeError(f"{what}: the code object declares a parameter type this API cannot "
                    "marshal")


def _integer(what: str, type_: int, value) -> bytes:
    if isinstance(value, (bool, np.bool_)):
        value = int(value)
    if not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} needs an integer, not {type(value).__name__}")
    dt = np.dtype(_INT_DTYPES[type_])
    v = int(value)
    lo, hi = -(1 << (8 * dt.itemsize - 1)), (1 << 8 * dt.itemsize) - 1
    if not lo <= v <= hi:
        raise errors.OutOfRangeError(f"{what}: {v} is out of the range [{lo}, {hi}]")
    return (v & ((1 << 8 * dt.itemsize) - 1)).to_bytes(dt.itemsize, "little")


def _real(what: str, type_: int, value) -> bytes:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                     np.floating)):
        raise TypeError(f"{what} needs a real number, not {type(value).__name__}")
    dt = np.dtype(_FLOAT_DTYPES[type_])
    v = float(value)
    if math.isfinite(v) and abs(v) > float(np.finfo(dt).max):
        raise errors.OutOfRangeError(f"{what}: {v} is out of the range of {dt.name}")
    return np.array(v, dtype=dt).tobytes()


def _by_value(what: str, size: int, value) -> bytes:
    if isinstance(value, (ctypes.Structure, ctypes.Union, ctypes.Array)):
        raw = bytes(value)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
    elif isinstance(value, np.void) or (isinstance(value, np.ndarray) and value.dtype.names
                                        and value.ndim == 0):
        raw = value.tobytes()
    else:
        raise TypeError(f"{what} is a struct passed by value: give a ctypes.Structure or "
                        f"{size} bytes, not {type(value).__name__}")
    if len(raw) != size:
        raise TypeError(f"{what} is {size} bytes, the value given is {len(raw)}")
    return raw
