"""pvgpu.guest.frontend.heap: the first-fit allocator of guest-physical memory."""

import pytest
from hypothesis import given, settings, strategies as st

from pvgpu.guest.frontend.heap import GuestHeap, OutOfGuestMemory


def test_alloc_free_coalesces_back_to_one_block():
    h = GuestHeap(4096, 1 << 20, align=64)
    a, b, c = h.alloc(100), h.alloc(5000), h.alloc(64)
    assert a == 4096 and b == a + 128 and c == b + 5056
    h.free(b)
    h.free(a)
    h.free(c)
    assert h._free == [(4096, 1 << 20)]


def test_alignment_and_exhaustion():
    h = GuestHeap(0, 1 << 16, align=64)
    h.alloc(100)
    x = h.alloc(4096, align=4096)
    assert x % 4096 == 0
    with pytest.raises(OutOfGuestMemory):
        h.alloc(1 << 16)
    with pytest.raises(ValueError):
        h.alloc(0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 9000), st.integers(0, 100)), max_size=60))
def test_random_alloc_free_never_overlaps_and_conserves_bytes(ops):
    size = 1 << 16
    h = GuestHeap(8192, size, align=64)
    live = {}
    for is_alloc, n, pick in ops:
        if is_alloc or not live:
            try:
                gpa = h.alloc(n)
            except OutOfGuestMemory:
                continue
            rounded = -(-n // 64) * 64
            assert 8192 <= gpa and gpa + rounded <= 8192 + size
            for g, m in live.items():
                assert gpa + rounded <= g or g + m <= gpa
            live[gpa] = rounded
        else:
            gpa = sorted(live)[pick % len(live)]
            h.free(gpa)
            del live[gpa]
        assert h.free_bytes + sum(live.values()) == size
    for gpa in list(live):
        h.free(gpa)
    assert h._free == [(8192, size)]
