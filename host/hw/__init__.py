"""The emulated GPU hardware: what the KMD drives, below the driver line.

Driven only the way a real driver drives a device: VRAM writes through the BAR, MMIO
registers and doorbells, and interrupts. It knows VMIDs, addresses, packets and
registers, never guests, sessions or virtio.

  regs.py               register map, page-table format, interrupt sources (the "header")
  packets.py            command packet format and encoders
  sysmem.py             SystemMemory: host memory behind the IOMMU (dma_map -> bus address)
  vram.py               Vram: device memory
  mmio.py               RegisterFile: the MMIO aperture and its side-effect hooks
  interrupts.py         Interrupt, InterruptController
  mmu.py                Mmu: page-table walks, extents, TLB; MmuFault
  kernels.py            the built-in kernel library and KernelMemory
  sm/                   the streaming multiprocessors: code objects (spec/isa.md) checked
                        and executed for PKT_LAUNCH_CODE
  command_processor.py  CommandProcessor: packet decoding and execution
  engine.py             Engine: one ring and its thread (three per GPU: compute, copy0, copy1)
  pcie.py               PcieFabric: PCIe topology, BARs, p2pdma distance, peer views
  gpu.py                Gpu and Platform builders
"""
