"""Buffer moves (host/kmd/evict.py): eviction and restore are COPY jobs in the kernel VMID on
a copy engine; the owner's later jobs wait for the move, whose PTE switch and release of
the old placement happen once the copy has signalled."""

import time

import numpy as np

from pvgpu.host.hw import packets, regs
from pvgpu.spec import kernels
from test_kmd_evict import W, Window
from test_kmd_evict import fill as put  # host data -> the BO, through the window

P = regs.PAGE_SIZE
MiB = 1 << 20


def get(ctx, win, bo, data):
    f = ctx.submit_copy(bo.va, W + MiB, data.nbytes)
    return f


def got(win, data):
    return win.buf[MiB:MiB + data.nbytes].view(data.dtype)


def copies(dev, engine):
    return dev.gpu.engines[engine].cp.copies


def test_eviction_and_restore_run_on_the_copy_engines_and_keep_the_data(make_dev):
    dev = make_dev(vram_size=8 * MiB)
    a = dev.create_context("a")
    win = Window(dev, a)
    bo = a.alloc(MiB)
    data = np.arange(MiB // 4, dtype=np.float32)
    put(a, win, bo, data)
    d2h, h2d = copies(dev, regs.ENGINE_COPY1), copies(dev, regs.ENGINE_COPY0)
    with dev.lock:
        assert dev._evict_bo(bo)
        move = bo.moving
        # the PTEs switch once the copy is done (it cannot be while this lock is held)
        assert not a.vm.walk(bo.va) & regs.PTE_SYSTEM
    assert move.wait(5) and move.error is None
    assert copies(dev, regs.ENGINE_COPY1) > d2h  # VRAM -> host pages on the d2h engine
    assert bo.evicted and a.vm.walk(bo.va) & regs.PTE_SYSTEM
    assert np.array_equal(bo.sysmem.buf.view(np.float32), data)
    filler = dev.create_context("filler")
    with dev.lock:  # (reclaim() would bring bo back at once)
        dev._reclaim_locked()
        room = dev.mm.avail - MiB // 2
    fill = filler.alloc(room)  # no room left to bring bo back for a's next job
    # a kernel on the system pages
    f = a.submit_launch(kernels.KERNEL_SCALE, (MiB // 4 // 256,), (256,),
                        [bo.va, bo.va, int(np.float32(3.0).view(np.uint32)), MiB // 4])
    assert f.wait(5) and f.error is None
    assert bo.evicted and h2d == copies(dev, regs.ENGINE_COPY0)
    with dev.lock:
        filler.free(fill)  # frees VRAM: a's BO moves back
        assert not bo.evicted
        move = bo.moving
        assert a.vm.walk(bo.va) & regs.PTE_SYSTEM  # until the copy is done
    assert move.wait(5) and move.error is None
    assert not a.vm.walk(bo.va) & regs.PTE_SYSTEM
    assert copies(dev, regs.ENGINE_COPY0) > h2d  # host pages -> VRAM on the h2d engine
    f = get(a, win, bo, data)
    assert f.wait(5) and f.error is None
    assert np.array_equal(got(win, data), data * 3)
    dev.reclaim()
    assert dev.evicted_bytes == 0 and dev.mem_stats()["restores"] == 1


def test_a_job_submitted_right_after_the_eviction_waits_for_its_copy(make_dev):
    dev = make_dev(vram_size=8 * MiB)
    a = dev.create_context("a")
    win = Window(dev, a)
    bo = a.alloc(MiB)
    data = np.arange(MiB // 4, dtype=np.float32) + 7
    put(a, win, bo, data)
    free = dev.mm.avail
    with dev.lock:  # the copy cannot complete (its fence signals under this lock) meanwhile
        assert dev._evict_bo(bo)
        move = bo.moving
        assert dev.mm.avail == free  # the VRAM is freed only once the copy has signalled
        f = get(a, win, bo, data)
        assert move in f.job.deps
    assert f.wait(5) and f.error is None
    assert a.vm.walk(bo.va) & regs.PTE_SYSTEM  # it ran after the switch
    assert np.array_equal(got(win, data), data)
    with dev.lock:
        dev._reclaim_locked()
        assert dev.mm.avail == free + MiB


def test_a_job_queued_before_the_eviction_waits_for_its_copy(make_dev, gate):
    dev = make_dev(vram_size=8 * MiB)
    a = dev.create_context("a")
    win = Window(dev, a)
    bo = a.alloc(MiB)
    data = np.arange(MiB // 4, dtype=np.float32) - 5
    put(a, win, bo, data)
    g = gate()
    f = a.submit_copy(bo.va, W + MiB, data.nbytes, wait=[g])  # queued: touches no memory yet
    with dev.lock:
        assert dev._evict_bo(bo)
        assert bo.moving in f.job.deps
    g.signal()
    assert f.wait(5) and f.error is None
    assert np.array_equal(got(win, data), data)


def test_a_job_of_the_owner_restores_its_buffers_first_and_waits_for_them(make_dev):
    dev = make_dev(vram_size=8 * MiB)
    a = dev.create_context("a")
    win = Window(dev, a)
    bo = a.alloc(MiB)
    data = np.arange(MiB // 4, dtype=np.float32) * 2
    put(a, win, bo, data)
    with dev.lock:
        assert dev._evict_bo(bo)
    assert a.wait_idle(5)
    with dev.lock:
        dev._reclaim_locked()
    assert bo.evicted and not bo.moving
    with dev.lock:
        f = get(a, win, bo, data)  # VRAM is free: the restore starts first
        assert not bo.evicted and bo.moving in f.job.deps
    assert f.wait(5) and f.error is None
    assert np.array_equal(got(win, data), data)


class FailingMoveCopies:
    """The copy engine `engine` runs the kernel VMID's COPY packets (buffer moves) as a
    fault (`mode="fault"`: their destination is an unmapped bus address) or as a hung DMA
    (`mode="hang"`: the copy makes no progress until an engine reset stops it)."""

    def __init__(self, dev, engine, mode):
        cp = dev.gpu.engines[engine].cp
        self.orig, body_dw = cp._ib_ops[packets.PKT_COPY]  # (COPY runs inside an IB)
        self.cp = cp
        self.mode = mode
        self.active = True
        cp._ib_ops[packets.PKT_COPY] = (self._copy, body_dw)

    def _copy(self, body, vmid, ctl):
        if not (self.active and vmid == regs.VMID_KERNEL):
            return self.orig(body, vmid, ctl)
        if self.mode == "hang":
            while not ctl.stopped():
                time.sleep(0.001)
            return None
        bad = 0x7FFF_0000_0000  # mapped nowhere: the copy faults
        body = list(body)
        body[2], body[3] = bad & 0xFFFF_FFFF, bad >> 32
        return self.orig(body, vmid, ctl)


def a_buffer_with_data(make_dev, **kw):
    """-> (device, context "a", its host window, a 1 MiB BO in VRAM, the data it holds)."""
    dev = make_dev(vram_size=8 * MiB, **kw)
    a = dev.create_context("a")
    win = Window(dev, a)
    bo = a.alloc(MiB)
    data = np.arange(MiB // 4, dtype=np.float32)
    put(a, win, bo, data)
    return dev, a, win, bo, data


def test_a_failed_eviction_copy_leaves_the_buffer_in_vram_with_its_data(make_dev):
    dev, a, win, bo, data = a_buffer_with_data(make_dev)
    FailingMoveCopies(dev, regs.ENGINE_COPY1, "fault")
    avail = dev.mm.avail
    with dev.lock:
        assert dev._evict_bo(bo)
        move = bo.moving
    assert move.wait(5)
    assert dev.mem_counters["moves_failed"] == 1
    assert not bo.evicted and a.evicted_bos == 0 and dev.evicted_bytes == 0
    assert not a.vm.walk(bo.va) & regs.PTE_SYSTEM
    assert dev.mm.avail == avail  # its VRAM was not freed
    f = get(a, win, bo, data)
    assert f.wait(5) and f.error is None
    assert np.array_equal(got(win, data), data)


def test_a_failed_restore_copy_leaves_the_buffer_in_host_memory_with_its_data(make_dev):
    dev, a, win, bo, data = a_buffer_with_data(make_dev)
    with dev.lock:
        assert dev._evict_bo(bo)
        move = bo.moving
    assert move.wait(5) and bo.evicted
    FailingMoveCopies(dev, regs.ENGINE_COPY0, "fault")
    avail = dev.mm.avail
    with dev.lock:
        assert dev._restore_bo(bo)
        move = bo.moving
    assert move.wait(5)
    assert dev.mem_counters["moves_failed"] == 1
    assert bo.evicted and a.evicted_bos == 1 and a.vm.walk(bo.va) & regs.PTE_SYSTEM
    assert dev.mm.avail == avail  # the VRAM it was to move into went back
    f = get(a, win, bo, data)
    assert f.wait(5) and f.error is None
    assert np.array_equal(got(win, data), data)


def test_a_hung_move_is_reset_and_later_moves_still_run(make_dev):
    """TDR loses the move context with its hung copy; the device takes a fresh one, so
    the next eviction still works instead of every later allocation running out of VRAM."""
    dev, a, win, bo, data = a_buffer_with_data(make_dev, job_timeout_ns=200_000_000)
    hang = FailingMoveCopies(dev, regs.ENGINE_COPY1, "hang")
    lost = dev._move_ctx
    with dev.lock:
        assert dev._evict_bo(bo)
        move = bo.moving
    assert move.wait(30)
    assert lost.lost and dev._move_ctx is not lost and not dev._move_ctx.lost
    assert not bo.evicted and dev.evicted_bytes == 0  # the hung move was abandoned
    hang.active = False
    with dev.lock:
        assert dev._evict_bo(bo)
        move = bo.moving
    assert move.wait(5) and move.error is None and bo.evicted
    assert np.array_equal(bo.sysmem.buf.view(np.float32), data)
