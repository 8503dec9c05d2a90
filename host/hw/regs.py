"""The emulated GPU's programming interface: register map, page-table format, interrupts.

This is the hardware's "register header" (like amdgpu's *_offset.h / *_sh_mask.h): the
KMD includes it to program the device, the hardware blocks include it to decode what the
KMD wrote. Nothing here knows about guests, sessions or virtio (the layering rule of the hardware).

Page tables (modelled on amdgpu's GMC, 4 KiB pages):
  a 48-bit GPU virtual address splits into 4 levels of 9 bits (PD2, PD1, PD0, PT) and a
  12-bit page offset. Every table is one 4 KiB VRAM page of 512 little-endian u64
  entries. A PDE holds the VRAM physical address of the next table and PDE_VALID. A PTE
  holds a page address and the flags below: without PTE_SYSTEM/PTE_PEER the address is
  this device's VRAM physical address; with PTE_SYSTEM it is a system bus address (DMA
  mapped host memory, see sysmem.py); with PTE_PEER it is a bus address inside a GPU's
  BAR0 (peer-to-peer, see pcie.py). REG_VM_PT_BASE(vmid) holds the root (PD2) address.
  VMID 0 is the kernel's physical address space: no translation, VRAM only.
"""

PAGE_SHIFT = 12
PAGE_SIZE = 1 << PAGE_SHIFT
PT_LEVELS = 4
PT_ENTRY_BITS = 9
PT_ENTRIES = 1 << PT_ENTRY_BITS
PTE_SIZE = 8
VA_BITS = PAGE_SHIFT + PT_LEVELS * PT_ENTRY_BITS  # 48

PDE_VALID = 1 << 0
PTE_VALID = 1 << 0
PTE_SYSTEM = 1 << 1
PTE_PEER = 1 << 2
PTE_EXEC = 1 << 4
PTE_READ = 1 << 5
PTE_WRITE = 1 << 6
PTE_FRAGMENT_SHIFT = 7  # 5 bits: the page lies in an aligned run of 2**frag pages mapped contiguously
PTE_FRAGMENT_MASK = 0x1F << PTE_FRAGMENT_SHIFT
PTE_ADDR_MASK = ((1 << 52) - 1) & ~(PAGE_SIZE - 1)

NUM_VMIDS = 64
VMID_KERNEL = 0

# Engines: one ring and one thread each; they run concurrently. The compute engine runs
# LAUNCH packets; the two copy engines are identical DMA engines that run COPY packets
# (the KMD uses copy0 for host->device and copy1 for device->host transfers).
ENGINE_COMPUTE = 0
ENGINE_COPY0 = 1
ENGINE_COPY1 = 2
ENGINE_COPY = ENGINE_COPY0  # alias kept for drivers that know one copy engine
NUM_ENGINES = 3
COPY_ENGINES = frozenset({ENGINE_COPY0, ENGINE_COPY1})
ENGINE_NAMES = {ENGINE_COMPUTE: "compute", ENGINE_COPY0: "copy0", ENGINE_COPY1: "copy1"}

# MMIO registers: byte offsets of 64-bit registers.
REG_DEVICE_ID = 0x0000  # RO: reads DEVICE_ID_PVGPU_EMU
DEVICE_ID_PVGPU_EMU = 0x50564750  # "PVGP"
REG_VRAM_SIZE = 0x0008  # RO
REG_IRQ_ENABLE = 0x0010  # RW: 1 = deliver interrupts
REG_VM_INVALIDATE = 0x0020  # WO: vmid -> drop that VMID's TLB entries; VM_INVALIDATE_ALL drops all
VM_INVALIDATE_ALL = 0xFFFFFFFF
REG_TIMESTAMP = 0x0030  # RO: the device clock in ns (Gpu.clock_ns: the host's monotonic clock)
REG_VM_PT_BASE0 = 0x1000  # RW, one per VMID: root page directory (VRAM physical), 0 = none


def REG_VM_PT_BASE(vmid: int) -> int:
    return REG_VM_PT_BASE0 + 8 * vmid


REG_ENGINE0 = 0x2000
ENGINE_REG_STRIDE = 0x100
RB_BASE = 0x00  # RW: ring buffer VRAM physical address (page aligned)
RB_SIZE = 0x08  # RW: ring size in bytes (power of two, >= 4 KiB)
RB_RPTR = 0x10  # RO: byte offset the command processor reads next
RB_WPTR = 0x18  # RW: byte offset one past the last packet the driver committed
RB_DOORBELL = 0x20  # WO: write the new wptr; wakes the engine
RB_RESET = 0x28  # WO: 1 = stop, drop pending packets, rptr = wptr = 0
RB_STATUS = 0x30  # RO: RB_STATUS_IDLE / RB_STATUS_BUSY
RB_BUSY_NS = 0x38  # RO: total ns this engine spent executing packets (a stalled WAIT counts)
RB_KICK_SYNC = 0x40  # WO: an idle engine runs the ring up to WPTR on the writing thread
RB_KICK_SYNC_WPTR = 0x48  # WO: the value is published as WPTR, then as RB_KICK_SYNC


def REG_ENGINE(engine: int, reg: int) -> int:
    return REG_ENGINE0 + ENGINE_REG_STRIDE * engine + reg


RB_STATUS_IDLE = 0
RB_STATUS_BUSY = 1

# Interrupt sources (InterruptController delivers pvgpu.host.hw.interrupts.Interrupt records).
# Every record also carries `timestamp`: the device clock (ns) when it was raised.
IRQ_FENCE = 1  # engine, address = fence address, data = the sequence number written
IRQ_PAGE_FAULT = 2  # engine, vmid, address, access (pvgpu.spec.kernels ACCESS_*)
IRQ_ILLEGAL_PACKET = 3  # engine, vmid, address = ring/IB byte offset, data = header dword
IRQ_CODE_FAULT = 4  # engine, vmid, address = VA of the offending record, data = COBJ_ERR_*
IRQ_NAMES = {IRQ_FENCE: "fence", IRQ_PAGE_FAULT: "page_fault", IRQ_ILLEGAL_PACKET: "illegal_packet",
             IRQ_CODE_FAULT: "code_fault"}
