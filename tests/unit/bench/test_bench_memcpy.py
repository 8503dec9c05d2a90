"""bench/memcpy.py: the parallel memcpy limit copies every byte, whatever the size and the
number of threads."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pvgpu.bench.memcpy import ParallelMemcpy, best_parallel, slices, thread_counts


@settings(max_examples=60, deadline=None)
@given(nbytes=st.integers(0, 3 * 4096 + 17), threads=st.integers(1, 5))
def test_slices_cover_the_bytes_in_order(nbytes, threads):
    pieces = slices(nbytes, threads)
    assert pieces[0][0] == 0 and pieces[-1][1] == nbytes
    assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
    assert len(pieces) <= threads
    assert all(lo % 4096 == 0 for lo, _hi in pieces)


@settings(max_examples=40, deadline=None)
@given(nbytes=st.integers(1, 5 * 4096 + 3), threads=st.integers(1, 4),
       dtype=st.sampled_from([np.uint8, np.float32]))
def test_parallel_memcpy_copies_every_byte(nbytes, threads, dtype):
    n = max(1, nbytes // np.dtype(dtype).itemsize)
    src = np.random.default_rng(nbytes).integers(0, 255, n * np.dtype(dtype).itemsize,
                                                 dtype=np.uint8).view(dtype)
    dst = np.zeros_like(src)
    with ParallelMemcpy(threads) as mt:
        mt(dst, src)
    assert dst.tobytes() == src.tobytes()


def test_sizes_must_match_and_threads_be_positive():
    with ParallelMemcpy(2) as mt, pytest.raises(ValueError):
        mt(np.zeros(8, np.uint8), np.zeros(9, np.uint8))
    with pytest.raises(ValueError):
        ParallelMemcpy(0)


def test_the_best_is_the_fastest_and_the_parallel_counts_start_at_two():
    assert best_parallel({1: 0.5, 2: 0.25, 4: 0.75}) == (0.25, 2)
    assert best_parallel({1: 0.25, 2: 0.5}) == (0.25, 1)
    assert thread_counts()[0] == 2
