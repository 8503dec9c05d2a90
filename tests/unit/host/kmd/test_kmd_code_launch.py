"""Code launches in the KMD against the real emulated GPU: executable buffer objects, the
kernarg area, PKT_LAUNCH_CODE jobs, code faults, implicit sync and TDR. Code objects are
built by hand (pvgpu/conformance/codeobj.py)."""

import struct

import numpy as np
import pytest

from pvgpu.conformance import codeobj
from pvgpu.host.hw import regs
from pvgpu.host.kmd import GpuFault, InvalidArgument
from pvgpu.host.kmd.errors import ContextLost
from pvgpu.host.kmd.bo import CodeFault
from pvgpu.host.kmd.fence import Fence
from pvgpu.host.kmd.kernarg import SLOT_SIZE, KernargArea
from pvgpu.spec import isa, wire

from test_kmd_device import Window

P = regs.PAGE_SIZE
W = wire.GUEST_WINDOW_VA


@pytest.fixture
def dev(make_dev):
    return make_dev()


def load(ctx, win, obj: bytes, off=0):
    """An executable BO holding `obj` -> (bo, object_va)."""
    bo = ctx.alloc(len(obj), executable=True)
    f = ctx.submit_copy(win.put(off, obj), bo.va, len(obj))
    assert f.wait(5) and f.error is None
    return bo, bo.va


def read(ctx, win, va, n, off=1 << 19):
    f = ctx.submit_copy(va, W + off, n)
    assert f.wait(5) and f.error is None, f.error
    return win.buf[off:off + n].copy()


def out_n(va, n):
    return struct.pack("<QI", va, n)


def pte_flags(ctx, va):
    return ctx.vm.walk(va) & ~regs.PTE_ADDR_MASK


# ---------------------------------------------------------------------- memory
def test_executable_allocations_and_the_kernarg_area(dev):
    ctx = dev.create_context()
    code = ctx.alloc(P, executable=True)
    data = ctx.alloc(P)
    assert pte_flags(ctx, code.va) & regs.PTE_EXEC and pte_flags(ctx, code.va) & regs.PTE_WRITE
    assert not pte_flags(ctx, data.va) & regs.PTE_EXEC
    assert ctx.kernargs is None  # made at the first code launch
    win = Window(dev, ctx)
    _bo, obj_va = load(ctx, win, codeobj.kernels())
    f = ctx.submit_launch_code(obj_va, codeobj.entry_va(obj_va, codeobj.kernels(), 2), 1, 32, 0, b"")
    f.wait(5)
    area = ctx.kernargs
    hw_limit = dev.schedulers[regs.ENGINE_COMPUTE].hw_limit
    assert area.size == hw_limit * SLOT_SIZE and area.in_use == 0
    flags = pte_flags(ctx, area.va)
    assert flags & regs.PTE_READ and not flags & (regs.PTE_WRITE | regs.PTE_EXEC)
    assert wire.VA_USER_BASE <= area.va < wire.VA_USER_LIMIT
    vram_before = dev.vram_free()
    dev.destroy_context(ctx)
    assert dev.wait_idle(5)
    dev.reclaim()
    assert dev.vram_free() > vram_before  # the area went with the context


def test_kernarg_slots_write_across_extents(dev):
    ctx = dev.create_context()
    with dev.lock:
        area = KernargArea(dev, ctx, 3)
    area.extents = [(p, P) for p, _n in area.extents for p in range(p, p + _n, P)][::-1]
    data = bytes(range(256)) * (SLOT_SIZE // 256)
    slots = [area.take(data) for _ in range(3)]
    assert sorted(slots) == [0, 1, 2] and area.take(b"x") is None and area.in_use == 3
    for s in slots:
        phys = area.extents[s * SLOT_SIZE // P][0]
        assert dev.vram.view(phys, 256).tobytes() == data[:256]
    area.give_back(1)
    assert area.take(b"\7" * 8) == 1 and area.stats["exhausted"] == 1
    with pytest.raises(InvalidArgument):
        ctx.submit_launch_code(1 << 32, 1 << 32, 1, 32, 0, bytes(isa.MAX_PARAM_SIZE + 1))
    with pytest.raises(InvalidArgument):
        ctx.submit_launch_code(1 << 32, 1 << 32, 1, 32, -1, b"")


# ---------------------------------------------------------------------- running code
def test_a_code_launch_runs_with_its_parameters(dev):
    ctx = dev.create_context()
    win = Window(dev, ctx)
    obj = codeobj.store_index()
    _bo, obj_va = load(ctx, win, obj)
    out = ctx.alloc(4 * 1000)
    f = ctx.submit_launch_code(obj_va, codeobj.entry_va(obj_va, obj), (8, 1, 1), (128, 1, 1), 0,
                               out_n(out.va, 1000))
    assert f.wait(10) and f.error is None, f.error
    np.testing.assert_array_equal(read(ctx, win, out.va, 4000).view(np.uint32), np.arange(1000))
    assert ctx.stats["code_launches"] == 1 and ctx.kernargs.in_use == 0


def test_code_launches_are_scheduled_and_accounted_like_built_in_ones(make_dev):
    from pvgpu.host.kmd.sched import VgpuShares
    a = VgpuShares("A", compute=50)
    dev = make_dev(policy="credit", vgpus=[a])
    ctx = dev.create_context(vgpu=a)
    win = Window(dev, ctx)
    obj = codeobj.store_index()
    _bo, obj_va = load(ctx, win, obj)
    out = ctx.alloc(4 * 4096)
    before = dev.sched_stats()["vgpus"]["A"]["compute"]
    for _ in range(3):
        f = ctx.submit_launch_code(obj_va, codeobj.entry_va(obj_va, obj), 16, 256, 0,
                                   out_n(out.va, 4096))
    assert f.wait(10) and f.error is None
    after = dev.sched_stats()["vgpus"]["A"]["compute"]
    assert after["jobs"] == before["jobs"] + 3 and after["busy_ns"] > before["busy_ns"]
    assert dev.sched_stats()["vgpus"]["default"].get("compute", {}).get("jobs", 0) == 0


def test_many_launches_recycle_the_parameter_slots(dev):
    ctx = dev.create_context()
    win = Window(dev, ctx)
    obj = codeobj.store_index()
    _bo, obj_va = load(ctx, win, obj)
    outs = [ctx.alloc(4 * 64) for _ in range(12)]
    fences = [ctx.submit_launch_code(obj_va, codeobj.entry_va(obj_va, obj), 1, 64, 0,
                                     out_n(o.va, 10 + i)) for i, o in enumerate(outs)]
    for f in fences:
        assert f.wait(10) and f.error is None, f.error
    for i, o in enumerate(outs):  # every launch saw its own parameters
        got = read(ctx, win, o.va, 4 * 64).view(np.uint32)
        np.testing.assert_array_equal(got[:10 + i], np.arange(10 + i))
        assert not got[10 + i:].any()
    assert ctx.kernargs.stats["taken"] == 12 and ctx.kernargs.stats["exhausted"] == 0


def test_code_faults_become_job_errors_and_the_context_carries_on(dev):
    ctx = dev.create_context()
    seen = []
    ctx.error_listener = lambda c, err, timeline, engine: seen.append((err, timeline, engine))
    win = Window(dev, ctx)
    obj = codeobj.kernels()
    _bo, obj_va = load(ctx, win, obj)
    trap_va = codeobj.entry_va(obj_va, obj, 2)
    f = ctx.submit_launch_code(obj_va, trap_va, 1, 32, 0, b"", timeline=3)
    assert f.wait(10)
    assert isinstance(f.error, CodeFault) and f.error.reason == isa.COBJ_ERR_TRAP
    assert f.error.vmid == ctx.vmid and f.error.engine == regs.ENGINE_COMPUTE
    assert seen and seen[0][0] is f.error and seen[0][1:] == (3, regs.ENGINE_COMPUTE)
    assert ctx.faults == [f.error] and not ctx.lost
    # a launch naming no entry record, and one whose object is not executable
    f = ctx.submit_launch_code(obj_va, obj_va + 4, 1, 32, 0, b"")
    assert f.wait(10) and isinstance(f.error, CodeFault) and f.error.reason == isa.COBJ_ERR_ENTRY
    plain = ctx.alloc(len(obj))
    assert ctx.submit_copy(win.put(0, obj), plain.va, len(obj)).wait(5)
    f = ctx.submit_launch_code(plain.va, codeobj.entry_va(plain.va, obj), 1, 32, 0, b"")
    assert f.wait(10) and isinstance(f.error, GpuFault)
    assert f.error.access == wire.ACCESS_EXEC and f.error.address == plain.va
    # the context still runs code
    out = ctx.alloc(4 * 32)
    f = ctx.submit_launch_code(obj_va, codeobj.entry_va(obj_va, obj, 0), 1, 32, 0, out_n(out.va, 32))
    assert f.wait(10) and f.error is None
    np.testing.assert_array_equal(read(ctx, win, out.va, 128).view(np.uint32), np.arange(32))


def test_a_looping_code_launch_is_stopped_by_tdr(make_dev):
    dev = make_dev(job_timeout_ns=300_000_000)
    ctx = dev.create_context()
    other = dev.create_context()
    win = Window(dev, ctx)
    obj = codeobj.kernels()
    _bo, obj_va = load(ctx, win, obj)
    f = ctx.submit_launch_code(obj_va, codeobj.entry_va(obj_va, obj, 1), 64, 256, 0, b"")
    assert f.wait(20)
    assert f.error is not None and f.error.code == "job_timeout" and ctx.lost
    with pytest.raises(ContextLost):
        ctx.submit_launch_code(obj_va, codeobj.entry_va(obj_va, obj, 0), 1, 32, 0, out_n(0, 0))
    # a context lost before its first code launch gets no kernarg area (CMD-LAUNCH-CODE-1)
    burnt = dev.create_context()
    b = burnt.submit_launch(wire.KERNEL_BURN, 1, 1, [wire.BURN_FOREVER])
    assert b.wait(20) and burnt.lost
    with pytest.raises(ContextLost):
        burnt.submit_launch_code(obj_va, codeobj.entry_va(obj_va, obj, 0), 1, 32, 0, b"")
    assert burnt.kernargs is None
    win2 = Window(dev, other)
    _bo2, va2 = load(other, win2, obj)  # the device and other contexts carry on
    out = other.alloc(4 * 32)
    g = other.submit_launch_code(va2, codeobj.entry_va(va2, obj), 1, 32, 0, out_n(out.va, 32))
    assert g.wait(10) and g.error is None, g.error


def test_a_code_launch_syncs_implicitly_with_every_shared_buffer(make_dev):
    """spec PRIME-SYNC-2: the launch waits for the writers of every shared buffer of its
    context, and later readers of them wait for it (it may write any of them)."""
    dev = make_dev()
    ctx = dev.create_context()
    win = Window(dev, ctx)
    obj = codeobj.kernels()
    _bo, obj_va = load(ctx, win, obj)
    shared = ctx.alloc(P)
    dmabuf = ctx.export_dmabuf(shared)
    trap = codeobj.entry_va(obj_va, obj, 2)
    # a writer of the shared buffer held back by a gate; the launch on another timeline
    gate = Fence(-1, 0)
    w = ctx.submit_copy(win.put(0, b"\1" * 16), shared.va, 16, wait=[gate], timeline=1)
    launch = ctx.submit_launch_code(obj_va, trap, 1, 32, 0, b"", timeline=2)
    assert not launch.wait(0.3)
    gate.signal()
    assert w.wait(5) and launch.wait(10)
    assert launch.timestamp >= w.timestamp
    # a reader on a third timeline waits for a launch held back by a gate
    gate2 = Fence(-1, 0)
    launch2 = ctx.submit_launch_code(obj_va, trap, 1, 32, 0, b"", wait=[gate2], timeline=2)
    r = ctx.submit_copy(shared.va, W + 4096, 16, timeline=3)
    assert not r.wait(0.3)
    gate2.signal()
    assert launch2.wait(10) and r.wait(5) and r.timestamp >= launch2.timestamp
    # without a shared buffer in the context, nothing holds a launch back
    other = dev.create_context()
    win2 = Window(dev, other)
    _bo2, va2 = load(other, win2, obj)
    assert other.submit_launch_code(va2, codeobj.entry_va(va2, obj, 2), 1, 32, 0, b"").wait(10)
    dmabuf.put()
