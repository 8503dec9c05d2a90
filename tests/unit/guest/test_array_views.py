"""guest/api/array.py's view arithmetic: which index expressions name one contiguous range
of a C-contiguous array, and where it starts (against numpy's own indexing)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvgpu.guest.api.array import _c_strides, _contiguous_range, _reshaped

shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)


def _index(n):
    return st.one_of(st.integers(-n - 1, n), st.slices(max(n, 1)), st.just(Ellipsis))


@st.composite
def shape_and_key(draw):
    shape = draw(shapes)
    key = tuple(draw(_index(n)) for n in shape[:draw(st.integers(0, len(shape)))])
    return shape, key if len(key) != 1 or draw(st.booleans()) else key[0]


@given(shape_and_key())
def test_a_contiguous_range_is_what_numpy_selects(case):
    shape, key = case
    base = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    try:
        want = base[key]
    except IndexError:
        with pytest.raises(IndexError):
            _contiguous_range(shape, key)
        return
    values = np.asarray(want).ravel()
    one_range = values.size > 0 and np.array_equal(values, np.arange(values[0], values[0] + values.size))
    try:
        offset, got_shape = _contiguous_range(shape, key)
    except IndexError:
        # refused: numpy's result is not one range of the array's memory, or it is one only
        # trivially (at most one element)
        assert not one_range or values.size <= 1
        return
    assert got_shape == want.shape
    if values.size:
        assert one_range and values[0] == offset


def test_strided_selections_are_refused():
    for key in [(slice(None), 1), slice(None, None, 2), (slice(1, 3), slice(1, 2)), [1, 2],
                None, 1.0, True, (1, 2, 3, 4), 10, (Ellipsis, Ellipsis)]:
        with pytest.raises(IndexError):
            _contiguous_range((4, 5, 6), key)


def test_reshape_arithmetic():
    assert _reshaped(12, (3, -1)) == (3, 4)
    assert _reshaped(12, [2, 2, 3]) == (2, 2, 3)
    assert _reshaped(0, (0, 5)) == (0, 5)
    for bad in [(5, -1), (-1, -1), (3, 5), (-2, -6)]:
        with pytest.raises(ValueError):
            _reshaped(12, bad)
    with pytest.raises(TypeError):
        _reshaped(12, (3.0, 4))


def test_c_strides():
    assert _c_strides((2, 3, 4), 4) == (48, 16, 4) == np.empty((2, 3, 4), np.float32).strides
    assert _c_strides((), 8) == ()
