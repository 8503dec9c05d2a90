"""Explicit VA management in the KMD (Context.reserve_va / map_bo_at / unmap_at /
release_va, spec §6.7) against the real emulated GPU and its MMU: one buffer reachable at
two VAs, read-only mappings that fault on write with access=write, and TLB invalidation
on unmap (a cached translation must not survive)."""

import numpy as np
import pytest

from pvgpu.host.hw import regs
from pvgpu.host.hw.mmu import MmuFault
from pvgpu.host.kmd import InvalidAddress, InvalidArgument
from pvgpu.spec import wire

from test_kmd_device import Window, download

P = regs.PAGE_SIZE
W = wire.GUEST_WINDOW_VA


@pytest.fixture
def dev(make_dev):
    return make_dev()


def test_reserve_is_unmapped_aligned_and_released(dev):
    ctx = dev.create_context()
    va = ctx.reserve_va(5 * P + 1, 1 << 21)
    assert va % (1 << 21) == 0 and wire.VA_USER_BASE <= va < wire.VA_USER_LIMIT
    assert ctx.va_reservations() == {va: 6 * P}
    assert all(ctx.vm.walk(va + o) == 0 for o in range(0, 6 * P, P))
    bo = ctx.alloc(P)
    assert not va <= bo.va < va + 6 * P  # allocations never land in a reservation
    for bad in ((0, 0), (P, 3 * P), (P, P // 2), (P, 2 * wire.MAX_VA_ALIGN), (-1, 0)):
        with pytest.raises(InvalidArgument):
            ctx.reserve_va(*bad)
    ctx.release_va(va)
    with pytest.raises(InvalidAddress):
        ctx.release_va(va)


def test_two_vas_see_the_same_data(dev):
    ctx = dev.create_context()
    win = Window(dev, ctx)
    bo = ctx.alloc(4 * P)
    r = ctx.reserve_va(8 * P)
    ctx.map_bo_at(bo, r + 2 * P, offset=P, size=2 * P, writable=True)
    for i in range(2):  # the same physical pages behind both VAs
        assert ctx.vm.walk(r + (2 + i) * P) & regs.PTE_ADDR_MASK == \
            ctx.vm.walk(bo.va + (1 + i) * P) & regs.PTE_ADDR_MASK
    data = np.arange(2 * P // 4, dtype=np.float32)
    assert ctx.submit_copy(win.put(0, data), bo.va + P, data.nbytes).wait(5)
    f = ctx.submit_copy(r + 2 * P, W + (1 << 20), data.nbytes)
    assert f.wait(5) and f.error is None and np.array_equal(win.get(1 << 20, data.size), data)
    # a kernel writing through the second VA is seen at the first
    f = ctx.submit_launch(wire.KERNEL_FILL, (4,), (256,), [r + 2 * P, 0x40400000, 1024])
    assert f.wait(5) and f.error is None
    assert np.all(download(ctx, win, bo, 4 * P // 4)[P // 4:P // 4 + 1024] == 3.0)
    assert ctx.mapped_elsewhere(bo) == [r + 2 * P]
    # overlaps, outside the reservation, misaligned, beyond the buffer
    with pytest.raises(InvalidAddress):
        ctx.map_bo_at(bo, r + 3 * P, 0, P)
    with pytest.raises(InvalidAddress):
        ctx.map_bo_at(bo, r + 7 * P, 0, 2 * P)
    with pytest.raises(InvalidAddress):
        ctx.map_bo_at(bo, bo.va + 8 * P, 0, P)
    with pytest.raises(InvalidArgument):
        ctx.map_bo_at(bo, r + 100, 0, P)
    with pytest.raises(InvalidArgument):
        ctx.map_bo_at(bo, r, 3 * P, 2 * P)
    with pytest.raises(InvalidArgument):  # a reservation with mappings is not released
        ctx.release_va(r)
    ctx.unmap_at(r + 2 * P)
    with pytest.raises(InvalidAddress):
        ctx.unmap_at(r + 2 * P)
    ctx.release_va(r)


def test_read_only_mapping_write_faults_with_access_write(dev):
    ctx, other = dev.create_context("ro"), dev.create_context("other")
    win = Window(dev, ctx)
    bo = ctx.alloc(P)
    r = ctx.reserve_va(P)
    ctx.map_bo_at(bo, r, 0, P, writable=False)
    pte = ctx.vm.walk(r)
    assert pte & regs.PTE_READ and not pte & regs.PTE_WRITE
    with pytest.raises(MmuFault) as e:  # the MMU itself refuses the write
        dev.gpu.mmu.translate(ctx.vmid, r + 8, 8, wire.ACCESS_WRITE)
    assert (e.value.vmid, e.value.address, e.value.access) == (ctx.vmid, r + 8, wire.ACCESS_WRITE)
    assert dev.gpu.mmu.translate(ctx.vmid, r, 8, wire.ACCESS_READ)
    f = ctx.submit_launch(wire.KERNEL_FILL, (1,), (256,), [r, 0x3F800000, 16])
    assert f.wait(5) and f.error is not None
    assert (f.error.address, f.error.access, f.error.vmid) == (r, wire.ACCESS_WRITE, ctx.vmid)
    f = ctx.submit_copy(win.put(0, np.ones(4, np.float32)), r, 16)
    assert f.wait(5) and f.error.access == wire.ACCESS_WRITE and f.error.address == r
    assert ctx.stats["faults"] == 2 and len(ctx.faults) == 2
    f = ctx.submit_copy(r, W, 16)  # reads work, nothing was written
    assert f.wait(5) and f.error is None and np.all(win.get(0, 4) == 0)
    # the other context carries on
    ob = other.alloc(P)
    f = other.submit_launch(wire.KERNEL_FILL, (1,), (256,), [ob.va, 0x3F800000, 16])
    assert f.wait(5) and f.error is None and not other.faults


def test_unmap_invalidates_the_tlb(dev):
    ctx = dev.create_context()
    mmu = dev.gpu.mmu
    bo = ctx.alloc(P)
    r = ctx.reserve_va(P)
    ctx.map_bo_at(bo, r, 0, P)
    assert mmu.translate(ctx.vmid, r, 8, wire.ACCESS_READ)  # cached in the TLB now
    hits = mmu.tlb_hits
    assert mmu.translate(ctx.vmid, r, 8, wire.ACCESS_READ) and mmu.tlb_hits == hits + 1
    flushes = mmu.flushes
    ctx.unmap_at(r)  # idle context: unmapped at once
    assert mmu.flushes > flushes and ctx.vm.walk(r) == 0
    with pytest.raises(MmuFault) as e:
        mmu.translate(ctx.vmid, r, 8, wire.ACCESS_READ)
    assert e.value.address == r and e.value.access == wire.ACCESS_READ
    # the original mapping is untouched
    assert mmu.translate(ctx.vmid, bo.va, 8, wire.ACCESS_WRITE)


def test_unmap_is_deferred_behind_pending_work_and_remap_waits(dev, gate):
    ctx = dev.create_context()
    bo = ctx.alloc(P)
    r = ctx.reserve_va(P)
    ctx.map_bo_at(bo, r, 0, P)
    pending = gate()
    burn = ctx.submit_launch(wire.KERNEL_BURN, (1,), (1,), [100_000], wait=[pending])
    ctx.unmap_at(r)
    assert ctx.vm.walk(r) & regs.PTE_VALID  # still mapped for the work taken before
    pending.signal()  # the burn runs now
    ctx.map_bo_at(bo, r, 0, P, writable=False)  # waits for the burn, then maps anew
    assert burn.signaled and not ctx.vm.walk(r) & regs.PTE_WRITE
    ctx.unmap_at(r)
    ctx.release_va(r)
    assert ctx.vm.walk(r) == 0


def test_mapping_an_evicted_buffer_brings_it_back_and_aliased_ones_stay(dev):
    ctx = dev.create_context()
    win = Window(dev, ctx)
    bo = ctx.alloc(2 * P)
    data = np.arange(2 * P // 4, dtype=np.float32)
    assert ctx.submit_copy(win.put(0, data), bo.va, data.nbytes).wait(5)
    with dev.lock:
        dev._evict_bo(bo)
    assert bo.sysmem is not None
    r = ctx.reserve_va(2 * P)
    ctx.map_bo_at(bo, r, 0, 2 * P, writable=False)  # restored into VRAM, then mapped
    assert bo.sysmem is None and ctx.vm.walk(r) & regs.PTE_ADDR_MASK == bo.phys
    f = ctx.submit_copy(r, W + (1 << 20), data.nbytes)
    assert f.wait(5) and f.error is None and np.array_equal(win.get(1 << 20, data.size), data)
    assert bo not in list(dev._evictable(ctx))  # an aliased BO is never evicted
