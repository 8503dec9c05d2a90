"""host/hw sysmem, vram, mmio and interrupts: the small blocks on their own."""

import threading

import numpy as np
import pytest

from pvgpu.host.hw.interrupts import MAX_LATCHED, Interrupt, InterruptController
from pvgpu.host.hw.mmio import RO, RW, WO, RegisterFile
from pvgpu.host.hw.regs import IRQ_FENCE, IRQ_PAGE_FAULT, PAGE_SIZE
from pvgpu.host.hw.sysmem import SYSMEM_BUS_BASE, SysmemFault, SystemMemory
from pvgpu.host.hw.vram import Vram, VramRangeError


# ------------------------------------------------------------------ SystemMemory
def test_dma_map_gives_unique_page_aligned_bus_addresses():
    sm = SystemMemory()
    bufs = [np.zeros(n, np.uint8) for n in (1, 4096, 5000, 0)]
    addrs = [sm.dma_map(b) for b in bufs]
    assert addrs[0] == SYSMEM_BUS_BASE
    assert all(a % PAGE_SIZE == 0 for a in addrs) and len(set(addrs)) == 4
    # mappings never touch: a page of hole after each
    for a, b, buf in zip(addrs, addrs[1:], bufs):
        assert b >= a + len(buf) + PAGE_SIZE
    sm.dma_unmap(addrs[1])
    assert sm.dma_map(np.zeros(8, np.uint8)) not in addrs  # never reused
    with pytest.raises(ValueError):
        sm.dma_unmap(addrs[1])


def test_sysmem_view_and_faults():
    sm = SystemMemory()
    buf = np.arange(5000, dtype=np.uint32).astype(np.uint8)
    bus = sm.dma_map(buf)
    v = sm.view(bus + 10, 100, write=True)
    assert np.shares_memory(v, buf) and np.array_equal(v, buf[10:110])
    with pytest.raises(SysmemFault) as e:
        sm.view(bus + 4990, 20)  # runs off the end
    assert e.value.address == bus + 5000
    for addr in (bus - 1, bus + 5000, bus + PAGE_SIZE * 2, SYSMEM_BUS_BASE - PAGE_SIZE):
        with pytest.raises(SysmemFault):
            sm.view(addr, 1)
    ro = np.frombuffer(b"x" * 100, np.uint8)
    rbus = sm.dma_map(ro)
    assert sm.view(rbus, 100).tobytes() == b"x" * 100
    with pytest.raises(SysmemFault):
        sm.view(rbus, 100, write=True)
    sm.dma_unmap(bus)
    with pytest.raises(SysmemFault):
        sm.view(bus, 1)


def test_dma_map_rejects_non_byte_arrays():
    sm = SystemMemory()
    for bad in (bytearray(10), np.zeros(4, np.float32), np.zeros((2, 2), np.uint8),
                np.zeros(10, np.uint8)[::2]):
        with pytest.raises((TypeError, ValueError)):
            sm.dma_map(bad)


def test_sysmem_is_thread_safe():
    sm = SystemMemory()
    errors = []

    def worker():
        try:
            for _ in range(300):
                b = np.zeros(100, np.uint8)
                bus = sm.dma_map(b)
                sm.view(bus, 100, write=True)[:] = 1
                sm.dma_unmap(bus)
                assert (b == 1).all()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors and sm.num_mappings == 0 and sm.mapped_bytes == 0


# --------------------------------------------------------------------------- Vram
def test_vram_accessors():
    v = Vram(1 << 20)
    assert v.size == 1 << 20 and not v.mem.any()
    v.write(100, b"\x01\x02\x03")
    assert v.read(99, 5) == b"\x00\x01\x02\x03\x00"
    v.write_u32(200, 0xDEADBEEF)
    assert v.read(200, 4) == bytes.fromhex("efbeadde") and v.read_u32(200) == 0xDEADBEEF
    for addr in (4096, 4099):  # aligned and unaligned
        v.write_u64(addr, 0x0123456789ABCDEF)
        assert v.read_u64(addr) == 0x0123456789ABCDEF
        assert v.read(addr, 8) == (0x0123456789ABCDEF).to_bytes(8, "little")
    v.write(8192, np.array([1.5, 2.5], np.float32))
    assert np.array_equal(v.view(8192, 8).view(np.float32), [1.5, 2.5])
    v.fill(8192, 8, 0xFF)
    assert v.read(8192, 8) == b"\xff" * 8


@pytest.mark.parametrize("call", [
    lambda v: v.read((1 << 20) - 4, 8),
    lambda v: v.write((1 << 20) - 1, b"ab"),
    lambda v: v.view(-1, 4),
    lambda v: v.read_u64(1 << 20),
    lambda v: v.write_u32((1 << 20) - 2, 1),
    lambda v: v.fill(0, (1 << 20) + 1),
])
def test_vram_bounds_are_checked(call):
    with pytest.raises(VramRangeError):
        call(Vram(1 << 20))


def test_vram_size_must_be_pages():
    with pytest.raises(ValueError):
        Vram(5000)


# --------------------------------------------------------------------- RegisterFile
def test_register_file_modes_and_hooks():
    rf = RegisterFile()
    seen = []
    rf.define(0x0, "ID", RO, 0x1234)
    rf.define(0x8, "CTL", RW, on_write=seen.append)
    rf.define(0x10, "KICK", WO, on_write=seen.append)
    rf.define(0x18, "LIVE", RO, on_read=lambda: 77)
    assert rf.read(0x0) == 0x1234
    rf.write(0x0, 5)
    assert rf.read(0x0) == 0x1234 and rf.ignored_writes == 1
    rf.write(0x8, -1)
    assert rf.read(0x8) == (1 << 64) - 1 and seen == [(1 << 64) - 1]
    rf.write(0x10, 3)
    assert rf.read(0x10) == 0 and seen[-1] == 3
    assert rf.read(0x18) == 77
    assert rf.read(0x1000) == 0 and rf.read(0x4) == 0 and rf.unknown_reads == 2
    rf.write(0x1000, 1)
    assert rf.unknown_writes == 1


def test_a_register_reader_reads_as_read_does():
    """reader(offset): a hooked register's hook itself; any other offset reads as read()."""
    rf = RegisterFile()
    clock = iter(range(100, 200))
    rf.define(0x0, "TIMESTAMP", RO, on_read=lambda: next(clock))
    rf.define(0x8, "ID", RO, 0x1234)
    rf.define(0x10, "KICK", WO, on_read=lambda: 99)
    ts = rf.reader(0x0)
    assert (ts(), ts(), rf.read(0x0)) == (100, 101, 102)
    assert rf.reader(0x8)() == 0x1234 and rf.reader(0x10)() == 0
    assert rf.reader(0x1000)() == 0 and rf.unknown_reads == 1


def test_a_register_writer_writes_as_write_does():
    """writer(offset): a write-only register's hook itself; any other offset writes as
    write() (stored, masked, read-only and unknown ones ignored)."""
    rf = RegisterFile()
    kicked, stored = [], []
    rf.define(0x0, "KICK", WO, on_write=kicked.append)
    rf.define(0x8, "WPTR", RW, on_write=stored.append)
    rf.define(0x10, "ID", RO, 0x1234)
    kick = rf.writer(0x0)
    assert kick == kicked.append  # no register file in between
    kick(5)
    rf.write(0x0, 6)
    assert kicked == [5, 6] and rf.read(0x0) == 0  # (write-only: reads as 0)
    rf.writer(0x8)(-1)
    assert stored == [(1 << 64) - 1] and rf.read(0x8) == (1 << 64) - 1
    rf.writer(0x10)(7)
    rf.writer(0x1000)(7)
    assert rf.read(0x10) == 0x1234 and rf.ignored_writes == 1 and rf.unknown_writes == 1


# ----------------------------------------------------------------- interrupts
def test_interrupts_are_delivered_synchronously_when_enabled():
    ic = InterruptController()
    got = []
    ic.set_handler(lambda irq: got.append((irq, threading.current_thread())))
    ic.set_enabled(True)
    irq = Interrupt(IRQ_FENCE, 0, data=5)
    ic.raise_irq(irq)
    assert got == [(irq, threading.current_thread())]
    assert ic.delivered == 1 and ic.counts[IRQ_FENCE] == 1


def test_interrupts_latch_while_disabled_and_deliver_on_enable():
    ic = InterruptController()
    got = []
    ic.set_handler(got.append)
    irqs = [Interrupt(IRQ_FENCE, 0, data=i) for i in range(MAX_LATCHED + 3)]
    for irq in irqs:
        ic.raise_irq(irq)
    assert got == [] and ic.latched == MAX_LATCHED and ic.dropped == 3
    ic.set_enabled(True)
    assert got == irqs[3:] and ic.latched == 0


def test_handler_exceptions_are_contained():
    ic = InterruptController()
    ic.set_enabled(True)
    ic.raise_irq(Interrupt(IRQ_FENCE, 0))  # no handler
    assert ic.unhandled == 1

    def bad(irq):
        raise RuntimeError("driver bug")

    ic.set_handler(bad)
    ic.raise_irq(Interrupt(IRQ_PAGE_FAULT, 1, vmid=3, address=0x1000, access=2))
    assert ic.handler_errors == 1 and ic.delivered == 0
