"""The copy engine's COPY against a per-page model: one copy per physically contiguous run,
shared out to the DMA lanes in pieces that ignore run boundaries, over VRAM and system
pages, partial first and last pages, non-contiguous backing and faults in the middle."""

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hwtest import RO, RW, vm_setup

from pvgpu.host.hw import command_processor as cp_module
from pvgpu.host.hw import packets as P
from pvgpu.host.hw.compute_units import ComputeUnits
from pvgpu.host.hw.gpu import Gpu
from pvgpu.host.hw.regs import (ENGINE_COPY0, IRQ_FENCE, IRQ_PAGE_FAULT, PAGE_SIZE, PTE_SYSTEM,
                          RB_BASE, RB_KICK_SYNC, RB_RESET, RB_SIZE, RB_WPTR, REG_ENGINE, REG_IRQ_ENABLE)
from pvgpu.host.hw.sysmem import SystemMemory
from pvgpu.spec.kernels import ACCESS_READ, ACCESS_WRITE

VRAM_SIZE = 16 << 20
TABLES = 1 << 20
RING = 2 << 20
IB = RING + PAGE_SIZE
FENCE = IB + PAGE_SIZE
SRC_VRAM, DST_VRAM = 4 << 20, 8 << 20  # backing pools, far apart: src and dst never overlap
SRC_VA, DST_VA = 1 << 32, 1 << 33
VMID = 1
MAX_PAGES = 40


@pytest.fixture(scope="module")
def gpu():
    g = Gpu(0, VRAM_SIZE, SystemMemory())
    g.dma_lanes.shutdown()
    g.dma_lanes = ComputeUnits(2, "test.dma")  # two lanes on any machine
    g.engines[ENGINE_COPY0].cp.cus = g.dma_lanes
    g.start()
    try:
        yield g
    finally:
        assert g.stop()
        g.dma_lanes.shutdown()


def _runs():
    """(kind, pages, gap) runs: gap pages of the pool skipped before the run, so that
    neighbouring runs of one kind are physically contiguous or not."""
    return st.lists(st.tuples(st.sampled_from(["vram", "vram", "vram", "sys", "sys", "none"]),
                              st.integers(1, 16), st.sampled_from([0, 0, 0, 1, 3])),
                    min_size=1, max_size=5)


def _map(gpu, pt, va, runs, vram_pool, host, bus, flags):
    """Map the runs at va; -> per page a view of its backing, or None (unmapped)."""
    pages = []
    vnext = snext = 0
    for kind, n, gap in runs:
        for _ in range(n):
            if len(pages) == MAX_PAGES:
                return pages
            v = va + len(pages) * PAGE_SIZE
            if kind == "none":
                pt.set_pte(v, 0)
                pages.append(None)
                continue
            if kind == "vram":
                phys = vram_pool + (vnext + gap) * PAGE_SIZE
                vnext += gap + 1
                pt.map(v, phys, 1, flags)
                pages.append(gpu.vram.mem[phys:phys + PAGE_SIZE])
            else:
                off = (snext + gap) * PAGE_SIZE
                snext += gap + 1
                pt.map(v, bus + off, 1, flags | PTE_SYSTEM)
                pages.append(host[off:off + PAGE_SIZE])
            gap = 0
    return pages


def _flat(pages) -> np.ndarray:
    """A copy of the pages' bytes (zeros for unmapped pages)."""
    return np.concatenate([np.zeros(PAGE_SIZE, np.uint8) if p is None else p for p in pages])


def _first_bad(pages, va, start, size):
    first, last = start // PAGE_SIZE, (start + size - 1) // PAGE_SIZE
    for p in range(first, last + 1):
        if pages[p] is None:
            return max(va + start, va + p * PAGE_SIZE)
    return None


def _copy_sync(gpu, src, dst, size):
    """COPY in an IB, then a FENCE, run on this thread (RB_KICK_SYNC); -> interrupts."""
    got = []
    gpu.irq.set_handler(got.append)
    gpu.mmio.write(REG_IRQ_ENABLE, 1)
    gpu.mmio.write(REG_ENGINE(ENGINE_COPY0, RB_BASE), RING)
    gpu.mmio.write(REG_ENGINE(ENGINE_COPY0, RB_SIZE), PAGE_SIZE)
    gpu.mmio.write(REG_ENGINE(ENGINE_COPY0, RB_RESET), 1)  # RPTR = WPTR = 0
    ib = P.copy(src, dst, size)
    gpu.vram.write(IB, ib)
    ring = P.indirect_buffer(IB, len(ib) // 4, VMID) + P.fence(FENCE, 1)
    gpu.vram.write(RING, ring)
    gpu.mmio.write(REG_ENGINE(ENGINE_COPY0, RB_WPTR), len(ring))
    gpu.mmio.write(REG_ENGINE(ENGINE_COPY0, RB_KICK_SYNC), 1)
    return got


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), split=st.sampled_from([None, 1, 1, 2]),
       piece=st.sampled_from([PAGE_SIZE, 5000, 3 * PAGE_SIZE + 1]))
def test_copy_matches_a_per_page_model(gpu, monkeypatch, data, split, piece):
    """split: COPY_SPLIT in pages (None: no lanes); piece: LANE_PIECE in bytes, which need
    not be page aligned, so pieces start inside pages and span run boundaries."""
    monkeypatch.setattr(cp_module, "COPY_SPLIT", 1 << 40 if split is None else split * PAGE_SIZE)
    monkeypatch.setattr(cp_module, "LANE_PIECE", piece)
    rng = np.random.default_rng(data.draw(st.integers(0, 1 << 16)))
    gpu.vram.mem[SRC_VRAM:DST_VRAM + (1 << 20)] = rng.integers(0, 256, DST_VRAM + (1 << 20) - SRC_VRAM,
                                                              dtype=np.uint8)
    host_src = rng.integers(0, 256, 4 * MAX_PAGES * PAGE_SIZE, dtype=np.uint8)
    host_dst = rng.integers(0, 256, 4 * MAX_PAGES * PAGE_SIZE, dtype=np.uint8)
    sysmem = gpu.sysmem
    buses = [sysmem.dma_map(host_src), sysmem.dma_map(host_dst)]
    try:
        pt = vm_setup(gpu, VMID, TABLES)  # fresh tables: flushes the VMID
        src_pages = _map(gpu, pt, SRC_VA, data.draw(_runs()), SRC_VRAM, host_src, buses[0], RO)
        dst_pages = _map(gpu, pt, DST_VA, data.draw(_runs()), DST_VRAM, host_dst, buses[1], RW)
        n_src, n_dst = len(src_pages) * PAGE_SIZE, len(dst_pages) * PAGE_SIZE
        most = min(n_src, n_dst)
        size = data.draw(st.integers(1, most) | st.integers(most // 2 + 1, most))
        s_off = data.draw(st.integers(0, n_src - size))
        d_off = data.draw(st.integers(0, n_dst - size))
        expect = _flat(src_pages)[s_off:s_off + size]
        before = _flat(dst_pages)

        splits = gpu.dma_lanes.split_launches
        got = _copy_sync(gpu, SRC_VA + s_off, DST_VA + d_off, size)
        event("shared out to the lanes" if gpu.dma_lanes.split_launches > splits
              else "one lane")

        fault = [(i.address, i.access) for i in got if i.source == IRQ_PAGE_FAULT]
        assert [i.data for i in got if i.source == IRQ_FENCE] == [1]  # the fence still signals
        bad_src = _first_bad(src_pages, SRC_VA, s_off, size)
        bad_dst = _first_bad(dst_pages, DST_VA, d_off, size)
        after = _flat(dst_pages)
        if bad_src is not None or bad_dst is not None:
            event("fault")
            # the source is translated first; a fault copies nothing
            assert fault == ([(bad_src, ACCESS_READ)] if bad_src is not None
                             else [(bad_dst, ACCESS_WRITE)])
            assert np.array_equal(after, before)
            return
        assert fault == []
        assert np.array_equal(after[d_off:d_off + size], expect)
        assert np.array_equal(after[:d_off], before[:d_off])  # nothing outside the range
        assert np.array_equal(after[d_off + size:], before[d_off + size:])
    finally:
        for bus in buses:
            sysmem.dma_unmap(bus)
