"""A CUDA program written for cuda-python, running on pvgpu: only its import lines differ
from what it would be against NVIDIA's driver (`from cuda.bindings import driver as cuda`).

It uses the driver API (context, module, device memory, cuLaunchKernel with both forms of
kernelParams) and the runtime API (pinned memory, a stream, events, mapped host memory
when the device can map it). The kernels are CUDA C (cuda_python_style.cu), compiled with
NVRTC when cuda-bindings' NVRTC is installed (`pip install 'pvgpu[cuda]'`), else the PTX
nvcc made of the same source (cuda_python_style.ptx).

    pvgpu host &
    python examples/cuda_python_style.py [ENDPOINT]     # PVGPU_MEMORY=inline for the inline model
"""

import ctypes
import os
import sys
from pathlib import Path

import numpy as np

from pvgpu.cuda import driver as cuda  # was: from cuda.bindings import driver as cuda
from pvgpu.cuda import runtime as cudart  # was: from cuda.bindings import runtime as cudart

HERE = Path(__file__).resolve().parent


def check(result):
    """cuda-python's usual helper: raise on an error, else the outputs."""
    err = result[0]
    if int(err):
        name = (cuda.cuGetErrorName(err) if isinstance(err, cuda.CUresult)
                else cudart.cudaGetErrorName(err))[1]
        raise RuntimeError(f"CUDA error {int(err)} ({name.decode()})")
    return None if len(result) == 1 else result[1] if len(result) == 2 else result[1:]


def kernel_image(major: int, minor: int) -> bytes:
    """PTX of the kernels: NVRTC if it is there, else the committed nvcc output."""
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        print("NVRTC is not installed: using the PTX nvcc made (cuda_python_style.ptx)")
        return (HERE / "cuda_python_style.ptx").read_bytes()
    source = (HERE / "cuda_python_style.cu").read_bytes()
    prog = check(nvrtc.nvrtcCreateProgram(source, b"cuda_python_style.cu", 0, [], []))
    opts = [f"--gpu-architecture=compute_{major}{minor}".encode()]
    check(nvrtc.nvrtcCompileProgram(prog, len(opts), opts))
    ptx = b" " * check(nvrtc.nvrtcGetPTXSize(prog))
    check(nvrtc.nvrtcGetPTX(prog, ptx))
    print(f"compiled cuda_python_style.cu with NVRTC for compute_{major}{minor}")
    return ptx


def main() -> int:
    if len(sys.argv) > 1:  # the pvgpu host to use (a cuda-python program ignores it)
        os.environ["PVGPU_ENDPOINT"] = sys.argv[1]
    # ------------------------------------------------------------ driver API
    check(cuda.cuInit(0))
    dev = check(cuda.cuDeviceGet(0))
    name = check(cuda.cuDeviceGetName(128, dev)).split(b"\0")[0].decode()
    major = check(cuda.cuDeviceGetAttribute(
        cuda.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = check(cuda.cuDeviceGetAttribute(
        cuda.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    sms = check(cuda.cuDeviceGetAttribute(
        cuda.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
    print(f"device 0: {name}, compute capability {major}.{minor}, {sms} SMs, "
          f"{check(cuda.cuDeviceTotalMem(dev)) >> 20} MiB")
    ctx = check(cuda.cuCtxCreate(None, 0, dev))
    module = check(cuda.cuModuleLoadData(kernel_image(major, minor)))
    scale_add = check(cuda.cuModuleGetFunction(module, b"scale_add"))
    histogram = check(cuda.cuModuleGetFunction(module, b"histogram"))

    n = 1 << 16
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    d_x, d_y = check(cuda.cuMemAlloc(x.nbytes)), check(cuda.cuMemAlloc(y.nbytes))
    check(cuda.cuMemcpyHtoD(d_x, x, x.nbytes))
    check(cuda.cuMemcpyHtoD(d_y, y, y.nbytes))
    args = ((2.0, d_x, d_y, n), (ctypes.c_float, None, None, ctypes.c_int))
    check(cuda.cuLaunchKernel(scale_add, 64, 1, 1, 256, 1, 1, 0, 0, args, 0))
    out = np.empty_like(y)
    check(cuda.cuMemcpyDtoH(out, d_y, out.nbytes))
    np.testing.assert_allclose(out, 2.0 * x + y, rtol=1e-6, atol=1e-6)
    print(f"scale_add: y = 2x + y on {n} floats, checked against numpy")

    # ------------------------------------------------------------ runtime API
    nbytes = 1 << 20
    data_addr = check(cudart.cudaMallocHost(nbytes))  # pinned: one DMA per copy
    data = np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(data_addr))
    data[:] = rng.integers(0, 256, nbytes, dtype=np.uint8)
    d_data = check(cudart.cudaMalloc(nbytes))
    d_bins = check(cudart.cudaMalloc(256 * 4))
    stream = check(cudart.cudaStreamCreate())
    start, stop = check(cudart.cudaEventCreate()), check(cudart.cudaEventCreate())
    check(cudart.cudaEventRecord(start, stream))
    check(cudart.cudaMemcpyAsync(d_data, data_addr, nbytes,
                                 cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, stream))
    check(cudart.cudaMemsetAsync(d_bins, 0, 256 * 4, stream))
    # kernelParams as C has them: an array of pointers to the argument values
    values = [np.array([d_data], np.uint64), np.array([d_bins], np.uint64),
              np.array([nbytes], np.int32)]
    params = np.array([v.ctypes.data for v in values], np.uint64)
    check(cuda.cuLaunchKernel(histogram, 32, 1, 1, 256, 1, 1, 0, stream, params.ctypes.data, 0))
    bins = np.zeros(256, np.uint32)
    check(cudart.cudaMemcpyAsync(bins, d_bins, bins.nbytes, cudart.cudaMemcpyKind.cudaMemcpyDefault,
                                 stream))
    check(cudart.cudaEventRecord(stop, stream))
    check(cudart.cudaEventSynchronize(stop))
    ms = check(cudart.cudaEventElapsedTime(start, stop))
    np.testing.assert_array_equal(bins, np.bincount(data, minlength=256))
    print(f"histogram of 1 MiB in pinned memory: checked against numpy ({ms:.2f} ms of device time)")

    prop = check(cudart.cudaGetDeviceProperties(0))
    if prop.canMapHostMemory:
        # zero copy: the kernel reads and writes host memory through its device address
        h_y = check(cudart.cudaHostAlloc(x.nbytes, cudart.cudaHostAllocMapped))
        mapped = np.ctypeslib.as_array((ctypes.c_float * n).from_address(h_y))
        mapped[:] = 1.0
        d_h_y = check(cudart.cudaHostGetDevicePointer(h_y, 0))
        check(cuda.cuLaunchKernel(scale_add, 64, 1, 1, 256, 1, 1, 0, 0,
                                  ((3.0, d_x, d_h_y, n),
                                   (ctypes.c_float, None, ctypes.c_void_p, ctypes.c_int)), 0))
        check(cudart.cudaDeviceSynchronize())
        np.testing.assert_allclose(mapped, 3.0 * x + 1.0, rtol=1e-6, atol=1e-6)
        print("mapped host memory: the kernel wrote the host's buffer in place")
        check(cudart.cudaFreeHost(h_y))
    else:
        print("this device cannot map host memory (the inline memory model): zero copy skipped")

    for ev in (start, stop):
        check(cudart.cudaEventDestroy(ev))
    check(cudart.cudaStreamDestroy(stream))
    check(cudart.cudaFreeHost(data_addr))
    for p in (d_data, d_bins):
        check(cudart.cudaFree(p))
    for p in (d_x, d_y):
        check(cuda.cuMemFree(p))
    check(cuda.cuModuleUnload(module))
    check(cuda.cuCtxDestroy(ctx))
    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
