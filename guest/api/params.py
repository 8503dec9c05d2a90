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
import struct

import numpy as np

from pvgpu.guest.api import errors
from pvgpu.guest.api.array import DeviceArray
from pvgpu.spec import isa

# float parameter types: (struct, largest finite value, name)
_REALS = {t: (struct.Struct(code), float(np.finfo(name).max), name)
          for t, code, name in ((isa.TYPE_F16, "<e", "float16"), (isa.TYPE_F32, "<f", "float32"),
                                (isa.TYPE_F64, "<d", "float64"))}
_UINTS = {1: struct.Struct("<B"), 2: struct.Struct("<H"), 4: struct.Struct("<I"),
          8: struct.Struct("<Q")}


def type_name(param) -> str:
    """The declared type of a parameter as PTX spells it (.u64, .f32, .align 8 .b8 x[24])."""
    if param.type == isa.TYPE_B8 and param.size > 1:
        return f".align {param.align} .b8 [{param.size}]"
    return "." + isa.TYPE_NAMES.get(param.type, f"type{param.type}")


class ParamBuffer(bytes):
    """A whole parameter buffer, laid out by the entry's parameter table already."""


class ParamLayout:
    """An entry's parameter table made ready once (per Function): per parameter, a
    converter that checks a value and packs it at the parameter's offset. A launch's
    arguments then take one pass, and an error message is composed only when a value
    is refused."""

    __slots__ = ("name", "params", "param_size", "_writers")

    def __init__(self, entry):
        self.name = entry.name
        self.params = tuple(entry.params)
        self.param_size = entry.param_size
        self._writers = tuple(_writer(entry.name, i, p) for i, p in enumerate(self.params))

    def marshal(self, ctx, args) -> bytes:
        """The parameter buffer of a launch in `ctx` with `args`."""
        params = self.params
        if type(args) is not tuple and type(args) is not list:  # (the common cases)
            if isinstance(args, ParamBuffer):
                if len(args) != self.param_size:
                    raise TypeError(f"{self.name}: a parameter buffer of {len(args)} bytes, the "
                                    f"kernel's parameters take {self.param_size}")
                return bytes(args)
            if isinstance(args, (str, bytes)) or not hasattr(args, "__len__"):
                raise TypeError(f"{self.name}: args must be a sequence of {len(params)} values, "
                                f"not {type(args).__name__}")
        if len(args) != len(params):
            raise TypeError(f"{self.name}({', '.join(type_name(p) for p in params)}) takes "
                            f"{len(params)} arguments, got {len(args)}")
        buf = bytearray(self.param_size)
        for write, value in zip(self._writers, args):
            write(buf, ctx, value)
        return bytes(buf)


def _writer(kernel: str, i: int, p):
    """-> write(buf, ctx, value): parameter `i` (`p`) of `kernel` checked and packed into
    the buffer at its offset; the common values (a Python int or float, a DeviceArray)
    take the first branch."""
    off = p.offset

    def what() -> str:
        return f"{kernel}: argument {i} ({type_name(p)})"

    def device_array(value, ctx) -> int:
        if p.size != 8 or p.type not in isa.INT_TYPES:
            raise TypeError(f"{what()} cannot take a DeviceArray: a device address needs a "
                            "64-bit integer parameter")
        value._check_usable()
        if value.context is not ctx:
            raise ValueError(f"{what()}: {value!r} belongs to context {value.context.ctx_id}, "
                             f"the launch runs in context {ctx.ctx_id} (device addresses are "
                             "per context)")
        return value.ptr

    if p.type == isa.TYPE_B8 and p.size > 1:
        def by_value(buf, ctx, value) -> None:
            buf[off:off + p.size] = _by_value(what(), p.size, value)
        return by_value

    if p.type in isa.INT_TYPES:
        pack = _UINTS[p.size].pack_into
        bits = 8 * p.size
        lo, hi = -(1 << (bits - 1)), (1 << bits) - 1

        def integer(buf, ctx, value) -> None:
            if type(value) is not int:
                if isinstance(value, DeviceArray):
                    value = device_array(value, ctx)
                else:
                    value = _integer(what, value)
            if not lo <= value <= hi:
                raise errors.OutOfRangeError(f"{what()}: {value} is out of the range [{lo}, {hi}]")
            pack(buf, off, value & hi)
        return integer

    if p.type in _REALS:
        real_struct, top, real_name = _REALS[p.type]
        pack = real_struct.pack_into

        def real(buf, ctx, value) -> None:
            if type(value) is not float:
                if isinstance(value, DeviceArray):
                    device_array(value, ctx)  # raises: not a 64-bit integer parameter
                if isinstance(value, (bool, np.bool_)) or not isinstance(
                        value, (int, float, np.integer, np.floating)):
                    raise TypeError(f"{what()} needs a real number, not {type(value).__name__}")
                value = float(value)
            if (value > top or value < -top) and math.isfinite(value):
                raise errors.OutOfRangeError(f"{what()}: {value} is out of the range of "
                                             f"{real_name}")
            pack(buf, off, value)
        return real

    def unsupported(buf, ctx, value) -> None:
        if isinstance(value, DeviceArray):
            device_array(value, ctx)
        raise TypeError(f"{what()}: the code object declares a parameter type this API cannot "
                        "marshal")
    return unsupported


def _integer(what, value) -> int:
    """An integer argument that is not a Python int: a numpy integer or a bool (`what()`
    names the argument in the error)."""
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what()} needs an integer, not {type(value).__name__}")
    return int(value)


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
