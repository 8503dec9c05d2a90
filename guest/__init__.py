"""pvgpu guest: the compute API (guest.api) over the virtio frontend (guest.frontend).

    import guest
    with guest.connect() as conn:
        ctx = conn.devices[0].create_context()
        ...
"""

from guest.api.array import DeviceArray, MappedArray, VaRange
from guest.api.connection import Connection, connect
from guest.api.context import Context
from guest.api.device import Device
from guest.api.event import Event, EventHandle
from guest.api.stream import Stream
from guest.api.errors import (AuthenticationError, ChannelError, ChannelTimeout,
                              ConnectionClosedError, ContextLostError, ControlError,
                              DeviceError, DeviceNeedsReset, HostLost, HostNotFound,
                              InvalidAddressError, InvalidContextError, InvalidEventError,
                              InvalidKernelError, InvalidParameterError, InvalidResourceError,
                              InvalidSegmentError, JobTimeoutError, LimitError, NotReadyError,
                              OutOfGuestMemory, OutOfMemoryError, OutOfRangeError,
                              PageFaultError, PermissionDeniedError, PvgpuError,
                              ShortCommandError, UnknownCommandError)
from guest.api.prime import BufferHandle, ImportedArray
from guest.api.shm import SharedArray, SharedSegment, ShmHandle
from spec.wire import KERNELS_BY_NAME as _K

KERNELS = sorted(_K)

__all__ = [
    "connect", "Connection", "Device", "Context", "DeviceArray", "Stream", "Event",
    "EventHandle", "KERNELS", "SharedSegment", "SharedArray", "ShmHandle", "VaRange",
    "MappedArray", "BufferHandle", "ImportedArray",
    "PvgpuError", "DeviceError", "OutOfMemoryError", "InvalidResourceError", "InvalidContextError",
    "InvalidParameterError", "UnknownCommandError", "ShortCommandError", "InvalidKernelError",
    "InvalidAddressError", "PageFaultError", "ContextLostError", "JobTimeoutError",
    "InvalidEventError", "InvalidSegmentError", "PermissionDeniedError", "LimitError", "NotReadyError",
    "DeviceNeedsReset", "HostLost", "HostNotFound", "ControlError", "AuthenticationError",
    "ConnectionClosedError", "OutOfRangeError", "OutOfGuestMemory", "ChannelError",
    "ChannelTimeout",
]

from guest.api.pinned import PinnedArray, PinnedMemoryError  # noqa: E402  (pinned host memory)

__all__ += ["PinnedArray", "PinnedMemoryError"]
from guest.api.errors import (CudaCompileError, IllegalCodeError,  # noqa: E402  (modules)
                              ModuleLoadError, NotFoundError, PtxCompileError)
from guest.api.module import Function, Module, ModuleGlobal  # noqa: E402

__all__ += ["Module", "Function", "ModuleGlobal", "IllegalCodeError", "ModuleLoadError",
            "PtxCompileError", "CudaCompileError", "NotFoundError"]
