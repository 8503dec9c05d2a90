"""host/kmd/shm.py: shared device memory (Gdev's gshmget/gshmat/gshmdt/gshmctl) in the KMD,
against the real emulated GPU: the same physical pages in several VMs, reference counts,
removal while attached, deferred unmaps behind pending work, quotas and permissions."""

import numpy as np
import pytest

from pvgpu.host.hw import regs
from pvgpu.host.kmd import (InvalidArgument, InvalidContext, InvalidSegment, OutOfMemory,
                      PermissionDenied)
from pvgpu.host.kmd.sched import VgpuShares
from pvgpu.spec import wire

from test_kmd_device import Window, download

P = regs.PAGE_SIZE
W = wire.GUEST_WINDOW_VA


@pytest.fixture
def dev(make_dev):
    return make_dev()


def _phys(ctx, va):
    pte = ctx.vm.walk(va)
    assert pte & regs.PTE_VALID
    return pte & regs.PTE_ADDR_MASK


def test_two_contexts_share_the_same_physical_pages(dev):
    a, b = dev.create_context("a"), dev.create_context("b")
    wa, wb = Window(dev, a), Window(dev, b)
    seg, created = dev.shm.get(0x1234, 3 * P + 100)
    assert created and seg.size == 4 * P and seg.nattach == 0
    va_a, va_b = a.attach_shared(seg), b.attach_shared(seg)
    assert wire.VA_USER_BASE <= va_a < wire.VA_USER_LIMIT and a.shared_va(seg) == va_a
    for off in range(0, seg.size, P):  # the same physical page behind both VAs
        assert _phys(a, va_a + off) == _phys(b, va_b + off)
        assert a.vm.walk(va_a + off) & regs.PTE_WRITE
    assert seg.nattach == 2 and seg.refcount == 3
    # a write through context a's VA is read through context b's VA
    data = np.arange(1024, dtype=np.float32)
    assert a.submit_copy(wa.put(0, data), va_a, data.nbytes).wait(5)
    out = b.alloc(data.nbytes)
    f = b.submit_launch(wire.KERNEL_SCALE, (4,), (256,), [out.va, va_b, 0x40000000, 1024])
    assert f.wait(5) and f.error is None  # 0x40000000 = 2.0f
    assert np.array_equal(download(b, wb, out, 1024), 2 * data)
    # and b's kernel writing into the segment is seen by a
    f = b.submit_launch(wire.KERNEL_FILL, (4,), (256,), [va_b + 4096, 0x40400000, 1024])
    assert f.wait(5) and f.error is None  # 3.0f
    got = a.submit_copy(va_a + 4096, W + (1 << 20), 4096)
    assert got.wait(5) and np.all(wa.get(1 << 20, 1024) == 3.0)


def test_key_lookup_sizes_and_private_keys(dev):
    seg, created = dev.shm.get(7, 10_000, namespace="s1")
    assert created and seg.size == 3 * P
    assert dev.shm.get(7, 3 * P, namespace="s1") == (seg, False)  # same key: same segment
    assert dev.shm.get(7, 9000, namespace="s1") == (seg, False)  # equal after rounding
    assert dev.shm.get(7, 0, namespace="s1") == (seg, False)  # size 0 looks up
    with pytest.raises(InvalidArgument):
        dev.shm.get(7, 4 * P, namespace="s1")  # size mismatch
    other, created = dev.shm.get(7, 3 * P, namespace="s2")  # keys are per namespace
    assert created and other is not seg
    with pytest.raises(InvalidSegment):
        dev.shm.get(8, 0, namespace="s1")
    p1, c1 = dev.shm.get(None, P, namespace="s1")  # no key: always a new segment
    p2, c2 = dev.shm.get(None, P, namespace="s1")
    assert c1 and c2 and p1 is not p2
    z, cz = dev.shm.get(0, P, namespace="s1")  # 0 is a key like any other to the KMD
    assert cz and dev.shm.get(0, 0, namespace="s1") == (z, False)
    for bad in (-1, 1 << 64, 1.5, True):
        with pytest.raises(InvalidArgument):
            dev.shm.get(bad, P)
    with pytest.raises(OutOfMemory):
        dev.shm.get(9, dev.vram_size * 2)


def test_remove_while_attached_keeps_the_memory_until_the_last_detach(dev):
    baseline = dev.vram_free()
    a, b = dev.create_context(), dev.create_context()
    wa = Window(dev, a)
    seg, _ = dev.shm.get(1, 1 << 20)
    va_a, va_b = a.attach_shared(seg), b.attach_shared(seg)
    assert a.submit_copy(wa.put(0, np.full(256, 5, np.float32)), va_a, 1024).wait(5)
    used = baseline - dev.vram_free()
    dev.shm.remove(seg)
    dev.shm.remove(seg)  # idempotent
    assert seg.removed and not seg.released and dev.vram_free() == baseline - used
    with pytest.raises(InvalidSegment):
        dev.create_context().attach_shared(seg)  # no new attachment after RMID
    with pytest.raises(InvalidSegment):
        dev.shm.get(1, 0)  # RMID frees the key...
    fresh, created = dev.shm.get(1, P)  # ... for a new segment at once
    assert created and fresh is not seg
    dev.shm.remove(fresh)
    a.detach_shared(seg)
    assert not seg.released and seg.nattach == 1 and a.vm.walk(va_a) == 0
    # b still reads what a wrote
    wb = Window(dev, b)
    assert b.submit_copy(va_b, W, 1024).wait(5) and np.all(wb.get(0, 256) == 5)
    b.detach_shared(seg)
    assert seg.released and seg.refcount == 0 and b.vm.walk(va_b) == 0
    assert seg.id not in dev.shm.segments
    # freed VRAM is cleared: a new segment over the same pages reads zeros
    again, _ = dev.shm.get(2, 1 << 20)
    va = b.attach_shared(again)
    assert b.submit_copy(va, W, 1 << 20).wait(5) and not wb.buf[:1 << 20].any()
    with pytest.raises(InvalidSegment):
        b.detach_shared(seg)


def test_remove_without_attachments_frees_at_once(dev):
    before = dev.vram_free()
    seg, _ = dev.shm.get(3, 2 << 20)
    assert dev.vram_free() == before - (2 << 20)
    dev.shm.remove(seg)
    assert seg.released and dev.vram_free() == before
    with pytest.raises(InvalidSegment):
        dev.shm.remove(seg)  # it no longer exists


def test_detach_is_deferred_behind_pending_work(dev, gate):
    ctx = dev.create_context()
    seg, _ = dev.shm.get(4, 1 << 20)
    va = ctx.attach_shared(seg)
    dev.shm.remove(seg)
    free_before = dev.vram_free()
    pending = gate()
    burn = ctx.submit_launch(wire.KERNEL_BURN, (1,), (1,), [1_000], wait=[pending])
    ctx.detach_shared(seg)
    assert ctx.shared_va(seg) is None and seg.nattach == 0 and seg.dead
    # the PTEs and the memory stay until the work that may use them is done
    assert ctx.vm.walk(va) & regs.PTE_VALID and not seg.released
    assert dev.vram_free() == free_before and dev.deferred_frees == 1
    pending.signal()
    assert burn.wait(5)
    assert dev.vram_free() == free_before + (1 << 20)
    assert seg.released and ctx.vm.walk(va) == 0
    with pytest.raises(InvalidSegment):
        ctx.attach_shared(seg)


def test_refcounts_and_destroy_context_detaches(dev, gate):
    a, b = dev.create_context(), dev.create_context()
    seg, _ = dev.shm.get(5, P)
    a.attach_shared(seg)
    b.attach_shared(seg)
    assert seg.refcount == 3
    with pytest.raises(InvalidArgument):
        a.attach_shared(seg)  # once per context
    pending = gate()
    burn = a.submit_launch(wire.KERNEL_BURN, (1,), (1,), [1_000], wait=[pending])
    dev.destroy_context(a)
    assert seg.nattach == 1 and seg.refcount == 3  # a's mapping goes with its VM, later
    pending.signal()
    assert burn.wait(5) and dev.reclaim() >= 0
    dev.vram_free()
    assert seg.refcount == 2
    with pytest.raises(InvalidContext):
        a.attach_shared(seg)
    dev.shm.remove(seg)
    assert not seg.released
    dev.destroy_context(b)
    dev.vram_free()
    assert seg.released and seg.refcount == 0


def test_quota_counts_against_the_creators_vgpu(make_dev):
    dev = make_dev(vram_size=32 << 20, vgpus=[VgpuShares("A", mem=25), VgpuShares("B", mem=25)])
    va, vb = dev.vgpus["A"], dev.vgpus["B"]
    limit = dev.vgpu_mem_limit(va)
    seg, _ = dev.shm.get(1, 4 << 20, namespace="a", vgpu=va)
    assert dev._vgpu_mem["A"] == 4 << 20
    ca = dev.create_context(vgpu=va, client="a")
    with pytest.raises(OutOfMemory):
        ca.alloc(limit - (4 << 20) + P)  # the segment uses A's share
    bo = ca.alloc(limit - (4 << 20))
    with pytest.raises(OutOfMemory):
        dev.shm.get(2, P, namespace="a", vgpu=va)
    ca.free(bo)
    # an importer's attachment does not move the charge
    cb = dev.create_context(vgpu=vb, client="b")
    dev.shm.import_(*dev.shm.export(seg, "a"), client="b")
    cb.attach_shared(seg)
    assert dev._vgpu_mem["B"] == 0 and dev._vgpu_mem["A"] == 4 << 20
    dev.shm.remove(seg, "a")
    assert dev._vgpu_mem["A"] == 4 << 20  # still attached by b: still charged
    cb.detach_shared(seg)
    assert dev._vgpu_mem["A"] == 0
    stats = dev.sched_stats()
    assert stats["vgpus"]["A"]["mem_bytes"] == 0 and stats["shm"]["segments"] == 0


def test_permissions_export_and_import(dev):
    seg, _ = dev.shm.get(1, P, namespace="a")
    ca, cb = dev.create_context(client="a"), dev.create_context(client="b")
    ca.attach_shared(seg)
    with pytest.raises(PermissionDenied):
        cb.attach_shared(seg)  # b neither created nor imported it
    with pytest.raises(PermissionDenied):
        dev.shm.export(seg, "b")
    with pytest.raises(PermissionDenied):
        dev.shm.remove(seg, "b")
    handle, token = dev.shm.export(seg, "a")
    assert dev.shm.export(seg, "a") == (handle, token)  # the same capability
    assert token != 0
    with pytest.raises(PermissionDenied):
        dev.shm.import_(handle, token ^ 1, "b")  # wrong token
    with pytest.raises(PermissionDenied):
        dev.shm.import_(handle + 1000, token, "b")  # unknown handle: the same error
    assert dev.shm.import_(handle, token, "b") is seg
    cb.attach_shared(seg)
    # removal withdraws the export
    dev.shm.remove(seg, "a")
    with pytest.raises(PermissionDenied):
        dev.shm.import_(handle, token, "c")
    with pytest.raises(InvalidSegment):
        dev.shm.export(seg, "a")


def test_release_client_removes_created_and_revokes_imported(dev):
    mine, _ = dev.shm.get(1, P, namespace="a")
    theirs, _ = dev.shm.get(1, P, namespace="b")
    dev.shm.import_(*dev.shm.export(theirs, "b"), client="a")
    cb = dev.create_context(client="b")
    dev.shm.import_(*dev.shm.export(mine, "a"), client="b")
    cb.attach_shared(mine)
    dev.shm.release_client("a")
    assert mine.removed and not mine.released  # b is still attached
    assert "a" not in theirs.allowed and not theirs.removed
    cb.detach_shared(mine)
    assert mine.released


def test_read_only_attachment_faults_on_write(dev):
    ctx = dev.create_context()
    win = Window(dev, ctx)
    seg, _ = dev.shm.get(1, P)
    va = ctx.attach_shared(seg, readonly=True)
    assert not ctx.vm.walk(va) & regs.PTE_WRITE
    f = ctx.submit_copy(win.put(0, np.ones(4, np.float32)), va, 16)
    assert f.wait(5) and f.error is not None and f.error.access == wire.ACCESS_WRITE
    f = ctx.submit_copy(va, W, 16)
    assert f.wait(5) and f.error is None
