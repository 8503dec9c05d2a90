"""pvgpu.cuda's handle types, dim3 and value_of (no host needed)."""

import ctypes
import pickle

import pytest

from pvgpu.cuda import handles as h


def test_handles_are_int_like_and_compare_by_type_and_value():
    p = h.CUdeviceptr(0x1234)
    assert int(p) == 0x1234 and hex(p) == "0x1234"
    assert p == h.CUdeviceptr(0x1234) and p != h.CUdeviceptr(0x1235)
    assert p != h.CUstream(0x1234) and p != 0x1234  # as cuda-python's handles
    assert len({p, h.CUdeviceptr(0x1234)}) == 1
    assert h.CUstream() == h.CUstream(0) and h.cudaStream_t is h.CUstream
    assert h.CUevent(h.CUevent(7)) == h.CUevent(7)
    assert repr(h.CUdevice(1)) == "<CUdevice 1>" and repr(h.CUcontext(16)) == "<CUcontext 0x10>"
    assert pickle.loads(pickle.dumps(p)) == p


def test_get_ptr_is_the_address_of_a_cell_holding_the_value():
    p = h.CUdeviceptr(0xDEADBEEF00)
    assert ctypes.c_uint64.from_address(p.getPtr()).value == 0xDEADBEEF00


def test_value_of():
    assert h.value_of(None) == 0 and h.value_of(5) == 5 and h.value_of(h.CUstream(9)) == 9
    assert h.value_of(7.9) == 7  # floats are truncated, as by Cython's unsigned int
    with pytest.raises(TypeError):
        h.value_of(True)
    with pytest.raises(TypeError):
        h.value_of("12")
    with pytest.raises(TypeError):
        h.value_of([1])


def test_dim3():
    d = h.dim3()
    assert tuple(d) == (1, 1, 1)
    d.x = 196.31  # truncated
    d.y = 2
    assert (d.x, d.y, d.z) == (196, 2, 1) and d == h.dim3(196, 2, 1)
    with pytest.raises(OverflowError):
        d.z = -1
    with pytest.raises(OverflowError):
        d.x = 1 << 32
