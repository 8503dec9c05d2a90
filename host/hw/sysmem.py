"""System memory as the devices see it: host buffers behind an IOMMU.

Models the platform side of the Linux DMA API (dma_map_single / dma_unmap_single): the
driver hands the platform a host buffer and gets back a *bus address* that it may write
into a PTE with PTE_SYSTEM; a device reaches the buffer only through that address.

  - Bus addresses start at SYSMEM_BUS_BASE (1 << 44), are page aligned and unique. They
    come from a bump allocator and are never reused, so a stale PTE can never reach a
    newer mapping. A one-page hole follows every mapping: bus addresses that look
    contiguous always lie inside one mapping (the MMU merges contiguous pages into one
    extent and relies on this).
  - The mapping covers exactly len(buf) bytes; the rest of its last page faults.
  - A read-only buffer (e.g. a received message frame) may be mapped; a device write to
    it faults.
  - view(bus_addr, n) is for the hardware: it returns a numpy view into the host buffer
    or raises SysmemFault (internal to host/hw; the MMU turns it into a page fault).

All methods are thread-safe. Unmapping while a device still holds a view is harmless to
the process (the view keeps the buffer alive) but, as with real DMA, the driver must not
unmap memory a device is still using.
"""

from __future__ import annotations

import bisect
import threading

import numpy as np

from pvgpu.host.hw.regs import PAGE_SIZE, PTE_ADDR_MASK

SYSMEM_BUS_BASE = 1 << 44
SYSMEM_BUS_LIMIT = (PTE_ADDR_MASK | (PAGE_SIZE - 1)) + 1  # bus addresses must fit a PTE


class SysmemFault(Exception):
    """A device access outside every DMA mapping (or a write to a read-only one).

    `address` is the first bus address of the access that is not accessible."""

    def __init__(self, address: int, write: bool = False):
        super().__init__(f"system memory fault at bus address {address:#x}"
                         f"{' (write)' if write else ''}")
        self.address = address
        self.write = write


class _Mapping:
    __slots__ = ("bus_addr", "length", "buf", "writable")

    def __init__(self, bus_addr, length, buf, writable):
        self.bus_addr = bus_addr
        self.length = length
        self.buf = buf
        self.writable = writable


class SystemMemory:
    """The platform's host memory as seen by devices through the IOMMU."""

    def __init__(self):
        self._lock = threading.Lock()
        self._next = SYSMEM_BUS_BASE
        self._starts: list[int] = []  # sorted bus addresses of live mappings
        self._maps: dict[int, _Mapping] = {}
        self.mapped_bytes = 0

    # ---------------------------------------------------------------- driver side
    def dma_map(self, buf) -> int:
        """Map a 1-D C-contiguous np.uint8 array for device access; -> bus address."""
        if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1:
            raise TypeError("dma_map needs a 1-D np.uint8 array")
        if not buf.flags.c_contiguous:
            raise ValueError("dma_map needs a contiguous buffer")
        length = int(buf.shape[0])
        span = (length + PAGE_SIZE - 1) // PAGE_SIZE * PAGE_SIZE + PAGE_SIZE  # + guard page
        with self._lock:
            bus = self._next
            if bus + span > SYSMEM_BUS_LIMIT:
                raise MemoryError("system bus address space exhausted")
            self._next = bus + span
            self._maps[bus] = _Mapping(bus, length, buf, bool(buf.flags.writeable))
            self._starts.append(bus)  # bump allocation keeps the list sorted
            self.mapped_bytes += length
        return bus

    def dma_unmap(self, bus_addr: int) -> None:
        with self._lock:
            m = self._maps.pop(bus_addr, None)
            if m is None:
                raise ValueError(f"bus address {bus_addr:#x} is not mapped")
            i = bisect.bisect_left(self._starts, bus_addr)
            del self._starts[i]
            self.mapped_bytes -= m.length

    @property
    def num_mappings(self) -> int:
        return len(self._maps)

    # -------------------------------------------------------------- hardware side
    def view(self, bus_addr: int, n: int, write: bool = False) -> np.ndarray:
        """np.uint8 view of [bus_addr, bus_addr + n), which must lie inside one mapping."""
        with self._lock:
            i = bisect.bisect_right(self._starts, bus_addr) - 1
            m = self._maps[self._starts[i]] if i >= 0 else None
        if m is None or bus_addr >= m.bus_addr + max(m.length, 1) or n < 0:
            raise SysmemFault(bus_addr, write)
        off = bus_addr - m.bus_addr
        if off + n > m.length:
            raise SysmemFault(max(bus_addr, m.bus_addr + m.length), write)
        if write and not m.writable:
            raise SysmemFault(bus_addr, write)
        return m.buf[off:off + n]
