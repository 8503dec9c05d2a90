"""host/hw engines, command processor and Gpu: driven only through VRAM, MMIO and IRQs."""

import threading
import time

import numpy as np
import pytest
from hwtest import RO, Ring, irq_collector, poll, vm_setup, wait_for

from host.hw import packets as P
from host.hw.gpu import Gpu, Platform
from host.hw.regs import (DEVICE_ID_PVGPU_EMU, ENGINE_COMPUTE, ENGINE_COPY, IRQ_FENCE,
                          IRQ_ILLEGAL_PACKET, IRQ_PAGE_FAULT, PAGE_SIZE, PTE_SYSTEM, PTE_WRITE,
                          RB_DOORBELL, RB_RESET, RB_RPTR, RB_SIZE, RB_STATUS, RB_STATUS_BUSY,
                          RB_STATUS_IDLE, RB_WPTR, REG_DEVICE_ID, REG_ENGINE, REG_IRQ_ENABLE,
                          REG_VM_INVALIDATE, REG_VRAM_SIZE)
from host.hw.sysmem import SystemMemory
from spec.wire import (ACCESS_READ, ACCESS_WRITE, KERNEL_BURN, KERNEL_SCALE,
                       KERNEL_VECTOR_ADD)

VRAM_SIZE = 64 << 20
TABLES = 1 << 20
RING_C = 2 << 20  # compute ring
RING_D = RING_C + (64 << 10)  # copy ring
IBS = 3 << 20
FENCES = 4 << 20
DATA = 8 << 20  # VA 1 << 32 maps here (16 MiB)
VA = 1 << 32
VMID = 1
ONE = (1, 1, 1)


def fence_addr(i):
    return FENCES + 8 * i


class Dev:
    def __init__(self, gpu):
        self.gpu = gpu
        self.irqs, self.cond = irq_collector(gpu)
        self.pt = vm_setup(gpu, VMID, TABLES)
        self.pt.map(VA, DATA, 4096)
        self.comp = Ring(gpu, ENGINE_COMPUTE, RING_C)
        self.copy = Ring(gpu, ENGINE_COPY, RING_D)
        self.ib_next = IBS

    def ib(self, data: bytes, vmid=VMID) -> bytes:
        """Write an IB into VRAM; -> the INDIRECT_BUFFER packet that runs it."""
        addr = self.ib_next
        self.gpu.vram.write(addr, data)
        self.ib_next += (len(data) + 255) // 256 * 256
        return P.indirect_buffer(addr, len(data) // 4, vmid)

    def put(self, va, arr):
        self.gpu.vram.write(DATA + va - VA, np.ascontiguousarray(arr))

    def get(self, va, n, dtype=np.float32):
        return self.gpu.vram.view(DATA + va - VA, n * np.dtype(dtype).itemsize).view(dtype).copy()

    def wait_irq(self, source, data=None, timeout=5.0):
        def match():
            return [i for i in self.irqs
                    if i.source == source and (data is None or i.data == data)]
        wait_for(self.cond, lambda: match(), timeout)
        return match()[0]

    def reg(self, engine, reg):
        return self.gpu.mmio.read(REG_ENGINE(engine, reg))


@pytest.fixture
def gpu():
    g = Gpu(0, VRAM_SIZE, SystemMemory())
    g.start()
    yield g
    assert g.stop(), "engine threads did not stop"


@pytest.fixture
def dev(gpu):
    return Dev(gpu)


def test_identity_registers(gpu):
    assert gpu.mmio.read(REG_DEVICE_ID) == DEVICE_ID_PVGPU_EMU
    assert gpu.mmio.read(REG_VRAM_SIZE) == VRAM_SIZE == gpu.vram.size
    assert gpu.mmio.read(0x7F8) == 0 and gpu.mmio.unknown_reads == 1
    gpu.mmio.write(0x7F8, 1)
    assert gpu.mmio.unknown_writes == 1
    gpu.mmio.write(REG_VRAM_SIZE, 1)
    assert gpu.mmio.read(REG_VRAM_SIZE) == VRAM_SIZE
    assert gpu.mmio.read(REG_ENGINE(ENGINE_COMPUTE, RB_STATUS)) == RB_STATUS_IDLE


def test_ring_with_ib_copy_launch_and_fences(dev):
    """Copy engine: IB[COPY] + FENCE. Compute engine: WAIT on that fence, IB[LAUNCH] + FENCE."""
    n = 10000
    a = np.arange(n, dtype=np.float32)
    b = np.full(n, 0.5, np.float32)
    dev.put(VA, a)
    dev.put(VA + 0x10000, b)
    # compute first: it must wait for the copy (b -> VA + 0x20000) before adding
    dev.comp.submit(P.wait(fence_addr(0), 1)
                    + dev.ib(P.launch(KERNEL_VECTOR_ADD, (40, 1, 1), (256, 1, 1),
                                      [VA, VA + 0x20000, VA + 0x30000, n]))
                    + P.fence(fence_addr(1), 2))
    assert dev.reg(ENGINE_COMPUTE, RB_STATUS) == RB_STATUS_BUSY
    dev.copy.submit(dev.ib(P.copy(VA + 0x10000, VA + 0x20000, 4 * n)) + P.fence(fence_addr(0), 1))
    irq = dev.wait_irq(IRQ_FENCE, 2)
    assert (irq.engine, irq.address) == (ENGINE_COMPUTE, fence_addr(1))
    assert np.array_equal(dev.get(VA + 0x30000, n), a + b)
    assert dev.gpu.vram.read_u64(fence_addr(0)) == 1 and dev.gpu.vram.read_u64(fence_addr(1)) == 2
    copy_irq = dev.wait_irq(IRQ_FENCE, 1)
    assert copy_irq.engine == ENGINE_COPY
    assert dev.reg(ENGINE_COMPUTE, RB_RPTR) == dev.comp.wptr == dev.reg(ENGINE_COMPUTE, RB_WPTR)
    assert not [i for i in dev.irqs if i.source != IRQ_FENCE]


def test_wait_sees_cpu_writes(dev):
    dev.comp.submit(P.wait(fence_addr(5), 3) + P.fence(fence_addr(6), 9))
    dev.gpu.vram.write_u64(fence_addr(5), 2)  # not enough
    dev.gpu.vram.write_u64(fence_addr(5), 3)
    dev.wait_irq(IRQ_FENCE, 9)


def test_ring_wraparound_with_packets_straddling_the_end(dev):
    ring = dev.comp
    ring.submit(P.nop(1013) + P.fence(fence_addr(0), 10))  # 4076 bytes
    dev.wait_irq(IRQ_FENCE, 10)  # consumed: the next packet straddles the 4 KiB end
    dev.put(VA, np.ones(8, np.float32))
    # a ring packet runs in VMID 0: physical addresses
    launch = P.launch(KERNEL_SCALE, ONE, (8, 1, 1), [DATA + 64, DATA, 0x40400000, 8])  # alpha 3
    ring.submit(launch + P.fence(fence_addr(0), 11))
    dev.wait_irq(IRQ_FENCE, 11)
    assert np.array_equal(dev.get(VA + 64, 8), np.full(8, 3, np.float32))
    assert ring.wptr == (4076 + len(launch) + 24) % 4096
    assert dev.reg(ENGINE_COMPUTE, RB_RPTR) == ring.wptr
    # and a fence whose own body straddles the end
    ring.submit(P.nop((4096 - ring.wptr) // 4 - 2))
    ring.submit(P.fence(fence_addr(1), 12))
    dev.wait_irq(IRQ_FENCE, 12)
    assert dev.gpu.vram.read_u64(fence_addr(1)) == 12


def test_faulting_launch_raises_page_fault_skips_the_ib_and_the_fence_still_arrives(dev):
    dev.put(VA, np.ones(2048, np.float32))
    unmapped = VA + (16 << 20) - PAGE_SIZE  # last mapped page, then nothing
    ib = dev.ib(P.launch(KERNEL_SCALE, ONE, (2048, 1, 1), [unmapped, VA, 0x40000000, 2048])
                + P.launch(KERNEL_SCALE, ONE, (16, 1, 1), [VA + 0x8000, VA, 0x40000000, 16]))
    dev.comp.submit(ib + P.fence(fence_addr(0), 1))
    dev.wait_irq(IRQ_FENCE, 1)
    faults = [i for i in dev.irqs if i.source == IRQ_PAGE_FAULT]
    assert len(faults) == 1
    f = faults[0]
    assert (f.engine, f.vmid, f.address, f.access) == (ENGINE_COMPUTE, VMID, VA + (16 << 20),
                                                       ACCESS_WRITE)
    assert dev.irqs.index(f) < [i.source for i in dev.irqs].index(IRQ_FENCE)
    assert (dev.get(VA + 0x8000, 16) == 0).all()  # the rest of the IB was skipped
    assert (dev.get(unmapped, 1024) == 0).all()  # nothing written before the fault


def test_faulting_copy_reports_the_source_read(dev):
    dev.copy.submit(dev.ib(P.copy(VA + (20 << 20), VA, 4096)) + P.fence(fence_addr(0), 1))
    dev.wait_irq(IRQ_FENCE, 1)
    f = [i for i in dev.irqs if i.source == IRQ_PAGE_FAULT][0]
    assert (f.engine, f.vmid, f.address, f.access) == (ENGINE_COPY, VMID, VA + (20 << 20),
                                                       ACCESS_READ)


def test_copy_between_system_memory_and_vram(dev):
    host = np.random.default_rng(0).integers(0, 256, 3 * PAGE_SIZE, dtype=np.uint8)
    back = np.zeros_like(host)
    hva, bva = VA + (1 << 30), VA + (2 << 30)
    dev.pt.map(hva, dev.gpu.sysmem.dma_map(host), 3, RO | PTE_SYSTEM)
    dev.pt.map(bva, dev.gpu.sysmem.dma_map(back), 3, RO | PTE_SYSTEM | PTE_WRITE)
    dev.copy.submit(dev.ib(P.copy(hva + 5, VA + 5, 3 * PAGE_SIZE - 10)
                           + P.copy(VA + 5, bva + 5, 3 * PAGE_SIZE - 10))
                    + P.fence(fence_addr(0), 1))
    dev.wait_irq(IRQ_FENCE, 1)
    assert np.array_equal(back[5:-5], host[5:-5]) and not back[:5].any() and not back[-5:].any()


@pytest.mark.parametrize("case", [
    "unknown_opcode", "fence_in_ib", "ib_in_ib", "copy_on_compute", "unknown_kernel",
    "wrong_nargs", "bad_length", "past_ib_end", "ib_outside_vram", "launch_on_copy"])
def test_illegal_packets(dev, case):
    engine, ring = ENGINE_COMPUTE, dev.comp
    marker = P.launch(KERNEL_SCALE, ONE, (4, 1, 1), [VA + 0x100, VA, 0x40000000, 4])
    dev.put(VA, np.ones(4, np.float32))
    ib_vmid = VMID
    if case == "unknown_opcode":
        bad, in_ib = bytes.fromhex("7f000000"), False
    elif case == "fence_in_ib":
        bad, in_ib = P.fence(fence_addr(3), 1), True
    elif case == "ib_in_ib":
        bad, in_ib = P.indirect_buffer(IBS, 1, VMID), True
    elif case == "copy_on_compute":
        bad, in_ib = P.copy(VA, VA + 64, 16), True
    elif case == "unknown_kernel":
        bad, in_ib = P.launch(99, ONE, ONE, []), True
    elif case == "wrong_nargs":
        bad, in_ib = P.launch(KERNEL_SCALE, ONE, ONE, [VA, VA]), True
    elif case == "bad_length":
        bad, in_ib = P.header(P.PKT_TLB_FLUSH, 2).to_bytes(4, "little") + bytes(8), False
    elif case == "past_ib_end":  # header promises 5 dwords, the IB ends after 1
        bad, in_ib = P.header(P.PKT_NOP, 5).to_bytes(4, "little") + bytes(4), True
    elif case == "ib_outside_vram":
        bad, in_ib = P.indirect_buffer(VRAM_SIZE - 4, 2, VMID), False
    elif case == "launch_on_copy":
        engine, ring, bad, in_ib = ENGINE_COPY, dev.copy, marker, True
    if in_ib:
        stream = dev.ib(bad if case == "past_ib_end" else bad + marker, ib_vmid)
    else:
        stream = bad
    ring.submit(stream + P.fence(fence_addr(0), 77))
    dev.wait_irq(IRQ_FENCE, 77)
    ill = [i for i in dev.irqs if i.source == IRQ_ILLEGAL_PACKET]
    assert len(ill) == 1 and ill[0].engine == engine
    assert ill[0].data == int.from_bytes(bad[:4], "little")
    assert ill[0].vmid == (ib_vmid if in_ib else 0) and ill[0].address == 0
    assert (dev.get(VA + 0x100, 4) == 0).all()  # the rest of the IB was skipped


def test_packet_running_past_wptr_is_dropped(dev):
    dev.comp.submit(P.fence(fence_addr(0), 5)[:12])  # only 3 of 6 dwords published
    ill = dev.wait_irq(IRQ_ILLEGAL_PACKET)
    assert ill.address == 0 and ill.vmid == 0
    dev.comp.submit(P.fence(fence_addr(0), 6))
    dev.wait_irq(IRQ_FENCE, 6)
    assert not [i for i in dev.irqs if i.source == IRQ_FENCE and i.data == 5]


def test_bad_ring_configuration_is_reported(dev):
    gpu = dev.gpu
    gpu.mmio.write(REG_ENGINE(ENGINE_COPY, RB_SIZE), 3000)
    gpu.mmio.write(REG_ENGINE(ENGINE_COPY, RB_DOORBELL), 8)
    ill = dev.wait_irq(IRQ_ILLEGAL_PACKET)
    assert (ill.engine, ill.address) == (ENGINE_COPY, RING_D)


def test_tlb_flush_packet_and_register(dev):
    gpu = dev.gpu
    dev.put(VA, np.arange(1024, dtype=np.float32))
    copy = dev.ib(P.copy(VA, VA + 0x100000, PAGE_SIZE))
    dev.copy.submit(copy + P.fence(fence_addr(0), 1))
    dev.wait_irq(IRQ_FENCE, 1)
    # remap the destination page without flushing: the copy still goes to the old page
    dev.pt.map(VA + 0x100000, DATA + 0x200000, 1)
    dev.put(VA, np.full(1024, 5, np.float32))
    dev.copy.submit(copy + P.fence(fence_addr(0), 2))
    dev.wait_irq(IRQ_FENCE, 2)
    assert (dev.get(VA + 0x100000, 1024) == 5).all() and not dev.get(VA + 0x200000, 1).any()
    dev.copy.submit(P.tlb_flush(VMID) + copy + P.fence(fence_addr(0), 3))
    dev.wait_irq(IRQ_FENCE, 3)
    assert (dev.get(VA + 0x200000, 1024) == 5).all()
    dev.pt.map(VA + 0x100000, DATA + 0x300000, 1)
    gpu.mmio.write(REG_VM_INVALIDATE, VMID)
    dev.copy.submit(copy + P.fence(fence_addr(0), 4))
    dev.wait_irq(IRQ_FENCE, 4)
    assert (dev.get(VA + 0x300000, 1024) == 5).all()


def test_rb_reset_stops_a_long_burn(dev):
    gpu = dev.gpu
    dev.comp.submit(P.launch(KERNEL_BURN, ONE, ONE, [30_000_000]) + P.fence(fence_addr(0), 1))
    assert dev.reg(ENGINE_COMPUTE, RB_STATUS) == RB_STATUS_BUSY
    poll(lambda: gpu.engines[ENGINE_COMPUTE].cp.launches == 1)  # the burn is running
    t = time.monotonic()
    gpu.mmio.write(REG_ENGINE(ENGINE_COMPUTE, RB_RESET), 1)
    assert time.monotonic() - t < 1.0
    assert dev.reg(ENGINE_COMPUTE, RB_STATUS) == RB_STATUS_IDLE
    assert dev.reg(ENGINE_COMPUTE, RB_RPTR) == 0 == dev.reg(ENGINE_COMPUTE, RB_WPTR)
    # the engine still works from the start of the ring; the old fence never came
    dev.comp.wptr = 0
    dev.comp.submit(P.fence(fence_addr(0), 2))
    dev.wait_irq(IRQ_FENCE, 2)
    assert not [i for i in dev.irqs if i.data == 1]


def test_rb_reset_from_the_engines_own_interrupt_handler(dev):
    gpu = dev.gpu
    reset_done, fenced = threading.Event(), threading.Event()

    def handler(irq):
        if irq.source == IRQ_PAGE_FAULT:
            gpu.mmio.write(REG_ENGINE(ENGINE_COPY, RB_RESET), 1)  # must not deadlock
            reset_done.set()
        if irq.source == IRQ_FENCE:
            fenced.set()

    gpu.irq.set_handler(handler)
    dev.copy.submit(P.copy(VRAM_SIZE, 0, 8) + P.fence(fence_addr(0), 1))
    assert reset_done.wait(5)
    dev.copy.wptr = 0
    dev.copy.submit(P.fence(fence_addr(1), 2))
    assert fenced.wait(5)
    assert gpu.vram.read_u64(fence_addr(1)) == 2
    assert gpu.vram.read_u64(fence_addr(0)) == 0  # dropped by the reset


def test_rb_reset_releases_a_wait(dev):
    dev.copy.submit(P.wait(fence_addr(0), 1) + P.fence(fence_addr(1), 1))
    t = time.monotonic()
    dev.gpu.mmio.write(REG_ENGINE(ENGINE_COPY, RB_RESET), 1)
    assert time.monotonic() - t < 0.5
    assert dev.reg(ENGINE_COPY, RB_STATUS) == RB_STATUS_IDLE


def test_gpu_stop_returns_promptly_while_burning_and_waiting():
    g = Gpu(0, 16 << 20, SystemMemory())
    g.start()
    comp = Ring(g, ENGINE_COMPUTE, 1 << 20)
    copy = Ring(g, ENGINE_COPY, 2 << 20)
    comp.submit(P.launch(KERNEL_BURN, ONE, ONE, [60_000_000]))
    copy.submit(P.wait(3 << 20, 1))
    poll(lambda: g.engines[ENGINE_COMPUTE].cp.launches == 1
         and g.engines[ENGINE_COPY].cp.waits == 1)
    t = time.monotonic()
    assert g.stop(timeout=1.0)
    assert time.monotonic() - t < 1.0


def test_interrupts_latched_until_enabled_and_handler_errors_contained(dev):
    gpu = dev.gpu
    gpu.mmio.write(REG_IRQ_ENABLE, 0)
    # the second fence (no IRQ) is written after the first one's interrupt was raised
    dev.comp.submit(P.fence(fence_addr(0), 1) + P.fence(fence_addr(1), 1, flags=0))
    with gpu.fence_cond:
        assert gpu.fence_cond.wait_for(lambda: gpu.vram.read_u64(fence_addr(1)) == 1, 5)
    assert dev.irqs == [] and gpu.irq.latched == 1
    gpu.mmio.write(REG_IRQ_ENABLE, 1)
    assert [i.data for i in dev.irqs] == [1]

    def bad(irq):
        raise RuntimeError("driver bug")

    gpu.irq.set_handler(bad)
    dev.comp.submit(P.fence(fence_addr(0), 2))
    dev.comp.submit(P.fence(fence_addr(0), 3) + P.fence(fence_addr(1), 3, flags=0))
    with gpu.fence_cond:  # the engine survived the failing handler
        assert gpu.fence_cond.wait_for(lambda: gpu.vram.read_u64(fence_addr(1)) == 3, 5)
    assert gpu.irq.handler_errors == 2


def test_platform_builds_gpus_sharing_system_memory():
    plat = Platform(num_gpus=2, vram_size=16 << 20)
    assert [g.index for g in plat.gpus] == [0, 1]
    assert plat.gpus[0].sysmem is plat.gpus[1].sysmem is plat.sysmem
    assert plat.gpus[0].vram is not plat.gpus[1].vram
    assert plat.gpus[1].name == "pvgpu-emu" and plat.gpus[1].vram.size == 16 << 20
    with plat:
        got, cond = irq_collector(plat.gpus[1])
        Ring(plat.gpus[1], ENGINE_COPY, 1 << 20).submit(P.fence(2 << 20, 4))
        wait_for(cond, lambda: got)
    assert all(not e._thread.is_alive() for g in plat.gpus for e in g.engines)


def test_64mib_copy_throughput(capsys):
    size = 64 << 20
    g = Gpu(0, 160 << 20, SystemMemory())
    g.start()
    try:
        dev = Dev(g)
        dev.pt.map(VA + (1 << 30), 16 << 20, size // PAGE_SIZE)
        dev.pt.map(VA + (2 << 30), 80 << 20, size // PAGE_SIZE)
        g.vram.mem[16 << 20:(16 << 20) + size] = 7
        copy = dev.ib(P.copy(VA + (1 << 30), VA + (2 << 30), size))
        times = []
        for seq in range(1, 4):
            t = time.perf_counter()
            dev.copy.submit(copy + P.fence(fence_addr(0), seq))
            dev.wait_irq(IRQ_FENCE, seq)
            times.append(time.perf_counter() - t)
        assert (g.vram.mem[80 << 20:(80 << 20) + size] == 7).all()
        src, dst = g.vram.mem[16 << 20:(16 << 20) + size], g.vram.mem[80 << 20:(80 << 20) + size]
        ref = []
        for _ in range(3):
            t = time.perf_counter()
            np.copyto(dst, src)
            ref.append(time.perf_counter() - t)
    finally:
        assert g.stop()
    with capsys.disabled():
        print(f"\n64 MiB COPY through the ring: {min(times) * 1e3:.2f} ms "
              f"({size / min(times) / 1e9:.1f} GB/s); np.copyto: {min(ref) * 1e3:.2f} ms "
              f"({size / min(ref) / 1e9:.1f} GB/s)")
