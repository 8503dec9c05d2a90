"""pvgpu.cuda's enums and constants: cuda-bindings' own types when it is installed, IntEnums
of the same names and values when it is not (checked in a process that cannot import it),
and flag constants equal to cuda-python's."""

import enum
import subprocess
import sys

from pvgpu.cuda import _enum_values, enums
from pvgpu.cuda import driver, runtime


def _table(name):
    return dict(_enum_values.ENUMS[name])


def test_enums_are_the_bindings_own_or_the_table():
    for name in enums.DRIVER_ENUMS + enums.RUNTIME_ENUMS:
        e = getattr(enums, name)
        members = {m.name: int(m) for m in e}
        assert members == _table(name), name  # the table is CUDA 13's enumeration
        if enums.FROM_BINDINGS:
            from cuda.bindings import driver as bd, runtime as br
            assert e is getattr(bd if name in enums.DRIVER_ENUMS else br, name)
        else:
            assert issubclass(e, enum.IntEnum)


def test_without_cuda_bindings_the_enums_are_intenums_of_the_same_values():
    code = (
        "import sys; sys.modules['cuda'] = None\n"  # import cuda... fails
        "import enum\n"
        "from pvgpu.cuda import enums, _enum_values, driver, runtime\n"
        "assert not enums.FROM_BINDINGS\n"
        "for name in enums.DRIVER_ENUMS + enums.RUNTIME_ENUMS:\n"
        "    e = getattr(enums, name)\n"
        "    assert issubclass(e, enum.IntEnum), name\n"
        "    assert {m.name: int(m) for m in e} == dict(_enum_values.ENUMS[name]), name\n"
        "assert driver.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS == 700\n"
        "assert runtime.cudaError_t.cudaErrorIllegalAddress.value == 700\n"
        "assert runtime.cudaGetErrorName(700)[1] == b'cudaErrorIllegalAddress'\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_the_modules_export_cuda_pythons_names():
    for name in ("CUresult", "CUdevice_attribute", "CUjit_option", "CU_STREAM_LEGACY",
                 "CU_MEMHOSTALLOC_DEVICEMAP", "CU_LAUNCH_PARAM_END", "CUdeviceptr", "CUstream"):
        assert hasattr(driver, name), name
    for name in ("cudaError_t", "cudaMemcpyKind", "cudaHostAllocMapped", "cudaDeviceMapHost",
                 "cudaMemAttachGlobal", "cudaEventBlockingSync", "cudaStreamNonBlocking",
                 "dim3", "cudaStream_t", "cudaEvent_t", "cudaDeviceAttr", "cudaComputeMode"):
        assert hasattr(runtime, name), name
    assert not hasattr(driver, "cudaError_t") and not hasattr(runtime, "CUresult")


def test_flag_constants_are_cuda_pythons():
    names = [n for n in vars(enums) if n.startswith(("CU_", "cuda")) and
             isinstance(getattr(enums, n), int) and not isinstance(getattr(enums, n), enum.Enum)]
    assert len(names) > 40
    if enums.FROM_BINDINGS:
        from cuda.bindings import driver as bd, runtime as br
        for n in names:
            assert getattr(bd if n.startswith("CU_") else br, n) == getattr(enums, n), n
    assert enums.CU_STREAM_LEGACY == 1 and enums.CU_STREAM_PER_THREAD == 2
    assert enums.cudaHostAllocMapped == enums.CU_MEMHOSTALLOC_DEVICEMAP == 2


def test_runtime_codes_share_the_driver_values():
    R, E = enums.CUresult, enums.cudaError_t
    assert enums.runtime_error(R.CUDA_ERROR_ILLEGAL_ADDRESS) is E.cudaErrorIllegalAddress
    assert enums.runtime_error(R.CUDA_ERROR_NOT_FOUND) is E.cudaErrorSymbolNotFound
    assert enums.runtime_error(R.CUDA_ERROR_INVALID_HANDLE) is E.cudaErrorInvalidResourceHandle
    assert enums.runtime_error(R.CUDA_ERROR_OUT_OF_MEMORY) is E.cudaErrorMemoryAllocation
    assert enums.runtime_error(R.CUDA_ERROR_DEVICE_UNAVAILABLE) is E.cudaErrorDevicesUnavailable
    missing = next(int(m) for m in R if int(m) not in {int(x) for x in E})
    assert enums.runtime_error(missing) is E.cudaErrorUnknown
    assert enums.error_string(700) == b"an illegal memory access was encountered"
    assert enums.error_string(123456) == b"unrecognized error code"
