"""A first-fit allocator of guest-physical memory (the driver's DMA-able pages).

The frontend carves its guest memory into the virtqueue rings, per-slot request areas
and this heap, from which bounce buffers for bulk copies come. Pure logic: it hands out
address ranges and never touches the memory itself.
"""

from __future__ import annotations

import bisect

from pvgpu.transport.errors import PvgpuError


class OutOfGuestMemory(PvgpuError, MemoryError):
    """Guest memory has no free block that large (bounce buffers, pinned arrays): free
    some, or connect with a larger mem_size."""


class GuestHeap:
    def __init__(self, base: int, size: int, align: int = 64):
        self.base, self.size, self.align = base, size, align
        self._free = [(base, size)]  # sorted, coalesced (start, length)
        self._live: dict[int, int] = {}  # start -> length

    @property
    def free_bytes(self) -> int:
        return sum(n for _, n in self._free)

    def largest_free(self) -> int:
        return max((n for _, n in self._free), default=0)

    def alloc(self, size: int, align: int | None = None) -> int:
        if size <= 0:
            raise ValueError(f"allocation size must be positive, got {size}")
        align = max(align or self.align, self.align)
        size = -(-size // self.align) * self.align
        for i, (start, length) in enumerate(self._free):
            aligned = -(-start // align) * align
            pad = aligned - start
            if length - pad >= size:
                pieces = []
                if pad:
                    pieces.append((start, pad))
                rest = length - pad - size
                if rest:
                    pieces.append((aligned + size, rest))
                self._free[i:i + 1] = pieces
                self._live[aligned] = size
                return aligned
        raise OutOfGuestMemory(
            f"no {size} bytes free in guest memory (largest free block {self.largest_free()})")

    def free(self, gpa: int) -> None:
        size = self._live.pop(gpa)
        i = bisect.bisect_left(self._free, (gpa, 0))
        self._free.insert(i, (gpa, size))
        # coalesce with the right neighbour, then the left one
        if i + 1 < len(self._free) and gpa + size == self._free[i + 1][0]:
            self._free[i] = (gpa, size + self._free[i + 1][1])
            del self._free[i + 1]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == gpa:
            self._free[i - 1] = (self._free[i - 1][0], self._free[i - 1][1] + self._free[i][1])
            del self._free[i]
