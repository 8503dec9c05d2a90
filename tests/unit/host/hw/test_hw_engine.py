"""host/hw engines, command processor and Gpu: driven only through VRAM, MMIO and IRQs."""

import threading
import time

import numpy as np
import pytest
from hwtest import RO, Ring, irq_collector, poll, vm_setup, wait_for

from pvgpu.host.hw import packets as P
from pvgpu.host.hw.gpu import Gpu, Platform
from pvgpu.host.hw import kernels
from pvgpu.host.hw.regs import (COPY_ENGINES, DEVICE_ID_PVGPU_EMU, ENGINE_COMPUTE, ENGINE_COPY,
                          ENGINE_COPY0, ENGINE_COPY1, ENGINE_NAMES, IRQ_FENCE,
                          IRQ_ILLEGAL_PACKET, IRQ_PAGE_FAULT, NUM_ENGINES, PAGE_SIZE, PTE_SYSTEM,
                          PTE_WRITE, RB_BUSY_NS, RB_DOORBELL, RB_KICK_SYNC, RB_KICK_SYNC_WPTR,
                          RB_RESET, RB_RPTR, RB_SIZE,
                          RB_STATUS, RB_STATUS_BUSY, RB_STATUS_IDLE, RB_WPTR, REG_DEVICE_ID,
                          REG_ENGINE, REG_IRQ_ENABLE, REG_TIMESTAMP, REG_VM_INVALIDATE,
                          REG_VRAM_SIZE)
from pvgpu.host.hw.sysmem import SystemMemory
from pvgpu.spec.kernels import (ACCESS_READ, ACCESS_WRITE, BURN_FOREVER, KERNEL_BURN, KERNEL_GEMM,
                          KERNEL_REDUCE_SUM, KERNEL_SCALE, KERNEL_SOFTMAX, KERNEL_VECTOR_ADD)

VRAM_SIZE = 64 << 20
TABLES = 1 << 20
RING_C = 2 << 20  # compute ring
RING_D = RING_C + (64 << 10)  # copy0 ring
RING_E = RING_C + (128 << 10)  # copy1 ring
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
        self.copy = Ring(gpu, ENGINE_COPY0, RING_D)
        self.copy1 = Ring(gpu, ENGINE_COPY1, RING_E)
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
    # the fence's interrupt comes before the engine finishes its packet and advances RPTR
    poll(lambda: dev.reg(ENGINE_COMPUTE, RB_STATUS) == RB_STATUS_IDLE)
    assert dev.reg(ENGINE_COMPUTE, RB_RPTR) == dev.comp.wptr == dev.reg(ENGINE_COMPUTE, RB_WPTR)
    assert not [i for i in dev.irqs if i.source != IRQ_FENCE]


def test_wait_sees_cpu_writes(dev):
    dev.comp.submit(P.wait(fence_addr(5), 3) + P.fence(fence_addr(6), 9))
    dev.gpu.vram.write_u64(fence_addr(5), 2)  # not enough
    dev.gpu.vram.write_u64(fence_addr(5), 3)
    dev.wait_irq(IRQ_FENCE, 9)


def test_a_fence_notifies_the_fence_condition_only_while_a_wait_waits(dev):
    """A stalled WAIT is counted on the GPU's fence condition (FENCE packets notify it only
    then), and the count drops when the WAIT is released."""
    cond = dev.gpu.fence_cond
    dev.comp.submit(P.wait(fence_addr(5), 1) + P.fence(fence_addr(6), 9))
    poll(lambda: cond.waiting == 1)
    dev.copy.submit(P.fence(fence_addr(5), 1))  # releases it
    dev.wait_irq(IRQ_FENCE, 9)
    poll(lambda: cond.waiting == 0)


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
    "wrong_nargs", "bad_length", "past_ib_end", "ib_outside_vram", "launch_on_copy",
    "launch_on_copy1"])
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
        engine, ring, bad, in_ib = ENGINE_COPY0, dev.copy, marker, True
    elif case == "launch_on_copy1":
        engine, ring, bad, in_ib = ENGINE_COPY1, dev.copy1, marker, True
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
    gpu.mmio.write(REG_ENGINE(ENGINE_COMPUTE, RB_RESET), 1)
    # idle at once: the write returned when the engine had left the 30 s burn
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
    dev.gpu.mmio.write(REG_ENGINE(ENGINE_COPY, RB_RESET), 1)
    assert dev.reg(ENGINE_COPY, RB_STATUS) == RB_STATUS_IDLE  # the WAIT (never met) was left


@pytest.mark.parametrize("burn_us", [60_000_000, BURN_FOREVER])
def test_gpu_stop_returns_promptly_while_burning_and_waiting(burn_us):
    g = Gpu(0, 16 << 20, SystemMemory())
    g.start()
    comp = Ring(g, ENGINE_COMPUTE, 1 << 20)
    copy = Ring(g, ENGINE_COPY0, 2 << 20)
    copy1 = Ring(g, ENGINE_COPY1, (2 << 20) + PAGE_SIZE)
    comp.submit(P.launch(KERNEL_BURN, ONE, ONE, [burn_us]))
    copy.submit(P.wait(3 << 20, 1))
    copy1.submit(P.wait(3 << 20, 1))
    poll(lambda: g.engines[ENGINE_COMPUTE].cp.launches == 1
         and g.engines[ENGINE_COPY0].cp.waits == 1 and g.engines[ENGINE_COPY1].cp.waits == 1)
    # every engine thread ends, long before the burn or the WAITs (never met) would
    assert g.stop(timeout=10.0)


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


# ------------------------------------------------------ three engines, clock, busy time

def test_three_engines_each_with_its_own_thread(gpu):
    assert NUM_ENGINES == 3 and len(gpu.engines) == 3
    assert (ENGINE_COMPUTE, ENGINE_COPY0, ENGINE_COPY1) == (0, 1, 2)
    assert ENGINE_COPY == ENGINE_COPY0 and COPY_ENGINES == {ENGINE_COPY0, ENGINE_COPY1}
    assert ENGINE_NAMES == {0: "compute", 1: "copy0", 2: "copy1"}
    assert [e.id for e in gpu.engines] == [0, 1, 2]
    assert [e.name for e in gpu.engines] == ["gpu0.compute", "gpu0.copy0", "gpu0.copy1"]
    threads = {e._thread for e in gpu.engines}
    assert len(threads) == 3 and all(t.is_alive() for t in threads)
    for e in range(NUM_ENGINES):
        assert gpu.mmio.read(REG_ENGINE(e, RB_STATUS)) == RB_STATUS_IDLE
        assert gpu.mmio.read(REG_ENGINE(e, RB_BUSY_NS)) == 0
    assert set(gpu.stats()["engines"]) == {"gpu0.compute", "gpu0.copy0", "gpu0.copy1"}


def test_copy_on_copy1_between_vram_and_system_memory(dev):
    host = np.random.default_rng(3).integers(0, 256, 2 * PAGE_SIZE, dtype=np.uint8)
    back = np.zeros_like(host)
    hva, bva = VA + (1 << 30), VA + (2 << 30)
    dev.pt.map(hva, dev.gpu.sysmem.dma_map(host), 2, RO | PTE_SYSTEM)
    dev.pt.map(bva, dev.gpu.sysmem.dma_map(back), 2, RO | PTE_SYSTEM | PTE_WRITE)
    dev.copy.submit(dev.ib(P.copy(hva, VA, 2 * PAGE_SIZE)) + P.fence(fence_addr(0), 1))
    dev.wait_irq(IRQ_FENCE, 1)
    dev.copy1.submit(dev.ib(P.copy(VA, bva, 2 * PAGE_SIZE)) + P.fence(fence_addr(1), 2))
    irq = dev.wait_irq(IRQ_FENCE, 2)
    assert irq.engine == ENGINE_COPY1 and np.array_equal(back, host)
    assert dev.gpu.engines[ENGINE_COPY1].cp.copies == 1
    assert dev.gpu.engines[ENGINE_COPY1].cp.bytes_copied == 2 * PAGE_SIZE
    assert not [i for i in dev.irqs if i.source != IRQ_FENCE]


def test_copies_on_both_copy_engines_run_while_the_compute_engine_burns(dev):
    gpu = dev.gpu
    dev.comp.submit(P.launch(KERNEL_BURN, ONE, ONE, [BURN_FOREVER]) + P.fence(fence_addr(0), 1))
    poll(lambda: gpu.engines[ENGINE_COMPUTE].cp.launches == 1)  # the burn is running
    dev.put(VA, np.arange(4096, dtype=np.float32))
    dev.copy.submit(dev.ib(P.copy(VA, VA + 0x10000, 4 * 4096)) + P.fence(fence_addr(1), 2))
    dev.copy1.submit(dev.ib(P.copy(VA, VA + 0x20000, 4 * 4096)) + P.fence(fence_addr(2), 3))
    assert dev.wait_irq(IRQ_FENCE, 2).engine == ENGINE_COPY0
    assert dev.wait_irq(IRQ_FENCE, 3).engine == ENGINE_COPY1
    # both copies completed while the burn still holds the compute engine
    assert dev.reg(ENGINE_COMPUTE, RB_STATUS) == RB_STATUS_BUSY
    assert gpu.vram.read_u64(fence_addr(0)) == 0
    assert np.array_equal(dev.get(VA + 0x10000, 4096), np.arange(4096, dtype=np.float32))
    assert np.array_equal(dev.get(VA + 0x20000, 4096), np.arange(4096, dtype=np.float32))
    gpu.mmio.write(REG_ENGINE(ENGINE_COMPUTE, RB_RESET), 1)
    assert dev.reg(ENGINE_COMPUTE, RB_STATUS) == RB_STATUS_IDLE


def test_timestamp_register_is_the_monotonic_device_clock(gpu):
    before = time.monotonic_ns()
    stamps = [gpu.mmio.read(REG_TIMESTAMP) for _ in range(100)]
    after = time.monotonic_ns()
    assert stamps == sorted(stamps) and before <= stamps[0] and stamps[-1] <= after
    assert before <= gpu.clock_ns() <= time.monotonic_ns()
    time.sleep(0.002)
    assert gpu.mmio.read(REG_TIMESTAMP) > stamps[-1]
    gpu.mmio.write(REG_TIMESTAMP, 0)  # read-only
    assert gpu.mmio.ignored_writes == 1 and gpu.mmio.read(REG_TIMESTAMP) > stamps[-1]


def test_fence_interrupts_carry_the_time_the_fence_was_written(dev):
    before = time.monotonic_ns()
    dev.comp.submit(P.fence(fence_addr(0), 1) + P.launch(KERNEL_BURN, ONE, ONE, [2000])
                    + P.fence(fence_addr(0), 2) + P.fence(fence_addr(1), 3))
    dev.wait_irq(IRQ_FENCE, 3)
    after = time.monotonic_ns()
    stamps = [dev.wait_irq(IRQ_FENCE, seq).timestamp for seq in (1, 2, 3)]
    assert before <= stamps[0] <= stamps[1] <= stamps[2] <= after
    assert stamps[1] - stamps[0] >= 2_000_000  # the 2 ms burn ran between them
    # other interrupts are stamped too
    dev.copy.submit(P.copy(VRAM_SIZE, 0, 8) + P.fence(fence_addr(2), 4))  # faults
    dev.copy1.submit(bytes.fromhex("7f000000") + P.fence(fence_addr(3), 5))  # illegal
    fault, ill = dev.wait_irq(IRQ_PAGE_FAULT), dev.wait_irq(IRQ_ILLEGAL_PACKET)
    assert after <= fault.timestamp <= dev.wait_irq(IRQ_FENCE, 4).timestamp <= time.monotonic_ns()
    assert after <= ill.timestamp <= dev.wait_irq(IRQ_FENCE, 5).timestamp <= time.monotonic_ns()


def test_latched_interrupts_keep_the_time_they_were_raised(dev):
    gpu = dev.gpu
    gpu.mmio.write(REG_IRQ_ENABLE, 0)
    dev.comp.submit(P.fence(fence_addr(0), 1) + P.fence(fence_addr(1), 1, flags=0))
    with gpu.fence_cond:
        assert gpu.fence_cond.wait_for(lambda: gpu.vram.read_u64(fence_addr(1)) == 1, 5)
    raised = time.monotonic_ns()
    time.sleep(0.005)
    gpu.mmio.write(REG_IRQ_ENABLE, 1)
    assert dev.irqs[0].timestamp <= raised


def test_busy_ns_counts_packet_execution(dev):
    gpu = dev.gpu
    busy = lambda e: dev.reg(e, RB_BUSY_NS)  # noqa: E731
    assert busy(ENGINE_COMPUTE) == 0
    dev.comp.submit(P.launch(KERNEL_BURN, ONE, ONE, [50_000]) + P.fence(fence_addr(0), 1))
    dev.wait_irq(IRQ_FENCE, 1)
    poll(lambda: dev.reg(ENGINE_COMPUTE, RB_STATUS) == RB_STATUS_IDLE)  # the fence packet ended
    after_burn = busy(ENGINE_COMPUTE)
    assert after_burn >= 50_000_000  # the burn's 50 ms (loose lower bound only)
    assert gpu.engines[ENGINE_COMPUTE].stats()["busy_ns"] == after_burn  # idle: not growing
    assert busy(ENGINE_COPY0) == 0 == busy(ENGINE_COPY1)
    # a stalled WAIT counts as busy, and the running packet is included while it runs
    dev.copy1.submit(P.wait(fence_addr(5), 1) + P.fence(fence_addr(6), 1))
    poll(lambda: gpu.engines[ENGINE_COPY1].cp.waits == 1)
    time.sleep(0.03)
    mid = busy(ENGINE_COPY1)
    assert mid >= 30_000_000
    time.sleep(0.01)
    assert busy(ENGINE_COPY1) >= mid + 10_000_000
    gpu.vram.write_u64(fence_addr(5), 1)
    dev.wait_irq(IRQ_FENCE, 1)
    poll(lambda: dev.reg(ENGINE_COPY1, RB_STATUS) == RB_STATUS_IDLE)
    total = busy(ENGINE_COPY1)
    assert total >= mid + 10_000_000 and busy(ENGINE_COPY1) == total
    gpu.mmio.write(REG_ENGINE(ENGINE_COPY1, RB_BUSY_NS), 0)  # read-only
    gpu.mmio.write(REG_ENGINE(ENGINE_COPY1, RB_RESET), 1)  # and not cleared by a reset
    assert busy(ENGINE_COPY1) == total


def test_burn_forever_holds_the_engine_until_reset_then_it_runs_new_work(dev):
    gpu = dev.gpu
    dev.comp.submit(P.launch(KERNEL_BURN, ONE, ONE, [BURN_FOREVER]) + P.fence(fence_addr(0), 1))
    poll(lambda: gpu.engines[ENGINE_COMPUTE].cp.launches == 1)
    time.sleep(0.1)
    assert dev.reg(ENGINE_COMPUTE, RB_STATUS) == RB_STATUS_BUSY
    assert gpu.vram.read_u64(fence_addr(0)) == 0
    busy = dev.reg(ENGINE_COMPUTE, RB_BUSY_NS)
    assert busy >= 100_000_000
    gpu.mmio.write(REG_ENGINE(ENGINE_COMPUTE, RB_RESET), 1)
    assert dev.reg(ENGINE_COMPUTE, RB_STATUS) == RB_STATUS_IDLE  # the burn was left
    assert gpu.engines[ENGINE_COMPUTE].resets == 1
    # new packets from the start of the ring: a kernel and a fence run
    dev.comp.wptr = 0
    dev.put(VA, np.ones(16, np.float32))
    dev.comp.submit(dev.ib(P.launch(KERNEL_SCALE, ONE, (16, 1, 1), [VA + 64, VA, 0x40000000, 16]))
                    + P.fence(fence_addr(0), 2))
    dev.wait_irq(IRQ_FENCE, 2)
    assert (dev.get(VA + 64, 16) == 2).all()
    assert not [i for i in dev.irqs if i.data == 1]
    assert dev.reg(ENGINE_COMPUTE, RB_BUSY_NS) >= busy


# --------------------------------------------- big kernels are stopped by a reset

def _reset_while_running(gpu, ring, launch, fence, started=None):
    """Submit a LAUNCH (ring: VMID 0) and a fence, reset once the kernel runs (and
    started() is true); the reset returns with the engine idle: it left the kernel (a
    reset that gave up after RESET_TIMEOUT would find it still busy)."""
    cp = gpu.engines[ENGINE_COMPUTE].cp
    launches = cp.launches
    ring.submit(launch + fence)
    poll(lambda: cp.launches == launches + 1 and (started is None or started()), timeout=30)
    gpu.mmio.write(REG_ENGINE(ENGINE_COMPUTE, RB_RESET), 1)
    assert gpu.mmio.read(REG_ENGINE(ENGINE_COMPUTE, RB_STATUS)) == RB_STATUS_IDLE


@pytest.fixture
def big_gpu():
    g = Gpu(0, 256 << 20, SystemMemory())
    g.start()
    yield g
    assert g.stop(), "engine threads did not stop"


def test_reset_stops_a_big_gemm_between_row_blocks(big_gpu):
    g = big_gpu
    got, cond = irq_collector(g)
    n = 4096  # 64 Gi multiply-adds: around a second of BLAS; row blocks of a few ms
    size = 4 * n * n
    A, B, C = 16 << 20, (16 << 20) + size, (16 << 20) + 2 * size
    g.vram.mem[A:A + 2 * size].view(np.float32)[:] = 1
    ring = Ring(g, ENGINE_COMPUTE, 1 << 20)
    c = g.vram.mem[C:C + size].view(np.float32).reshape(n, n)
    _reset_while_running(g, ring, P.launch(KERNEL_GEMM, ONE, ONE, [A, B, C, n, n, n]),
                         P.fence(2 << 20, 1), started=lambda: c[0, 0] == n)
    assert not c[-1].any()  # the last row block was never computed
    assert not got  # no fence, no interrupt
    ring.wptr = 0  # the engine runs new work
    ring.submit(P.launch(KERNEL_GEMM, ONE, ONE, [A, B, C, 16, 16, 16]) + P.fence(2 << 20, 2))
    wait_for(cond, lambda: got)
    assert got[0].data == 2 and (c.reshape(-1)[:256] == 16).all()


def test_reset_stops_softmax_and_reduce_sum_between_blocks(big_gpu, monkeypatch):
    """Small blocks make a kernel of modest size run for seconds; a reset stops it in the
    middle (a big softmax/reduce_sum at the real block sizes is checked for results in
    test_hw_kernels.py)."""
    g = big_gpu
    got, cond = irq_collector(g)
    ring = Ring(g, ENGINE_COMPUTE, 1 << 20)
    rows, cols = 1 << 20, 16  # one row per block: ~1 Mi blocks
    monkeypatch.setattr(kernels, "SOFTMAX_BLOCK", 1)
    src, dst = 16 << 20, 96 << 20
    y = g.vram.mem[dst:dst + 4 * rows * cols].view(np.float32).reshape(rows, cols)
    _reset_while_running(g, ring, P.launch(KERNEL_SOFTMAX, ONE, ONE, [dst, src, rows, cols]),
                         P.fence(2 << 20, 1), started=lambda: y[0, 0] != 0)
    np.testing.assert_allclose(y[0], 1 / cols)  # started ...
    assert not y[-1].any()  # ... and stopped long before the end
    monkeypatch.setattr(kernels, "REDUCE_BLOCK", 16)
    ring.wptr = 0
    out = 2 << 20
    g.vram.write_u64(out, 0xFFFFFFFF)
    _reset_while_running(g, ring, P.launch(KERNEL_REDUCE_SUM, ONE, ONE, [src, out, rows * cols]),
                         P.fence(2 << 20, 1))
    assert g.vram.read_u64(out) == 0xFFFFFFFF  # dst not written
    assert not got  # no fence, no interrupt


def test_a_large_copy_is_spread_over_the_dma_lanes(dev):
    """A COPY piece of at least COPY_SPLIT bytes goes over the copy engines' DMA lanes."""
    from pvgpu.host.hw.command_processor import COPY_SPLIT
    from pvgpu.host.hw.compute_units import ComputeUnits
    n = COPY_SPLIT + 3 * PAGE_SIZE
    host = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
    back = np.zeros_like(host)
    hva, bva = VA + (1 << 30), VA + (2 << 30)
    dev.pt.map(hva, dev.gpu.sysmem.dma_map(host), n // PAGE_SIZE, RO | PTE_SYSTEM)
    dev.pt.map(bva, dev.gpu.sysmem.dma_map(back), n // PAGE_SIZE, RO | PTE_SYSTEM | PTE_WRITE)
    lanes = dev.gpu.dma_lanes
    if lanes.count == 1:  # a one-CPU machine: force two lanes
        lanes = dev.gpu.dma_lanes = ComputeUnits(2, "test.dma")
        dev.gpu.engines[ENGINE_COPY].cp.cus = lanes
    before = lanes.split_launches
    dev.copy.submit(dev.ib(P.copy(hva, bva, n)) + P.fence(fence_addr(0), 1))
    dev.wait_irq(IRQ_FENCE, 1)
    assert np.array_equal(back, host) and lanes.split_launches == before + 1


# ------------------------------------------------------------------ RB_KICK_SYNC
def test_stamped_fences_write_their_own_time_and_only_fence_irq_interrupts(dev):
    """A FENCE with a stamp slot writes (seq, completion time) there; one without
    FENCE_IRQ raises nothing, so three fences committed together make one interrupt."""
    ticks = iter(range(1_000, 1_000_000, 1_000))
    dev.gpu.engines[ENGINE_COMPUTE].cp.clock = lambda: next(ticks)
    slot = FENCES + PAGE_SIZE
    dev.comp.submit(P.fence(fence_addr(0), 1, 0, stamp=slot)
                    + P.launch(KERNEL_BURN, ONE, ONE, [0])
                    + P.fence(fence_addr(0), 2, 0, stamp=slot + 16)
                    + P.fence(fence_addr(0), 3, P.FENCE_IRQ, stamp=slot + 32))
    irq = dev.wait_irq(IRQ_FENCE, 3)
    assert [i.data for i in dev.irqs if i.source == IRQ_FENCE] == [3]
    q = dev.gpu.vram.qwords
    slots = [(int(q[(slot >> 3) + 2 * i]), int(q[(slot >> 3) + 2 * i + 1])) for i in range(3)]
    assert [s for s, _t in slots] == [1, 2, 3]
    times = [t for _s, t in slots]
    assert times == sorted(times) and len(set(times)) == 3 and times[2] == irq.timestamp
    assert dev.gpu.vram.read_u64(fence_addr(0)) == 3
    # a stamp slot must be 16-aligned
    dev.comp.submit(P.fence(fence_addr(1), 4, P.FENCE_IRQ, stamp=slot + 8))
    dev.wait_irq(IRQ_ILLEGAL_PACKET)
    assert dev.gpu.vram.read_u64(fence_addr(1)) == 0


def _publish(ring, data: bytes) -> None:
    """Write packets and publish WPTR without waking the engine (RB_WPTR, no doorbell)."""
    ring.write(data)
    ring.gpu.mmio.write(REG_ENGINE(ring.engine, RB_WPTR), ring.wptr)


def test_kick_sync_runs_the_ring_on_the_writing_thread(dev):
    """An idle engine's packets run on the thread that writes RB_KICK_SYNC: the write
    returns with the work done, RPTR at WPTR and the interrupts delivered on that thread."""
    gpu = dev.gpu
    threads = []
    got = []
    gpu.irq.set_handler(lambda irq: (got.append(irq), threads.append(threading.current_thread())))
    n = 1000
    dev.put(VA, np.arange(n, dtype=np.float32))
    _publish(dev.copy, dev.ib(P.copy(VA, VA + 0x10000, 4 * n)) + P.fence(fence_addr(0), 1))
    _publish(dev.copy, P.fence(fence_addr(1), 2))
    engine = gpu.engines[ENGINE_COPY]
    gpu.mmio.write(REG_ENGINE(ENGINE_COPY, RB_KICK_SYNC), 1)
    assert np.array_equal(dev.get(VA + 0x10000, n), np.arange(n, dtype=np.float32))
    assert [(i.source, i.data) for i in got] == [(IRQ_FENCE, 1), (IRQ_FENCE, 2)]
    assert threads == [threading.current_thread()] * 2
    assert dev.reg(ENGINE_COPY, RB_RPTR) == dev.copy.wptr
    assert dev.reg(ENGINE_COPY, RB_STATUS) == RB_STATUS_IDLE
    assert engine.sync_kicks == 1 and engine.doorbells == 0
    assert engine.cp.ibs == 1 and dev.reg(ENGINE_COPY, RB_BUSY_NS) > 0


def test_kick_sync_wptr_publishes_wptr_and_runs_the_ring_in_one_write(dev):
    """RB_KICK_SYNC_WPTR: the value written becomes RB_WPTR, and the packets up to it run
    on the writing thread, as after RB_WPTR and RB_KICK_SYNC."""
    gpu = dev.gpu
    threads = []
    gpu.irq.set_handler(lambda irq: threads.append((irq.data, threading.current_thread())))
    dev.copy.write(P.fence(fence_addr(0), 5))  # in the ring, WPTR not published
    assert dev.reg(ENGINE_COPY, RB_WPTR) == 0
    engine = gpu.engines[ENGINE_COPY]
    gpu.mmio.write(REG_ENGINE(ENGINE_COPY, RB_KICK_SYNC_WPTR), dev.copy.wptr)
    assert dev.reg(ENGINE_COPY, RB_WPTR) == dev.copy.wptr == dev.reg(ENGINE_COPY, RB_RPTR)
    assert gpu.vram.read_u64(fence_addr(0)) == 5
    assert threads == [(5, threading.current_thread())]
    assert engine.sync_kicks == 1 and engine.doorbells == 0


def test_kick_sync_on_a_busy_engine_is_a_doorbell(dev):
    """While the engine's thread executes, a kick does not run packets on the writing
    thread: it wakes the engine, which runs them in ring order after the current one."""
    gpu = dev.gpu
    engine = gpu.engines[ENGINE_COMPUTE]
    dev.comp.submit(P.launch(KERNEL_BURN, ONE, ONE, [BURN_FOREVER]))
    poll(lambda: engine.cp.launches == 1)
    _publish(dev.comp, P.fence(fence_addr(0), 7))
    gpu.mmio.write(REG_ENGINE(ENGINE_COMPUTE, RB_KICK_SYNC), 1)  # returns at once
    assert engine.sync_kicks == 0 and dev.reg(ENGINE_COMPUTE, RB_STATUS) == RB_STATUS_BUSY
    assert gpu.vram.read_u64(fence_addr(0)) == 0
    gpu.mmio.write(REG_ENGINE(ENGINE_COMPUTE, RB_RESET), 1)
    dev.comp.wptr = 0
    _publish(dev.comp, P.fence(fence_addr(1), 8))
    gpu.mmio.write(REG_ENGINE(ENGINE_COMPUTE, RB_KICK_SYNC), 1)
    assert gpu.vram.read_u64(fence_addr(1)) == 8 and engine.sync_kicks == 1


def test_kick_sync_on_an_engine_not_started_runs_nothing():
    """Before start() the hardware executes nothing, kicked or not; the published work
    runs once the engine's thread starts."""
    g = Gpu(0, VRAM_SIZE, SystemMemory())
    try:
        dev = Dev(g)
        _publish(dev.copy, P.fence(fence_addr(0), 3))
        g.mmio.write(REG_ENGINE(ENGINE_COPY, RB_KICK_SYNC), 1)
        assert g.vram.read_u64(fence_addr(0)) == 0 and g.engines[ENGINE_COPY].sync_kicks == 0
        g.start()
        dev.wait_irq(IRQ_FENCE, 3)
    finally:
        assert g.stop()


def test_reset_from_an_interrupt_handler_on_the_kicking_thread(dev, monkeypatch):
    """A handler that resets the engine on the thread running a kick does not wait for
    itself (that wait would never end: the pytest timeout fails it): the rest of the ring
    is dropped and the kick returns."""
    from pvgpu.host.hw import engine as engine_mod
    monkeypatch.setattr(engine_mod, "RESET_TIMEOUT", None)
    gpu = dev.gpu
    seen = []

    def handler(irq):
        seen.append(irq.source)
        if irq.source == IRQ_PAGE_FAULT:
            gpu.mmio.write(REG_ENGINE(ENGINE_COPY, RB_RESET), 1)

    gpu.irq.set_handler(handler)
    _publish(dev.copy, P.copy(VRAM_SIZE, 0, 8) + P.fence(fence_addr(0), 1))
    gpu.mmio.write(REG_ENGINE(ENGINE_COPY, RB_KICK_SYNC), 1)
    assert seen == [IRQ_PAGE_FAULT]
    assert gpu.vram.read_u64(fence_addr(0)) == 0  # dropped by the reset
    assert dev.reg(ENGINE_COPY, RB_RPTR) == 0 == dev.reg(ENGINE_COPY, RB_WPTR)


def test_engine_thread_drains_packets_published_while_it_runs(dev):
    """The engine goes on with packets doorbelled while it executes, in ring order."""
    gpu = dev.gpu
    engine = gpu.engines[ENGINE_COMPUTE]
    dev.comp.submit(P.launch(KERNEL_BURN, ONE, ONE, [20_000]))
    poll(lambda: engine.cp.launches == 1)
    for i in range(5):
        dev.comp.submit(P.fence(fence_addr(i), i + 1))
    dev.wait_irq(IRQ_FENCE, 5)
    assert [i.data for i in dev.irqs if i.source == IRQ_FENCE] == [1, 2, 3, 4, 5]
    poll(lambda: dev.reg(ENGINE_COMPUTE, RB_STATUS) == RB_STATUS_IDLE)
    assert dev.reg(ENGINE_COMPUTE, RB_RPTR) == dev.comp.wptr


def test_work_doorbelled_after_a_reset_on_the_kicking_thread_still_runs(dev):
    """A handler on the kicking thread resets the engine and submits new work with a
    doorbell while the kick still owns the engine: when the kick returns, the engine's
    thread runs that work."""
    gpu = dev.gpu
    fenced = threading.Event()

    def handler(irq):
        if irq.source == IRQ_PAGE_FAULT:
            gpu.mmio.write(REG_ENGINE(ENGINE_COPY, RB_RESET), 1)
            dev.copy.wptr = 0
            dev.copy.submit(P.fence(fence_addr(1), 5))
        elif irq.source == IRQ_FENCE and irq.data == 5:
            fenced.set()

    gpu.irq.set_handler(handler)
    _publish(dev.copy, P.copy(VRAM_SIZE, 0, 8) + P.fence(fence_addr(0), 1))
    gpu.mmio.write(REG_ENGINE(ENGINE_COPY, RB_KICK_SYNC), 1)
    assert fenced.wait(10)
    assert gpu.vram.read_u64(fence_addr(1)) == 5 and gpu.vram.read_u64(fence_addr(0)) == 0


def test_a_kick_runs_only_the_work_it_kicked(dev):
    """Packets doorbelled while a kick executes (here by its own interrupt handler) run on
    the engine's thread, not on the kicking thread."""
    gpu = dev.gpu
    where = {}
    done = threading.Event()

    def handler(irq):
        where[irq.data] = threading.current_thread()
        if irq.data == 1:
            dev.copy.submit(P.fence(fence_addr(1), 2))
        elif irq.data == 2:
            done.set()

    gpu.irq.set_handler(handler)
    _publish(dev.copy, P.fence(fence_addr(0), 1))
    gpu.mmio.write(REG_ENGINE(ENGINE_COPY, RB_KICK_SYNC), 1)
    assert where[1] is threading.current_thread()
    assert done.wait(10)
    assert where[2] is gpu.engines[ENGINE_COPY]._thread


def test_a_nop_behind_a_ring_packet_is_consumed_with_it(dev):
    """The padding NOP fetched with a packet is executed with it: one fetch of the engine
    moves RPTR past both. A NOP running past WPTR is left to a fetch of its own."""
    cp = dev.gpu.engines[ENGINE_COPY].cp
    base, size = RING_D, PAGE_SIZE
    fence, pad = P.fence(fence_addr(0), 1), P.nop(5)
    dev.gpu.vram.write(base, fence + pad)
    ctl = kernels.NEVER_STOP
    assert cp.run_ring_fetch(base, size, 0, len(fence + pad), ctl) == len(fence + pad)
    assert cp.packets == 2 and dev.gpu.vram.read_u64(fence_addr(0)) == 1
    # WPTR inside the NOP: only the fence runs
    assert cp.run_ring_fetch(base, size, 0, len(fence) + 8, ctl) == len(fence)
    assert cp.packets == 3


def test_the_packets_of_one_fetch_run_together_and_a_stop_ends_the_fetch(dev):
    """A fetch executes every packet wholly inside it, so one step of the engine moves RPTR
    past all of them; a packet only partly inside is left to the next fetch, and a stop
    (reset) between two packets leaves the rest undone."""
    cp = dev.gpu.engines[ENGINE_COPY].cp
    base, size = RING_D, PAGE_SIZE
    f1, f2, f3 = (P.fence(fence_addr(i), 1) for i in range(3))  # 6 dwords each
    dev.gpu.vram.write(base, f1 + f2 + f3)
    wptr = len(f1 + f2 + f3)
    ctl = kernels.NEVER_STOP
    # 16 dwords fetched: the first two fences run, the third straddles the fetch
    assert cp.run_ring_fetch(base, size, 0, wptr, ctl) == len(f1 + f2)
    assert cp.packets == 2 and [dev.gpu.vram.read_u64(fence_addr(i)) for i in range(3)] == [1, 1, 0]
    assert cp.run_ring_fetch(base, size, len(f1 + f2), wptr, ctl) == wptr
    assert dev.gpu.vram.read_u64(fence_addr(2)) == 1

    for i in range(3):
        dev.gpu.vram.write_u64(fence_addr(i), 0)
    stop = kernels.StopToken(stopped=lambda: cp.fences >= 4)  # stopped once f1 has run
    assert cp.run_ring_fetch(base, size, 0, wptr, stop) == len(f1)
    assert [dev.gpu.vram.read_u64(fence_addr(i)) for i in range(3)] == [1, 0, 0]
