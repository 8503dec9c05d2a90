"""Errors the kernel-mode driver returns to its callers.

Like a DRM driver returning -ENOMEM / -EINVAL / -ENOSPC, every caller mistake or resource
shortage is a KmdError carrying a short machine-readable `code`; the backend maps codes
onto wire response types. Broken internal invariants are assertions, not KmdErrors.
"""

from __future__ import annotations

OUT_OF_MEMORY = "out_of_memory"
INVALID_ARGUMENT = "invalid_argument"
INVALID_ADDRESS = "invalid_address"
INVALID_CONTEXT = "invalid_context"
NO_VMID = "no_vmid"
RING_FULL = "ring_full"
BUSY = "busy"
DEVICE_LOST = "device_lost"
NO_DEVICE = "no_device"
CONTEXT_LOST = "context_lost"
JOB_TIMEOUT = "job_timeout"
QUOTA = "quota"
INVALID_SEGMENT = "invalid_segment"
PERMISSION = "permission"
LIMIT = "limit"


class KmdError(Exception):
    """Base of every driver error; `code` is one of the strings above."""

    code = "error"

    def __init__(self, message: str = "", code: str | None = None):
        if code is not None:
            self.code = code
        super().__init__(message or self.code)


class OutOfMemory(KmdError):
    code = OUT_OF_MEMORY


class LimitReached(OutOfMemory):
    """A count the context's ContextLimits bound (host/kmd/limits.py) is reached: not a
    shortage that evicting or waiting would cure (like -ENOSPC of a full table)."""

    code = LIMIT


class InvalidArgument(KmdError):
    code = INVALID_ARGUMENT


class InvalidAddress(KmdError):
    code = INVALID_ADDRESS


class InvalidContext(KmdError):
    code = INVALID_CONTEXT


class NoVmid(KmdError):
    code = NO_VMID


class RingFull(KmdError):
    code = RING_FULL


class Busy(KmdError):
    code = BUSY


class DeviceLost(KmdError):
    code = DEVICE_LOST


class ContextLost(KmdError):
    """The context was marked guilty of a GPU hang (TDR) and accepts no more work.

    Raised by submissions to a lost context, and used as the error of that context's jobs
    that were queued or running when it was marked lost."""

    code = CONTEXT_LOST


class JobTimedOut(KmdError):
    """The error of a job that ran past the scheduler's timeout and was stopped by an
    engine reset (drm_sched timedout_job); its context is marked lost."""

    code = JOB_TIMEOUT


class InvalidSegment(KmdError):
    """A shared segment that does not exist (any more), was removed, is not attached to
    the context, or has no key (host/kmd/shm.py)."""

    code = INVALID_SEGMENT


class PermissionDenied(KmdError):
    """A client may not do this to a shared segment: attach one it neither created nor
    imported, remove or export one it did not create, import with a wrong token."""

    code = PERMISSION
