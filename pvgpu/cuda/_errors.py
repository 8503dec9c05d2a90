"""CUDA error codes for what goes wrong below the facade, and the wrapper that turns a
facade function's result or failure into cuda-python's tuple `(error, value...)`.

Functions never raise for a CUDA error: the wrapper catches CudaError (raised by the facade
itself) and the guest API's exceptions and returns their code, with None for each output,
as cuda-python does. An argument of the wrong Python type is a TypeError, as it is for
cuda-python's Cython signatures. The message of the last failure of the calling thread is
kept (pvgpu.cuda.error_detail()): the codes alone do not say which argument was wrong.

The guest API's errors map onto the codes a CUDA programmer expects:

  PageFaultError                         CUDA_ERROR_ILLEGAL_ADDRESS
  IllegalCodeError: trap                 CUDA_ERROR_LAUNCH_FAILED
                    launch               CUDA_ERROR_INVALID_VALUE
                    anything else        CUDA_ERROR_ILLEGAL_INSTRUCTION
  InvalidParameterError                  CUDA_ERROR_INVALID_VALUE (bad launch configuration, ...)
  OutOfRangeError                        CUDA_ERROR_INVALID_VALUE (a parameter out of its type's range)
  NotFoundError                          CUDA_ERROR_NOT_FOUND
  OutOfMemoryError, guest memory full    CUDA_ERROR_OUT_OF_MEMORY
  PtxCompileError                        CUDA_ERROR_INVALID_PTX
  ModuleLoadError                        CUDA_ERROR_INVALID_IMAGE
  JobTimeoutError                        CUDA_ERROR_LAUNCH_TIMEOUT
  ContextLostError                       CUDA_ERROR_LAUNCH_FAILED (the context must be destroyed)
  InvalidContextError                    CUDA_ERROR_CONTEXT_IS_DESTROYED
  InvalidEventError                      CUDA_ERROR_INVALID_HANDLE
  NotReadyError                          CUDA_ERROR_NOT_READY
  HostLost                               CUDA_ERROR_DEVICE_UNAVAILABLE
  DeviceNeedsReset                       CUDA_ERROR_DEVICE_UNAVAILABLE
  PermissionDeniedError                  CUDA_ERROR_NOT_PERMITTED
  any other pvgpu error                  CUDA_ERROR_UNKNOWN

Errors are not sticky: a pvgpu context survives a page fault or a trap (spec
[CMD-FAULT-4]), so the call that reports one returns its code and later calls work.
"""

from __future__ import annotations

import functools
import threading

from pvgpu.guest.api import errors as gerr
from pvgpu.guest.api.pinned import PinnedMemoryError
from pvgpu.guest.frontend.heap import OutOfGuestMemory
from pvgpu.cuda import enums
from pvgpu.spec import isa

R = enums.CUresult
_thread = threading.local()


class CudaError(Exception):
    """A CUDA error the facade found itself: `code` (a CUresult) and why."""

    def __init__(self, code, message: str = ""):
        super().__init__(message or code.name)
        self.code = code


def check(condition, code, message: str) -> None:
    if not condition:
        raise CudaError(code, message)


def code_of(exc: BaseException):
    """The CUresult of an exception raised below the facade (None: not a CUDA error)."""
    if isinstance(exc, CudaError):
        return exc.code
    if isinstance(exc, gerr.PageFaultError):
        return R.CUDA_ERROR_ILLEGAL_ADDRESS
    if isinstance(exc, gerr.IllegalCodeError):
        if exc.info1 == isa.COBJ_ERR_TRAP:
            return R.CUDA_ERROR_LAUNCH_FAILED
        if exc.info1 == isa.COBJ_ERR_LAUNCH:
            return R.CUDA_ERROR_INVALID_VALUE
        return R.CUDA_ERROR_ILLEGAL_INSTRUCTION
    table = (
        (gerr.InvalidParameterError, R.CUDA_ERROR_INVALID_VALUE),
        (gerr.InvalidAddressError, R.CUDA_ERROR_INVALID_VALUE),
        (gerr.InvalidResourceError, R.CUDA_ERROR_INVALID_VALUE),
        (PinnedMemoryError, R.CUDA_ERROR_INVALID_VALUE),
        (gerr.OutOfRangeError, R.CUDA_ERROR_INVALID_VALUE),
        (gerr.NotFoundError, R.CUDA_ERROR_NOT_FOUND),
        (gerr.OutOfMemoryError, R.CUDA_ERROR_OUT_OF_MEMORY),
        (OutOfGuestMemory, R.CUDA_ERROR_OUT_OF_MEMORY),
        (gerr.PtxCompileError, R.CUDA_ERROR_INVALID_PTX),
        (gerr.ModuleLoadError, R.CUDA_ERROR_INVALID_IMAGE),
        (gerr.JobTimeoutError, R.CUDA_ERROR_LAUNCH_TIMEOUT),
        (gerr.ContextLostError, R.CUDA_ERROR_LAUNCH_FAILED),
        (gerr.InvalidContextError, R.CUDA_ERROR_CONTEXT_IS_DESTROYED),
        (gerr.InvalidEventError, R.CUDA_ERROR_INVALID_HANDLE),
        (gerr.NotReadyError, R.CUDA_ERROR_NOT_READY),
        (gerr.HostLost, R.CUDA_ERROR_DEVICE_UNAVAILABLE),
        (gerr.DeviceNeedsReset, R.CUDA_ERROR_DEVICE_UNAVAILABLE),
        (gerr.PermissionDeniedError, R.CUDA_ERROR_NOT_PERMITTED),
        (gerr.PvgpuError, R.CUDA_ERROR_UNKNOWN),
    )
    for cls, code in table:
        if isinstance(exc, cls):
            return code
    return None


def detail() -> str:
    """The message of the calling thread's last failing facade call ('' if none)."""
    return getattr(_thread, "detail", "")


def _fail(exc: BaseException):
    code = code_of(exc)
    if code is None:
        raise exc
    _thread.detail = f"{code.name}: {exc}"
    return code


def driver_api(outputs: int):
    """Wrap a driver function returning its `outputs` values (a tuple, one value, or None)
    into cuda-python's `(CUresult, value...)`."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                out = fn(*args, **kwargs)
            except Exception as e:
                return (_fail(e),) + (None,) * outputs
            return (R.CUDA_SUCCESS,) + _as_tuple(out, outputs)
        return wrapper
    return deco


def runtime_api(outputs: int, *, records: bool = True):
    """As driver_api, with cudaError_t; a failure also becomes the thread's last error
    (cudaGetLastError) unless `records` is False."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                out = fn(*args, **kwargs)
            except Exception as e:
                err = enums.runtime_error(_fail(e))
                if records:
                    _thread.last_error = err
                return (err,) + (None,) * outputs
            return (enums.cudaError_t.cudaSuccess,) + _as_tuple(out, outputs)
        return wrapper
    return deco


def reset_thread() -> None:
    """Forget the calling thread's last error and its detail (a new connection)."""
    _thread.__dict__.clear()


def last_runtime_error(reset: bool):
    err = getattr(_thread, "last_error", enums.cudaError_t.cudaSuccess)
    if reset:
        _thread.last_error = enums.cudaError_t.cudaSuccess
    return err


def _as_tuple(out, outputs: int) -> tuple:
    if outputs == 0:
        return ()
    if outputs == 1:
        return (out,)
    return tuple(out)
