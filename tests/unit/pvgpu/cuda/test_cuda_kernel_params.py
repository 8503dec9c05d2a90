"""cuLaunchKernel's kernelParams and extra, turned into a parameter buffer by the kernel's
parameter table, and the translation of 64-bit pointer parameters (no host needed)."""

import ctypes
import struct

import numpy as np
import pytest

from pvgpu.conformance import codeobj
from pvgpu.guest.api import module
from pvgpu.cuda import _launch, handles
from pvgpu.cuda._errors import CudaError
from pvgpu.cuda.enums import CUresult as R
from pvgpu.spec import isa

# saxpy(float a, float *x, float *y, int n) as nvcc lays it out; then a struct by value
PARAMS = ((0, 4, 4, isa.TYPE_F32), (8, 8, 8, isa.TYPE_U64), (16, 8, 8, isa.TYPE_U64),
          (24, 4, 4, isa.TYPE_U32))


class Pair(ctypes.Structure):
    _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_int32), ("c", ctypes.c_double)]


def function(params, param_size=None):
    size = param_size if param_size is not None else max((o + s for o, s, _a, _t in params), default=0)
    obj = codeobj.build([codeobj.Entry("k", codeobj.trap_code(), params=params, param_size=size)])
    entry = module.CodeObject(obj).entries["k"]

    class Fn:
        name, params, param_size = entry.name, entry.params, entry.param_size
    return Fn


SAXPY = function(PARAMS)
WANT = struct.pack("<f4xQQI", 2.5, 0x1000, 0x2000, 77)


def invalid(fn, *args):
    with pytest.raises(CudaError) as e:
        _launch.parameter_buffer(fn, *args)
    assert e.value.code is R.CUDA_ERROR_INVALID_VALUE
    return str(e.value)


def test_values_with_their_ctypes_types():
    buf = _launch.parameter_buffer(SAXPY, ((2.5, handles.CUdeviceptr(0x1000), 0x2000, 77),
                                           (ctypes.c_float, None, None, ctypes.c_int)), 0)
    assert bytes(buf) == WANT
    buf = _launch.parameter_buffer(SAXPY, [[np.float32(2.5), 0x1000, handles.CUdeviceptr(0x2000), 77],
                                           [ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p,
                                            ctypes.c_uint32]], None)
    assert bytes(buf) == WANT
    pair = function(((0, 16, 8, isa.TYPE_B8), (16, 4, 4, isa.TYPE_U32)))
    buf = _launch.parameter_buffer(pair, ((Pair(1.5, -3, 2.25), 7), (Pair, ctypes.c_uint32)), 0)
    assert struct.unpack("<fidI", bytes(buf)) == (1.5, -3, 2.25, 7)


def test_an_array_of_pointers_to_the_values():
    vals = [ctypes.c_float(2.5), ctypes.c_uint64(0x1000), ctypes.c_uint64(0x2000), ctypes.c_int(77)]
    ptrs = (ctypes.c_void_p * 4)(*[ctypes.addressof(v) for v in vals])
    assert bytes(_launch.parameter_buffer(SAXPY, ctypes.addressof(ptrs), 0)) == WANT
    arr = np.array([ctypes.addressof(v) for v in vals], np.uint64)
    assert bytes(_launch.parameter_buffer(SAXPY, arr, 0)) == WANT
    assert bytes(_launch.parameter_buffer(SAXPY, arr.ctypes.data, None)) == WANT
    invalid(SAXPY, np.array([1, 2], np.uint32), 0)


def test_extra_gives_the_whole_buffer():
    raw = ctypes.create_string_buffer(WANT, len(WANT))
    size = ctypes.c_size_t(len(WANT))
    extra = np.array([1, ctypes.addressof(raw), 2, ctypes.addressof(size), 0], np.uint64)
    assert bytes(_launch.parameter_buffer(SAXPY, None, extra.ctypes.data)) == WANT
    assert bytes(_launch.parameter_buffer(SAXPY, 0, extra)) == WANT
    size.value = 8
    assert "buffer of 8 bytes" in invalid(SAXPY, None, extra)
    invalid(SAXPY, np.zeros(1, np.uint64), extra)  # both kernelParams and extra
    assert "unknown extra key" in invalid(SAXPY, None, np.array([9, 0, 0], np.uint64))
    assert "END" in invalid(SAXPY, None, np.full(70, 1, np.uint64))


def test_wrong_counts_sizes_and_forms():
    assert "takes 4 parameters" in invalid(SAXPY, ((1.0, 2), (ctypes.c_float, None)), 0)
    assert "2 values but 1 types" in invalid(SAXPY, ((1.0, 2), (ctypes.c_float,)), 0)
    assert "is 8 bytes, the parameter 4" in invalid(
        SAXPY, ((2.5, 1, 2, 3), (ctypes.c_double, None, None, ctypes.c_int)), 0)
    assert "gives none" in invalid(SAXPY, None, 0)
    assert "NULL pointer" in invalid(SAXPY, np.zeros(4, np.uint64), 0)
    with pytest.raises(TypeError):
        _launch.parameter_buffer(SAXPY, [1, 2, 3, 4], 0)
    with pytest.raises(TypeError):
        _launch.parameter_buffer(SAXPY, ((2.5, 1, 2, 3), (float, None, None, int)), 0)
    empty = function(())
    assert bytes(_launch.parameter_buffer(empty, None, 0)) == b""
    assert bytes(_launch.parameter_buffer(empty, ((), ()), 0)) == b""


def test_pointer_parameters_are_translated():
    class Memory:
        def kernel_pointer(self, ctx, value):
            return value + 0x7F00_0000_0000 if value == 0x2000 else value

    buf = bytearray(WANT)
    _launch.translate_pointers(Memory(), None, SAXPY, buf)
    assert struct.unpack("<f4xQQI", bytes(buf)) == (2.5, 0x1000, 0x7F00_0000_2000, 77)
