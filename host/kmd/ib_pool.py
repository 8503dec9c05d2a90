"""The indirect-buffer pool of one device (amdgpu_sa): KMD-owned VRAM that job IBs are
written into before the ring points the engine at them.

IbPool sub-allocates the range circularly; an IB too large for the pool (or one that
finds it full) gets its own contiguous VRAM blocks instead (IbPoolMixin._ib_alloc_nowait,
which never waits). IB space returns when the job's fence retires (job.py, _retire).
"""

from __future__ import annotations

import collections

from pvgpu.host.hw import regs
from pvgpu.host.kmd.buddy import CONTIGUOUS, TOPDOWN, round_up

PAGE_SIZE = regs.PAGE_SIZE
DEFAULT_IB_POOL_SIZE = 1 << 20
IB_ALIGN = 256


class IbPool:
    """Sub-allocator of indirect-buffer space in one KMD-owned VRAM range (amdgpu_sa).

    Allocation is circular (a FIFO of live IBs); IBs may be released in any order, and
    space is reused once every older IB is released too. alloc() -> phys or None."""

    def __init__(self, base: int, size: int, align: int = IB_ALIGN):
        self.base, self.size, self.align = base, size, align
        self._live = collections.deque()  # [start, end, done] in allocation order
        self._by_start = {}
        self._tail = 0  # next free offset

    @property
    def in_use(self) -> int:
        return len(self._live)

    def free_bytes(self) -> int:
        """Contiguous room the next alloc() could use (a lower bound of all free space)."""
        if not self._live:
            return self.size
        head, tail = self._live[0][0], self._tail
        if tail > head:
            return max(self.size - tail, head)
        return head - tail

    def alloc(self, nbytes: int) -> int | None:
        n = -(-max(nbytes, 1) // self.align) * self.align
        if n >= self.size:
            return None
        if not self._live:
            start = 0
        else:
            head, tail = self._live[0][0], self._tail
            # tail == head never happens with live IBs (strict comparisons below), so
            # tail > head means the live range [head, tail) has not wrapped.
            if tail > head:
                start = tail if tail + n <= self.size else (0 if n < head else None)
            else:  # wrapped: the free space is [tail, head)
                start = tail if tail + n < head else None
            if start is None:
                return None
        entry = [start, start + n, False]
        self._live.append(entry)
        self._by_start[start] = entry
        self._tail = start + n
        return self.base + start

    def free(self, phys: int) -> None:
        entry = self._by_start.pop(phys - self.base)
        entry[2] = True
        while self._live and self._live[0][2]:
            self._live.popleft()
        if not self._live:
            self._tail = 0


class IbPoolMixin:
    """KmdDevice's IB allocation: from the pool, else dedicated VRAM blocks."""

    def _ib_alloc_nowait(self, nbytes: int):
        if nbytes <= self.ib_pool.size // 2:
            phys = self.ib_pool.alloc(nbytes)
            if phys is not None:
                return phys, None
            self.stats["ib_pool_full"] += 1
        blocks = self.mm.alloc_blocks(round_up(nbytes, PAGE_SIZE), flags=CONTIGUOUS | TOPDOWN)
        return min(b.offset for b in blocks), blocks
