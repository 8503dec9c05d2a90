"""A context's VA management beyond its buffer objects: system mappings, and explicit VA
reservations and mappings (cuMemAddressReserve / cuMemMap, spec §6.7)."""

from __future__ import annotations

import time

import numpy as np

from pvgpu.host.hw import regs
from pvgpu.host.kmd import wouldblock
from pvgpu.host.kmd.bo import BufferObject
from pvgpu.host.kmd.buddy import round_up
from pvgpu.host.kmd.dma import DmaMapping
from pvgpu.host.kmd.errors import InvalidAddress, InvalidArgument, LimitReached, OutOfMemory

PAGE_SIZE = regs.PAGE_SIZE
_U64 = (1 << 64) - 1


def _slice_extents(extents, offset: int, size: int) -> list:
    """[(phys, size)] of bytes [offset, offset + size) of a BO with `extents`."""
    out, pos = [], 0
    for phys, n in extents:
        lo, hi = max(offset, pos), min(offset + size, pos + n)
        if lo < hi:
            out.append((phys + lo - pos, hi - lo))
        pos += n
    return out


class ContextVaMixin:
    """Context's system mappings and explicit VA management."""

    def map_system(self, mapping: DmaMapping, va: int, size: int | None = None,
                   writable: bool = True) -> None:
        """Map a dma-mapped host buffer at `va` (PTE_SYSTEM), e.g. the guest-memory window."""
        if not isinstance(mapping, DmaMapping):
            raise InvalidArgument("map_system needs a DmaMapping")
        if mapping.device is not None and mapping.device is not self.device:
            raise InvalidArgument("DMA mapping of another device")
        if size is None:
            size = mapping.size
        if not isinstance(va, int) or not isinstance(size, int) or size <= 0 \
                or size > round_up(mapping.size, PAGE_SIZE) or va % PAGE_SIZE:
            raise InvalidArgument(f"bad system mapping va={va!r} size={size!r}")
        psize = round_up(size, PAGE_SIZE)
        flags = regs.PTE_SYSTEM | regs.PTE_READ | (regs.PTE_WRITE if writable else 0)
        dev = self.device
        with dev.lock:
            self._check()
            dev._reclaim_locked()
            in_user = va < self.limits.va_limit and va + psize > self.limits.va_base
            if in_user:
                self.vm.va.reserve(va, psize)
            try:
                self.vm.map(va, [(mapping.bus_addr, psize)], flags)
            except BaseException:
                if in_user:
                    self.vm.va.free(va)
                raise
            self._sys_maps[va] = (mapping, psize, in_user)
            self.stats["system_bytes_mapped"] += psize

    def unmap_system(self, va: int) -> None:
        """Remove a system mapping; the PTEs go once this context's pending work is done."""
        dev = self.device
        with dev.lock:
            self._check()
            entry = self._sys_maps.pop(va, None)
            if entry is None:
                raise InvalidAddress(f"no system mapping at {va:#x}")
            self.stats["system_bytes_mapped"] -= entry[1]

            def release():
                if not self.vm.freed:
                    self.vm.unmap(va)
                    if entry[2]:
                        self.vm.va.free(va)
            dev._defer(self.pending_fences(), release)

    # ------------------------------------------------------------------ explicit VA management
    # cuMemAddressReserve / cuMemMap / cuMemSetAccess / cuMemUnmap / cuMemAddressFree (spec
    # §6.7): a reservation is a range of this context's VA space that nothing is mapped in
    # until map_bo_at puts (a page-aligned slice of) a buffer object there, READ or
    # READ|WRITE; the BO's own mapping at bo.va stays. unmap_at clears the PTEs and
    # invalidates the TLB (GpuVm.unmap -> REG_VM_INVALIDATE) behind this context's pending
    # work, like every other unmap. A BO must not be freed while it is mapped elsewhere
    # (mapped_elsewhere(); the backend refuses such a MEM_FREE).
    def reserve_va(self, size: int, align: int = PAGE_SIZE) -> int:
        """Reserve an unmapped, `align`-aligned range of `size` bytes (page rounded) in the
        user VA space; -> its VA. Raises InvalidArgument, OutOfMemory."""
        for what, v in (("size", size), ("alignment", align)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise InvalidArgument(f"bad VA reservation {what} {v!r}")
        size, align = int(size), int(align) or PAGE_SIZE
        lim = self.limits
        if not 0 < size <= lim.va_limit - lim.va_base:
            raise InvalidArgument(f"bad VA reservation size {size:#x}")
        if align < PAGE_SIZE or align & (align - 1) or align > lim.max_va_align:
            raise InvalidArgument(f"VA alignment {align:#x} is not a power of two in "
                                  f"[{PAGE_SIZE:#x}, {lim.max_va_align:#x}]")
        psize = round_up(size, PAGE_SIZE)
        with self.device.lock:
            self._check()
            self.device._reclaim_locked()
            if len(self._va_reserved) >= lim.max_va_reservations:
                raise LimitReached(f"{lim.max_va_reservations} VA reservations in use")
            va = self.vm.va.alloc(psize, align)
            self._va_reserved[va] = psize
            self.stats["va_reserved"] += psize
            return va

    def va_reservations(self) -> dict:
        """{va: size} of the live reservations."""
        with self.device.lock:
            return dict(self._va_reserved)

    def va_mappings(self) -> dict:
        """{va: (bo, offset, size, writable)} of the live map_bo_at mappings."""
        with self.device.lock:
            return dict(self._va_maps)

    def mapped_elsewhere(self, bo: BufferObject) -> list:
        """VAs at which map_bo_at mapped `bo` (besides bo.va)."""
        with self.device.lock:
            return [va for va, m in self._va_maps.items() if m[0] is bo]

    def release_va(self, va: int) -> None:
        """End reservation `va` (no mapping may be left in it: InvalidArgument); the range
        returns to the allocator once this context's pending work is done (so that it is
        not reused before earlier unmaps in it took effect)."""
        dev = self.device
        with dev.lock:
            self._check()
            size = self._va_reserved.get(va)
            if size is None:
                raise InvalidAddress(f"no VA reservation starts at {va:#x}")
            inside = [m for m in self._va_maps if va <= m < va + size]
            if inside:
                raise InvalidArgument(f"VA reservation {va:#x} still has {len(inside)} "
                                      f"mapping(s), first at {min(inside):#x}: unmap first")
            del self._va_reserved[va]
            self.stats["va_reserved"] -= size

            def release():
                if not self.vm.freed:
                    self.vm.va.free(va)
            dev._defer(self.pending_fences(), release)

    def _reservation_of(self, va: int, size: int):
        for start, rsize in self._va_reserved.items():
            if start <= va and va + size <= start + rsize:
                return start
        return None

    def map_bo_at(self, bo: BufferObject, va: int, offset: int = 0, size: int | None = None,
                  writable: bool = True) -> None:
        """Map [offset, offset + size) of `bo` (this context's) at `va`, inside a
        reservation, READ (+WRITE): the same physical pages become reachable there.
        While an earlier unmap of the range (or the BO's context, if the BO is evicted)
        still has work pending, it waits for that work (host/kmd/wouldblock.py).
        Raises InvalidArgument (alignment, range, bo), InvalidAddress (outside a
        reservation, overlapping another mapping, or the range still being unmapped after
        `timeout`), OutOfMemory (page tables)."""
        if size is None:
            size = bo.size - offset if isinstance(bo, BufferObject) else 0
        for what, v in (("va", va), ("offset", offset), ("size", size)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v <= _U64:
                raise InvalidArgument(f"bad mapping {what} {v!r}")
        va, offset, size = int(va), int(offset), int(size)
        if va % PAGE_SIZE or offset % PAGE_SIZE or size % PAGE_SIZE or size == 0:
            raise InvalidArgument(f"mapping va {va:#x}, offset {offset:#x} and size {size:#x} "
                                  "must be page aligned, size > 0")
        dev = self.device
        deadline = None
        with dev.lock:
            while True:
                self._check()
                dev._reclaim_locked()
                if not isinstance(bo, BufferObject) or self._bos.get(bo.va) is not bo:
                    raise InvalidArgument(f"{bo!r} is not a live buffer object of this context")
                if offset + size > bo.size:
                    raise InvalidArgument(f"[{offset:#x}, {offset + size:#x}) is outside the "
                                          f"{bo.size:#x}-byte buffer")
                if self._reservation_of(va, size) is None:
                    raise InvalidAddress(f"[{va:#x}, {va + size:#x}) is not inside one VA "
                                         "reservation of this context")
                for m, (_b, _o, msize, _w) in self._va_maps.items():
                    if m < va + size and va < m + msize:
                        raise InvalidAddress(f"[{va:#x}, {va + size:#x}) overlaps the mapping "
                                             f"at {m:#x}")
                if len(self._va_maps) >= self.limits.max_va_mappings:
                    raise LimitReached(f"{self.limits.max_va_mappings} mappings in use")
                pending = any(s < va + size and va < s + n for s, n, _f in self.vm.mappings())
                if getattr(bo, "sysmem", None) is not None:  # evicted: back into VRAM first
                    if dev._ctx_on_gpu(self) or dev._bo_moving(bo):
                        pending = True  # its jobs may be using the host copy, or it is
                        # still being evicted: wait
                    elif not dev._restore_bo(bo):
                        raise OutOfMemory(f"{bo!r} is evicted to host memory and does not "
                                          "fit back into VRAM to be mapped")
                if not pending:
                    flags = regs.PTE_READ | (regs.PTE_WRITE if writable else 0)
                    self.vm.map(va, _slice_extents(bo.extents, offset, size), flags)
                    self._va_maps[va] = (bo, offset, size, bool(writable))
                    self.stats["va_mapped"] += size
                    return
                # an earlier unmap of this range (or a restore) waits for this context's
                # work (host/kmd/wouldblock.py: WouldBlock in non-blocking mode)
                if deadline is None:
                    deadline = time.monotonic() + dev.timeout
                wouldblock.wait(dev, self.pending_fences(), deadline, InvalidAddress(
                    f"[{va:#x}, {va + size:#x}) is still being unmapped"))

    def unmap_at(self, va: int) -> None:
        """Remove the map_bo_at mapping that starts at `va`: at once for new work; the PTEs
        are cleared and the TLB invalidated once this context's pending work is done."""
        dev = self.device
        with dev.lock:
            self._check()
            entry = self._va_maps.pop(va, None)
            if entry is None:
                raise InvalidAddress(f"no mapping starts at {va:#x}")
            self.stats["va_mapped"] -= entry[2]

            def release():
                if not self.vm.freed:
                    self.vm.unmap(va)  # clears the PTEs, REG_VM_INVALIDATE(vmid)
            dev._defer(self.pending_fences(), release)
