"""The enumerations and constants of the CUDA driver and runtime APIs, as pvgpu.cuda returns
and accepts them.

When cuda-bindings is installed (`pip install 'pvgpu[cuda]'`), the enum types are its own
(`cuda.bindings.driver.CUresult`, `cuda.bindings.runtime.cudaError_t`, ...), so that code
written for cuda-python compares and prints our results exactly as it does theirs
(`err == cuda.CUresult.CUDA_SUCCESS`, `isinstance(err, cuda.CUresult)`). Without it they are
IntEnums of the same names and values (pvgpu/cuda/_enum_values.py). Flag constants
(`cudaHostAllocMapped`, `CU_STREAM_LEGACY`, ...) are plain ints, as in cuda-python.
"""

from __future__ import annotations

import enum

from pvgpu.cuda import _enum_values

try:  # the real types, when the bindings are there
    from cuda.bindings import driver as _bd
    from cuda.bindings import runtime as _br
except ImportError:  # pragma: no cover - exercised where cuda-bindings is absent
    _bd = _br = None

FROM_BINDINGS = _bd is not None


def _enum(name: str):
    for mod in (_bd, _br):
        if mod is not None and hasattr(mod, name):
            return getattr(mod, name)
    return enum.IntEnum(name, list(_enum_values.ENUMS[name]), module=__name__)


CUresult = _enum("CUresult")
cudaError_t = _enum("cudaError_t")
CUdevice_attribute = _enum("CUdevice_attribute")
cudaDeviceAttr = _enum("cudaDeviceAttr")
CUjit_option = _enum("CUjit_option")
CUfunction_attribute = _enum("CUfunction_attribute")
cudaFuncAttribute = _enum("cudaFuncAttribute")
cudaMemcpyKind = _enum("cudaMemcpyKind")
CUctx_flags = _enum("CUctx_flags")
CUstream_flags = _enum("CUstream_flags")
CUevent_flags = _enum("CUevent_flags")
CUmemorytype = _enum("CUmemorytype")
cudaMemoryType = _enum("cudaMemoryType")
CUpointer_attribute = _enum("CUpointer_attribute")
CUcomputemode = _enum("CUcomputemode")
cudaComputeMode = _enum("cudaComputeMode")
CUmemAttach_flags = _enum("CUmemAttach_flags")
CUlimit = _enum("CUlimit")
cudaLimit = _enum("cudaLimit")

DRIVER_ENUMS = ("CUresult", "CUdevice_attribute", "CUjit_option", "CUfunction_attribute",
                "CUctx_flags", "CUstream_flags", "CUevent_flags", "CUmemorytype",
                "CUpointer_attribute", "CUcomputemode", "CUmemAttach_flags", "CUlimit")
RUNTIME_ENUMS = ("cudaError_t", "cudaDeviceAttr", "cudaFuncAttribute", "cudaMemcpyKind",
                 "cudaMemoryType", "cudaComputeMode", "cudaLimit")

# ---------------------------------------------------------------- driver flag constants
CU_STREAM_LEGACY = 1  # the NULL stream's handle values (cuda-python's are plain ints too)
CU_STREAM_PER_THREAD = 2
CU_MEMHOSTALLOC_PORTABLE = 1
CU_MEMHOSTALLOC_DEVICEMAP = 2
CU_MEMHOSTALLOC_WRITECOMBINED = 4
CU_MEMHOSTREGISTER_PORTABLE = 1
CU_MEMHOSTREGISTER_DEVICEMAP = 2
CU_LAUNCH_PARAM_END = 0
CU_LAUNCH_PARAM_BUFFER_POINTER = 1
CU_LAUNCH_PARAM_BUFFER_SIZE = 2
CU_LAUNCH_PARAM_END_AS_INT = 0
CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT = 1
CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT = 2

# ---------------------------------------------------------------- runtime flag constants
cudaHostAllocDefault = 0
cudaHostAllocPortable = 1
cudaHostAllocMapped = 2
cudaHostAllocWriteCombined = 4
cudaHostRegisterDefault = 0
cudaHostRegisterPortable = 1
cudaHostRegisterMapped = 2
cudaDeviceScheduleAuto = 0
cudaDeviceScheduleSpin = 1
cudaDeviceScheduleYield = 2
cudaDeviceScheduleBlockingSync = 4
cudaDeviceBlockingSync = 4
cudaDeviceScheduleMask = 7
cudaDeviceMapHost = 8
cudaDeviceLmemResizeToMax = 16
cudaDeviceMask = 0xFF
cudaEventDefault = 0
cudaEventBlockingSync = 1
cudaEventDisableTiming = 2
cudaEventInterprocess = 4
cudaStreamDefault = 0
cudaStreamNonBlocking = 1
cudaStreamLegacy = 1
cudaStreamPerThread = 2
cudaMemAttachGlobal = 1
cudaMemAttachHost = 2
cudaMemAttachSingle = 4
cudaCpuDeviceId = -1
cudaInvalidDeviceId = -2

# --------------------------------------------------------------------- error texts
_RUNTIME_BY_VALUE = {int(m): m for m in cudaError_t}


def runtime_error(code) -> "cudaError_t":
    """The cudaError_t of a CUresult (the two share their values; a driver code the runtime
    lacks becomes cudaErrorUnknown)."""
    return _RUNTIME_BY_VALUE.get(int(code), cudaError_t.cudaErrorUnknown)


def error_string(code) -> bytes:
    """CUDA's description of error `code` (a CUresult or cudaError_t value)."""
    return _enum_values.ERROR_STRINGS.get(int(code), "unrecognized error code").encode()
