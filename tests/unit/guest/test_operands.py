"""guest/api/operands.py without a host: the element types of the kernel signatures
(spec [KRN-ARGS-2]) and the typed host operands of DeviceArray copies."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvgpu.guest.api import operands
from pvgpu.spec import wire


def test_every_pointer_argument_has_an_element_type():
    for sig in wire.BUILTIN_KERNELS.values():
        for name, kind in sig.args:
            assert (sig.elem_type(name) == wire.ELEM_F32) == (kind == wire.ARG_PTR), (sig, name)
    with pytest.raises(ValueError, match="element type"):
        wire.KernelSignature(99, "k", (("p", wire.ARG_PTR), ("n", wire.ARG_U32)))
    with pytest.raises(ValueError, match="element type"):
        wire.KernelSignature(99, "k", (("n", wire.ARG_U32),), (("n", wire.ELEM_F32),))


def arr(shape=(2, 3), dtype=np.float32):
    return SimpleNamespace(shape=shape, dtype=np.dtype(dtype))


def test_sources_must_match_dtype_and_shape():
    a = arr()
    src = np.ones((2, 3), np.float32)
    assert operands.host_source(a, src) is src
    fortran = np.asfortranarray(src)
    got = operands.host_source(a, fortran)
    assert got.flags.c_contiguous and np.array_equal(got, src)
    for bad in (np.ones((2, 3)), np.ones((2, 3), np.int32), np.ones((2, 3), ">f4"), np.float64(1)):
        with pytest.raises(TypeError, match="dtype"):
            operands.host_source(a, bad)
    for bad in (np.ones(6, np.float32), np.ones((3, 2), np.float32), np.ones((1, 2, 3), np.float32),
                np.float32(1)):
        with pytest.raises(ValueError, match="shape"):
            operands.host_source(a, bad)


def test_python_data_takes_the_arrays_dtype_within_same_kind():
    got = operands.host_source(arr(), [[1, 2, 3], [4.5, 5, 6]])
    assert got.dtype == np.float32 and got[1, 0] == 4.5
    ints = arr((3,), np.int32)
    assert operands.host_source(ints, [1, 2, True]).tolist() == [1, 2, 1]
    with pytest.raises(TypeError, match="cast"):
        operands.host_source(ints, [1.5, 2, 3])
    with pytest.raises(TypeError, match="cast"):
        operands.host_source(arr(), [[1j, 2, 3], [4, 5, 6]])
    with pytest.raises(OverflowError):
        operands.host_source(ints, [1, 2, 1 << 40])
    with pytest.raises(ValueError, match="shape"):
        operands.host_source(ints, [1, 2])
    with pytest.raises(ValueError, match="shape"):
        operands.host_source(ints, 7)
    with pytest.raises(ValueError):
        operands.host_source(ints, [[1], [2, 3]])


def test_destinations_must_match_dtype_and_shape():
    a = arr()
    new = operands.host_destination(a, None)
    assert new.shape == (2, 3) and new.dtype == np.float32
    out = np.empty((2, 3), np.float32)
    assert operands.host_destination(a, out) is out
    with pytest.raises(TypeError, match="dtype"):
        operands.host_destination(a, np.empty((2, 3), np.int32))
    with pytest.raises(ValueError, match="shape"):
        operands.host_destination(a, np.empty(6, np.float32))
    with pytest.raises(TypeError, match="ndarray"):
        operands.host_destination(a, [[0.0] * 3] * 2)


# ------------------------------------------------------------------ allocation shapes
@pytest.mark.parametrize("shape, dtype, want", [
    (5, np.float32, ((5,), 20)), (np.int64(5), np.float32, ((5,), 20)),
    ((2, 3), np.float64, ((2, 3), 48)), ([2, np.uint8(3)], np.int8, ((2, 3), 6)),
    ((), np.float32, ((), 4)), (0, np.float32, ((0,), 0)), ((4, 0), np.float32, ((4, 0), 0)),
    ((1 << 62) - 1, np.float32, (((1 << 62) - 1,), (1 << 64) - 4)),
])
def test_allocation_normalizes_good_shapes(shape, dtype, want):
    dims, dt, nbytes = operands.allocation(shape, dtype)
    assert (dims, nbytes) == want and dt == np.dtype(dtype)
    assert all(type(d) is int for d in dims)


@pytest.mark.parametrize("shape, dtype, exc", [
    (-5, np.float32, ValueError), ((3, -1), np.float32, ValueError),
    ((2**32, 2**32), np.float32, ValueError), (1 << 62, np.float32, ValueError),
    ((1 << 64,), np.uint8, ValueError),
    ("10", np.float32, TypeError), (b"10", np.float32, TypeError), (2.5, np.float32, TypeError),
    ((2, 2.0), np.float32, TypeError), (True, np.float32, TypeError), ((2, True), np.float32, TypeError),
    (None, np.float32, TypeError), (np.float64(3), np.float32, TypeError), (4, object, TypeError),
])
def test_allocation_refuses_bad_shapes(shape, dtype, exc):
    with pytest.raises(exc):
        operands.allocation(shape, dtype)


@given(st.lists(st.integers(-3, 1 << 40), max_size=5),
       st.sampled_from([np.uint8, np.float32, np.complex128]))
def test_allocation_agrees_with_exact_arithmetic(dims, dtype):
    itemsize = np.dtype(dtype).itemsize
    nbytes = math.prod(dims) * itemsize
    if any(d < 0 for d in dims) or nbytes > operands.MAX_NBYTES:
        with pytest.raises(ValueError):
            operands.allocation(dims, dtype)
    else:
        assert operands.allocation(dims, dtype) == (tuple(dims), np.dtype(dtype), nbytes)
