"""pvgpu guest: the compute API (pvgpu.guest.api) over the virtio frontend (pvgpu.guest.frontend).

    from pvgpu import guest
    with guest.connect() as conn:
        ctx = conn.devices[0].create_context()
        ...
"""

if not __name__.startswith("pvgpu."):  # the checkout's top directory on sys.path
    raise ImportError(f"`{__name__}` is pvgpu.{__name__}: import it as that")

from pvgpu.guest.api.array import DeviceArray, MappedArray, VaRange
from pvgpu.guest.api.connection import Connection, connect
from pvgpu.guest.api.context import Context
from pvgpu.guest.api.device import Device
from pvgpu.guest.api.event import Event, EventHandle
from pvgpu.guest.api.stream import Stream
from pvgpu.guest.api.errors import (AuthenticationError, ChannelError, ChannelTimeout,
                              ConnectionClosedError, ContextLostError, ControlError,
                              DeviceError, DeviceNeedsReset, HostLost, HostNotFound,
                              InvalidAddressError, InvalidContextError, InvalidEventError,
                              InvalidKernelError, InvalidParameterError, InvalidResourceError,
                              InvalidSegmentError, JobTimeoutError, LimitError, NotReadyError,
                              OutOfGuestMemory, OutOfMemoryError, OutOfRangeError,
                              PageFaultError, PermissionDeniedError, PvgpuError,
                              ShortCommandError, UnknownCommandError)
from pvgpu.guest.api.prime import BufferHandle, ImportedArray
from pvgpu.guest.api.shm import SharedArray, SharedSegment, ShmHandle
from pvgpu.spec.wire import KERNELS_BY_NAME as _K

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

from pvgpu.guest.api.pinned import PinnedArray, PinnedMemoryError  # noqa: E402  (pinned host memory)

__all__ += ["PinnedArray", "PinnedMemoryError"]
from pvgpu.guest.api.errors import (CudaCompileError, IllegalCodeError,  # noqa: E402  (modules)
                              ModuleLoadError, NotFoundError, PtxCompileError)
from pvgpu.guest.api.module import Function, Module, ModuleGlobal  # noqa: E402

__all__ += ["Module", "Function", "ModuleGlobal", "IllegalCodeError", "ModuleLoadError",
            "PtxCompileError", "CudaCompileError", "NotFoundError"]
