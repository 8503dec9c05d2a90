"""Calls that would wait for the GPU (host/kmd/wouldblock.py): in non-blocking mode they
raise WouldBlock, change nothing, and the fence they carry signals once a retry can
succeed; in blocking mode (in-process callers) they wait, lock released. The busy work
is a job that stays on the hardware until the test opens its gate (tests/hwgate.py)."""

import threading

import numpy as np
import pytest

from hwgate import DEADLINE, SpinGates
from pvgpu.host.hw import regs
from pvgpu.host.kmd import InvalidAddress, OutOfMemory
from pvgpu.host.kmd.wouldblock import WouldBlock, nonblocking

from test_kmd_evict import Window, fill, read

P = regs.PAGE_SIZE
MiB = 1 << 20


def would_block(call):
    """call() in non-blocking mode -> the WouldBlock it raised."""
    with nonblocking(), pytest.raises(WouldBlock) as e:
        call()
    assert not e.value.fence.signaled
    return e.value


def test_allocation_on_busy_victims_would_block_then_evicts(make_dev):
    dev = make_dev(vram_size=16 * MiB, timeout=DEADLINE, job_timeout_ns=int(600e9))
    busy, other = dev.create_context("busy"), dev.create_context("other")
    gates = SpinGates(dev, busy)
    win = Window(dev, busy, MiB)
    victim = busy.alloc(8 * MiB)
    data = np.arange(MiB // 4, dtype=np.float32)
    fill(busy, win, victim, data)
    gates.close()
    size = dev.vram_free() + MiB
    before = (dev.mm.avail, dict(dev._vgpu_mem), other.stats["bos_allocated"])
    wb = would_block(lambda: other.alloc(size))
    assert isinstance(wb.error, OutOfMemory) and "busy" in str(wb.error)
    assert (dev.mm.avail, dict(dev._vgpu_mem), other.stats["bos_allocated"]) == before
    assert not victim.evicted
    gates.open()
    assert wb.fence.wait(DEADLINE)
    with nonblocking(), pytest.raises(WouldBlock) as e:
        other.alloc(size)  # the victim is idle now: its eviction starts, on a copy engine
    assert victim.evicted and isinstance(e.value.error, OutOfMemory)
    assert e.value.fence.wait(DEADLINE)  # the eviction's copy
    with nonblocking():
        bo = other.alloc(size)  # its VRAM is free now
    assert bo.size >= size and victim.evicted
    np.testing.assert_array_equal(read(busy, win, victim, data.size), data)


def test_blocking_allocation_waits_for_busy_victims(make_dev):
    """The in-process API keeps waiting (lock released: other calls go on meanwhile)."""
    dev = make_dev(vram_size=16 * MiB, timeout=DEADLINE, job_timeout_ns=int(600e9))
    busy, other = dev.create_context("busy"), dev.create_context("other")
    gates = SpinGates(dev, busy)
    victim = busy.alloc(8 * MiB)
    gates.close()
    size = dev.vram_free() + MiB
    result = []
    t = threading.Thread(target=lambda: result.append(other.alloc(size)))
    t.start()
    try:
        small = other.alloc(P)  # the device lock is free while the allocation waits
        other.free(small)
        assert not result and not victim.evicted
    finally:
        gates.open()
        t.join(DEADLINE)
    assert result and result[0].size >= size and victim.evicted


def test_busy_victims_past_the_timeout_give_out_of_memory_at_once(make_dev):
    dev = make_dev(vram_size=16 * MiB, timeout=0, job_timeout_ns=int(600e9))
    busy, other = dev.create_context("busy"), dev.create_context("other")
    gates = SpinGates(dev, busy)
    busy.alloc(8 * MiB)
    gates.close()
    with pytest.raises(OutOfMemory, match="busy"):
        other.alloc(dev.vram_free() + MiB)
    with nonblocking(expired=True), pytest.raises(OutOfMemory, match="busy"):
        other.alloc(dev.vram_free() + MiB)
    gates.open()


def test_mapping_a_range_still_being_unmapped_would_block(make_dev):
    dev = make_dev(timeout=DEADLINE, job_timeout_ns=int(600e9))
    ctx = dev.create_context()
    gates = SpinGates(dev, ctx)
    bo = ctx.alloc(4 * P)
    r = ctx.reserve_va(4 * P)
    ctx.map_bo_at(bo, r)
    gates.close()
    ctx.unmap_at(r)  # the PTEs go once the gated job is done
    wb = would_block(lambda: ctx.map_bo_at(bo, r))
    assert isinstance(wb.error, InvalidAddress) and r not in ctx.va_mappings()
    gates.open()
    assert wb.fence.wait(DEADLINE)
    with nonblocking():
        ctx.map_bo_at(bo, r)
    assert r in ctx.va_mappings()


def test_migrating_a_busy_shared_buffer_would_block(make_dev):
    d0, d1 = make_dev(32 * MiB, num_gpus=2, timeout=DEADLINE, job_timeout_ns=int(600e9))
    a, b = d0.create_context("exporter"), d1.create_context("importer")
    gates = SpinGates(d0, a)
    src = a.alloc(MiB)
    dmabuf = a.export_dmabuf(src)
    gates.close()  # the exporter's context is on the hardware: the buffer cannot move
    wb = would_block(lambda: b.import_dmabuf(dmabuf, peer2peer=False))
    assert isinstance(wb.error, OutOfMemory)
    assert src.sysmem is None and src.sys_pins == 0 and dmabuf.nattach == 0
    gates.open()
    assert wb.fence.wait(DEADLINE)
    with nonblocking():
        imp = b.import_dmabuf(dmabuf, peer2peer=False)
    assert imp.kind == "system" and src.sysmem is not None and src.sys_pins == 1
