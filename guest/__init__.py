"""pvgpu guest: the compute API (guest.api) over the virtio frontend (guest.frontend).

    import guest
    with guest.connect() as conn:
        ctx = conn.devices[0].create_context()
        ...
"""

from guest.api.core import (Connection, Context, Device, DeviceArray, Event, EventHandle, Stream,
                            connect)
from guest.api.errors import (ContextLostError, ControlError, DeviceError, DeviceNeedsReset,
                              HostLost, InvalidAddressError, InvalidContextError,
                              InvalidEventError, InvalidKernelError, InvalidParameterError,
                              InvalidResourceError, JobTimeoutError, NotReadyError,
                              OutOfMemoryError, PageFaultError, PvgpuError, ShortCommandError,
                              UnknownCommandError)
from spec.wire import KERNELS_BY_NAME as _K

KERNELS = sorted(_K)

__all__ = [
    "connect", "Connection", "Device", "Context", "DeviceArray", "Stream", "Event",
    "EventHandle", "KERNELS",
    "PvgpuError", "DeviceError", "OutOfMemoryError", "InvalidResourceError", "InvalidContextError",
    "InvalidParameterError", "UnknownCommandError", "ShortCommandError", "InvalidKernelError",
    "InvalidAddressError", "PageFaultError", "ContextLostError", "JobTimeoutError",
    "InvalidEventError", "NotReadyError", "DeviceNeedsReset", "HostLost", "ControlError",
]
