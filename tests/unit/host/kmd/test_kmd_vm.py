"""pvgpu.host.kmd.vm: VA allocator, page-table programming, cross-checked with the hardware MMU."""


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pvgpu.host.hw import regs
from pvgpu.host.hw.mmu import Mmu, MmuFault
from pvgpu.host.hw.sysmem import SystemMemory
from pvgpu.host.hw.vram import Vram
from pvgpu.host.kmd.buddy import BuddyAllocator
from pvgpu.host.kmd.errors import InvalidAddress, InvalidArgument, OutOfMemory
from pvgpu.host.kmd.vm import GpuVm, VaAllocator, fragment_field
from pvgpu.spec import wire

P = regs.PAGE_SIZE
RW = regs.PTE_READ | regs.PTE_WRITE


# ---------------------------------------------------------------------- VaAllocator
def test_va_first_fit_with_guard():
    va = VaAllocator(wire.VA_USER_BASE, wire.VA_USER_LIMIT)
    a = va.alloc(P)
    b = va.alloc(3 * P)
    assert a == wire.VA_USER_BASE
    assert b == a + 2 * P  # one guard page after a
    va.free(a)
    assert va.alloc(P) == a  # first fit reuses the hole
    assert va.alloc(P) == b + 4 * P


def test_va_default_range_is_the_hardware_va_space_but_page_0():
    va = VaAllocator()
    assert va.holes() == [(P, 1 << regs.VA_BITS)] and va.alloc(P) == P


def test_va_alignment_and_merge():
    va = VaAllocator(wire.VA_USER_BASE, wire.VA_USER_LIMIT)
    a = va.alloc(P)
    big = va.alloc(4 << 20, align=2 << 20)
    assert big % (2 << 20) == 0 and big > a
    va.free(big)
    va.free(a)
    assert va.holes() == [(wire.VA_USER_BASE, wire.VA_USER_LIMIT)]


def test_va_reserve():
    va = VaAllocator()
    a = va.alloc(P)
    with pytest.raises(InvalidAddress):
        va.reserve(a, P)
    with pytest.raises(InvalidAddress):
        va.reserve(a + P, P)  # a's guard page
    va.reserve(a + 2 * P, P)
    assert va.alloc(P) == a + 4 * P
    with pytest.raises(InvalidAddress):
        va.free(a + 123 * P)
    with pytest.raises(InvalidArgument):
        va.alloc(0)


def test_va_exhaustion():
    va = VaAllocator(base=1 << 32, limit=(1 << 32) + 8 * P)
    va.alloc(3 * P)
    va.alloc(3 * P)
    with pytest.raises(OutOfMemory):
        va.alloc(P)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 20), st.sampled_from([1, 2, 8])),
                max_size=60))
def test_va_allocator_properties(ops):
    base, limit = 1 << 32, (1 << 32) + 256 * P
    va = VaAllocator(base=base, limit=limit)
    live = {}
    for is_alloc, n, align in ops:
        if is_alloc or not live:
            try:
                a = va.alloc(n * P, align * P)
            except OutOfMemory:
                continue
            assert a % (align * P) == 0 and base <= a and a + n * P + P <= limit
            live[a] = n * P
        else:
            a = sorted(live)[n % len(live)]
            va.free(a)
            del live[a]
        spans = sorted(live.items())
        for (s1, n1), (s2, _) in zip(spans, spans[1:]):
            assert s1 + n1 + P <= s2, "allocations closer than the guard page"
        holes = va.holes()
        assert all(h1[1] < h2[0] for h1, h2 in zip(holes, holes[1:])), "unmerged holes"
        covered = sum(e - s for s, e in holes) + sum(n + P for n in live.values())
        assert covered == limit - base
    for a in list(live):
        va.free(a)
    assert va.holes() == [(base, limit)]


# ---------------------------------------------------------------------- GpuVm
@pytest.fixture
def hw():
    vram = Vram(8 << 20)
    mm = BuddyAllocator(vram.size)
    mm.alloc_blocks(P, start=0, end=P)  # like the device: page 0 never holds a table
    sysmem = SystemMemory()
    mmu = Mmu(vram, sysmem)
    return vram, mm, sysmem, mmu


def test_map_and_walk(hw):
    vram, mm, _, _ = hw
    vm = GpuVm(vram, mm)
    assert vm.root != 0 and vm.table_pages == 1
    va = wire.VA_USER_BASE
    vm.map(va, [(0x10000, 2 * P), (0x40000, P)], RW)
    assert vm.table_pages == 4
    pte = vm.walk(va + P)
    assert pte & regs.PTE_ADDR_MASK == 0x11000
    assert pte & (regs.PTE_VALID | RW) == regs.PTE_VALID | RW
    assert vm.walk(va + 2 * P) & regs.PTE_ADDR_MASK == 0x40000
    assert vm.walk(va + 3 * P) == 0
    assert vm.mapping_at(va + 2 * P) == (va, 3 * P, regs.PTE_VALID | RW)
    with pytest.raises(InvalidAddress):
        vm.map(va + 2 * P, [(0x50000, P)], RW)  # overlaps
    with pytest.raises(InvalidArgument):
        vm.map(va + 100 * P, [(0x50001, P)], RW)


def test_page_tables_match_the_hardware_mmu(hw):
    vram, mm, sysmem, mmu = hw
    flushes = []
    vm = GpuVm(vram, mm, invalidate=lambda: (flushes.append(3), mmu.flush(3)))
    mmu.set_root(3, vm.root)
    data = np.arange(6 * P, dtype=np.uint8) * 7
    blocks = mm.alloc_blocks(6 * P)  # contiguous here
    phys = blocks[0].offset
    vram.write(phys, data)
    va = wire.VA_USER_BASE + (5 << 21) - 2 * P  # straddles a leaf-table boundary
    vm.map(va, [(phys + 3 * P, 3 * P), (phys, 3 * P)], RW)  # swapped halves
    out = np.concatenate(mmu.translate(3, va, 6 * P, wire.ACCESS_READ))
    assert np.array_equal(out[:3 * P], data[3 * P:]) and np.array_equal(out[3 * P:], data[:3 * P])
    # system memory through PTE_SYSTEM, read-only
    host = np.arange(2 * P, dtype=np.uint8)
    bus = sysmem.dma_map(host)
    vm.map(wire.GUEST_WINDOW_VA, [(bus, 2 * P)], regs.PTE_SYSTEM | regs.PTE_READ)
    views = mmu.translate(3, wire.GUEST_WINDOW_VA + 10, 100, wire.ACCESS_READ)
    assert bytes(np.concatenate(views)) == bytes(host[10:110])
    with pytest.raises(MmuFault):
        mmu.translate(3, wire.GUEST_WINDOW_VA, 8, wire.ACCESS_WRITE)
    # unmap clears the PTEs and flushes (the TLB holds the old translation until then)
    vm.unmap(va)
    assert flushes == [3]
    with pytest.raises(MmuFault) as e:
        mmu.translate(3, va + P, 8, wire.ACCESS_READ)
    assert e.value.address == va + P


def test_fragment_field():
    # 16 pages, VA and phys aligned alike: one run of 16
    f = fragment_field(1 << 32, 1 << 20, 16 * P)
    assert f.tolist() == [4] * 16
    # misaligned start: runs grow towards aligned boundaries
    f = fragment_field((1 << 32) + P, (1 << 20) + P, 8 * P)
    assert f.tolist() == [0, 1, 1, 2, 2, 2, 2, 0]
    # VA and phys aligned differently (delta of one page): no run longer than 1 page
    assert fragment_field(1 << 32, (1 << 20) + P, 8 * P).tolist() == [0] * 8
    # delta of 2 pages: runs of 2 at most
    assert fragment_field(1 << 32, (1 << 20) + 2 * P, 8 * P).tolist() == [1] * 8


def test_fragment_bits_written(hw):
    vram, mm, _, _ = hw
    vm = GpuVm(vram, mm)
    va = wire.VA_USER_BASE
    vm.map(va, [(1 << 20, 16 * P)], RW)
    frag = (vm.walk(va + 5 * P) & regs.PTE_FRAGMENT_MASK) >> regs.PTE_FRAGMENT_SHIFT
    assert frag == 4
    vm2 = GpuVm(vram, mm, fragments=False)
    vm2.map(va, [(1 << 20, 16 * P)], RW)
    assert vm2.walk(va) & regs.PTE_FRAGMENT_MASK == 0


def test_large_system_mapping_writes_whole_leaf_tables(hw, monkeypatch):
    """65536 PTEs are written a leaf table (512 PTEs) at a time, not page by page."""
    vram, mm, sysmem, mmu = hw
    vm = GpuVm(vram, mm)
    size = 256 << 20
    host = np.zeros(size, dtype=np.uint8)
    bus = sysmem.dma_map(host)
    views = []
    real_view = vram.view
    monkeypatch.setattr(vram, "view", lambda addr, n: views.append(n) or real_view(addr, n))
    vm.map(wire.GUEST_WINDOW_VA, [(bus, size)], regs.PTE_SYSTEM | RW)
    monkeypatch.undo()
    assert len(views) <= 2 * (128 + 3)  # a PTE slice and a zeroed page per table at most
    assert sum(n for n in views) >= (size // regs.PAGE_SIZE) * regs.PTE_SIZE
    assert vm.table_pages == 1 + 1 + 1 + 128
    mmu.set_root(5, vm.root)
    host[size - 8:] = 42
    views = mmu.translate(5, wire.GUEST_WINDOW_VA + size - 8, 8, wire.ACCESS_READ)
    assert bytes(np.concatenate(views)) == b"\x2a" * 8
    vm.unmap(wire.GUEST_WINDOW_VA)
    assert vm.walk(wire.GUEST_WINDOW_VA + size - 8) & regs.PTE_VALID == 0


def test_oom_while_mapping_leaves_no_mapping():
    vram = Vram(64 * P)
    mm = BuddyAllocator(vram.size)
    vm = GpuVm(vram, mm)
    hog = mm.alloc_blocks(mm.avail - 3 * P)  # room for 3 more tables
    va = wire.VA_USER_BASE
    with pytest.raises(OutOfMemory):
        vm.map(va, [(0, 4 << 20)], RW)  # needs PD1, PD0 and two leaf tables
    assert vm.mappings() == []
    assert vm.walk(va) == 0 and vm.walk(va + (2 << 20)) == 0
    mm.free_blocks(hog)
    vm.map(va, [(0, 4 << 20)], RW)
    vm.free()
    assert mm.avail == mm.size


def test_free_releases_every_table(hw):
    vram, mm, _, _ = hw
    before = mm.avail
    vm = GpuVm(vram, mm)
    for i in range(5):
        vm.map(wire.VA_USER_BASE + i * (1 << 30), [(1 << 20, P)], RW)
    assert vm.table_pages == 1 + 1 + 5 + 5
    vm.free()
    assert mm.avail == before
    vm.free()  # idempotent
