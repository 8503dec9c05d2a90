"""Buffer objects and GPU fault records.

A BufferObject is the driver's handle on a piece of VRAM (amdgpu_bo / drm_gem_object):
the buddy blocks that back it, the same memory as a short list of physically contiguous
extents (adjacent blocks coalesced — what the page-table code maps), the GPU virtual
address it is mapped at in its context, and a reference count. The last reference going
away frees the memory, but only once the GPU can no longer touch it (see device.py).

A GpuFault is what a page-fault interrupt reports, a CodeFault what a code-fault
interrupt reports (a code object or launch the SMs refused, or a trap); either becomes the
error of the fence of the job that faulted.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from pvgpu.spec import isa, kernels

_handles = itertools.count(1)


def blocks_to_extents(blocks) -> list:
    """Buddy blocks -> [(phys, size)] in address order, adjacent blocks coalesced."""
    extents = []
    for b in sorted(blocks, key=lambda b: b.offset):
        if extents and extents[-1][0] + extents[-1][1] == b.offset:
            extents[-1] = (extents[-1][0], extents[-1][1] + b.size)
        else:
            extents.append((b.offset, b.size))
    return extents


class BufferObject:
    """VRAM memory owned by one context and mapped at `va` in its address space."""

    __slots__ = ("handle", "size", "blocks", "extents", "va", "context", "refcount", "freed",
                 "sysmem", "resv", "dmabuf", "sys_pins", "moving", "__weakref__")

    def __init__(self, size: int, blocks: list, context=None, va: int = 0):
        self.handle = next(_handles)
        self.size = size  # page rounded; == sum of the block sizes
        self.blocks = blocks
        self.extents = blocks_to_extents(blocks)
        self.va = va
        self.context = context
        self.refcount = 1
        self.freed = False
        self.sysmem = None  # DmaMapping of the host copy while evicted
        self.resv = None  # DmaResv once exported (host/kmd/prime.py): implicit sync
        self.dmabuf = None  # its DmaBuf while exported
        self.sys_pins = 0  # attachments that need it in system memory (no peer-to-peer)
        self.moving = None  # the fence of its move (evict.py) while one is in flight

    @property
    def evicted(self) -> bool:
        return self.sysmem is not None

    @property
    def phys(self) -> int:
        """Physical address of the first byte (the whole BO when len(extents) == 1)."""
        return self.extents[0][0]

    @property
    def contiguous(self) -> bool:
        return len(self.extents) == 1

    def get(self) -> "BufferObject":
        assert self.refcount > 0, "get() on a released buffer object"
        self.refcount += 1
        return self

    def put(self) -> bool:
        """Drop a reference; True when it was the last one."""
        assert self.refcount > 0, "put() on a released buffer object"
        self.refcount -= 1
        return self.refcount == 0

    def contains(self, va: int, size: int = 1) -> bool:
        return self.va <= va and va + size <= self.va + self.size

    def __repr__(self) -> str:
        return (f"BufferObject(handle={self.handle}, va={self.va:#x}, size={self.size:#x}, "
                f"extents={len(self.extents)}, refcount={self.refcount}"
                f"{', evicted' if self.sysmem is not None else ''})")


@dataclass(frozen=True)
class GpuFault:
    """A GPU page fault: `address` (VA) of `vmid` could not be accessed for `access`."""

    vmid: int
    address: int
    access: int  # pvgpu.spec.kernels ACCESS_*
    engine: int

    def __str__(self) -> str:
        kind = kernels.ACCESS_NAMES.get(self.access, f"access {self.access}")
        return (f"GPU page fault: {kind} at {self.address:#x} "
                f"(vmid {self.vmid}, engine {self.engine})")


@dataclass(frozen=True)
class CodeFault:
    """A code fault (IRQ_CODE_FAULT): the SM refused a code object or launch, or the kernel
    executed trap. `address` is the VA of the offending record, `reason` a COBJ_ERR_*."""

    vmid: int
    address: int
    reason: int  # pvgpu.spec.isa COBJ_ERR_*
    engine: int

    def __str__(self) -> str:
        why = isa.COBJ_ERR_NAMES.get(self.reason, f"reason {self.reason}")
        return (f"code fault ({why}) at {self.address:#x} "
                f"(vmid {self.vmid}, engine {self.engine})")
