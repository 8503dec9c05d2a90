"""The kernel-mode driver: buddy allocator, buffer objects, VMs, rings, fences, devices."""

from host.kmd.bo import BufferObject, GpuFault
from host.kmd.buddy import CONTIGUOUS, RANGE, TOPDOWN, Block, BuddyAllocator
from host.kmd.context import Context
from host.kmd.device import KmdDevice
from host.kmd.dma import DmaMapping
from host.kmd.errors import (Busy, DeviceLost, InvalidAddress, InvalidArgument, InvalidContext,
                             InvalidSegment, KmdError, NoVmid, OutOfMemory, PermissionDenied,
                             RingFull)
from host.kmd.fence import Fence, FenceDriver
from host.kmd.limits import ContextLimits
from host.kmd.ring import Ring
from host.kmd.shm import SharedSegment, ShmManager
from host.kmd.vm import GpuVm, VaAllocator

__all__ = [
    "Block", "BufferObject", "BuddyAllocator", "Busy", "CONTIGUOUS", "Context", "ContextLimits",
    "DeviceLost",
    "DmaMapping", "Fence", "FenceDriver", "GpuFault", "GpuVm", "InvalidAddress",
    "InvalidArgument", "InvalidContext", "InvalidSegment", "KmdDevice", "KmdError", "NoVmid",
    "OutOfMemory", "PermissionDenied", "RANGE", "Ring", "RingFull", "SharedSegment",
    "ShmManager", "TOPDOWN", "VaAllocator",
]
