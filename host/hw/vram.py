"""Device memory (VRAM) of one emulated GPU.

One private anonymous mapping per device, seen as an np.uint8 array: the OS zeroes its
pages lazily, so a large VRAM costs nothing until it is touched. `clear` zeroes a range by
handing its whole pages back to the OS (madvise MADV_DONTNEED; they read as zero again),
so clearing costs no first touch of pages never written and no O(size) memset.

Addresses here are VRAM *physical* addresses. The CPU reaches VRAM through the BAR (the
KMD uses read/write/view: packets, page tables, fence memory); the hardware blocks use
`mem`, `qwords` and `buf` (the mapping itself, for struct.unpack_from) directly after
their own checks.

Every accessor is bounds-checked and raises VramRangeError (an IndexError) for a range
outside [0, size). Integers are little-endian.
"""

from __future__ import annotations

import mmap
import sys

import numpy as np

from pvgpu.host.hw.regs import PAGE_SIZE


# Linux: MADV_DONTNEED on a private anonymous mapping makes the pages zero-fill-on-demand
# (elsewhere it may keep the contents, so `clear` writes zeros instead)
_DISCARD = sys.platform.startswith("linux") and hasattr(mmap, "MADV_DONTNEED")


class VramRangeError(IndexError):
    pass


class Vram:
    def __init__(self, size: int):
        if size <= 0 or size % PAGE_SIZE:
            raise ValueError(f"VRAM size must be a positive multiple of {PAGE_SIZE}")
        self.size = size
        self._map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)  # anonymous, zero-filled
        self.buf = self._map
        self.mem = np.frombuffer(self._map, dtype=np.uint8)
        self.qwords = self.mem.view("<u8")  # page-table entries, fences (aligned u64)

    def check(self, addr: int, n: int) -> None:
        if addr < 0 or n < 0 or addr + n > self.size:
            raise VramRangeError(f"VRAM range [{addr:#x}, +{n:#x}) outside {self.size:#x}")

    def view(self, addr: int, n: int) -> np.ndarray:
        """Writable np.uint8 view of [addr, addr + n)."""
        self.check(addr, n)
        return self.mem[addr:addr + n]

    def read(self, addr: int, n: int) -> bytes:
        self.check(addr, n)
        return self.mem[addr:addr + n].tobytes()

    def write(self, addr: int, data) -> None:
        """Write a bytes-like object or a numpy array (its raw bytes) at addr."""
        if type(data) is bytes:  # packets and IBs: a plain buffer copy
            n = len(data)
            if addr < 0 or addr + n > self.size:
                self.check(addr, n)
            self._map[addr:addr + n] = data
            return
        if isinstance(data, np.ndarray):
            src = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        else:
            src = np.frombuffer(data, dtype=np.uint8)
        n = src.shape[0]
        self.check(addr, n)
        self.mem[addr:addr + n] = src

    def fill(self, addr: int, n: int, byte: int = 0) -> None:
        self.check(addr, n)
        self.mem[addr:addr + n] = byte

    def clear(self, addr: int, n: int) -> None:
        """Zero [addr, addr + n): its whole pages go back to the OS, the rest is written."""
        self.check(addr, n)
        page = mmap.PAGESIZE
        start, end = -(-addr // page) * page, (addr + n) // page * page
        if not _DISCARD or end <= start:
            self.mem[addr:addr + n] = 0
            return
        self.mem[addr:start] = 0
        self._map.madvise(mmap.MADV_DONTNEED, start, end - start)
        self.mem[end:addr + n] = 0

    def read_u32(self, addr: int) -> int:
        self.check(addr, 4)
        return int.from_bytes(self.mem[addr:addr + 4].tobytes(), "little")

    def write_u32(self, addr: int, value: int) -> None:
        self.check(addr, 4)
        self.mem[addr:addr + 4] = np.frombuffer((value & 0xFFFFFFFF).to_bytes(4, "little"),
                                                dtype=np.uint8)

    def read_u64(self, addr: int) -> int:
        self.check(addr, 8)
        if addr & 7 == 0:
            return int(self.qwords[addr >> 3])
        return int.from_bytes(self.mem[addr:addr + 8].tobytes(), "little")

    def write_u64(self, addr: int, value: int) -> None:
        self.check(addr, 8)
        value &= 0xFFFFFFFFFFFFFFFF
        if addr & 7 == 0:
            self.qwords[addr >> 3] = value
        else:
            self.mem[addr:addr + 8] = np.frombuffer(value.to_bytes(8, "little"), dtype=np.uint8)
