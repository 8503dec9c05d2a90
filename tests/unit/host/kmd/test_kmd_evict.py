"""Oversubscription: the KMD evicts other contexts' buffer objects to host memory (Gdev's
swapping), keeps them reachable through PTE_SYSTEM pages at the same VA, and migrates them
back when VRAM frees up (host/kmd/evict.py)."""

import msgpack
import numpy as np
import pytest
from pvgpu.conformance.burns import with_longer_burns

from pvgpu.host.hw import regs
from pvgpu.host.kmd import OutOfMemory
from pvgpu.host.kmd.sched import PRIORITY_HIGH, PRIORITY_LOW, VgpuShares
from pvgpu.spec import wire

P = regs.PAGE_SIZE
MiB = 1 << 20
W = wire.GUEST_WINDOW_VA
VRAM = 8 * MiB


class Window:
    """Host memory dma-mapped and mapped at GUEST_WINDOW_VA in a context."""

    def __init__(self, dev, ctx, size=8 * MiB):
        self.buf = np.zeros(size, dtype=np.uint8)
        ctx.map_system(dev.dma_map(self.buf), W)


def fill(ctx, win, bo, data):
    raw = data.view(np.uint8)
    win.buf[:raw.size] = raw
    f = ctx.submit_copy(W, bo.va, raw.size)
    assert f.wait(5) and f.error is None, f.error


def read(ctx, win, bo, n):
    f = ctx.submit_copy(bo.va, W, 4 * n)
    assert f.wait(5) and f.error is None, f.error
    return win.buf[:4 * n].view(np.float32).copy()


def scale(ctx, dst, src, alpha, n):
    f = ctx.submit_launch(wire.KERNEL_SCALE, (n // 256,), (256,),
                          [dst.va, src.va, int(np.float32(alpha).view(np.uint32)), n])
    assert f.wait(5) and f.error is None, f.error


def pte(ctx, bo, off=0):
    return ctx.vm.walk(bo.va + off)


def test_eviction_keeps_data_reachable_and_restores_on_free(make_dev):
    # [SCHED-VGPU-5] evicted buffers keep their data, restored later
    dev = make_dev(vram_size=VRAM)
    a, b = dev.create_context("a"), dev.create_context("b")
    win = Window(dev, a)
    n = MiB // 4  # 1 MiB of float32 per BO
    bos = [a.alloc(2 * MiB) for _ in range(3)]
    data = [np.arange(2 * n, dtype=np.float32) + 1000 * i for i in range(3)]
    for bo, d in zip(bos, data):
        fill(a, win, bo, d)
    free_before = dev.mm.avail
    assert free_before < 4 * MiB
    big = b.alloc(4 * MiB)  # does not fit: a's BOs go to host memory
    evicted = [bo for bo in bos if bo.evicted]
    assert evicted and dev.evicted_bytes == sum(bo.size for bo in evicted)
    assert not big.evicted and pte(b, big) & regs.PTE_SYSTEM == 0
    for bo in evicted:
        assert bo.blocks == [] and bo.extents == []
        for off in (0, bo.size - P):
            e = pte(a, bo, off)
            assert e & regs.PTE_VALID and e & regs.PTE_SYSTEM and e & regs.PTE_WRITE
            assert (e & regs.PTE_ADDR_MASK) == bo.sysmem.bus_addr + off
    # the GPU still reads and writes the evicted BOs (through the SYSTEM pages)
    for bo, d in zip(bos, data):
        assert np.array_equal(read(a, win, bo, 2 * n), d)
    victim = evicted[0]
    i = bos.index(victim)
    scale(a, victim, victim, 2.0, 2 * n)  # in place, on the host copy
    data[i] = data[i] * 2
    assert victim.evicted  # no free VRAM: the job ran against the host copy
    assert np.array_equal(read(a, win, victim, 2 * n), data[i])
    # b frees its BO: a's BOs migrate back, PTEs point at VRAM again
    b.free(big)
    assert not any(bo.evicted for bo in bos)  # the moves back are under way
    assert a.wait_idle(5)  # they are a's pending work until their copies are done
    dev.reclaim()  # then the host copies go
    assert dev.evicted_bytes == 0
    for bo, d in zip(bos, data):
        e = pte(a, bo)
        assert e & regs.PTE_VALID and not e & regs.PTE_SYSTEM and e & regs.PTE_ADDR_MASK == bo.phys
        assert np.array_equal(read(a, win, bo, 2 * n), d)
    st = dev.mem_stats()
    assert st["evictions"] == st["restores"] == len(evicted)
    assert st["bytes_evicted"] == st["bytes_restored"] == sum(bo.size for bo in evicted)


def test_restore_before_the_owners_next_job(make_dev):
    dev = make_dev(vram_size=VRAM)
    a, b = dev.create_context("a"), dev.create_context("b")
    win = Window(dev, a)
    bo = a.alloc(4 * MiB)
    d = np.random.default_rng(1).random(MiB, dtype=np.float32)
    fill(a, win, bo, d)
    x = b.alloc(4 * MiB)
    assert bo.evicted
    # free b's memory behind b's pending work: the release is deferred, nothing restored yet
    f = b.submit_launch(wire.KERNEL_BURN, (1,), (1,), [50_000])
    b.free(x)
    assert bo.evicted
    assert f.wait(5)
    # a's next job: run_job finds free VRAM (the deferred free has been reclaimed) and
    # migrates a's BO back before the job runs
    out = read(a, win, bo, MiB)
    assert np.array_equal(out, d)
    assert not bo.evicted and not pte(a, bo) & regs.PTE_SYSTEM
    assert dev.mem_stats()["restores"] == 1


def test_victim_order_priority_then_lru(make_dev):
    dev = make_dev(vram_size=VRAM)
    low = dev.create_context("low", priority=PRIORITY_LOW)
    old = dev.create_context("old")
    new = dev.create_context("new")
    high = dev.create_context("high", priority=PRIORITY_HIGH)
    req = dev.create_context("requester")
    size = 3 * MiB // 2
    bos = {c.name: c.alloc(size) for c in (high, old, low, new)}
    for c in (high, low, old, new):  # last use: old before new (ties: creation order)
        assert c.submit_launch(wire.KERNEL_BURN, (1,), (1,), [10]).wait(5)
    order = []
    for _ in range(5):  # the first fits into free VRAM
        req.alloc(size)
        for name, bo in bos.items():
            if bo.evicted and name not in order:
                order.append(name)
    assert order == ["low", "old", "new", "high"]


def test_busy_victims_are_not_evicted_while_their_jobs_run(make_dev):
    def attempt(burn_us):
        dev = make_dev(vram_size=VRAM, timeout=30)
        a, b = dev.create_context("a"), dev.create_context("b")
        win = Window(dev, a)
        bo = a.alloc(5 * MiB)
        d = np.arange(5 * MiB // 4, dtype=np.float32)
        fill(a, win, bo, d)
        burn = a.submit_launch(wire.KERNEL_BURN, (1,), (1,), [burn_us])
        x = b.alloc(5 * MiB)  # waits for a's job, then evicts
        assert burn.signaled  # not while the job ran
        assert bo.evicted and not x.evicted
        assert np.array_equal(read(a, win, bo, d.size), d)
        return dev.mem_stats()["evict_waits"] >= 1  # it waited (else the burn was over)
    with_longer_burns(attempt)


def test_busy_victims_time_out_with_out_of_memory(make_dev):
    def attempt(burn_us):
        dev = make_dev(vram_size=VRAM, timeout=0.2)
        a, b = dev.create_context("a"), dev.create_context("b")
        bo = a.alloc(5 * MiB)
        burn = a.submit_launch(wire.KERNEL_BURN, (1,), (1,), [burn_us])
        try:
            b.alloc(5 * MiB)
        except OutOfMemory as e:
            assert "busy" in str(e)
        else:
            assert burn.signaled and bo.evicted  # it waited the burn out: a longer one
            return False
        assert not bo.evicted and dev.mem_stats()["evict_skipped_busy"] >= 1
        assert burn.wait(30)
        b.alloc(5 * MiB)  # now it is idle
        assert bo.evicted
        return True
    with_longer_burns(attempt, (800_000, 3_000_000, 10_000_000))


def test_evicted_bytes_limit_gives_out_of_memory(make_dev):
    dev = make_dev(vram_size=VRAM, max_evicted_bytes=2 * MiB)
    a, b = dev.create_context("a"), dev.create_context("b")
    win = Window(dev, a)
    bo = a.alloc(4 * MiB)
    d = np.arange(MiB, dtype=np.float32)
    fill(a, win, bo, d)
    with pytest.raises(OutOfMemory, match="evict"):
        b.alloc(5 * MiB)  # within the share, but a's 4 MiB BO exceeds the evicted limit
    assert not bo.evicted and dev.evicted_bytes == 0
    assert dev.mem_stats()["evict_skipped_limit"] >= 1
    small = a.alloc(MiB)
    b.alloc(3 * MiB)  # fits once the 1 MiB BO is evicted; the 4 MiB one may not be
    assert small.evicted and not bo.evicted
    assert np.array_equal(read(a, win, bo, MiB), d)
    # no eviction at all with max_evicted_bytes=0
    dev0 = make_dev(vram_size=VRAM, max_evicted_bytes=0)
    c, e = dev0.create_context(), dev0.create_context()
    c.alloc(4 * MiB)
    with pytest.raises(OutOfMemory):
        e.alloc(4 * MiB)


def test_vgpu_share_counts_evicted_bytes(make_dev):
    # [SCHED-VGPU-1] evicted buffers count as resident ones
    s = VgpuShares("s", mem=50)
    dev = make_dev(vram_size=VRAM, vgpus=[s], max_evicted_bytes=8 * MiB)
    limit = dev.vgpu_mem_limit(s)
    assert limit == (VRAM - dev.kernel_vram + 8 * MiB) // 2 // P * P
    cs, other = dev.create_context(vgpu=s), dev.create_context()
    bo = cs.alloc(5 * MiB)
    other.alloc(5 * MiB)
    assert bo.evicted
    assert dev.sched_stats()["vgpus"]["s"]["mem_bytes"] == 5 * MiB  # still charged
    with pytest.raises(OutOfMemory, match="share"):
        cs.alloc(limit - 5 * MiB + P)
    cs.free(bo)
    assert dev.sched_stats()["vgpus"]["s"]["mem_bytes"] == 0 and dev.evicted_bytes == 0


def test_free_and_destroy_release_host_copies(make_dev):
    dev = make_dev(vram_size=VRAM)
    sysmem = dev.gpu.sysmem
    a, b = dev.create_context("a"), dev.create_context("b")
    base = sysmem.num_mappings
    x, y = a.alloc(3 * MiB), a.alloc(3 * MiB)
    b.alloc(6 * MiB)
    assert x.evicted and y.evicted and sysmem.num_mappings == base + 2
    a.free(x)
    assert sysmem.num_mappings == base + 1 and dev.evicted_bytes == y.size
    dev.destroy_context(a)
    dev.reclaim()
    assert sysmem.num_mappings == base and dev.evicted_bytes == 0


def test_shared_segments_are_never_evicted(make_dev):
    dev = make_dev(vram_size=VRAM)
    a, b = dev.create_context("a", client="a"), dev.create_context("b", client="b")
    seg, _ = dev.shm.get(1, 4 * MiB, namespace="a")
    va = a.attach_shared(seg)
    with pytest.raises(OutOfMemory):
        b.alloc(5 * MiB)
    assert not a.vm.walk(va) & regs.PTE_SYSTEM


def test_mem_stats(make_dev):
    dev = make_dev(vram_size=VRAM)
    a, b = dev.create_context("a"), dev.create_context("b")
    a.alloc(3 * MiB)
    a.alloc(2 * MiB)
    b.alloc(4 * MiB)
    st = dev.mem_stats()
    assert st["evictions"] >= 1 and st["evicted_bytes"] == dev.evicted_bytes > 0
    ca, cb = st["contexts"][str(a.id)], st["contexts"][str(b.id)]
    assert ca["resident_bytes"] + ca["evicted_bytes"] == 5 * MiB
    assert ca["evicted_bytes"] == dev.evicted_bytes
    assert cb == {**cb, "resident_bytes": 4 * MiB, "evicted_bytes": 0}
    assert st["max_evicted_bytes"] == 2 * VRAM
    full = dev.sched_stats()
    assert full["mem"]["evictions"] == st["evictions"]
    msgpack.unpackb(msgpack.packb(full), strict_map_key=True)


def test_shared_segment_allocation_evicts_buffer_objects(make_dev):
    dev = make_dev(vram_size=VRAM)
    a = dev.create_context("a", client="a")
    win = Window(dev, a)
    bo = a.alloc(5 * MiB)
    d = np.arange(5 * MiB // 4, dtype=np.float32)
    fill(a, win, bo, d)
    seg, created = dev.shm.get(1, 5 * MiB, namespace="b")
    assert created and bo.evicted
    assert np.array_equal(read(a, win, bo, d.size), d)


def test_make_resident(make_dev):
    dev = make_dev(vram_size=VRAM)
    a, b = dev.create_context("a"), dev.create_context("b")
    win = Window(dev, a)
    bo = a.alloc(4 * MiB)
    d = np.arange(MiB, dtype=np.float32)
    fill(a, win, bo, d)
    x = b.alloc(4 * MiB)
    assert bo.evicted
    with dev.lock:
        dev._make_resident(bo)  # evicts b's BO in turn
    assert not bo.evicted and x.evicted
    assert a.wait_idle(5)  # the restore's copy: the PTEs switch once it is done
    assert not pte(a, bo) & regs.PTE_SYSTEM
    assert np.array_equal(read(a, win, bo, MiB), d)


def test_mem_stats_count_the_frees_that_became_safe(make_dev, gate):
    """A context destroyed with work in flight frees its memory once that work is done
    (a deferred free); the statistics report it then, as vram_free() does, whether or not
    anything else ran on the device meanwhile (a guest killed mid-transfer, reclaimed at
    once: the host's GET_STATS must show its VRAM back)."""
    dev = make_dev(vram_size=VRAM)
    baseline = dev.mem_stats()["vram_free"]
    ctx = dev.create_context()
    win = Window(dev, ctx)
    bo = ctx.alloc(MiB)
    g = gate()
    copy = ctx.submit_copy(bo.va, W, MiB, wait=[g])
    dev.destroy_context(ctx)
    assert dev.mem_stats()["vram_free"] < baseline  # the copy may still touch it
    g.signal()
    assert copy.wait(5)
    assert dev.mem_stats()["vram_free"] == baseline
    del win  # (its buffer had to outlive the copy)
