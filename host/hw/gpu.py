"""Builders: one emulated GPU from its blocks, and the platform that holds the GPUs.

Gpu wires VRAM, the MMIO register file, the interrupt controller, the MMU and one Engine
(ring + command processor + thread) per regs.ENGINE_* (NUM_ENGINES = 3: compute, copy0,
copy1; all run concurrently). The KMD drives it only through:
  gpu.vram        CPU access through the BAR: read/write/view/read_u64/... (physical)
  gpu.mmio        read(offset) / write(offset, value)  (host/hw/regs.py)
  gpu.irq         set_handler(fn(Interrupt))
  gpu.sysmem      dma_map(buf) -> bus address / dma_unmap(bus address)
  gpu.clock_ns()  the device clock (also MMIO REG_TIMESTAMP)
  gpu.pci         its PCIe function (pcie.Endpoint): bdf, bar0 (bus address of BAR0, which
                  exposes the whole VRAM to peers), bar0_size, p2pdma_distance(other.pci)
  gpu.index, gpu.name, gpu.vram.size
Everything else (gpu.mmu, gpu.engines, stats()) is for tests and benchmarks.

The device clock counts nanoseconds on the host's monotonic base: Gpu.clock_ns() is
time.monotonic_ns(), so device timestamps (REG_TIMESTAMP, Interrupt.timestamp, engine
busy time) compare directly with the host's time.monotonic_ns() — as if the driver had
calibrated the GPU clock against the CPU clock. It never goes backwards.

Platform builds one SystemMemory shared by all devices, `num_gpus` GPUs and the PCIe
fabric they sit in (`topology`: one of pcie.LAYOUTS, default "switch"). Each GPU's MMU
resolves PTE_PEER pages through that fabric, so a GPU can reach a peer's VRAM through the
peer's BAR0 where the route allows P2P. A Gpu built on its own sits alone in a slot of a
private fabric.
"""

from __future__ import annotations

import time

from pvgpu.host.hw.command_processor import FenceCondition
from pvgpu.host.hw.compute_units import ComputeUnits
from pvgpu.host.hw.engine import Engine
from pvgpu.host.hw.interrupts import InterruptController
from pvgpu.host.hw.mmio import RO, RW, WO, RegisterFile
from pvgpu.host.hw.mmu import Mmu
from pvgpu.host.hw.pcie import DEFAULT_LAYOUT, PcieFabric
from pvgpu.host.hw.regs import (DEVICE_ID_PVGPU_EMU, ENGINE_COMPUTE, NUM_ENGINES, NUM_VMIDS,
                          REG_DEVICE_ID, REG_IRQ_ENABLE, REG_TIMESTAMP, REG_VM_INVALIDATE,
                          REG_VM_PT_BASE, REG_VRAM_SIZE, VM_INVALIDATE_ALL)
from pvgpu.host.hw.sysmem import SystemMemory
from pvgpu.host.hw.vram import Vram

DEFAULT_VRAM_SIZE = 1 << 30


class Gpu:
    def __init__(self, index: int, vram_size: int, sysmem: SystemMemory,
                 name: str = "pvgpu-emu", compute_units: int | None = None,
                 fabric: PcieFabric | None = None):
        """fabric: the platform's PcieFabric, whose endpoint `index` (and its VRAM) is
        this GPU; None: a private one-GPU fabric."""
        self.index = index
        self.name = name
        tag = f"gpu{index}"
        self.sysmem = sysmem
        if fabric is None:
            fabric = PcieFabric(DEFAULT_LAYOUT, [Vram(vram_size)])
            self.pci = fabric.endpoints[0]
        else:
            self.pci = fabric.endpoints[index]
        if self.pci.vram.size != vram_size:
            raise ValueError(f"{self.pci.name} has {self.pci.vram.size:#x} bytes of VRAM, "
                             f"not {vram_size:#x}")
        self.vram = self.pci.vram
        self.mmio = RegisterFile(tag)
        self.irq = InterruptController(tag)
        self.mmu = Mmu(self.vram, sysmem, tag, fabric, self.pci.index)
        self.fence_cond = FenceCondition()  # FENCE writes notify the WAITs on it
        self.cus = ComputeUnits(compute_units, tag)
        self.dma_lanes = ComputeUnits(compute_units, tag + ".dma")  # of both copy engines
        self.engines = [Engine(e, self.vram, self.mmu, self.irq, self.fence_cond, tag,
                               self.cus if e == ENGINE_COMPUTE else self.dma_lanes, self.clock_ns)
                        for e in range(NUM_ENGINES)]
        self._started = False

        m = self.mmio
        m.define(REG_DEVICE_ID, "DEVICE_ID", RO, DEVICE_ID_PVGPU_EMU)
        m.define(REG_VRAM_SIZE, "VRAM_SIZE", RO, vram_size)
        m.define(REG_TIMESTAMP, "TIMESTAMP", RO, on_read=self.clock_ns)
        m.define(REG_IRQ_ENABLE, "IRQ_ENABLE", RW,
                 on_write=lambda v: self.irq.set_enabled(v & 1))
        m.define(REG_VM_INVALIDATE, "VM_INVALIDATE", WO, on_write=self._vm_invalidate)
        for vmid in range(NUM_VMIDS):
            m.define(REG_VM_PT_BASE(vmid), f"VM_PT_BASE{vmid}", RW,
                     on_write=lambda v, vmid=vmid: self.mmu.set_root(vmid, v))
        for engine in self.engines:
            engine.attach(m)

    # the device clock in ns: time.monotonic_ns() itself (the host's monotonic base)
    clock_ns = staticmethod(time.monotonic_ns)

    def _vm_invalidate(self, value: int) -> None:
        if value == VM_INVALIDATE_ALL:
            self.mmu.flush_all()
        else:
            self.mmu.flush(value)  # out-of-range vmids are ignored

    def start(self) -> None:
        """Start the engine threads (once: a stopped Gpu is not restarted)."""
        if not self._started:
            self._started = True
            for engine in self.engines:
                engine.start()

    def stop(self, timeout: float = 1.0) -> bool:
        """Stop and join every engine thread; -> True if all ended within timeout."""
        for engine in self.engines:
            engine.request_stop()
        deadline = time.monotonic() + timeout
        ok = all([e.join(max(0.0, deadline - time.monotonic())) for e in self.engines])
        self.cus.shutdown()
        self.dma_lanes.shutdown()
        return ok

    def stats(self) -> dict:
        return {"mmu": self.mmu.stats(),
                "engines": {e.name: e.stats() for e in self.engines},
                "irq": {"raised": self.irq.raised, "delivered": self.irq.delivered,
                        "latched": self.irq.latched, "dropped": self.irq.dropped,
                        "handler_errors": self.irq.handler_errors},
                "mmio": {"unknown_reads": self.mmio.unknown_reads,
                         "unknown_writes": self.mmio.unknown_writes,
                         "ignored_writes": self.mmio.ignored_writes}}

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def __repr__(self):
        return f"Gpu({self.index}, {self.name!r}, vram={self.vram.size:#x})"


class Platform:
    def __init__(self, num_gpus: int = 2, vram_size: int = DEFAULT_VRAM_SIZE,
                 name: str = "pvgpu-emu", topology: str = DEFAULT_LAYOUT):
        self.sysmem = SystemMemory()
        self.fabric = PcieFabric(topology, [Vram(vram_size) for _ in range(num_gpus)])
        self.gpus = [Gpu(i, vram_size, self.sysmem, name, fabric=self.fabric)
                     for i in range(num_gpus)]

    def start(self) -> None:
        for gpu in self.gpus:
            gpu.start()

    def stop(self, timeout: float = 1.0) -> bool:
        for gpu in self.gpus:
            for engine in gpu.engines:
                engine.request_stop()
        deadline = time.monotonic() + timeout
        return all([gpu.stop(max(0.0, deadline - time.monotonic())) for gpu in self.gpus])

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
