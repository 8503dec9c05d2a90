"""Python exceptions of the compute API, one per device error (spec §9).

A device error response becomes the exception named after it (ERR_PAGE_FAULT ->
PageFaultError, ERR_CONTEXT_LOST -> ContextLostError, ...); a control refusal becomes
ControlError; a silent host becomes HostLost; DEVICE_NEEDS_RESET becomes DeviceNeedsReset.

Every exception the API raises on purpose derives from PvgpuError, which the transport
defines (transport/errors.py) so that its own errors, the channel's (ChannelError,
ChannelTimeout) and the frontend's (OutOfGuestMemory) share it. Where Python has a
built-in for the same failure the class derives from it too (ChannelTimeout is a
TimeoutError, OutOfGuestMemory a MemoryError, OutOfRangeError an OverflowError), so code
that catches the built-in keeps working.
"""

from pvgpu.spec import isa, wire
from pvgpu.guest.frontend.driver import DeviceNeedsReset as _FrontendNeedsReset
from pvgpu.guest.frontend.driver import DeviceResponseError
from pvgpu.guest.frontend.heap import OutOfGuestMemory
from pvgpu.guest.frontend.session import (ChannelError, ChannelTimeout, ControlRequestError,
                                    PvgpuError)
from pvgpu.guest.frontend.session import AuthenticationFailed as _AuthenticationFailed
from pvgpu.guest.frontend.session import HostLost as _TransportHostLost
from pvgpu.guest.frontend.session import HostNotFound as _TransportHostNotFound


class DeviceError(PvgpuError):
    """A device command failed. `code` is the wire response type, `name` its spec name."""

    code = wire.RESP_ERR_UNSPEC

    def __init__(self, message: str, *, code: int | None = None, info0: int = 0, info1: int = 0):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.info0, self.info1 = info0, info1

    @property
    def name(self) -> str:
        """The spec's name of the response, e.g. "ERR_OUT_OF_MEMORY"."""
        return wire.RESP_NAMES.get(self.code, hex(self.code))


class OutOfMemoryError(DeviceError):
    """The device (or this vGPU's memory share) has no room for the allocation: free
    arrays, or allocate less (cudaErrorMemoryAllocation)."""

    code = wire.RESP_ERR_OUT_OF_MEMORY


class LimitError(OutOfMemoryError):
    """A per-session or per-context count of the host is reached (spec §10.3: contexts,
    events, segment ids, VA reservations and mappings, imports); freeing some of them
    makes room. An OutOfMemoryError, as the CUDA driver reports too many contexts."""

    code = wire.RESP_ERR_LIMIT


class InvalidResourceError(DeviceError):
    """No such buffer in the context: the array was freed, or belongs to another context."""

    code = wire.RESP_ERR_INVALID_RESOURCE_ID


class InvalidContextError(DeviceError):
    """No such context on the device: it was destroyed, or its device was reset."""

    code = wire.RESP_ERR_INVALID_CONTEXT_ID


class InvalidParameterError(DeviceError):
    """The device refused an argument of the command (a size, range, launch dimension...)."""

    code = wire.RESP_ERR_INVALID_PARAMETER


class UnknownCommandError(DeviceError):
    """The device does not know the command (an older device, or a feature not negotiated)."""

    code = wire.RESP_ERR_UNKNOWN_COMMAND


class ShortCommandError(DeviceError):
    """The command's readable bytes were fewer than its type needs (a driver bug)."""

    code = wire.RESP_ERR_SHORT_COMMAND


class InvalidKernelError(DeviceError):
    """No built-in kernel with that id (LAUNCH): the device has no such kernel."""

    code = wire.RESP_ERR_INVALID_KERNEL


class InvalidAddressError(DeviceError):
    """VA_RELEASE / MEM_MAP / MEM_UNMAP (Context.release_va / map / unmap): no reservation
    or mapping starts at that address, or the range is not inside one reservation of the
    context, or it overlaps another mapping."""

    code = wire.RESP_ERR_INVALID_ADDRESS


class _FaultReport(DeviceError):
    """A fault the device also reports on its event queue: `address` (info0) names where,
    `event` is the queue's report (a DeviceEvent), when there is one; `str()` includes it."""

    event = None

    def __str__(self) -> str:
        text = super().__str__()
        if self.event is not None and str(self.event) not in text:
            text = f"{text} [{self.event}]"
        return text

    @property
    def address(self) -> int:
        """The device address the fault names (info0)."""
        return self.info0


class PageFaultError(_FaultReport):
    """The GPU faulted: `address` is the faulting device VA, `access` 'read'/'write'/'exec'.
    `event` is the device's event-queue report of the fault (a DeviceEvent with its vmid,
    engine and stream), when the device has an event queue; `str()` then includes it."""

    code = wire.RESP_ERR_PAGE_FAULT

    @property
    def access(self) -> str:
        """The faulting access: "read", "write" or "exec"."""
        return wire.ACCESS_NAMES.get(self.info1, str(self.info1))


class IllegalCodeError(_FaultReport):
    """The device refused a code object or a launch of it (malformed object, an entry the
    launch does not fit, a bad instruction), or the kernel executed `trap`: `address` is the
    device VA of the offending record (header, entry, parameter or instruction), `reason`
    why (the name of a spec/isa.py COBJ_ERR_*). Like a page fault it affects only that
    launch: the context keeps working. `event` is the event-queue report, when there is one."""

    code = wire.RESP_ERR_ILLEGAL_CODE

    @property
    def reason(self) -> str:
        """Why the device refused the code: the name of a spec/isa.py COBJ_ERR_*."""
        return isa.COBJ_ERR_NAMES.get(self.info1, str(self.info1))


class ContextLostError(DeviceError):
    """The context was found guilty of a GPU hang (its job ran too long, or another of its
    jobs did) and the host cancelled its work. The context is unusable from now on: every
    later command on it fails with this error. Destroy it (and create a new one); other
    contexts, and other guests, are unaffected."""

    code = wire.RESP_ERR_CONTEXT_LOST


class JobTimeoutError(DeviceError):
    """A job ran past the host's timeout and was stopped (TDR). Its context is lost as
    well: later work on it fails with ContextLostError; destroy it."""

    code = wire.RESP_ERR_JOB_TIMEOUT


class InvalidEventError(DeviceError):
    """An event id the device does not know (never recorded, destroyed, reset), or an event
    handle that is unknown, withdrawn or has the wrong token."""

    code = wire.RESP_ERR_INVALID_EVENT


class InvalidSegmentError(DeviceError):
    """A shared segment this guest cannot name on the device (never created or imported
    here, or removed and detached by all), a removed segment (no new attachments), or one
    not attached to the context (guest/api/shm.py)."""

    code = wire.RESP_ERR_INVALID_SEGMENT


class PermissionDeniedError(DeviceError):
    """Only a segment's creator removes or exports it; an import needs a live export's
    handle and token (on the segment's device)."""

    code = wire.RESP_ERR_PERMISSION


class ModuleLoadError(PvgpuError):
    """A module could not be loaded: its source is not something load_module takes, a file
    cannot be read, or the bytes given are not a valid code object."""


class PtxCompileError(ModuleLoadError):
    """The PTX does not compile: the message is the compiler's and names the PTX line;
    `line` (1-based), `instruction` and `section` (of the PTX ISA) when it gave them."""

    def __init__(self, message: str, *, line=None, instruction=None, section=None):
        super().__init__(message)
        self.line, self.instruction, self.section = line, instruction, section


class CudaCompileError(ModuleLoadError):
    """CUDA C source cannot be compiled: NVRTC is not installed (pip install 'pvgpu[cuda]'),
    or the source has errors (`log`: NVRTC's log)."""

    def __init__(self, message: str, *, log: str = ""):
        super().__init__(message)
        self.log = log


class NotFoundError(PvgpuError, LookupError):
    """A module has no kernel or variable of that name."""


class NotReadyError(PvgpuError):
    """The work an event captured has not completed yet (Event.elapsed_time)."""


class DeviceNeedsReset(PvgpuError):
    """The device rejected a malformed request and must be reset (Device.reset())."""


class HostLost(PvgpuError):
    """The host stopped answering (heartbeats missed) or went away. The connection is of
    no further use: connect again once a host runs."""


class HostNotFound(HostLost):
    """No host serves the endpoint (an ipc endpoint without its socket file): start one
    with `pvgpu host`, or connect to the endpoint of one that runs."""


class ConnectionClosedError(PvgpuError):
    """The connection was closed (Connection.close, or the end of its `with` block):
    nothing more can be done with it or its objects; open a new one with connect()."""


class OutOfRangeError(PvgpuError, OverflowError):
    """A number does not fit the type it becomes (a kernel parameter, an element of the
    array it is copied into): pass one in range, or use a wider type."""


class ControlError(PvgpuError):
    """The host refused a control-channel request."""


class AuthenticationError(PvgpuError):
    """The host did not accept this guest's connection: its CURVE key is not authorized,
    the server key is not the host's, or only one side uses CURVE (spec CTL-AUTH-6)."""


_BY_CODE = {cls.code: cls for cls in (
    OutOfMemoryError, InvalidResourceError, InvalidContextError, InvalidParameterError,
    UnknownCommandError, ShortCommandError, InvalidKernelError, InvalidAddressError, PageFaultError,
    ContextLostError, JobTimeoutError, InvalidEventError, InvalidSegmentError,
    PermissionDeniedError, IllegalCodeError, LimitError)}


def error_for(code: int, message: str, info0: int = 0, info1: int = 0) -> DeviceError:
    """The exception for device error `code` (a RESP_ERR_* value)."""
    return _BY_CODE.get(code, DeviceError)(message, code=code, info0=info0, info1=info1)


def translate(exc: BaseException) -> BaseException:
    """Map a frontend/transport exception onto the API's exception (others: as they are)."""
    if isinstance(exc, DeviceResponseError):
        return error_for(exc.resp, str(exc), exc.info0, exc.info1)
    if isinstance(exc, _FrontendNeedsReset):
        return DeviceNeedsReset(str(exc))
    if isinstance(exc, _AuthenticationFailed):
        return AuthenticationError(str(exc))
    if isinstance(exc, _TransportHostNotFound):
        return HostNotFound(str(exc))
    if isinstance(exc, _TransportHostLost):
        return HostLost(str(exc))
    if isinstance(exc, ControlRequestError):
        return ControlError(str(exc))
    return exc

