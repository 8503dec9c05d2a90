"""Stand-ins for the helpers NVIDIA's cuda-python samples import (their
`cuda.bindings._example_helpers`, formerly `common` and `common.helper_cuda`), working
against pvgpu.cuda, so that a sample runs with only its import lines changed:

    from pvgpu.cuda.helpers import KernelHelper, check_cuda_errors, find_cuda_device

KernelHelper compiles CUDA C with NVRTC (the `pvgpu[cuda]` extra) to PTX for the device's
compute capability, where theirs makes a cubin: pvgpu's SMs run PTX compiled by the guest.
Without NVRTC it stops the program with requirement_not_met and a message that says what
to install. Both spellings of the names are here (check_cuda_errors / checkCudaErrors, ...).
"""

from __future__ import annotations

import os
import sys

from pvgpu.cuda import driver as cuda
from pvgpu.cuda import runtime as cudart


def requirement_not_met(message: str):
    """Print why the program cannot run here and exit (status CUDA_BINDINGS_SKIP_EXAMPLE,
    default 1), as the samples' helper does."""
    print(message, file=sys.stderr)
    sys.exit(int(os.environ.get("CUDA_BINDINGS_SKIP_EXAMPLE", "1")))


def _error_name(err) -> str:
    if isinstance(err, cuda.CUresult):
        return cuda.cuGetErrorName(err)[1].decode()
    if isinstance(err, cudart.cudaError_t):
        return cudart.cudaGetErrorName(err)[1].decode()
    return str(err)


def check_cuda_errors(result):
    """Raise RuntimeError if `result[0]` is an error; else the outputs: None, the one
    output, or a tuple of them."""
    err = result[0]
    if int(err):
        raise RuntimeError(f"CUDA error code={int(err)}({_error_name(err)})")
    if len(result) == 1:
        return None
    if len(result) == 2:
        return result[1]
    return result[1:]


def check_cmd_line_flag(flag: str) -> bool:
    """Whether `flag` (e.g. "device=") starts one of the program's arguments."""
    return any(arg.lstrip("-").startswith(flag) for arg in sys.argv[1:])


def get_cmd_line_argument_int(flag: str) -> int:
    """The int after `flag` ("device=1" -> 1), 0 if absent."""
    for arg in sys.argv[1:]:
        arg = arg.lstrip("-")
        if arg.startswith(flag):
            try:
                return int(arg[len(flag):])
            except ValueError:
                return 0
    return 0


def find_cuda_device() -> int:
    """The device of `device=N` (default 0), made the runtime's device."""
    dev_id = get_cmd_line_argument_int("device=") if check_cmd_line_flag("device=") else 0
    check_cuda_errors(cudart.cudaSetDevice(dev_id))
    return dev_id


def find_cuda_device_drv():
    """cuInit, then the CUdevice of `device=N` (default 0)."""
    dev_id = get_cmd_line_argument_int("device=") if check_cmd_line_flag("device=") else 0
    check_cuda_errors(cuda.cuInit(0))
    return check_cuda_errors(cuda.cuDeviceGet(dev_id))


def check_compute_capability_too_low(dev_id: int, required: tuple) -> None:
    major = check_cuda_errors(cudart.cudaDeviceGetAttribute(
        cudart.cudaDeviceAttr.cudaDevAttrComputeCapabilityMajor, dev_id))
    minor = check_cuda_errors(cudart.cudaDeviceGetAttribute(
        cudart.cudaDeviceAttr.cudaDevAttrComputeCapabilityMinor, dev_id))
    if (major, minor) < tuple(required):
        requirement_not_met(f"compute capability {major}.{minor} is below {required}")


class KernelHelper:
    """Compile CUDA C `code` for device `dev_id` and load it into the current context:
    `get_function(name)` -> CUfunction."""

    def __init__(self, code: str, dev_id: int):
        from pvgpu.guest.api.errors import CudaCompileError
        from pvgpu.guest.api.module import compile_cuda

        check_cuda_errors(cudart.cudaFree(0))  # make the device's context current
        major = check_cuda_errors(cudart.cudaDeviceGetAttribute(
            cudart.cudaDeviceAttr.cudaDevAttrComputeCapabilityMajor, dev_id))
        minor = check_cuda_errors(cudart.cudaDeviceGetAttribute(
            cudart.cudaDeviceAttr.cudaDevAttrComputeCapabilityMinor, dev_id))
        try:
            if (major, minor) != cuda._attributes.COMPUTE_CAPABILITY:
                requirement_not_met(f"compute capability {major}.{minor}: pvgpu compiles for "
                                    "compute_80")
            ptx = compile_cuda(code, "sourceCode.cu",
                               options=("--fmad=true", "--std=c++17", "-default-device"))
        except CudaCompileError as e:
            if e.log:
                print(e.log, file=sys.stderr)
                sys.exit(1)
            requirement_not_met(str(e))
        self.module = check_cuda_errors(cuda.cuModuleLoadData(ptx.encode()))

    def get_function(self, name):
        return check_cuda_errors(cuda.cuModuleGetFunction(self.module, name))

    getFunction = get_function


checkCudaErrors = check_cuda_errors
checkCmdLineFlag = check_cmd_line_flag
getCmdLineArgumentInt = get_cmd_line_argument_int
findCudaDevice = find_cuda_device
findCudaDeviceDRV = find_cuda_device_drv
