"""pvgpu.host.hw.vram: bounds, and `clear`, which zeroes a range without touching its pages."""

import mmap
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pvgpu.host.hw.vram import Vram, VramRangeError

MiB = 1 << 20


def resident_bytes() -> int:
    """This process's resident memory (Linux, as the host is)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 5 * mmap.PAGESIZE), st.integers(0, 5 * mmap.PAGESIZE))
def test_clear_zeroes_exactly_the_range(addr, n):
    size = 8 * mmap.PAGESIZE
    vram = Vram(size)
    n = min(n, size - addr)
    vram.mem[:] = 0xA5
    vram.clear(addr, n)
    expect = np.full(size, 0xA5, np.uint8)
    expect[addr:addr + n] = 0
    np.testing.assert_array_equal(vram.mem, expect)
    vram.write(addr, b"\x01" * n)  # the cleared range is usable again
    assert vram.read(addr, n) == b"\x01" * n


def test_clear_checks_bounds():
    vram = Vram(1 * MiB)
    with pytest.raises(VramRangeError):
        vram.clear(1 * MiB - 4096, 8192)
    with pytest.raises(VramRangeError):
        vram.clear(-4096, 4096)


def test_clearing_memory_never_written_does_not_touch_its_pages():
    """Freed VRAM is cleared on the host's I/O thread: that must not fault in (and zero)
    every page of a large range nobody wrote, which on a fresh host took seconds."""
    vram = Vram(512 * MiB)
    before = resident_bytes()
    vram.clear(0, 384 * MiB)
    assert resident_bytes() - before < 64 * MiB
    assert not vram.mem[::4096].any()


def test_clearing_written_memory_gives_its_pages_back():
    vram = Vram(256 * MiB)
    vram.mem[:] = 7
    written = resident_bytes()
    vram.clear(4096, 256 * MiB - 4096)
    assert written - resident_bytes() > 128 * MiB
    assert vram.mem[0] == 7 and not vram.mem[4096:].any()
