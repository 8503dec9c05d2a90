"""PKT_LAUNCH_CODE through a real Gpu: ring, IB, VMID, IRQ_CODE_FAULT / IRQ_PAGE_FAULT /
IRQ_ILLEGAL_PACKET, the rest of the IB skipped after a fault, the engine carries on, a
reset stops a kernel that loops forever."""

import struct
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hwtest import RW, Ring, irq_collector, poll, vm_setup, wait_for  # noqa: E402

import smasm  # noqa: E402
from pvgpu.host.hw import packets as P  # noqa: E402
from pvgpu.host.hw.gpu import Gpu  # noqa: E402
from pvgpu.host.hw.regs import (ENGINE_COMPUTE, ENGINE_COPY0, IRQ_CODE_FAULT, IRQ_FENCE,  # noqa: E402
                          IRQ_ILLEGAL_PACKET, IRQ_NAMES, IRQ_PAGE_FAULT, PTE_EXEC, PTE_READ,
                          PTE_VALID, RB_RESET, RB_STATUS, RB_STATUS_BUSY, RB_STATUS_IDLE,
                          REG_ENGINE)
from pvgpu.host.hw.sysmem import SystemMemory  # noqa: E402
from pvgpu.spec import isa  # noqa: E402
from pvgpu.spec.kernels import ACCESS_EXEC, ACCESS_WRITE  # noqa: E402

VRAM_SIZE = 64 << 20
TABLES = 1 << 20
RING_C = 2 << 20
RING_D = RING_C + (64 << 10)
IBS = 3 << 20
FENCES = 4 << 20
CODE_PHYS = 6 << 20
DATA_PHYS = 8 << 20
VMID = 2
CODE_VA = 1 << 36
DATA_VA = 1 << 32
EXEC = PTE_VALID | PTE_READ | PTE_EXEC

VADD = """
.entry vadd
.param u64 a
.param u64 b
.param u64 c
.param u32 n
  ld.param.u64 rd0, [a]
  ld.param.u64 rd1, [b]
  ld.param.u64 rd2, [c]
  ld.param.u32 r0, [n]
  mov.u32 r1, %ctaid.x
  mov.u32 r2, %ntid.x
  mov.u32 r3, %tid.x
  mad.lo.s32 r4, r1, r2, r3
  setp.ge.s32 p0, r4, r0
  @p0 bra END
  mul.wide.s32 rd3, r4, 4
  add.s64 rd4, rd0, rd3
  add.s64 rd5, rd1, rd3
  add.s64 rd6, rd2, rd3
  ld.global.f32 r5, [rd4]
  ld.global.f32 r6, [rd5]
  add.f32 r7, r5, r6
  st.global.f32 [rd6], r7
END:
  exit
"""

SPIN = """
.entry spin
L:
  bra L
"""


class Dev:
    def __init__(self, gpu):
        self.gpu = gpu
        self.irqs, self.cond = irq_collector(gpu)
        self.pt = vm_setup(gpu, VMID, TABLES)
        self.pt.map(DATA_VA, DATA_PHYS, 2048, RW)
        self.pt.map(CODE_VA, CODE_PHYS, 16, EXEC)
        self.comp = Ring(gpu, ENGINE_COMPUTE, RING_C)
        self.copy = Ring(gpu, ENGINE_COPY0, RING_D)
        self.ib_next = IBS
        self.fences = 0

    def ib(self, data: bytes) -> bytes:
        addr = self.ib_next
        self.gpu.vram.write(addr, data)
        self.ib_next += (len(data) + 255) // 256 * 256
        return P.indirect_buffer(addr, len(data) // 4, VMID)

    def put(self, va, data):
        self.gpu.vram.write(DATA_PHYS + va - DATA_VA, data)

    def get(self, va, n, dtype=np.float32):
        nbytes = n * np.dtype(dtype).itemsize
        return self.gpu.vram.view(DATA_PHYS + va - DATA_VA, nbytes).view(dtype).copy()

    def load(self, obj: bytes, offset: int = 0) -> int:
        self.gpu.vram.write(CODE_PHYS + offset, obj)
        return CODE_VA + offset

    def fence(self) -> tuple:
        self.fences += 1
        return P.fence(FENCES + 8 * self.fences, self.fences), self.fences

    def wait_irq(self, source, data=None, timeout=10.0):
        def match():
            return [i for i in self.irqs if i.source == source and (data is None or i.data == data)]
        wait_for(self.cond, lambda: match(), timeout)
        return match()[0]


@pytest.fixture
def dev():
    g = Gpu(0, VRAM_SIZE, SystemMemory())
    g.start()
    yield Dev(g)
    assert g.stop(), "engine threads did not stop"


def vadd_launch(dev, n, obj_va, entry_va, params_va=DATA_VA + 0x300000, grid=None, block=256):
    a, b, c = DATA_VA, DATA_VA + 0x100000, DATA_VA + 0x200000
    dev.put(params_va, struct.pack("<QQQI", a, b, c, n))
    grid = grid if grid is not None else -(-n // block)
    return P.launch_code(obj_va, entry_va, (grid, 1, 1), (block, 1, 1), 0, params_va, 28)


def test_launch_code_runs_in_the_ibs_vmid_and_fences_after(dev):
    obj = smasm.assemble(VADD)
    va = dev.load(obj)
    n = 5000
    a = np.arange(n, dtype=np.float32)
    dev.put(DATA_VA, a.tobytes())
    dev.put(DATA_VA + 0x100000, (a * 3).tobytes())
    fence, seq = dev.fence()
    dev.comp.submit(dev.ib(vadd_launch(dev, n, va, va + smasm.entry_offset(obj))) + fence)
    dev.wait_irq(IRQ_FENCE, seq)
    assert np.array_equal(dev.get(DATA_VA + 0x200000, n), a * 4)
    assert not [i for i in dev.irqs if i.source != IRQ_FENCE]
    cp = dev.gpu.engines[ENGINE_COMPUTE].cp
    assert cp.stats()["sm"]["code_launches"] == 1 and cp.stats()["sm"]["lane_instructions"] > n


def test_a_malformed_object_raises_code_fault_and_the_ib_rest_is_skipped(dev):
    obj = bytearray(smasm.assemble(VADD))
    h = smasm.header(bytes(obj))
    bad_instr = 3
    off = h["code_off"] + bad_instr * isa.INSTR_SIZE
    obj[off:off + 2] = struct.pack("<H", 0x7FFF)  # no such opcode
    va = dev.load(bytes(obj))
    dev.put(DATA_VA + 0x200000, bytes(4 * 16))
    fence, seq = dev.fence()
    skipped = vadd_launch(dev, 16, CODE_VA + 0x4000, CODE_VA + 0x4000)  # never reached
    dev.comp.submit(dev.ib(vadd_launch(dev, 16, va, va + h["entries_off"]) + skipped) + fence)
    irq = dev.wait_irq(IRQ_CODE_FAULT)
    assert (irq.engine, irq.vmid, irq.address, irq.data) == (ENGINE_COMPUTE, VMID, va + off,
                                                              isa.COBJ_ERR_INSTR)
    dev.wait_irq(IRQ_FENCE, seq)  # the ring carries on after the faulting IB
    assert [i.source for i in dev.irqs].count(IRQ_CODE_FAULT) == 1
    assert (dev.get(DATA_VA + 0x200000, 16) == 0).all()  # nothing ran
    assert IRQ_NAMES[IRQ_CODE_FAULT] == "code_fault"


def test_code_without_exec_permission_is_a_page_fault_with_access_exec(dev):
    obj = smasm.assemble(VADD)
    dev.pt.map(CODE_VA + 0x8000, CODE_PHYS + 0x8000, 1, RW)  # readable, not executable
    dev.gpu.vram.write(CODE_PHYS + 0x8000, obj)
    va = CODE_VA + 0x8000
    fence, seq = dev.fence()
    dev.comp.submit(dev.ib(vadd_launch(dev, 16, va, va + smasm.entry_offset(obj))) + fence)
    irq = dev.wait_irq(IRQ_PAGE_FAULT)
    assert (irq.vmid, irq.address, irq.access) == (VMID, va, ACCESS_EXEC)
    dev.wait_irq(IRQ_FENCE, seq)


def test_an_out_of_bounds_store_is_a_page_fault_naming_the_address(dev):
    obj = smasm.assemble(VADD)
    va = dev.load(obj)
    fence, seq = dev.fence()
    params = DATA_VA + 0x300000
    c = DATA_VA + 2048 * 4096 - 64  # 16 floats before the end of the mapping
    dev.put(params, struct.pack("<QQQI", DATA_VA, DATA_VA, c, 64))
    pkt = P.launch_code(va, va + smasm.entry_offset(obj), (1, 1, 1), (64, 1, 1), 0, params, 28)
    dev.comp.submit(dev.ib(pkt) + fence)
    irq = dev.wait_irq(IRQ_PAGE_FAULT)
    assert (irq.vmid, irq.address, irq.access) == (VMID, DATA_VA + 2048 * 4096, ACCESS_WRITE)
    dev.wait_irq(IRQ_FENCE, seq)


@pytest.mark.parametrize("case", ["reserved", "short", "long", "copy_engine"])
def test_illegal_launch_code_packets(dev, case):
    obj = smasm.assemble(VADD)
    va = dev.load(obj)
    pkt = bytearray(vadd_launch(dev, 16, va, va + smasm.entry_offset(obj)))
    ring = dev.comp
    if case == "reserved":
        pkt[-4:] = struct.pack("<I", 1)
    elif case == "short":
        pkt = bytearray(struct.pack("<I", P.header(P.PKT_LAUNCH_CODE, 14)) + pkt[4:-4])
    elif case == "long":
        pkt = bytearray(struct.pack("<I", P.header(P.PKT_LAUNCH_CODE, 16)) + pkt[4:] + bytes(4))
    else:
        ring = dev.copy
    fence, seq = dev.fence()
    ring.submit(dev.ib(bytes(pkt)) + fence)
    irq = dev.wait_irq(IRQ_ILLEGAL_PACKET)
    assert irq.vmid == VMID and irq.address == 0 and irq.data & 0xFF == P.PKT_LAUNCH_CODE
    dev.wait_irq(IRQ_FENCE, seq)


def test_reset_stops_a_kernel_that_loops_forever(dev):
    obj = smasm.assemble(SPIN)
    va = dev.load(obj)
    pkt = P.launch_code(va, va + smasm.entry_offset(obj), (4, 1, 1), (32, 1, 1), 0, 0, 0)
    dev.comp.submit(dev.ib(pkt))
    reg = REG_ENGINE(ENGINE_COMPUTE, RB_STATUS)
    cp = dev.gpu.engines[ENGINE_COMPUTE].cp
    poll(lambda: cp.sm.current is not None and cp.sm.current.lane_instructions > 1000)
    assert dev.gpu.mmio.read(reg) == RB_STATUS_BUSY
    dev.gpu.mmio.write(REG_ENGINE(ENGINE_COMPUTE, RB_RESET), 1)
    poll(lambda: dev.gpu.mmio.read(reg) == RB_STATUS_IDLE)
    assert not [i for i in dev.irqs if i.source != IRQ_FENCE]  # a stopped launch is silent
    dev.comp.wptr = 0  # the reset emptied the ring
    fence, seq = dev.fence()
    dev.comp.submit(fence)  # the engine carries on
    dev.wait_irq(IRQ_FENCE, seq)


def test_launch_code_encoder_matches_the_packet_format():
    pkt = P.launch_code(0x1_2345_6789, 0xA_0000_0010, (1, 2, 3), (4, 5, 6), 7, 0xB_0000_0020, 8)
    words = struct.unpack("<16I", pkt)
    assert P.split_header(words[0]) == (P.PKT_LAUNCH_CODE, 15)
    assert words[1:] == (0x2345_6789, 1, 0x10, 0xA, 1, 2, 3, 4, 5, 6, 7, 0x20, 0xB, 8, 0)
