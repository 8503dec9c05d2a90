"""The GPU MMU: per-VMID 4-level page-table walks and a TLB (amdgpu GMC/VM style).

Page-table format (host/hw/regs.py): 48-bit VA = PD2[9] PD1[9] PD0[9] PT[9] offset[12].
Every table is a 4 KiB VRAM page of 512 little-endian u64 entries; REG_VM_PT_BASE(vmid)
holds the root (PD2) and reaches the MMU through set_root(). A PDE is the next table's
VRAM address | PDE_VALID. A PTE is a page address | PTE_VALID | permissions; the address
is of one of three kinds: this device's VRAM (no kind bit), with PTE_SYSTEM a system bus
address (SystemMemory, i.e. DMA-mapped host memory), with PTE_PEER a bus address inside a
peer GPU's BAR0 (PcieFabric.peer_view, pcie.py; this device's own BAR works too). Without
a fabric (Mmu(..., fabric=None)) PEER pages fault. VMID 0 is the kernel's physical
address space: identity over VRAM, and system bus addresses (from SYSMEM_BUS_BASE, through
the IOMMU) so the driver can move buffers between the two; no permission checks.

translate(vmid, va, size, access) returns the range as a list of numpy uint8 views
("extents"), in VA order, with physically contiguous pages merged, so copies and kernels
work on a few large views instead of pages. It is vectorized: the directories are walked
once per 2 MiB leaf table and the leaf's PTE slice is checked with numpy masks; page
runs of one kind are found with np.diff on the addresses; PTEs that step by exactly one
page from a good first PTE (a buffer backed contiguously, the common case) are one run,
recognised with one comparison. Python work is per leaf table and per extent, never per
page.

Coalesced TLB entries. The first time a range uses a cached leaf table, the MMU records
the leaf's runs: the pages whose PTEs (fragment field aside) step by exactly one page
with the same flags, as (first index, end index, first PTE), like the contiguous-block
entries of a real GPU TLB. A leaf with more than MAX_LEAF_RUNS runs records that it has
none. A range over cached leaves with recorded runs is translated from the runs alone:
a few integer checks per run (the first PTE's permissions and kind, the last page inside
VRAM), no numpy and nothing per page, so the translation of a large copy costs per leaf
table and run, not per page. Anything else (a leaf not cached or too fragmented, a page
that is not good) goes the vectorized way above, which also decides the faults.

Faults. A missing PDE/PTE, a missing permission, a PTE outside VRAM or with both
PTE_SYSTEM and PTE_PEER, a SYSTEM address outside every DMA mapping (or a write to a
read-only mapping), a PEER address the fabric refuses (outside every BAR's VRAM or on a
P2PDMA_MAP_NOT_SUPPORTED route: reason "peer not reachable: ...") and any PEER page
without a fabric raise MmuFault(vmid, address, access): `address` is the first faulting
page's address (or `va` itself if that is the first page); `access` is the ACCESS_*
bits that were missing for a permission fault, else the requested access.
MmuFault is internal to host/hw: the engines turn it into an IRQ_PAGE_FAULT interrupt.
Nothing is written by translate, so a fault leaves memory untouched.

TLB. A TLB entry caches one leaf table's PTEs (a 4 KiB copy) under (vmid, va >> 21);
a page-walk cache keeps the PD0 table address under (vmid, va >> 30). Like a real TLB,
translations of valid entries are used until invalidated: after changing or removing a
valid PTE the driver must flush (TLB_FLUSH packet, REG_VM_INVALIDATE, or writing the
VMID's root). Like a real TLB, invalid translations are not trusted: a fault on a cached
leaf re-reads it from VRAM once before faulting, so newly mapped pages work without a
flush. A walk that raced with a flush does not refill the TLB. The fragment bits are a
hint and are ignored (extents already merge contiguous pages).
"""

from __future__ import annotations

import logging
import threading

import numpy as np

from pvgpu.host.hw.regs import (NUM_VMIDS, PAGE_SHIFT, PAGE_SIZE, PDE_VALID, PT_ENTRIES,
                          PT_ENTRY_BITS, PTE_ADDR_MASK, PTE_EXEC, PTE_FRAGMENT_MASK,
                          PTE_PEER, PTE_READ, PTE_SYSTEM, PTE_VALID, PTE_WRITE, VA_BITS,
                          VMID_KERNEL)
from pvgpu.host.hw.pcie import PeerFault
from pvgpu.host.hw.sysmem import SYSMEM_BUS_BASE, SysmemFault
from pvgpu.spec.kernels import ACCESS_EXEC, ACCESS_READ, ACCESS_WRITE

log = logging.getLogger("pvgpu.hw.mmu")

VA_LIMIT = 1 << VA_BITS
LEAF_SHIFT = PAGE_SHIFT + PT_ENTRY_BITS  # 21: VA bytes covered by one leaf table
PD_SHIFT = LEAF_SHIFT + PT_ENTRY_BITS  # 30: VA bytes covered by one PD0 table
_IDX = PT_ENTRIES - 1
_PAGE_MASK = PAGE_SIZE - 1
BATCH_LEAVES = 64  # leaf tables checked at once (128 MiB of VA)
MAX_LEAF_RUNS = 16  # runs of pages a coalesced TLB entry holds at most (else none)
_PAGE_STRIDE = np.arange(BATCH_LEAVES * PT_ENTRIES, dtype=np.uint64) << np.uint64(PAGE_SHIFT)
# a page's kind: the PTE_SYSTEM/PTE_PEER bits of its PTE
_VRAM = 0
_SYSTEM = PTE_SYSTEM
_PEER = PTE_PEER
_KINDS = PTE_SYSTEM | PTE_PEER  # both at once: a bad PTE

_PERM = ((ACCESS_READ, PTE_READ), (ACCESS_WRITE, PTE_WRITE), (ACCESS_EXEC, PTE_EXEC))


def _pte_perms(access: int) -> int:
    return sum(pte for acc, pte in _PERM if access & acc)


_ACCESS_ALL = ACCESS_READ | ACCESS_WRITE | ACCESS_EXEC
_NEED = [PTE_VALID | _pte_perms(a) for a in range(_ACCESS_ALL + 1)]  # access -> PTE bits


def _missing_access(pte: int, access: int) -> int:
    return sum(acc for acc, bit in _PERM if access & acc and not pte & bit)


_UNKNOWN = object()  # a cached leaf whose runs are not computed yet
_NO_FRAGMENT = np.uint64(~PTE_FRAGMENT_MASK & (2**64 - 1))


def _leaf_runs(ptes) -> tuple | None:
    """A leaf table's PTEs as runs (first index, end index, first PTE without its fragment
    field) of pages whose PTEs step by exactly one page with the same flags (a run of
    invalid PTEs is one run too); None past MAX_LEAF_RUNS runs."""
    ptes = ptes & _NO_FRAGMENT
    head, tail = int(ptes[0]), int(ptes[-1])
    n = ptes.shape[0]
    if (not (head ^ tail) & ~PTE_ADDR_MASK and tail - head == (n - 1) << PAGE_SHIFT
            and np.array_equal(ptes, _PAGE_STRIDE[:n] + np.uint64(head))):
        return ((0, n, head),)  # the common case: one contiguous run
    valid = (ptes & np.uint64(PTE_VALID)).astype(bool)
    brk = np.diff(ptes) != PAGE_SIZE
    brk &= valid[1:] | valid[:-1]  # invalid PTEs next to each other stay one run
    starts = np.flatnonzero(brk) + 1
    if starts.shape[0] >= MAX_LEAF_RUNS:
        return None
    bounds = [0, *starts.tolist(), n]
    runs = []
    for i in range(len(bounds) - 1):
        lo, hi = bounds[i], bounds[i + 1]
        first, end = int(ptes[lo]), int(ptes[hi - 1])
        if first & PTE_VALID and (first ^ end) & ~PTE_ADDR_MASK:
            return None  # the address carried into the flags: not one run
        runs.append((lo, hi, first))
    return tuple(runs)


class MmuFault(Exception):
    """A GPU page fault (internal to host/hw; engines convert it into IRQ_PAGE_FAULT)."""

    def __init__(self, vmid: int, address: int, access: int, reason: str = ""):
        super().__init__(f"GPU page fault vmid={vmid} address={address:#x} access={access}"
                         f"{': ' + reason if reason else ''}")
        self.vmid = vmid
        self.address = address
        self.access = access
        self.reason = reason


class Mmu:
    TLB_CAPACITY = 2048  # leaf tables (each caches 2 MiB of VA; 8 MiB of PTE copies)

    def __init__(self, vram, sysmem, name: str = "gpu", fabric=None, requester: int = 0):
        """fabric: the PcieFabric resolving PEER pages, requester: this device's endpoint
        index in it; without a fabric PEER pages fault."""
        self.vram = vram
        self.sysmem = sysmem
        self.name = name
        self.fabric = fabric
        self.requester = requester
        self._bus_kinds = (_SYSTEM, _PEER) if fabric is not None else (_SYSTEM,)
        self._forbidden_kind = 0 if fabric is not None else PTE_PEER
        self._roots = [0] * NUM_VMIDS
        self._lock = threading.Lock()
        self._tlb = [{} for _ in range(NUM_VMIDS)]  # va >> 21 -> read-only PTE array
        self._runs = [{} for _ in range(NUM_VMIDS)]  # va >> 21 -> _leaf_runs of its TLB entry
        self._pwc = [{} for _ in range(NUM_VMIDS)]  # va >> 30 -> PD0 table address
        self._gen = [0] * NUM_VMIDS  # bumped by every flush of the VMID
        self._tlb_entries = 0
        self.tlb_hits = 0
        self.tlb_misses = 0
        self.pwc_hits = 0
        self.pwc_misses = 0
        self.flushes = 0
        self.faults = 0

    # --------------------------------------------------------------- registers
    def set_root(self, vmid: int, table: int) -> None:
        """REG_VM_PT_BASE(vmid) written: new root page directory; flushes the VMID."""
        if 0 < vmid < NUM_VMIDS:
            self._roots[vmid] = table & PTE_ADDR_MASK
            self.flush(vmid)

    def root(self, vmid: int) -> int:
        return self._roots[vmid]

    def flush(self, vmid: int) -> None:
        if not 0 <= vmid < NUM_VMIDS:
            return
        with self._lock:
            self._tlb_entries -= len(self._tlb[vmid])
            self._tlb[vmid] = {}
            self._runs[vmid] = {}
            self._pwc[vmid] = {}
            self._gen[vmid] += 1
            self.flushes += 1

    def flush_all(self) -> None:
        for vmid in range(NUM_VMIDS):
            self.flush(vmid)

    def stats(self) -> dict:
        return {"tlb_hits": self.tlb_hits, "tlb_misses": self.tlb_misses,
                "pwc_hits": self.pwc_hits, "pwc_misses": self.pwc_misses,
                "tlb_entries": self._tlb_entries, "flushes": self.flushes,
                "faults": self.faults}

    # --------------------------------------------------------------- the walk
    def _pde(self, table: int, index: int):
        """Address of the next-level table, or None."""
        if table + PAGE_SIZE > self.vram.size:
            return None
        entry = int(self.vram.qwords[(table >> 3) + index])
        if not entry & PDE_VALID:
            return None
        nxt = entry & PTE_ADDR_MASK
        return nxt if nxt + PAGE_SIZE <= self.vram.size else None

    def _leaf(self, vmid: int, chunk: int, use_tlb: bool):
        """PTEs of the leaf table covering VA chunk (va >> 21) -> (array or None, cached)."""
        with self._lock:
            if use_tlb:
                ptes = self._tlb[vmid].get(chunk)
                if ptes is not None:
                    self.tlb_hits += 1
                    return ptes, True
            self.tlb_misses += 1
            gen = self._gen[vmid]
            pd0 = self._pwc[vmid].get(chunk >> PT_ENTRY_BITS)
            if pd0 is None:
                self.pwc_misses += 1
            else:
                self.pwc_hits += 1
        if pd0 is None:
            table = self._roots[vmid]
            if table == 0:
                return None, False
            for shift in (2 * PT_ENTRY_BITS, PT_ENTRY_BITS):  # PD2, PD1
                table = self._pde(table, (chunk >> shift) & _IDX)
                if table is None:
                    return None, False
            pd0 = table
        leaf = self._pde(pd0, chunk & _IDX)
        if leaf is None:
            return None, False
        ptes = self.vram.qwords[leaf >> 3:(leaf >> 3) + PT_ENTRIES].copy()
        ptes.flags.writeable = False
        with self._lock:
            if gen == self._gen[vmid]:  # no flush since the walk began
                self._pwc[vmid][chunk >> PT_ENTRY_BITS] = pd0
                tlb = self._tlb[vmid]
                if chunk not in tlb:
                    if self._tlb_entries >= self.TLB_CAPACITY:
                        self._evict(vmid)
                    self._tlb_entries += 1
                tlb[chunk] = ptes
                self._runs[vmid].pop(chunk, None)
        return ptes, False

    def _evict(self, prefer: int) -> None:
        """Drop the oldest TLB entry of VMID `prefer` (of another VMID if it has none)."""
        vmid = prefer if self._tlb[prefer] else next(v for v, t in enumerate(self._tlb) if t)
        victim = self._tlb[vmid]
        chunk = next(iter(victim))  # FIFO within the VMID
        del victim[chunk]
        self._runs[vmid].pop(chunk, None)
        self._tlb_entries -= 1

    # --------------------------------------------------------------- translate
    def translate(self, vmid: int, va: int, size: int, access: int) -> list:
        """[va, va + size) -> list of np.uint8 views in VA order; raises MmuFault."""
        if size <= 0:
            if size == 0:
                return []
            raise ValueError("negative size")
        end = va + size
        if vmid == VMID_KERNEL:
            if va >= SYSMEM_BUS_BASE:  # a system bus address: the driver's buffer moves
                try:
                    return [self.sysmem.view(va, size, bool(access & ACCESS_WRITE))]
                except SysmemFault as f:
                    self._fault(vmid, f.address, access, "system address not mapped")
            if va < 0 or end > self.vram.size:
                self._fault(vmid, max(va, self.vram.size), access, "outside VRAM")
            return [self.vram.mem[va:end]]
        if not 0 < vmid < NUM_VMIDS or va < 0 or va >= VA_LIMIT:
            self._fault(vmid, va, access, "bad vmid or address")
        need = _NEED[access & _ACCESS_ALL]
        first = va >> PAGE_SHIFT
        last = (min(end, VA_LIMIT) - 1) >> PAGE_SHIFT
        if first == last:
            views = self._translate_page(vmid, va, end, access, need)
        else:
            views = self._translate_range(vmid, va, end, access, need, first, last)
        if end > VA_LIMIT:
            self._fault(vmid, VA_LIMIT, access, "beyond the VA space")
        return views

    def _translate_page(self, vmid, va, end, access, need) -> list:
        """The common small case: a range inside one page, with plain ints."""
        chunk = va >> LEAF_SHIFT
        index = (va >> PAGE_SHIFT) & _IDX
        with self._lock:  # the TLB first (_leaf's hit path, without the call)
            ptes = self._tlb[vmid].get(chunk)
            if ptes is not None:
                self.tlb_hits += 1
        cached = ptes is not None
        while True:
            if ptes is None:  # a miss, or a cached leaf re-read once
                ptes, cached = self._leaf(vmid, chunk, False)
                if ptes is None:
                    self._fault(vmid, va, access, "no page table")
            pte = int(ptes[index])
            addr = pte & PTE_ADDR_MASK
            kind = pte & _KINDS
            if kind == _VRAM:
                if (pte & need) == need and addr + PAGE_SIZE <= self.vram.size:
                    addr += va & _PAGE_MASK
                    return [self.vram.mem[addr:addr + end - va]]  # (_views of a VRAM page)
            elif (pte & need) == need and kind in self._bus_kinds:
                return self._views(vmid, [(kind, addr, va & ~_PAGE_MASK, 1)], va, end, access)
            if not cached:
                break
            ptes = None
        self._bad_pte(vmid, va, pte, access)

    def _translate_range(self, vmid, va, end, access, need, first, last) -> list:
        runs = self._cached_runs(vmid, need, first, last)
        if runs is not None:
            return self._views(vmid, runs, va, end, access)
        runs = []  # (kind, phys, page_va, npages), physically contiguous
        page = first
        while page <= last:
            page, bad_at, bad_pte, missing = self._batch(vmid, need, page, last, runs)
            if bad_at is not None or missing is not None:
                self._views(vmid, runs, va, end, access)  # an earlier fault wins
                if bad_at is not None:
                    self._bad_pte(vmid, max(va, bad_at << PAGE_SHIFT), bad_pte, access)
                self._fault(vmid, max(va, missing << PAGE_SHIFT), access, "no page table")
        return self._views(vmid, runs, va, end, access)

    def _cached_runs(self, vmid, need, first, last):
        """Pages first..last as runs (kind, phys, page_va, npages) from the coalesced TLB
        entries, or None: a leaf not cached or without runs, or a page that is not good."""
        check = need | self._forbidden_kind
        vram_last = self.vram.size - PAGE_SIZE
        bus_kinds = self._bus_kinds
        out = []
        page = first
        with self._lock:
            cached, tlb = self._runs[vmid], self._tlb[vmid]
            leaves = 0
            while page <= last:
                chunk = page >> PT_ENTRY_BITS
                leaf_runs = cached.get(chunk, _UNKNOWN)
                if leaf_runs is _UNKNOWN:
                    ptes = tlb.get(chunk)
                    if ptes is None:
                        return None
                    leaf_runs = cached[chunk] = _leaf_runs(ptes)
                if leaf_runs is None:
                    return None
                base = chunk << PT_ENTRY_BITS
                lo = page - base
                hi = last - base + 1 if last - base < PT_ENTRIES else PT_ENTRIES
                for start, stop, head in leaf_runs:
                    if stop <= lo:
                        continue
                    if start >= hi:
                        break
                    s = lo if lo > start else start  # the run clipped to [lo, hi)
                    e = hi if hi < stop else stop
                    kind = head & _KINDS
                    addr = (head & PTE_ADDR_MASK) + ((s - start) << PAGE_SHIFT)
                    if (head & check) != need or (
                            addr + ((e - s - 1) << PAGE_SHIFT) > vram_last if kind == _VRAM
                            else kind not in bus_kinds):
                        return None
                    prev = out[-1] if out else None
                    if prev and prev[0] == kind and prev[1] + (prev[3] << PAGE_SHIFT) == addr:
                        out[-1] = (kind, prev[1], prev[2], prev[3] + e - s)  # joins the last
                    else:
                        out.append((kind, addr, (base + s) << PAGE_SHIFT, e - s))
                leaves += 1
                page = base + PT_ENTRIES
            self.tlb_hits += leaves
        return out

    def _batch(self, vmid, need, page, last, runs):
        """Check up to BATCH_LEAVES leaf tables from `page` and append their runs.

        -> (next page, first bad page or None, its PTE, first page without a leaf table
        or None). Batching bounds the memory a huge, mostly invalid range can cost."""
        # 1. the leaf tables' PTE slices, one per 2 MiB of VA (TLB first)
        first = page
        slices, cached = [], []
        missing = None
        while page <= last and len(slices) < BATCH_LEAVES:
            chunk = page >> PT_ENTRY_BITS
            lo = page & _IDX
            hi = min(PT_ENTRIES, last - (chunk << PT_ENTRY_BITS) + 1)
            ptes, hit = self._leaf(vmid, chunk, True)
            if ptes is None:
                missing = page
                break
            slices.append(ptes[lo:hi])
            cached.append(hit)
            page = (chunk + 1) << PT_ENTRY_BITS
        # 2. check them at once; a bad PTE that came from the TLB is re-read from VRAM once
        while True:
            if not slices:
                return page, None, 0, missing
            sl = slices[0] if len(slices) == 1 else np.concatenate(slices)
            if self._one_good_run(sl, need):  # the common case, without per-page masks
                n = sl.shape[0]
                self._append_runs(runs, first, [0, n], [int(sl[0]) & PTE_ADDR_MASK],
                                  [int(sl[0]) & _KINDS])
                return page, None, 0, missing
            addr = sl & PTE_ADDR_MASK
            kind = (sl & _KINDS).astype(np.uint8)  # u8: few large arrays alive (page faults)
            bad = (sl & (need | self._forbidden_kind)) != need
            bad |= kind == _KINDS
            bad |= (addr > self.vram.size - PAGE_SIZE) & (kind == _VRAM)
            bad_at = int(bad.argmax())
            if not bad[bad_at]:
                bad_at = -1
                break
            k, off = 0, bad_at  # which slice holds the bad PTE
            while off >= slices[k].shape[0]:
                off -= slices[k].shape[0]
                k += 1
            if not cached[k]:
                break
            slice_page = first + bad_at - off
            ptes, _ = self._leaf(vmid, slice_page >> PT_ENTRY_BITS, False)
            if ptes is None:
                del slices[k:], cached[k:]
                missing = slice_page
            else:
                lo = slice_page & _IDX
                slices[k] = ptes[lo:lo + slices[k].shape[0]]
                cached[k] = False
        # 3. physically contiguous runs of the good prefix
        n = bad_at if bad_at >= 0 else sl.shape[0]
        if n:
            addr, kind = addr[:n], kind[:n]
            brk = np.diff(addr) != PAGE_SIZE
            brk |= kind[1:] != kind[:-1]
            idx = np.flatnonzero(brk) + 1
            starts = [0] + idx.tolist() + [n]
            phys = [int(addr[0])] + addr[idx].tolist()
            kinds = [int(kind[0])] + kind[idx].tolist()
            self._append_runs(runs, first, starts, phys, kinds)
        if bad_at >= 0:
            return page, first + bad_at, int(sl[bad_at]), None
        return page, None, 0, missing

    def _one_good_run(self, sl, need) -> bool:
        """Whether the PTEs `sl` map one physically contiguous run of good pages: each PTE
        is the first plus i pages (so every flag bit is the same), and the first is good."""
        head, tail = int(sl[0]), int(sl[-1])
        n = sl.shape[0]
        if (head ^ tail) & ~PTE_ADDR_MASK or tail - head != (n - 1) << PAGE_SHIFT:
            return False  # (equal bits above the address: no carry out of it in between)
        kind = head & _KINDS
        if (head & (need | self._forbidden_kind)) != need or kind == _KINDS or (
                kind == _VRAM and (tail & PTE_ADDR_MASK) > self.vram.size - PAGE_SIZE):
            return False
        return n <= 2 or bool(np.array_equal(sl, _PAGE_STRIDE[:n] + np.uint64(head)))

    @staticmethod
    def _append_runs(runs, first, starts, phys, kinds) -> None:
        """Append the runs of pages first + [starts[i], starts[i + 1]) (physical address
        phys[i], kind kinds[i]), joining the first to the last run already there."""
        if runs:
            kind, p, run_va, npages = runs[-1]
            if kind == kinds[0] and p + (npages << PAGE_SHIFT) == phys[0]:
                runs[-1] = (kind, p, run_va, npages + starts[1])
                starts, phys, kinds = starts[1:], phys[1:], kinds[1:]
        base_va = first << PAGE_SHIFT
        runs.extend((kinds[i], phys[i], base_va + (starts[i] << PAGE_SHIFT),
                     starts[i + 1] - starts[i]) for i in range(len(phys)))

    def _bad_pte(self, vmid, address, pte, access):
        kind = pte & _KINDS
        if kind == _PEER and self.fabric is None:
            self._fault(vmid, address, access, "peer access not supported (no PCIe fabric)")
        if pte & PTE_VALID and kind != _KINDS and _missing_access(pte, access):
            self._fault(vmid, address, _missing_access(pte, access), "permission")
        self._fault(vmid, address, access, f"bad PTE {pte:#x}")

    def _fault(self, vmid, address, access, reason):
        self.faults += 1
        raise MmuFault(vmid, address, access, reason)

    def _views(self, vmid: int, runs, va: int, end: int, access: int) -> list:
        """Runs (kind, phys, page_va, npages) -> views clipped to [va, end)."""
        views = []
        write = bool(access & ACCESS_WRITE)
        mem = self.vram.mem
        for kind, phys, run_va, npages in runs:
            s = max(va, run_va)
            e = min(end, run_va + (npages << PAGE_SHIFT))
            p = phys + (s - run_va)
            if kind == _VRAM:
                views.append(mem[p:p + e - s])
                continue
            try:
                if kind == _SYSTEM:
                    views.append(self.sysmem.view(p, e - s, write))
                else:
                    views.append(self.fabric.peer_view(self.requester, p, e - s, write))
            except SysmemFault as f:
                self._fault(vmid, self._fault_va(va, s, p, f.address), access,
                            "system address not mapped")
            except PeerFault as f:
                self._fault(vmid, self._fault_va(va, s, p, f.address), access,
                            f"peer not reachable: {f.reason}")
        return views

    @staticmethod
    def _fault_va(va: int, s: int, p: int, bad_addr: int) -> int:
        """The VA of the page holding bus address bad_addr of a run mapping s -> p."""
        return max(va, (s + (bad_addr - p)) & ~_PAGE_MASK)
