"""Per-context GPU virtual address spaces: page tables in VRAM and a VA range allocator.

Modelled on amdgpu_vm. The format is the hardware's (host/hw/regs.py): a 48-bit VA splits
into four 9-bit indices (PD2 -> PD1 -> PD0 -> PT) and a 12-bit page offset; every table is
one 4 KiB VRAM page of 512 little-endian u64 entries; a PDE is the next table's physical
address | PDE_VALID; a PTE is a page address | PTE_* flags. The root (PD2) page is
allocated with the VM; the others are allocated on demand, zeroed, from the device's
buddy allocator (TOPDOWN, to keep them away from large buffer objects). A VM never
frees a table before the VM itself is freed.

map(va, extents, flags) writes the PTEs of a whole range with numpy, one leaf table (512
pages, 2 MiB of VA) per slice assignment — a 256 MiB window is 128 slice writes, never a
Python loop per page. Every table the range needs is allocated before any PTE is written,
so an OutOfMemory while mapping leaves no half-written mapping behind. When a run of
pages is both virtually and physically contiguous and aligned, the PTEs carry the
FRAGMENT field (log2 of the aligned run they lie in), as amdgpu does, so a TLB can use
large entries. The VM remembers its mappings (like amdgpu_bo_va_mapping): a new mapping
may not overlap an existing one and unmap() removes a whole mapping, so a fragment run
is never cut in two.

TLB invalidation: after removing PTEs the VM calls its `invalidate` hook; the device binds
it to an MMIO write of REG_VM_INVALIDATE(vmid). We use the register rather than a
TLB_FLUSH packet on a ring because the driver only unmaps memory after every job that
could use it has signalled its fence (device.py defers the free), so no in-flight work
can hold a stale translation and an immediate flush is both correct and cheaper than a
ring round trip. New mappings need no flush: the hardware's TLB does not trust invalid
entries (host/hw/mmu.py re-walks before faulting), and a VA is only reused after the
unmap that flushed it.

The VaAllocator hands out first-fit ranges of the context's user VA range (its
ContextLimits, host/kmd/limits.py), each followed by an unmapped guard page, so two
buffer objects never touch: running off the end of one faults instead of silently reading
its neighbour.
"""

from __future__ import annotations

import bisect

import numpy as np

from pvgpu.host.hw import regs
from pvgpu.host.kmd.buddy import TOPDOWN
from pvgpu.host.kmd.errors import InvalidAddress, InvalidArgument, OutOfMemory

PAGE_SIZE = regs.PAGE_SIZE
PAGE_SHIFT = regs.PAGE_SHIFT
_VA_LIMIT = 1 << regs.VA_BITS
_PT_SPAN_SHIFT = PAGE_SHIFT + regs.PT_ENTRY_BITS  # VA bits covered by one leaf table (2 MiB)
_PTE_DTYPE = np.dtype("<u8")
_MAX_FRAGMENT = regs.PTE_FRAGMENT_MASK >> regs.PTE_FRAGMENT_SHIFT
# Alignment given to large VA allocations so their PTEs can carry big fragments.
VA_MAX_ALIGN = 2 << 20


def _round_up(x: int, a: int) -> int:
    return -(-x // a) * a


class VaAllocator:
    """First-fit allocator of page-aligned VA ranges with a guard gap after each one."""

    def __init__(self, base: int = PAGE_SIZE, limit: int = _VA_LIMIT, guard: int = PAGE_SIZE):
        assert base % PAGE_SIZE == 0 and limit % PAGE_SIZE == 0 and base < limit
        self.base, self.limit, self.guard = base, limit, guard
        self._starts = [base]  # sorted free holes [start, end)
        self._ends = [limit]
        self._used = {}  # va -> (reserved start, reserved end incl. guard)

    def __len__(self) -> int:
        return len(self._used)

    def holes(self) -> list:
        return list(zip(self._starts, self._ends))

    def _take(self, i: int, start: int, end: int) -> None:
        hs, he = self._starts[i], self._ends[i]
        assert hs <= start < end <= he
        parts = [(s, e) for s, e in ((hs, start), (end, he)) if s < e]
        self._starts[i:i + 1] = [s for s, _ in parts]
        self._ends[i:i + 1] = [e for _, e in parts]

    def alloc(self, size: int, align: int = PAGE_SIZE) -> int:
        if size <= 0 or align < PAGE_SIZE or align & (align - 1):
            raise InvalidArgument(f"bad VA allocation size={size} align={align}")
        size = _round_up(size, PAGE_SIZE)
        need = size + self.guard
        for i, (hs, he) in enumerate(zip(self._starts, self._ends)):
            va = _round_up(hs, align)
            if va + need <= he:
                self._take(i, va, va + need)
                self._used[va] = (va, va + need)
                return va
        raise OutOfMemory(f"no {size:#x}-byte hole in the GPU virtual address space")

    def reserve(self, va: int, size: int) -> None:
        """Claim exactly [va, va + size) (+ guard) or raise InvalidAddress."""
        if va % PAGE_SIZE or size <= 0:
            raise InvalidArgument(f"bad VA reservation {va:#x}+{size:#x}")
        end = va + _round_up(size, PAGE_SIZE) + self.guard
        i = bisect.bisect_right(self._starts, va) - 1
        if i < 0 or end > self._ends[i] or va in self._used:
            raise InvalidAddress(f"VA range {va:#x}+{size:#x} is not free")
        self._take(i, va, end)
        self._used[va] = (va, end)

    def free(self, va: int) -> None:
        try:
            start, end = self._used.pop(va)
        except KeyError:
            raise InvalidAddress(f"VA {va:#x} was not allocated") from None
        i = bisect.bisect_left(self._starts, start)
        # merge with the hole that ends at `start` and the one that starts at `end`
        if i > 0 and self._ends[i - 1] == start:
            i -= 1
            start = self._starts[i]
            del self._starts[i], self._ends[i]
        if i < len(self._starts) and self._starts[i] == end:
            end = self._ends[i]
            del self._starts[i], self._ends[i]
        self._starts.insert(i, start)
        self._ends.insert(i, end)


def fragment_field(va: int, phys: int, size: int) -> np.ndarray:
    """FRAGMENT value of each page of a mapping of [va, va+size) onto contiguous [phys, ...).

    A page gets f when the aligned run of 2**f pages that contains it lies inside the
    mapping and is physically contiguous and aligned alike (va - phys divisible by the run)."""
    n = size >> PAGE_SHIFT
    frag = np.zeros(n, dtype=np.uint64)
    vp, pp = va >> PAGE_SHIFT, phys >> PAGE_SHIFT
    delta = vp - pp
    align_limit = (delta & -delta).bit_length() - 1 if delta else _MAX_FRAGMENT
    for f in range(1, min(align_limit, _MAX_FRAGMENT, n.bit_length() - 1) + 1):
        run = 1 << f
        lo = _round_up(vp, run) - vp
        hi = ((vp + n) // run) * run - vp
        if lo >= hi:
            break  # a larger run fits even less
        frag[lo:hi] = f
    return frag


class GpuVm:
    """One GPU virtual address space: its page tables live in VRAM."""

    def __init__(self, vram, buddy, invalidate=None, *, fragments: bool = True,
                 va_base: int = PAGE_SIZE, va_limit: int = _VA_LIMIT):
        self.vram = vram
        self.buddy = buddy
        self.invalidate = invalidate or (lambda: None)
        self.fragments = fragments
        self.va = VaAllocator(va_base, va_limit)
        self._tables = {}  # (level, va >> span) -> phys; level 2=PD1, 1=PD0, 0=PT
        self._blocks = {}  # phys -> buddy Block of each table page
        self._map_starts = []  # sorted mapping starts
        self._mappings = {}  # va -> (size, flags)
        self.root = self._new_table()
        self.freed = False

    # ------------------------------------------------------------------ tables
    def _new_table(self) -> int:
        block = self.buddy.alloc_blocks(PAGE_SIZE, flags=TOPDOWN)[0]
        self.vram.view(block.offset, PAGE_SIZE)[:] = 0
        self._blocks[block.offset] = block
        return block.offset

    @property
    def table_pages(self) -> int:
        return len(self._blocks)

    def _entries(self, table: int, first: int, count: int) -> np.ndarray:
        return self.vram.view(table + first * regs.PTE_SIZE, count * regs.PTE_SIZE).view(_PTE_DTYPE)

    def _leaf(self, va: int, create: bool) -> int | None:
        """Physical address of the leaf table (PT) covering va, allocating the path."""
        pt = self._tables.get((0, va >> _PT_SPAN_SHIFT))
        if pt is not None or not create:
            return pt
        parent = self.root
        for level in (2, 1, 0):
            shift = PAGE_SHIFT + regs.PT_ENTRY_BITS * (level + 1)
            key = (level, va >> shift)
            table = self._tables.get(key)
            if table is None:
                table = self._new_table()
                self._tables[key] = table
                index = (va >> shift) & (regs.PT_ENTRIES - 1)
                self.vram.write_u64(parent + index * regs.PTE_SIZE, table | regs.PDE_VALID)
            parent = table
        return parent

    def _leaf_spans(self, va: int, size: int):
        """(leaf table key VA, first entry, count, offset into the range's pages) per table."""
        page = va >> PAGE_SHIFT
        end = (va + size) >> PAGE_SHIFT
        done = 0
        while page < end:
            first = page & (regs.PT_ENTRIES - 1)
            count = min(regs.PT_ENTRIES - first, end - page)
            yield page << PAGE_SHIFT, first, count, done
            page += count
            done += count

    # ------------------------------------------------------------------ mappings
    def _check_range(self, va: int, size: int) -> None:
        if va % PAGE_SIZE or size <= 0 or size % PAGE_SIZE or va + size > _VA_LIMIT or va < 0:
            raise InvalidArgument(f"bad GPU VA range {va:#x}+{size:#x}")
        i = bisect.bisect_right(self._map_starts, va + size - 1) - 1
        if i >= 0:
            s = self._map_starts[i]
            if s + self._mappings[s][0] > va:
                raise InvalidAddress(f"VA range {va:#x}+{size:#x} overlaps the mapping at {s:#x}")

    def map(self, va: int, extents, flags: int) -> None:
        """Map [va, va + total) onto `extents` [(addr, size), ...] in order.

        Addresses are VRAM physical addresses, or bus addresses with PTE_SYSTEM in flags.
        flags are PTE_* bits; PTE_VALID is implied."""
        extents = [(int(a), int(s)) for a, s in extents]
        if not extents or any(a % PAGE_SIZE or s <= 0 or s % PAGE_SIZE or a < 0
                               or a + s > regs.PTE_ADDR_MASK + PAGE_SIZE for a, s in extents):
            raise InvalidArgument("extents must be non-empty, page aligned ranges")
        total = sum(s for _, s in extents)
        self._check_range(va, total)
        assert not self.freed
        flags = (flags | regs.PTE_VALID) & ~(regs.PTE_ADDR_MASK | regs.PTE_FRAGMENT_MASK)

        # 1. every table first, so OOM cannot leave a half-written mapping
        for table_va, _, _, _ in self._leaf_spans(va, total):
            self._leaf(table_va, create=True)
        # 2. the PTE values of the whole range, vectorized
        ptes = np.empty(total >> PAGE_SHIFT, dtype=np.uint64)
        pos, cur_va = 0, va
        for addr, size in extents:
            n = size >> PAGE_SHIFT
            seg = ptes[pos:pos + n]
            seg[:] = np.arange(addr, addr + size, PAGE_SIZE, dtype=np.uint64)
            if self.fragments and n > 1:
                seg |= fragment_field(cur_va, addr, size) << np.uint64(regs.PTE_FRAGMENT_SHIFT)
            pos += n
            cur_va += size
        ptes |= np.uint64(flags)
        # 3. one slice assignment per leaf table
        for table_va, first, count, off in self._leaf_spans(va, total):
            pt = self._leaf(table_va, create=False)
            self._entries(pt, first, count)[:] = ptes[off:off + count]

        i = bisect.bisect_left(self._map_starts, va)
        self._map_starts.insert(i, va)
        self._mappings[va] = (total, flags)

    def unmap(self, va: int) -> int:
        """Remove the mapping that starts at va (whole); -> its size."""
        try:
            size, _ = self._mappings.pop(va)
        except KeyError:
            raise InvalidAddress(f"no mapping starts at {va:#x}") from None
        self._map_starts.remove(va)
        for table_va, first, count, _ in self._leaf_spans(va, size):
            pt = self._leaf(table_va, create=False)
            if pt is not None:
                self._entries(pt, first, count)[:] = 0
        self.invalidate()
        return size

    def mapping_at(self, va: int):
        """(start, size, flags) of the mapping that contains va, or None."""
        i = bisect.bisect_right(self._map_starts, va) - 1
        if i >= 0:
            s = self._map_starts[i]
            size, flags = self._mappings[s]
            if va < s + size:
                return s, size, flags
        return None

    def mappings(self) -> list:
        return [(s, *self._mappings[s]) for s in self._map_starts]

    # ------------------------------------------------------------------ CPU page walk
    def walk(self, va: int) -> int:
        """The PTE for va, read back from VRAM the way the MMU walks (0 if unmapped)."""
        table = self.root
        for level in (3, 2, 1):
            shift = PAGE_SHIFT + regs.PT_ENTRY_BITS * level
            pde = self.vram.read_u64(table + ((va >> shift) & (regs.PT_ENTRIES - 1)) * 8)
            if not pde & regs.PDE_VALID:
                return 0
            table = pde & regs.PTE_ADDR_MASK
        return self.vram.read_u64(table + ((va >> PAGE_SHIFT) & (regs.PT_ENTRIES - 1)) * 8)

    def free(self) -> None:
        """Release every page-table page (cleared). The VMID must no longer point here."""
        if self.freed:
            return
        self.freed = True
        for phys in self._blocks:
            self.vram.view(phys, PAGE_SIZE)[:] = 0
        self.buddy.free_blocks(list(self._blocks.values()))
        self._blocks.clear()
        self._tables.clear()
        self._mappings.clear()
        self._map_starts.clear()
