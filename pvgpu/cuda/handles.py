"""The handle and struct types of pvgpu.cuda, shaped like cuda-python's: CUdevice,
CUcontext, CUmodule, CUfunction, CUstream, CUevent and CUdeviceptr (cudaStream_t and
cudaEvent_t are CUstream and CUevent, as in cuda-bindings 13), dim3 and cudaDeviceProp.

A handle is a small object around an int: `int(h)` is its value, two handles of one type and
value are equal, `CUstream(0)` is the NULL stream. `getPtr()` is the address of a 64-bit
cell holding the value, so a handle can be passed by address, as cuda-python's can (an
array of such addresses is a valid `kernelParams`). Handle values of contexts, modules,
functions, streams and events are ids the facade hands out; those of devices are ordinals,
those of device pointers the addresses themselves.
"""

from __future__ import annotations

import ctypes


def value_of(obj) -> int:
    """The int behind a handle, an int, or anything int() takes (cuda-python's handles too);
    None is 0. TypeError for anything else."""
    if obj is None:
        return 0
    if isinstance(obj, (bool, str, bytes, bytearray)):
        raise TypeError(f"expected a handle or an int, not {obj!r}")
    try:
        return int(obj)
    except (TypeError, ValueError):
        raise TypeError(f"expected a handle or an int, not {type(obj).__name__}") from None


class _Handle:
    __slots__ = ("_cell",)

    def __init__(self, init=0):
        self._cell = ctypes.c_uint64(value_of(init) & (1 << 64) - 1)

    def __int__(self) -> int:
        return self._cell.value

    __index__ = __int__

    def getPtr(self) -> int:
        """The address of the 64-bit cell that holds the value."""
        return ctypes.addressof(self._cell)

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and int(other) == int(self)

    def __hash__(self) -> int:
        return hash((type(self).__name__, int(self)))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {int(self):#x}>"

    def __reduce__(self):
        return type(self), (int(self),)


class CUdevice(_Handle):
    __slots__ = ()

    def __repr__(self) -> str:
        return f"<CUdevice {int(self)}>"


class CUdeviceptr(_Handle):
    __slots__ = ()


class CUcontext(_Handle):
    __slots__ = ()


class CUmodule(_Handle):
    __slots__ = ()


class CUfunction(_Handle):
    __slots__ = ()


class CUstream(_Handle):
    __slots__ = ()


class CUevent(_Handle):
    __slots__ = ()


cudaStream_t = CUstream
cudaEvent_t = CUevent


class dim3:
    """Grid or block dimensions; x, y and z are unsigned ints (a float assigned is truncated,
    as cuda-python's struct field does)."""

    __slots__ = ("_x", "_y", "_z")

    def __init__(self, x=1, y=1, z=1):
        self.x, self.y, self.z = x, y, z

    def _set(self, name, v):
        v = int(v)
        if not 0 <= v < 1 << 32:
            raise OverflowError(f"dim3.{name} = {v} is not an unsigned int")
        setattr(self, "_" + name, v)

    x = property(lambda s: s._x, lambda s, v: s._set("x", v))
    y = property(lambda s: s._y, lambda s, v: s._set("y", v))
    z = property(lambda s: s._z, lambda s, v: s._set("z", v))

    def __iter__(self):
        return iter((self._x, self._y, self._z))

    def __eq__(self, other) -> bool:
        return isinstance(other, dim3) and tuple(self) == tuple(other)

    def __repr__(self) -> str:
        return f"x : {self._x}\ny : {self._y}\nz : {self._z}"


class cudaDeviceProp:
    """The properties cudaGetDeviceProperties reports (the fields of CUDA's struct; those
    pvgpu does not model are 0). `name` is bytes, as in cuda-python."""

    def __init__(self, **fields):
        for k, v in fields.items():
            setattr(self, k, v)

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={v!r}" for k, v in sorted(vars(self).items()))
        return f"cudaDeviceProp({items})"
