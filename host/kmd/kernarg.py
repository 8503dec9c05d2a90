"""Parameter buffers of code launches: each context's kernarg area.

CMD_LAUNCH_CODE (spec [CMD-LAUNCH-CODE-3]) carries a kernel's parameter bytes. The SM
reads them through the MMU, with READ permission, at the VA its PKT_LAUNCH_CODE names, so
the KMD puts them where the context can read them and nothing can write them: the
context's KernargArea, KMD-owned VRAM mapped READ only (not WRITE, not EXEC) at a VA of
the context's user range, cut into slots of SLOT_SIZE bytes (isa.MAX_PARAM_SIZE, page
rounded). This is the kernarg segment an HSA runtime allocates per queue; here the KMD
owns it, as the guest must never be able to change a launch's parameters under it.

A launch's parameters wait in its job's payload (CodeLaunch) until run_job hands the job
to the hardware; then a slot is taken, the bytes written into it and the IB built with
the slot's VA. The slot comes back when the job retires (its hardware fence signalled,
or an engine reset abandoned it; KmdDevice._retire). So a context never needs more slots
than jobs it can have on the compute ring at once, the scheduler's hw_limit, and taking
a slot never waits and never allocates.

The area is made at the context's first code launch, at submission, where running out
of VRAM or page tables can still be answered (OutOfMemory), and its VRAM goes back
(cleared) with the context's VM. It is driver memory: never evicted, and not counted in
the vGPU's memory share (a few pages per context, bounded by the number of contexts).
"""

from __future__ import annotations

from dataclasses import dataclass

from pvgpu.host.hw import packets, regs
from pvgpu.host.kmd.bo import blocks_to_extents
from pvgpu.spec import isa

PAGE_SIZE = regs.PAGE_SIZE
SLOT_SIZE = -(-isa.MAX_PARAM_SIZE // PAGE_SIZE) * PAGE_SIZE


@dataclass(frozen=True)
class CodeLaunch:
    """The payload of a code-launch job until run_job: what PKT_LAUNCH_CODE needs but the
    parameter buffer's VA, and the parameter bytes to put there."""

    object_va: int
    entry_va: int
    grid: tuple
    block: tuple
    dyn_shared: int
    params: bytes

    def ib(self, params_va: int) -> bytes:
        """The job's IB: one PKT_LAUNCH_CODE naming the parameter buffer at params_va."""
        return packets.launch_code(self.object_va, self.entry_va, self.grid, self.block,
                                   self.dyn_shared, params_va, len(self.params))


class KernargArea:
    """The parameter-buffer slots of one context (lock of the device held throughout)."""

    def __init__(self, device, ctx, slots: int):
        self.device = device
        self.ctx = ctx
        self.size = slots * SLOT_SIZE
        self.blocks = device._alloc_vram(self.size, ctx)  # evicts others' BOs if VRAM is full
        try:
            self.extents = blocks_to_extents(self.blocks)
            self.va = ctx.vm.va.alloc(self.size)
            try:
                ctx.vm.map(self.va, self.extents, regs.PTE_READ)
            except BaseException:
                ctx.vm.va.free(self.va)
                raise
        except BaseException:
            device.mm.free_blocks(self.blocks)
            raise
        self._free = list(range(slots))
        self.stats = {"taken": 0, "exhausted": 0}

    def take(self, params: bytes) -> int | None:
        """A free slot with `params` written into it -> its index (the VA is slot_va(i)),
        or None if every slot is in use (more launches on the hardware than slots)."""
        if not self._free:
            self.stats["exhausted"] += 1
            return None
        slot = self._free.pop(0)
        self._write(slot * SLOT_SIZE, params)
        self.stats["taken"] += 1
        return slot

    def give_back(self, slot: int) -> None:
        self._free.append(slot)

    def slot_va(self, slot: int) -> int:
        return self.va + slot * SLOT_SIZE

    @property
    def in_use(self) -> int:
        return self.size // SLOT_SIZE - len(self._free)

    def _write(self, offset: int, data: bytes) -> None:
        pos = 0
        for phys, n in self.extents:
            if offset < pos + n and data:
                start = max(offset - pos, 0)
                chunk = data[:n - start]
                self.device.vram.write(phys + start, chunk)
                data = data[len(chunk):]
                offset += len(chunk)
            pos += n

    def release(self) -> None:
        """Give the VRAM back (cleared); the mapping goes with the context's VM."""
        self.device._release_vram(self.blocks)
        self.blocks, self.extents = [], []
