"""The kernel-mode driver: buddy allocator, buffer objects, VMs, rings, fences, devices."""

from pvgpu.host.kmd.bo import BufferObject, GpuFault
from pvgpu.host.kmd.buddy import CONTIGUOUS, RANGE, TOPDOWN, Block, BuddyAllocator
from pvgpu.host.kmd.context import Context
from pvgpu.host.kmd.device import KmdDevice
from pvgpu.host.kmd.dma import DmaMapping
from pvgpu.host.kmd.errors import (Busy, DeviceLost, InvalidAddress, InvalidArgument, InvalidContext,
                             InvalidSegment, KmdError, NoVmid, OutOfMemory, PermissionDenied,
                             RingFull)
from pvgpu.host.kmd.fence import Fence, FenceDriver
from pvgpu.host.kmd.limits import ContextLimits
from pvgpu.host.kmd.ring import Ring
from pvgpu.host.kmd.shm import SharedSegment, ShmManager
from pvgpu.host.kmd.vm import GpuVm, VaAllocator

__all__ = [
    "Block", "BufferObject", "BuddyAllocator", "Busy", "CONTIGUOUS", "Context", "ContextLimits",
    "DeviceLost",
    "DmaMapping", "Fence", "FenceDriver", "GpuFault", "GpuVm", "InvalidAddress",
    "InvalidArgument", "InvalidContext", "InvalidSegment", "KmdDevice", "KmdError", "NoVmid",
    "OutOfMemory", "PermissionDenied", "RANGE", "Ring", "RingFull", "SharedSegment",
    "ShmManager", "TOPDOWN", "VaAllocator",
]
