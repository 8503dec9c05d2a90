"""DeviceArray shaped like CuPy's ndarray (guest/api/array.py): attributes, views that
copies and kernels accept, copy(), fill(), and no implicit conversion to numpy."""

import numpy as np
import pytest

from pvgpu.guest.api import errors


def test_attributes_and_cupy_names(conn):
    ctx = conn.devices[0].create_context()
    a = ctx.to_device(np.arange(24, dtype=np.float64).reshape(2, 3, 4))
    assert (a.ndim, a.size, a.itemsize, a.nbytes, len(a)) == (3, 24, 8, 192, 2)
    assert a.strides == np.empty((2, 3, 4), np.float64).strides
    assert np.array_equal(a.get(), np.arange(24.0).reshape(2, 3, 4))
    a.set(np.ones((2, 3, 4)))
    assert np.array_equal(a.get(), np.ones((2, 3, 4)))
    with pytest.raises(TypeError, match="use .get()"):
        np.asarray(a)
    with pytest.raises(TypeError, match="use .get()"):
        np.add(a, 1)
    with pytest.raises(TypeError):
        len(ctx.empty((), np.float32))


def test_views_share_the_memory_and_work_in_copies_and_launches(conn):
    ctx = conn.devices[0].create_context()
    host = np.arange(48, dtype=np.float32).reshape(6, 8)
    a = ctx.to_device(host)
    row = a[2]
    assert row.shape == (8,) and row.ptr == a.ptr + 2 * 8 * 4 and row.base is a
    assert np.array_equal(row.get(), host[2])
    assert np.array_equal(a[1:4].get(), host[1:4])
    assert np.array_equal(a[-1, 2:5].get(), host[-1, 2:5])
    assert np.array_equal(a.reshape(4, -1).get(), host.reshape(4, 12))
    assert np.array_equal(a.reshape(48)[10:20].get(), host.ravel()[10:20])
    assert a.reshape(3, 16)[1].base is a  # a view of a view views the array itself
    a[3:5].set(np.zeros((2, 8), np.float32))  # writes through to the array
    a[0].fill(7.0)  # a kernel launched on a view
    want = host.copy()
    want[3:5] = 0
    want[0] = 7
    assert np.array_equal(a.get(), want)
    with pytest.raises(IndexError, match="contiguous"):
        a[:, 1]
    with pytest.raises(IndexError, match="contiguous"):
        a[::2]
    with pytest.raises(ValueError):
        a.reshape(5, 10)


def test_copy_and_fill(conn):
    ctx = conn.devices[0].create_context()
    a = ctx.to_device(np.arange(1000, dtype=np.int32))
    b = a.copy()
    assert b.ptr != a.ptr and b.base is None and b.dtype == np.int32
    a.fill(-3)  # not float32: filled from the host
    assert np.array_equal(b.get(), np.arange(1000, dtype=np.int32))
    assert np.array_equal(a.get(), np.full(1000, -3, np.int32))
    f = ctx.empty(1000, np.float32)
    f.fill(2.5)
    assert np.array_equal(f.get(), np.full(1000, 2.5, np.float32))
    with pytest.raises(OverflowError):
        ctx.empty(4, np.uint8).fill(300)


def test_a_view_owns_nothing(conn):
    ctx = conn.devices[0].create_context()
    a = ctx.to_device(np.arange(16, dtype=np.float32))
    v = a[4:8]
    with pytest.raises(ValueError, match="view"):
        v.export()
    v.free()  # ends the view only
    with pytest.raises(errors.InvalidResourceError):
        v.get()
    assert np.array_equal(a.get(), np.arange(16, dtype=np.float32))
    w = a[0:4]
    a.free()
    with pytest.raises(errors.InvalidResourceError, match="freed"):
        w.get()
