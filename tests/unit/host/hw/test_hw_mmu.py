"""host/hw/mmu.py: page-table walks, extents, faults, TLB (page tables built by hand)."""

import numpy as np
import pytest
from anymachine import python_calls
from hypothesis import given, settings, strategies as st
from hwtest import RO, RW, PageTables

from pvgpu.host.hw import mmu as mmu_module
from pvgpu.host.hw.mmu import BATCH_LEAVES, Mmu, MmuFault
from pvgpu.host.hw.pcie import PcieFabric
from pvgpu.host.hw.regs import (NUM_VMIDS, PAGE_SIZE, PTE_EXEC, PTE_FRAGMENT_SHIFT, PTE_PEER,
                          PTE_READ, PTE_SYSTEM, PTE_VALID, PTE_WRITE)
from pvgpu.host.hw.sysmem import SystemMemory
from pvgpu.host.hw.vram import Vram
from pvgpu.spec.kernels import ACCESS_EXEC, ACCESS_READ, ACCESS_WRITE

VRAM_SIZE = 96 << 20
TABLES = 1 << 20
DATA = 8 << 20
VA = 1 << 32


@pytest.fixture
def env():
    vram = Vram(VRAM_SIZE)
    sysmem = SystemMemory()
    mmu = Mmu(vram, sysmem)
    pt = PageTables(vram, TABLES)
    mmu.set_root(1, pt.root)
    # a recognisable pattern in the data area: every u32 holds its own address
    end = DATA + (2 << 20)
    vram.mem[DATA:end].view("<u4")[:] = np.arange(DATA, end, 4, dtype=np.uint32)
    return vram, sysmem, mmu, pt


def joined(extents):
    return np.concatenate(extents) if extents else np.empty(0, np.uint8)


def test_single_page_is_a_view_of_vram(env):
    vram, _, mmu, pt = env
    pt.map(VA, DATA + 5 * PAGE_SIZE)
    ext = mmu.translate(1, VA + 100, 200, ACCESS_READ)
    assert len(ext) == 1 and ext[0].shape == (200,)
    assert np.array_equal(ext[0], vram.view(DATA + 5 * PAGE_SIZE + 100, 200))
    ext = mmu.translate(1, VA + 100, 200, ACCESS_WRITE)
    ext[0][:] = 0xAB
    assert vram.read(DATA + 5 * PAGE_SIZE + 100, 200) == b"\xab" * 200


def test_contiguous_pages_across_leaf_and_directory_boundaries_merge_into_one_extent(env):
    vram, _, mmu, pt = env
    va = (1 << 30) * 3 - 3 * PAGE_SIZE  # crosses a 2 MiB leaf and a 1 GiB PD0 boundary
    pt.map(va, DATA, 6)
    ext = mmu.translate(1, va + 10, 6 * PAGE_SIZE - 20, ACCESS_READ | ACCESS_WRITE)
    assert len(ext) == 1
    assert np.array_equal(ext[0], vram.view(DATA + 10, 6 * PAGE_SIZE - 20))


def test_discontiguous_pages_give_several_extents_in_va_order(env):
    vram, _, mmu, pt = env
    phys = [DATA + 10 * PAGE_SIZE, DATA + 11 * PAGE_SIZE, DATA + 3 * PAGE_SIZE,
            DATA + 20 * PAGE_SIZE, DATA + 21 * PAGE_SIZE]
    pt.map_pages(VA, phys)
    ext = mmu.translate(1, VA + 8, 5 * PAGE_SIZE - 16, ACCESS_READ)
    assert [e.shape[0] for e in ext] == [2 * PAGE_SIZE - 8, PAGE_SIZE, 2 * PAGE_SIZE - 8]
    expect = np.concatenate([vram.view(p, PAGE_SIZE) for p in phys])[8:-8]
    assert np.array_equal(joined(ext), expect)


def test_system_pages_resolve_into_the_dma_mapped_buffer(env):
    vram, sysmem, mmu, pt = env
    buf = np.arange(10000, dtype=np.uint32).astype(np.uint8)
    bus = sysmem.dma_map(buf)
    assert bus % PAGE_SIZE == 0 and bus >= 1 << 44
    pt.map(VA, bus, 3, RW | PTE_SYSTEM)
    ext = mmu.translate(1, VA, 10000, ACCESS_WRITE)
    assert len(ext) == 1 and np.shares_memory(ext[0], buf)
    ext[0][:] = 7
    assert (buf == 7).all()
    # a system page followed by a VRAM page: two extents
    buf2 = np.full(2 * PAGE_SIZE, 9, np.uint8)
    va2 = VA + (1 << 20)
    pt.map(va2, sysmem.dma_map(buf2), 2, RW | PTE_SYSTEM)
    pt.map(va2 + 2 * PAGE_SIZE, DATA, 1)
    ext = mmu.translate(1, va2 + PAGE_SIZE, PAGE_SIZE + 16, ACCESS_READ)
    assert [e.shape[0] for e in ext] == [PAGE_SIZE, 16]
    assert np.shares_memory(ext[0], buf2) and np.shares_memory(ext[1], vram.mem)


def test_system_access_beyond_the_buffer_or_after_unmap_faults(env):
    vram, sysmem, mmu, pt = env
    buf = np.zeros(10000, np.uint8)
    bus = sysmem.dma_map(buf)
    pt.map(VA, bus, 3, RW | PTE_SYSTEM)
    with pytest.raises(MmuFault) as e:
        mmu.translate(1, VA + 8, 3 * PAGE_SIZE - 8, ACCESS_READ)
    assert (e.value.vmid, e.value.address, e.value.access) == (1, VA + 2 * PAGE_SIZE, ACCESS_READ)
    sysmem.dma_unmap(bus)
    with pytest.raises(MmuFault) as e:
        mmu.translate(1, VA + 8, 100, ACCESS_READ)
    assert e.value.address == VA + 8


def test_read_only_system_buffer_faults_on_write(env):
    _, sysmem, mmu, pt = env
    buf = np.frombuffer(bytes(PAGE_SIZE), np.uint8)  # read-only
    pt.map(VA, sysmem.dma_map(buf), 1, RW | PTE_SYSTEM)
    assert mmu.translate(1, VA, PAGE_SIZE, ACCESS_READ)[0].shape == (PAGE_SIZE,)
    with pytest.raises(MmuFault):
        mmu.translate(1, VA, PAGE_SIZE, ACCESS_WRITE)


@pytest.mark.parametrize("flags, access, missing", [
    (RO, ACCESS_WRITE, ACCESS_WRITE),
    (RO, ACCESS_READ | ACCESS_WRITE, ACCESS_WRITE),
    (PTE_VALID | PTE_WRITE, ACCESS_READ, ACCESS_READ),
    (RW, ACCESS_EXEC, ACCESS_EXEC),
])
def test_missing_permission_faults_with_the_missing_access(env, flags, access, missing):
    _, _, mmu, pt = env
    pt.map(VA, DATA, 2, RW | PTE_EXEC)
    pt.map(VA + 2 * PAGE_SIZE, DATA + 2 * PAGE_SIZE, 1, flags)
    with pytest.raises(MmuFault) as e:
        mmu.translate(1, VA + 4, 3 * PAGE_SIZE - 8, access)
    assert (e.value.vmid, e.value.address, e.value.access) == (1, VA + 2 * PAGE_SIZE, missing)
    with pytest.raises(MmuFault) as e:  # the one-page path
        mmu.translate(1, VA + 2 * PAGE_SIZE + 4, 8, access)
    assert (e.value.address, e.value.access) == (VA + 2 * PAGE_SIZE + 4, missing)


def test_exec_permission(env):
    _, _, mmu, pt = env
    pt.map(VA, DATA, 2, PTE_VALID | PTE_READ | PTE_EXEC)
    assert len(mmu.translate(1, VA, 2 * PAGE_SIZE, ACCESS_EXEC | ACCESS_READ)) == 1


def test_unmapped_pages_fault_at_the_first_bad_page(env):
    _, _, mmu, pt = env
    pt.map(VA, DATA, 3)
    with pytest.raises(MmuFault) as e:
        mmu.translate(1, VA + 100, 5 * PAGE_SIZE, ACCESS_READ)
    assert (e.value.vmid, e.value.address, e.value.access) == (1, VA + 3 * PAGE_SIZE, ACCESS_READ)
    with pytest.raises(MmuFault) as e:  # starts in an unmapped page: the VA itself
        mmu.translate(1, VA - PAGE_SIZE + 100, 2 * PAGE_SIZE, ACCESS_WRITE)
    assert (e.value.address, e.value.access) == (VA - PAGE_SIZE + 100, ACCESS_WRITE)
    # a missing leaf table in the middle of a range
    va = VA + (2 << 20) - 2 * PAGE_SIZE
    pt.map(va, DATA, 2)
    with pytest.raises(MmuFault) as e:
        mmu.translate(1, va, 4 * PAGE_SIZE, ACCESS_READ)
    assert e.value.address == VA + (2 << 20)


def test_bad_pte_kinds_fault(env):
    vram, _, mmu, pt = env
    bad = [(DATA, RW | PTE_PEER),  # an Mmu without a PCIe fabric: PEER faults
           (VRAM_SIZE, RW),  # outside VRAM
           (DATA, RW | PTE_SYSTEM | PTE_PEER)]  # two kinds at once
    for i, (addr, flags) in enumerate(bad):
        va = VA + i * (2 << 20)
        pt.map(va - PAGE_SIZE, DATA, 1)
        pt.map(va, addr, 1, flags)
        with pytest.raises(MmuFault) as e:
            mmu.translate(1, va, 16, ACCESS_READ)
        assert e.value.address == va
        with pytest.raises(MmuFault) as e:  # the multi-page path
            mmu.translate(1, va - PAGE_SIZE, 2 * PAGE_SIZE, ACCESS_READ)
        assert e.value.address == va
    with pytest.raises(MmuFault) as e:
        mmu.translate(1, VA, 8, ACCESS_READ | ACCESS_WRITE)
    assert "peer access not supported" in e.value.reason


PEER_VRAM = 16 << 20


@pytest.fixture
def peer_env(request):
    """GPU0's MMU in a two-GPU fabric (layout: the test's parameter, default "switch")."""
    layout = getattr(request, "param", "switch")
    vram, peer = Vram(VRAM_SIZE), Vram(PEER_VRAM)
    fabric = PcieFabric(layout, [vram, peer])
    mmu = Mmu(vram, SystemMemory(), "gpu0", fabric, 0)
    pt = PageTables(vram, TABLES)
    mmu.set_root(1, pt.root)
    peer.mem.view("<u4")[:] = np.arange(0, PEER_VRAM, 4, dtype=np.uint32) | 0x80000000
    return mmu, pt, peer, fabric.endpoints[1].bar0


def test_peer_pages_are_views_of_the_peers_vram(peer_env):
    mmu, pt, peer, bar = peer_env
    pt.map(VA, bar + 5 * PAGE_SIZE, 3, RW | PTE_PEER)
    ext = mmu.translate(1, VA + 8, 3 * PAGE_SIZE - 16, ACCESS_READ | ACCESS_WRITE)
    assert len(ext) == 1 and np.shares_memory(ext[0], peer.mem)
    assert np.array_equal(ext[0], peer.view(5 * PAGE_SIZE + 8, 3 * PAGE_SIZE - 16))
    ext[0][:4] = 0xEE
    assert peer.read(5 * PAGE_SIZE + 8, 4) == b"\xee" * 4
    ext = mmu.translate(1, VA + PAGE_SIZE + 4, 8, ACCESS_WRITE)  # the one-page path
    assert np.shares_memory(ext[0], peer.mem)
    assert np.array_equal(ext[0], peer.view(6 * PAGE_SIZE + 4, 8))
    stats = mmu.fabric.stats()["gpu0->gpu1"]
    assert stats["write_bytes"] == 3 * PAGE_SIZE - 16 + 8 and stats["read_bytes"] == 0


def test_vram_system_and_peer_runs_in_one_range(peer_env):
    mmu, pt, peer, bar = peer_env
    host = np.full(2 * PAGE_SIZE, 7, np.uint8)
    bus = mmu.sysmem.dma_map(host)
    va = VA + (2 << 20) - 3 * PAGE_SIZE  # crosses a leaf table boundary
    pt.map(va, DATA, 2)
    pt.map(va + 2 * PAGE_SIZE, bus, 2, RW | PTE_SYSTEM)
    pt.map(va + 4 * PAGE_SIZE, bar + 2 * PAGE_SIZE, 2, RW | PTE_PEER)
    # pages continuing the addresses of earlier runs, but not theirs: separate extents
    pt.map(va + 6 * PAGE_SIZE, DATA + 2 * PAGE_SIZE, 1)
    pt.map(va + 7 * PAGE_SIZE, bar + 4 * PAGE_SIZE, 1, RW | PTE_PEER)
    ext = mmu.translate(1, va + 4, 8 * PAGE_SIZE - 8, ACCESS_READ)
    assert [e.shape[0] for e in ext] == [2 * PAGE_SIZE - 4, 2 * PAGE_SIZE, 2 * PAGE_SIZE,
                                         PAGE_SIZE, PAGE_SIZE - 4]
    owners = [mmu.vram.mem, host, peer.mem, mmu.vram.mem, peer.mem]
    assert all(np.shares_memory(e, o) for e, o in zip(ext, owners))
    expect = np.concatenate([mmu.vram.view(DATA + 4, 2 * PAGE_SIZE - 4), host,
                             peer.view(2 * PAGE_SIZE, 2 * PAGE_SIZE),
                             mmu.vram.view(DATA + 2 * PAGE_SIZE, PAGE_SIZE),
                             peer.view(4 * PAGE_SIZE, PAGE_SIZE - 4)])
    assert np.array_equal(joined(ext), expect)


def test_peer_page_permissions(peer_env):
    mmu, pt, _, bar = peer_env
    pt.map(VA, bar, 1, RW | PTE_PEER)
    pt.map(VA + PAGE_SIZE, bar + PAGE_SIZE, 1, RO | PTE_PEER)
    assert mmu.translate(1, VA + PAGE_SIZE, 8, ACCESS_READ)[0].shape == (8,)
    for va, size in ((VA + PAGE_SIZE + 4, 8), (VA, 2 * PAGE_SIZE)):
        with pytest.raises(MmuFault) as e:
            mmu.translate(1, va, size, ACCESS_WRITE)
        assert (e.value.address, e.value.access) == (va if size == 8 else VA + PAGE_SIZE,
                                                     ACCESS_WRITE)
        assert e.value.reason == "permission"


def test_peer_pages_outside_a_bars_vram_fault_at_their_va(peer_env):
    mmu, pt, _, bar = peer_env
    pt.map(VA, bar + PEER_VRAM - 2 * PAGE_SIZE, 3, RW | PTE_PEER)  # the last one is past VRAM
    pt.map(VA + (1 << 20), DATA, 1)
    pt.map(VA + (1 << 20) + PAGE_SIZE, bar - (1 << 30), 1, RW | PTE_PEER)  # no BAR there
    for va, size, bad in ((VA + 8, 3 * PAGE_SIZE - 8, VA + 2 * PAGE_SIZE),
                          (VA + 2 * PAGE_SIZE + 8, 8, VA + 2 * PAGE_SIZE + 8),
                          (VA + (1 << 20), 2 * PAGE_SIZE, VA + (1 << 20) + PAGE_SIZE)):
        with pytest.raises(MmuFault) as e:
            mmu.translate(1, va, size, ACCESS_READ)
        assert e.value.address == bad and e.value.reason.startswith("peer not reachable")


@pytest.mark.parametrize("peer_env", ["sockets"], indirect=True)
def test_peer_pages_on_an_unsupported_route_fault(peer_env):
    mmu, pt, _, bar = peer_env
    pt.map(VA, DATA, 1)
    pt.map(VA + PAGE_SIZE, bar, 1, RW | PTE_PEER)
    for va, size in ((VA + 16, 2 * PAGE_SIZE), (VA + PAGE_SIZE + 16, 8)):
        with pytest.raises(MmuFault) as e:
            mmu.translate(1, va, size, ACCESS_READ)
        assert e.value.address == max(va, VA + PAGE_SIZE) and e.value.access == ACCESS_READ
        assert "peer" in e.value.reason and "not supported" in e.value.reason
    assert mmu.fabric.stats()["gpu0->gpu1"] == {"read_bytes": 0, "write_bytes": 0}


def test_vmid_zero_is_physical_and_bounded(env):
    vram, _, mmu, _ = env
    ext = mmu.translate(0, DATA, 3 * PAGE_SIZE + 5, ACCESS_WRITE)
    assert len(ext) == 1 and np.shares_memory(ext[0], vram.mem)
    with pytest.raises(MmuFault) as e:
        mmu.translate(0, VRAM_SIZE - 8, 16, ACCESS_READ)
    assert (e.value.vmid, e.value.address) == (0, VRAM_SIZE)


def test_bad_vmids_and_addresses_fault(env):
    _, _, mmu, pt = env
    for vmid in (2, NUM_VMIDS, -1):  # 2 has no root
        with pytest.raises(MmuFault):
            mmu.translate(vmid, VA, 8, ACCESS_READ)
    with pytest.raises(MmuFault):
        mmu.translate(1, 1 << 48, 8, ACCESS_READ)
    top = (1 << 48) - PAGE_SIZE
    pt.map(top, DATA, 1)
    with pytest.raises(MmuFault) as e:
        mmu.translate(1, top, 2 * PAGE_SIZE, ACCESS_READ)
    assert e.value.address == 1 << 48
    assert mmu.translate(1, VA, 0, ACCESS_READ) == []


def test_tlb_counts_hits_and_misses(env):
    _, _, mmu, pt = env
    pt.map(VA, DATA, 600)  # two leaf tables
    mmu.translate(1, VA, 600 * PAGE_SIZE, ACCESS_READ)
    assert (mmu.tlb_hits, mmu.tlb_misses) == (0, 2)
    mmu.translate(1, VA, 600 * PAGE_SIZE, ACCESS_READ)
    mmu.translate(1, VA + 8, 8, ACCESS_READ)
    assert (mmu.tlb_hits, mmu.tlb_misses) == (3, 2)
    mmu.flush(1)
    mmu.translate(1, VA, 8, ACCESS_READ)
    assert (mmu.tlb_hits, mmu.tlb_misses) == (3, 3)


def test_pte_change_is_invisible_until_flush(env):
    vram, _, mmu, pt = env
    pt.map(VA, DATA, 2)
    old = mmu.translate(1, VA, 2 * PAGE_SIZE, ACCESS_READ)[0].copy()
    pt.map(VA, DATA + 100 * PAGE_SIZE, 2)  # remap
    pt.set_pte(VA + 2 * PAGE_SIZE, 0)
    assert np.array_equal(mmu.translate(1, VA, 2 * PAGE_SIZE, ACCESS_READ)[0], old)
    mmu.flush(2)  # another VMID: no effect
    assert np.array_equal(mmu.translate(1, VA, 2 * PAGE_SIZE, ACCESS_READ)[0], old)
    mmu.flush(1)
    new = mmu.translate(1, VA, 2 * PAGE_SIZE, ACCESS_READ)[0]
    assert np.array_equal(new, vram.view(DATA + 100 * PAGE_SIZE, 2 * PAGE_SIZE))
    # unmapping a valid page is also invisible until flush_all
    pt.set_pte(VA, 0)
    assert mmu.translate(1, VA, 8, ACCESS_READ)[0].shape == (8,)
    mmu.flush_all()
    with pytest.raises(MmuFault):
        mmu.translate(1, VA, 8, ACCESS_READ)


def test_new_mapping_is_visible_without_flush(env):
    _, _, mmu, pt = env
    pt.map(VA, DATA, 1)
    mmu.translate(1, VA, 8, ACCESS_READ)  # caches the leaf table
    pt.map(VA + PAGE_SIZE, DATA + PAGE_SIZE, 1)  # invalid -> valid: TLBs keep no invalid entries
    assert len(mmu.translate(1, VA, 2 * PAGE_SIZE, ACCESS_READ)) == 1
    pt.map(VA + 2 * PAGE_SIZE, DATA + 9 * PAGE_SIZE, 1, RO)  # and a permission upgrade
    mmu.translate(1, VA + 2 * PAGE_SIZE, 8, ACCESS_READ)
    pt.map(VA + 2 * PAGE_SIZE, DATA + 9 * PAGE_SIZE, 1, RW)
    assert len(mmu.translate(1, VA + 2 * PAGE_SIZE, 8, ACCESS_WRITE)) == 1


def test_tlb_capacity_is_bounded(env):
    vram, _, mmu, pt = env
    mmu.TLB_CAPACITY = 4
    pt.map(VA, DATA, 10 * 512)  # ten leaf tables
    for _ in range(2):
        ext = mmu.translate(1, VA, 10 * 512 * PAGE_SIZE, ACCESS_READ)
        assert len(ext) == 1 and ext[0].shape[0] == 10 << 21
        assert mmu.stats()["tlb_entries"] == 4
    assert mmu.tlb_misses == 20


def test_set_root_flushes(env):
    vram, _, mmu, pt = env
    pt.map(VA, DATA, 1)
    mmu.translate(1, VA, 8, ACCESS_READ)
    pt2 = PageTables(vram, TABLES + (1 << 20))
    pt2.map(VA, DATA + PAGE_SIZE, 1)
    mmu.set_root(1, pt2.root)
    assert np.array_equal(mmu.translate(1, VA, 8, ACCESS_READ)[0], vram.view(DATA + PAGE_SIZE, 8))


def test_64mib_translation_is_vectorized(env):
    vram, _, mmu, pt = env
    pt.map(VA, DATA, 16384)
    mmu.translate(1, VA, 64 << 20, ACCESS_READ)
    calls = python_calls(lambda: mmu.translate(1, VA, 64 << 20, ACCESS_READ))
    assert calls < 16384 // 16, f"{calls} calls for 16384 pages: per-page Python work"
    # fragmented: 4096 single-page extents, still no per-page Python beyond the views
    pt.map_pages(VA + (1 << 30), [DATA + 2 * i * PAGE_SIZE for i in range(4096)])
    ext = mmu.translate(1, VA + (1 << 30), 4096 * PAGE_SIZE, ACCESS_READ)
    assert len(ext) == 4096


def test_a_contiguous_good_range_needs_no_per_page_masks(env, monkeypatch):
    """A range mapped to one physically contiguous run is recognised from its first and
    last PTE and one comparison, without the per-page run search (np.diff)."""
    vram, _, mmu, pt = env
    pt.map(VA - 3 * PAGE_SIZE, DATA, 4 * 512)  # four leaf tables, not leaf-aligned
    mmu.translate(1, VA, 8, ACCESS_READ)
    diffs = []
    real_diff = np.diff
    monkeypatch.setattr(np, "diff", lambda *a, **k: diffs.append(1) or real_diff(*a, **k))
    ext = mmu.translate(1, VA - 3 * PAGE_SIZE + 5, 4 * 512 * PAGE_SIZE - 9, ACCESS_READ)
    assert len(ext) == 1 and not diffs
    assert np.array_equal(ext[0], vram.view(DATA + 5, 4 * 512 * PAGE_SIZE - 9))
    pt.set_pte(VA + 7 * PAGE_SIZE, (DATA + 900 * PAGE_SIZE) | RW)  # one page elsewhere
    mmu.flush(1)
    ext = mmu.translate(1, VA, 16 * PAGE_SIZE, ACCESS_READ)
    assert [e.shape[0] for e in ext] == [7 * PAGE_SIZE, PAGE_SIZE, 8 * PAGE_SIZE] and diffs


@pytest.mark.parametrize("case", ["flag", "beyond_vram"])
def test_an_arithmetic_run_is_one_run_only_when_every_page_is_good(env, case):
    """PTEs that step by one page from a good first PTE but are not one good run: a flag
    that differs in the middle (it breaks the step), a run leaving VRAM."""
    vram, _, mmu, pt = env
    if case == "flag":
        pt.map(VA, DATA, 8)
        pt.set_pte(VA + 5 * PAGE_SIZE, (DATA + 5 * PAGE_SIZE) | PTE_VALID | PTE_WRITE)
        with pytest.raises(MmuFault) as e:
            mmu.translate(1, VA, 8 * PAGE_SIZE, ACCESS_READ)
        assert (e.value.address, e.value.access) == (VA + 5 * PAGE_SIZE, ACCESS_READ)
    else:
        pt.map(VA, VRAM_SIZE - 2 * PAGE_SIZE, 2)
        pt.set_pte(VA + 2 * PAGE_SIZE, VRAM_SIZE | RW)  # the next page: outside VRAM
        with pytest.raises(MmuFault) as e:
            mmu.translate(1, VA, 3 * PAGE_SIZE, ACCESS_READ)
        assert e.value.address == VA + 2 * PAGE_SIZE


def test_ranges_beyond_one_batch_of_leaf_tables():
    vram = Vram(1 << 20)
    sysmem = SystemMemory()
    mmu = Mmu(vram, sysmem)
    pt = PageTables(vram, PAGE_SIZE)
    mmu.set_root(1, pt.root)
    npages = (BATCH_LEAVES + 3) * 512  # > one batch
    buf = np.zeros(npages * PAGE_SIZE, np.uint8)  # lazily zeroed by the OS
    pt.map(VA, sysmem.dma_map(buf), npages, RW | PTE_SYSTEM)
    ext = mmu.translate(1, VA + 8, npages * PAGE_SIZE - 8, ACCESS_WRITE)
    assert len(ext) == 1 and ext[0].shape[0] == buf.shape[0] - 8
    with pytest.raises(MmuFault) as e:
        mmu.translate(1, VA, (npages + 1) * PAGE_SIZE, ACCESS_READ)
    assert e.value.address == VA + npages * PAGE_SIZE


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_translate_matches_a_per_page_model(data):
    vram, peer = Vram(8 << 20), Vram(1 << 20)
    sysmem = SystemMemory()
    fabric = PcieFabric("switch", [vram, peer])
    mmu = Mmu(vram, sysmem, "gpu0", fabric, 0)
    vram.mem[4 << 20:(4 << 20) + 64 * PAGE_SIZE] = np.random.default_rng(1).integers(
        0, 256, 64 * PAGE_SIZE, dtype=np.uint8)
    peer.mem[:64 * PAGE_SIZE] = np.random.default_rng(3).integers(0, 256, 64 * PAGE_SIZE,
                                                                  dtype=np.uint8)
    pt = PageTables(vram, 1 << 20)
    mmu.set_root(3, pt.root)
    host = np.random.default_rng(2).integers(0, 256, 64 * PAGE_SIZE, dtype=np.uint8)
    bus = sysmem.dma_map(host)
    npages = data.draw(st.integers(1, 40))
    base_va = (1 << 32) + data.draw(st.sampled_from([0, (2 << 20) - 7 * PAGE_SIZE,
                                                     (4 << 20) - 30 * PAGE_SIZE]))
    model = []  # bytes of each page, or None
    for i in range(npages):
        kind = data.draw(st.sampled_from(["vram", "vram", "sys", "peer", "none"]))
        if kind == "none":
            model.append(None)
            continue
        j = data.draw(st.integers(0, 63))
        if kind == "vram":
            phys = (4 << 20) + j * PAGE_SIZE
            pt.map(base_va + i * PAGE_SIZE, phys, 1)
            model.append(vram.mem[phys:phys + PAGE_SIZE])
        elif kind == "sys":
            pt.map(base_va + i * PAGE_SIZE, bus + j * PAGE_SIZE, 1, RW | PTE_SYSTEM)
            model.append(host[j * PAGE_SIZE:(j + 1) * PAGE_SIZE])
        else:
            bar = fabric.endpoints[1].bar0
            pt.map(base_va + i * PAGE_SIZE, bar + j * PAGE_SIZE, 1, RW | PTE_PEER)
            model.append(peer.mem[j * PAGE_SIZE:(j + 1) * PAGE_SIZE])
    start = data.draw(st.integers(0, npages * PAGE_SIZE - 1))
    size = data.draw(st.integers(1, npages * PAGE_SIZE - start))
    first, last = start // PAGE_SIZE, (start + size - 1) // PAGE_SIZE
    bad = [p for p in range(first, last + 1) if model[p] is None]
    saved = mmu_module.BATCH_LEAVES
    mmu_module.BATCH_LEAVES = data.draw(st.sampled_from([1, saved]))  # batches join runs too
    try:
        for _ in range(2):  # the second time from the coalesced TLB entries, where they apply
            if bad:
                with pytest.raises(MmuFault) as e:
                    mmu.translate(3, base_va + start, size, ACCESS_READ)
                assert e.value.address == max(base_va + start, base_va + bad[0] * PAGE_SIZE)
                continue
            ext = mmu.translate(3, base_va + start, size, ACCESS_READ)
            expect = np.concatenate(model[first:last + 1])[start - first * PAGE_SIZE:][:size]
            assert np.array_equal(joined(ext), expect)
            # extents are maximal: neighbours are never physically contiguous
            for a, b in zip(ext, ext[1:]):
                assert (a.__array_interface__["data"][0] + a.shape[0]
                        != b.__array_interface__["data"][0])
    finally:
        mmu_module.BATCH_LEAVES = saved


def _no_page_walk(monkeypatch, mmu):
    """Make the vectorized page-by-page path count its uses -> the list of them."""
    walks = []
    real = mmu._batch
    monkeypatch.setattr(mmu, "_batch", lambda *a: walks.append(1) or real(*a))
    return walks


def test_a_fragmented_range_is_translated_from_coalesced_tlb_entries(env, monkeypatch):
    """Three leaf tables mapped in runs of 64 pages scattered over VRAM and a DMA-mapped host
    buffer (5 to 9 runs per leaf, with the fragment field set as the KMD sets it): once the
    leaves are cached, the range is translated from their runs, without the page-by-page
    walk, and the extents hold the same bytes as the pages they map."""
    vram, sysmem, mmu, pt = env
    FRAG = 6 << PTE_FRAGMENT_SHIFT  # a fragment field in every PTE (a hint the MMU ignores)
    host = np.random.default_rng(4).integers(0, 256, 8 * 64 * PAGE_SIZE, dtype=np.uint8)
    bus = sysmem.dma_map(host)
    vram.mem[DATA:DATA + 32 * 64 * PAGE_SIZE] = np.random.default_rng(5).integers(
        0, 256, 32 * 64 * PAGE_SIZE, dtype=np.uint8)
    order = np.random.default_rng(6).permutation(32)
    va = VA - 100 * PAGE_SIZE  # from inside one leaf table to inside the third
    expect = []
    for i in range(21):
        run_va = va + i * 64 * PAGE_SIZE
        if i % 5 == 2:  # host memory
            j = i // 5
            pt.map(run_va, bus + j * 64 * PAGE_SIZE, 64, RW | PTE_SYSTEM | FRAG)
            expect.append(host[j * 64 * PAGE_SIZE:(j + 1) * 64 * PAGE_SIZE])
        else:
            phys = DATA + int(order[i]) * 64 * PAGE_SIZE
            pt.map(run_va, phys, 64, RW | FRAG)
            expect.append(vram.mem[phys:phys + 64 * PAGE_SIZE])
    expect = np.concatenate(expect)
    start, size = 3 * PAGE_SIZE + 17, 21 * 64 * PAGE_SIZE - 3 * PAGE_SIZE - 40
    first = mmu.translate(1, va + start, size, ACCESS_READ)
    walks = _no_page_walk(monkeypatch, mmu)
    again = mmu.translate(1, va + start, size, ACCESS_READ)
    assert not walks
    assert np.array_equal(joined(again), expect[start:start + size])
    assert [e.shape for e in again] == [e.shape for e in first]
    # the extents are the memory itself: a write through them lands in the mapped pages
    for e in mmu.translate(1, va + start, size, ACCESS_WRITE):
        e[:] = 0x5A
    assert not walks
    assert (vram.mem[DATA:DATA + 32 * 64 * PAGE_SIZE] == 0x5A).sum() > 0
    assert np.all(joined(mmu.translate(1, va + start, size, ACCESS_READ)) == 0x5A)


def test_a_leaf_too_fragmented_for_a_coalesced_entry_takes_the_page_walk(env, monkeypatch):
    vram, _, mmu, pt = env
    pages = np.random.default_rng(7).permutation(512)  # 512 runs of one page
    pt.map_pages(VA, [DATA + int(p) * PAGE_SIZE for p in pages])
    mmu.translate(1, VA, 512 * PAGE_SIZE, ACCESS_READ)
    walks = _no_page_walk(monkeypatch, mmu)
    ext = mmu.translate(1, VA, 512 * PAGE_SIZE, ACCESS_READ)
    assert walks and len(ext) == 512
    assert np.array_equal(joined(ext), np.concatenate(
        [vram.mem[DATA + int(p) * PAGE_SIZE:DATA + (int(p) + 1) * PAGE_SIZE] for p in pages]))


@pytest.mark.parametrize("how", ["permission", "invalid"])
def test_a_coalesced_entry_does_not_hide_a_fault(env, how):
    """A page of a cached run that is not good for the access: the page walk decides, and
    faults at that page."""
    _, _, mmu, pt = env
    pt.map(VA, DATA, 8, RO)
    pt.map(VA + 8 * PAGE_SIZE, DATA + 8 * PAGE_SIZE, 8, RW if how == "permission" else 0)
    if how == "permission":
        mmu.translate(1, VA, 16 * PAGE_SIZE, ACCESS_READ)
    else:
        mmu.translate(1, VA, 8 * PAGE_SIZE, ACCESS_READ)
        mmu.translate(1, VA, 8 * PAGE_SIZE, ACCESS_READ)  # the leaf's runs recorded
    with pytest.raises(MmuFault) as e:
        mmu.translate(1, VA + 100, 16 * PAGE_SIZE - 200, ACCESS_WRITE if how == "permission"
                      else ACCESS_READ)
    assert e.value.address == (VA + 100 if how == "permission" else VA + 8 * PAGE_SIZE)


def test_an_evicted_leaf_takes_its_coalesced_entry_along(env):
    """A leaf table that left the TLB is walked again: its runs are not used after it."""
    vram, _, mmu, pt = env
    mmu.TLB_CAPACITY = 1
    pt.map(VA, DATA, 4)
    pt.map(VA + (2 << 20), DATA + 64 * PAGE_SIZE, 4)
    for _ in range(2):  # cached, runs recorded
        mmu.translate(1, VA, 4 * PAGE_SIZE, ACCESS_READ)
    mmu.translate(1, VA + (2 << 20), 4 * PAGE_SIZE, ACCESS_READ)  # evicts the first leaf
    pt.map(VA, DATA + 128 * PAGE_SIZE, 4)  # remapped while not cached: no flush needed
    ext = mmu.translate(1, VA, 4 * PAGE_SIZE, ACCESS_READ)
    assert np.array_equal(joined(ext), vram.view(DATA + 128 * PAGE_SIZE, 4 * PAGE_SIZE))


def test_a_cached_range_costs_calls_per_leaf_table_not_per_page(env):
    """Python calls of translating a cached, contiguously mapped 64 MiB (32 leaf tables):
    about one per leaf table (its coalesced entry) and a few per translation."""
    _, _, mmu, pt = env
    pt.map(VA, DATA, 16384)
    for _ in range(2):  # cached, runs recorded
        mmu.translate(1, VA, 64 << 20, ACCESS_READ)
    calls = python_calls(lambda: mmu.translate(1, VA, 64 << 20, ACCESS_READ))
    assert calls <= 2 * 32 + 16, f"{calls} calls for 32 cached leaf tables"
