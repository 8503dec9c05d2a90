"""DRM PRIME in the KMD (host/kmd/prime.py): dma-buf export and import between the two
emulated GPUs, peer-to-peer through the PCIe BAR or migrated to system memory, implicit
synchronisation through the shared reservation object, and move_notify on eviction."""

import dataclasses

import numpy as np
import pytest

from pvgpu.host.hw import regs
from pvgpu.host.kmd import OutOfMemory
from pvgpu.host.kmd.errors import LimitReached
from pvgpu.host.kmd.dmabuf import DmaBufRevoked
from pvgpu.spec import wire

from test_kmd_evict import Window, fill, read, scale

MiB = 1 << 20
N = 64 * 1024  # floats: 256 KiB


def f32(x):
    return int(np.float32(x).view(np.uint32))


def launch(ctx, kernel, args, grid=N // 256, wait=()):
    return ctx.submit_launch(kernel, (grid,), (256,), args, wait)


def done(f):
    assert f.wait(5) and f.error is None, f.error


@pytest.fixture
def pair(make_dev):
    def make(topology="switch", vram_size=32 * MiB):
        d0, d1 = make_dev(vram_size, num_gpus=2, topology=topology)
        a, b = d0.create_context("exporter"), d1.create_context("importer")
        return d0, d1, a, b, Window(d0, a), Window(d1, b)
    return make


def test_import_over_p2p_reads_and_writes_the_exporters_vram(pair):
    d0, d1, a, b, wa, wb = pair("switch")
    src = a.alloc(4 * N)
    data = np.arange(N, dtype=np.float32)
    fill(a, wa, src, data)
    dmabuf = a.export_dmabuf(src)
    imp = b.import_dmabuf(dmabuf)
    assert imp.kind == "peer" and imp.size == 4 * N
    pte = b.vm.walk(imp.va)
    assert pte & regs.PTE_PEER and (pte & regs.PTE_ADDR_MASK) == d0.gpu.pci.bar0 + src.phys
    out = b.alloc(4 * N)
    scale(b, out, imp, 2.0, N)  # a kernel on gpu1 reads gpu0's VRAM
    np.testing.assert_array_equal(read(b, wb, out, N), 2 * data)
    scale(b, imp, out, 0.5, N)  # ... and writes it
    np.testing.assert_array_equal(read(a, wa, src, N), data)
    assert src.sysmem is None  # never left VRAM
    assert d1.gpu.mmu.fabric.stats()["gpu1->gpu0"]["read_bytes"] >= 4 * N  # fabric counters


@pytest.mark.parametrize("topology,peer2peer", [("sockets", True), ("switch", False)])
def test_without_p2p_the_buffer_moves_to_system_memory(pair, topology, peer2peer):
    d0, d1, a, b, wa, wb = pair(topology)
    src = a.alloc(4 * N)
    data = np.arange(N, dtype=np.float32)
    fill(a, wa, src, data)
    imp = b.import_dmabuf(a.export_dmabuf(src), peer2peer=peer2peer)
    assert imp.kind == "system" and src.sysmem is not None and src.sys_pins == 1
    assert a.wait_idle(5)  # the migration's copy: the exporter's PTEs switch once it is done
    assert b.vm.walk(imp.va) & regs.PTE_SYSTEM and a.vm.walk(src.va) & regs.PTE_SYSTEM
    out = b.alloc(4 * N)
    scale(b, out, imp, 3.0, N)
    np.testing.assert_array_equal(read(b, wb, out, N), 3 * data)
    scale(a, src, src, 2.0, N)  # the exporter works on it there too
    np.testing.assert_array_equal(read(b, wb, imp, N), 2 * data)
    # pinned in system memory while attached: no restore; after the detach it may go back
    assert not d0._restore_evicted(a) and src.sysmem is not None
    b.free_import(imp)
    assert b.wait_idle(5)
    d1.reclaim()  # the import's deferred unmap and detach
    assert src.sys_pins == 0 and d0._restore_evicted(a) == 1 and src.sysmem is None
    np.testing.assert_array_equal(read(a, wa, src, N), 2 * data)


def test_same_device_import_maps_the_same_vram(pair):
    d0, _d1, a, _b, wa, _wb = pair()
    c = d0.create_context("second")
    src = a.alloc(4 * N)
    fill(a, wa, src, np.ones(N, np.float32))
    imp = c.import_dmabuf(a.export_dmabuf(src))
    assert imp.kind == "local"
    assert c.vm.walk(imp.va) & regs.PTE_ADDR_MASK == src.phys
    assert not c.vm.walk(imp.va) & (regs.PTE_PEER | regs.PTE_SYSTEM)


def test_one_dmabuf_per_bo_and_memory_goes_with_the_last_reference(pair):
    d0, d1, a, b, _wa, _wb = pair()
    src = a.alloc(1 * MiB)
    free0 = d0.mm.avail + 1 * MiB  # page tables of the mapping stay with the context
    x, y = a.export_dmabuf(src), a.export_dmabuf(src)
    assert x is y and x.refcount == 2
    y.put()
    imp = b.import_dmabuf(x)
    x.put()  # the exporter's handle is gone; the attachment keeps it
    a.free(src)  # and so is the exporter's BO handle
    assert a.wait_idle(5)
    d0.reclaim()
    assert d0.mm.avail < free0  # still held by the import
    with pytest.raises(DmaBufRevoked):  # freeing the export stops new imports
        b.import_dmabuf(x)
    b.free_import(imp)
    assert b.wait_idle(5)
    d1.reclaim()
    d0.reclaim()
    assert x.released and d0.mm.avail == free0


def test_importer_reads_wait_for_the_exporters_slow_write(pair, gate):
    d0, d1, a, b, wa, wb = pair()
    src = a.alloc(4 * N)
    fill(a, wa, src, np.zeros(N, np.float32))
    imp = b.import_dmabuf(a.export_dmabuf(src))
    out = b.alloc(4 * N)
    slow = gate()  # the write runs when the test opens the gate: as slow as it likes
    writer = launch(a, wire.KERNEL_FILL, [src.va, f32(7.0), N], wait=[slow])
    reader = b.submit_copy(imp.va, out.va, 4 * N)  # no explicit wait
    assert not reader.wait(0.2)  # held back with the writer (it never runs before the gate)
    assert not writer.signaled
    slow.signal()
    done(reader)
    assert writer.signaled  # the reader waited for the writer through the resv
    np.testing.assert_array_equal(read(b, wb, out, N), np.full(N, 7.0, np.float32))


def test_exporter_writes_wait_for_the_importers_slow_read_and_write(pair, gate):
    d0, d1, a, b, wa, wb = pair()
    src = a.alloc(4 * N)
    fill(a, wa, src, np.ones(N, np.float32))
    imp = b.import_dmabuf(a.export_dmabuf(src))
    slow = gate()
    importer = launch(b, wire.KERNEL_SCALE, [imp.va, imp.va, f32(4.0), N], wait=[slow])
    exporter = launch(a, wire.KERNEL_FILL, [src.va, f32(3.0), N])
    assert not exporter.wait(0.2)  # held back with the importer's job
    assert not importer.signaled
    slow.signal()
    done(exporter)
    assert importer.signaled
    # write after read and write: 4 * 1, then 3 (the other order would leave 12)
    np.testing.assert_array_equal(read(a, wa, src, N), np.full(N, 3.0, np.float32))


def test_eviction_tells_importers_and_they_remap_before_their_next_job(pair):
    d0, d1, a, b, wa, wb = pair(vram_size=8 * MiB)
    src = a.alloc(2 * MiB)
    data = np.arange(2 * MiB // 4, dtype=np.float32)
    fill(a, wa, src, data)
    dmabuf = a.export_dmabuf(src)
    imp = b.import_dmabuf(dmabuf)
    assert imp.kind == "peer"
    # another context on gpu0 needs the room: the idle shared BO is evicted
    hog = d0.create_context("hog")
    hog.alloc(d0.mm.avail)
    hog.alloc(1 * MiB)
    assert src.sysmem is not None and dmabuf.stats["move_notifies"] == 1 and imp.stale
    out = b.alloc(2 * MiB)
    done(b.submit_copy(imp.va, out.va, 2 * MiB))  # re-mapped in run_job
    assert not imp.stale and imp.kind == "system" and b.vm.walk(imp.va) & regs.PTE_SYSTEM
    np.testing.assert_array_equal(read(b, wb, out, 2 * MiB // 4), data)


def test_a_busy_shared_buffer_is_not_evicted(pair, gate):
    d0, d1, a, b, wa, wb = pair(vram_size=8 * MiB)
    src = a.alloc(2 * MiB)
    imp = b.import_dmabuf(a.export_dmabuf(src))
    busy = gate()
    reader = b.submit_copy(imp.va, imp.va + MiB, MiB, wait=[busy])  # holds the resv
    hog = d0.create_context("hog")
    hog.alloc(d0.mm.avail - 64 * 1024)  # room left for its page tables
    d0.timeout = 0.1
    with pytest.raises(OutOfMemory):
        hog.alloc(1 * MiB)
    assert src.sysmem is None and d0.prime.stats["moves_skipped_busy"] >= 1
    busy.signal()
    done(reader)


def test_detach_and_release_never_wait_for_the_exporters_lock(pair):
    """An importer detaches under its own lock (deferred frees); taking the exporter's lock
    there would deadlock two devices that import from each other."""
    import threading
    d0, d1, a, b, _wa, _wb = pair("sockets")  # a system-memory pin to drop, too
    src = a.alloc(1 * MiB)
    dmabuf = a.export_dmabuf(src)
    imp = b.import_dmabuf(dmabuf)
    a.free(src)
    dmabuf.put()  # only the attachment holds the buffer now
    held, release = threading.Event(), threading.Event()

    def hold_exporter():
        with d0.lock:
            held.set()
            release.wait(10)
    t = threading.Thread(target=hold_exporter)
    t.start()
    try:
        assert held.wait(5)
        done = threading.Event()

        def detach():
            with d1.lock:
                imp.attachment.detach()  # the last reference: exporter detach + release
            done.set()
        threading.Thread(target=detach, daemon=True).start()
        assert done.wait(5), "detach waited for the exporter's lock"
    finally:
        release.set()
        t.join(5)
    # The exporter's submission context reaps the released buffer once its lock is free,
    # with no further call into the device (nothing else may ever come).
    import time
    deadline = time.monotonic() + 10
    while src.refcount and time.monotonic() < deadline:
        time.sleep(0.005)
    assert dmabuf.released and src.refcount == 0 and src.sys_pins == 0
    assert not d0.prime._released


def test_a_migration_beyond_the_host_memory_limit_is_refused(make_dev):
    d0, d1 = make_dev(32 * MiB, num_gpus=2, topology="sockets", max_evicted_bytes=1 * MiB)
    a, b = d0.create_context("a"), d1.create_context("b")
    src = a.alloc(2 * MiB)
    dmabuf = a.export_dmabuf(src)
    with pytest.raises(OutOfMemory, match="max-evicted"):
        b.import_dmabuf(dmabuf)
    assert src.sysmem is None and src.sys_pins == 0 and dmabuf.nattach == 0


def test_imports_per_context_are_bounded(pair, monkeypatch):
    d0, d1, a, b, _wa, _wb = pair()
    monkeypatch.setattr(b, "limits", dataclasses.replace(b.limits, max_imports=3))
    dmabuf = a.export_dmabuf(a.alloc(64 * 1024))
    imps = [b.import_dmabuf(dmabuf) for _ in range(3)]
    with pytest.raises(LimitReached, match="imports"):
        b.import_dmabuf(dmabuf)
    assert dmabuf.nattach == 3
    b.free_import(imps[0])
    b.import_dmabuf(dmabuf)  # room again
