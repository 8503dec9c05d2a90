"""VMID 0, the kernel's physical address space: VRAM by identity, and system bus addresses
through the IOMMU (the driver's buffer moves copy between the two)."""

import numpy as np
import pytest

from pvgpu.host.hw.mmu import Mmu, MmuFault
from pvgpu.host.hw.regs import PAGE_SIZE, VMID_KERNEL
from pvgpu.host.hw.sysmem import SystemMemory
from pvgpu.host.hw.vram import Vram
from pvgpu.spec.kernels import ACCESS_READ, ACCESS_WRITE


def test_the_kernel_vmid_reaches_vram_and_dma_mapped_host_pages():
    vram, sysmem = Vram(1 << 20), SystemMemory()
    mmu = Mmu(vram, sysmem)
    vram.mem[PAGE_SIZE:2 * PAGE_SIZE] = 7
    (v,) = mmu.translate(VMID_KERNEL, PAGE_SIZE, PAGE_SIZE, ACCESS_READ)
    assert (v == 7).all()
    host = np.zeros(3 * PAGE_SIZE, dtype=np.uint8)
    bus = sysmem.dma_map(host)
    (s,) = mmu.translate(VMID_KERNEL, bus + PAGE_SIZE, PAGE_SIZE, ACCESS_WRITE)
    s[:] = v
    assert (host[PAGE_SIZE:2 * PAGE_SIZE] == 7).all() and not host[:PAGE_SIZE].any()
    with pytest.raises(MmuFault):  # past the end of the mapping
        mmu.translate(VMID_KERNEL, bus + 2 * PAGE_SIZE, 2 * PAGE_SIZE, ACCESS_READ)
    with pytest.raises(MmuFault):  # between VRAM and the system bus window
        mmu.translate(VMID_KERNEL, vram.size, PAGE_SIZE, ACCESS_READ)
