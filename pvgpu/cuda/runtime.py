"""The CUDA runtime API over pvgpu, shaped like cuda-python's `cuda.bindings.runtime`: a
program written for it runs with its import changed to `from pvgpu.cuda import runtime as
cudart`. Every function returns `(cudaError_t, outputs...)` and never raises for a CUDA
error; a failure is also the thread's last error (cudaGetLastError).

    err, = cudart.cudaSetDevice(0)
    err, prop = cudart.cudaGetDeviceProperties(0)
    err, d_a = cudart.cudaMalloc(nbytes)                        # an int, as in cuda-python
    err, = cudart.cudaMemcpy(d_a, host_array, nbytes, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice)
    err, h = cudart.cudaHostAlloc(nbytes, cudart.cudaHostAllocMapped)   # a real host address
    err, d_h = cudart.cudaHostGetDevicePointer(h, 0)            # the device's address of it
    err, m = cudart.cudaMallocManaged(nbytes, cudart.cudaMemAttachGlobal)

The runtime is the driver's functions (pvgpu/cuda/driver.py) in the context the runtime
uses: the thread's current context, else the primary context of the thread's device
(cudaSetDevice), made current. The first call connects (PVGPU_ENDPOINT, PVGPU_MEMORY,
PVGPU_MEM_SIZE; pvgpu/cuda/_state.py). Kernels are launched with the driver's cuLaunchKernel
(as cuda-python's samples do) on functions of modules loaded with cuModuleLoadData.
"""

from __future__ import annotations

import functools

from pvgpu.cuda import _attributes, _errors, _state, driver, enums
from pvgpu.cuda._errors import CudaError, check
from pvgpu.cuda._memory import MANAGED
from pvgpu.cuda.enums import CUresult as R
from pvgpu.cuda.handles import CUevent, CUstream, cudaDeviceProp, dim3, value_of  # noqa: F401

# the runtime's enums and constants, as cuda-python has them (cudaError_t, cudaMemcpyKind, ...)
globals().update({k: v for k, v in vars(enums).items() if k.startswith("cuda")})
cudaStream_t = CUstream
cudaEvent_t = CUevent

RUNTIME_VERSION = driver.DRIVER_VERSION
K = enums.cudaMemcpyKind


def _api(outputs: int, *, context: bool = True, records: bool = True):
    """A runtime function: under the facade's lock, with the runtime's context current
    (connecting on first use) unless context=False, errors as cudaError_t."""
    def deco(fn):
        @functools.wraps(fn)
        def locked(*args, **kwargs):
            with _state._lock:
                if context:
                    _state.get().runtime_context()
                return fn(*args, **kwargs)
        return _errors.runtime_api(outputs, records=records)(locked)
    return deco


def _f() -> _state.Facade:
    return _state.get()


def _d(name: str):
    """The bare implementation of a driver function (it raises CudaError)."""
    return getattr(driver, name).__wrapped__


# ---------------------------------------------------------------------- devices
@_api(1, context=False)
def cudaGetDeviceCount():
    f = _f()
    f.runtime_init()
    return len(f.devices)


@_api(0, context=False)
def cudaSetDevice(device):
    f = _f()
    f.runtime_init()
    f.set_runtime_device(int(device))


@_api(1)
def cudaGetDevice():
    return _f().current().device.index


@_api(1, context=False)
def cudaGetDeviceProperties(device):
    f = _f()
    f.runtime_init()
    return _attributes.properties(f.device(int(device)).info())


@_api(1, context=False)
def cudaDeviceGetAttribute(attr, device):
    f = _f()
    f.runtime_init()
    info = f.device(int(device)).info()
    try:
        return _attributes.get(info, attr)
    except KeyError:
        raise CudaError(R.CUDA_ERROR_INVALID_VALUE, f"no device attribute {int(attr)}") from None


@_api(0)
def cudaSetDeviceFlags(flags):
    flags = int(flags)
    check(0 <= flags <= enums.cudaDeviceMask, R.CUDA_ERROR_INVALID_VALUE,
          f"unknown device flags {flags:#x}")
    _f().current().device.flags = flags


@_api(1)
def cudaGetDeviceFlags():
    return _f().current().device.flags


@_api(0)
def cudaDeviceSynchronize():
    _f().current().guest.synchronize()


@_api(0)
def cudaDeviceReset():
    f = _f()
    dev = f.current().device
    if dev.primary is not None:
        f.destroy_context(dev.primary)


@_api(1)
def cudaDeviceCanAccessPeer(device, peerDevice):
    return _d("cuDeviceCanAccessPeer")(int(device), int(peerDevice))


@_api(0)
def cudaDeviceEnablePeerAccess(peerDevice, flags):
    f = _f()
    check(int(flags) == 0, R.CUDA_ERROR_INVALID_VALUE, "flags must be 0")
    driver.enable_peer(f.current(), f.device(int(peerDevice)))


@_api(0)
def cudaDeviceDisablePeerAccess(peerDevice):
    f = _f()
    driver.disable_peer(f.current(), f.device(int(peerDevice)))


@_api(1, context=False)
def cudaDriverGetVersion():
    return driver.DRIVER_VERSION


@_api(1, context=False)
def cudaRuntimeGetVersion():
    return RUNTIME_VERSION


@_api(2)
def cudaMemGetInfo():
    return _d("cuMemGetInfo")()


# ---------------------------------------------------------------------- memory
@_api(1)
def cudaMalloc(size):
    size = driver._uint(size, "size")
    if size == 0:
        return 0  # as CUDA: success and a NULL pointer
    return int(_d("cuMemAlloc")(size))


@_api(0)
def cudaFree(devPtr):
    addr = value_of(devPtr)
    if addr:  # cudaFree(0) only makes the context current
        _f().memory.free_device(addr)


@_api(1)
def cudaMallocHost(size):
    return driver.host_alloc(size, False)


@_api(1)
def cudaHostAlloc(size, flags):
    flags = driver._uint(flags, "flags")
    check(not flags & ~7, R.CUDA_ERROR_INVALID_VALUE, f"unknown cudaHostAlloc flags {flags:#x}")
    return driver.host_alloc(size, bool(flags & enums.cudaHostAllocMapped))


@_api(0)
def cudaFreeHost(ptr):
    _f().memory.free_host(ptr)


@_api(1)
def cudaHostGetDevicePointer(pHost, flags):
    return driver.host_device_pointer(pHost, flags)


@_api(1)
def cudaMallocManaged(size, flags):
    fl = driver._uint(flags, "flags")
    check(fl in (enums.cudaMemAttachGlobal, enums.cudaMemAttachHost), R.CUDA_ERROR_INVALID_VALUE,
          f"flags must be cudaMemAttachGlobal or cudaMemAttachHost, not {fl}")
    return driver.host_alloc(size, True, MANAGED)


def _ends(dst, src, kind):
    """The two ends of a cudaMemcpy of `kind` (cudaMemcpyDefault: as the addresses say)."""
    try:
        kind = K(int(kind))
    except ValueError:
        raise CudaError(R.CUDA_ERROR_INVALID_VALUE, f"no cudaMemcpyKind {int(kind)}") from None
    dst_dev, src_dev = {K.cudaMemcpyHostToHost: (False, False),
                        K.cudaMemcpyHostToDevice: (True, False),
                        K.cudaMemcpyDeviceToHost: (False, True),
                        K.cudaMemcpyDeviceToDevice: (True, True),
                        K.cudaMemcpyDefault: (None, None)}[kind]
    mem = _f().memory
    return mem.where(dst, device=dst_dev, writable=True), mem.where(src, device=src_dev)


@_api(0)
def cudaMemcpy(dst, src, count, kind):
    d, s = _ends(dst, src, kind)
    _f().memory.copy(d, s, driver._uint(count, "count"))


@_api(0)
def cudaMemcpyAsync(dst, src, count, kind, stream):
    d, s = _ends(dst, src, kind)
    _f().memory.copy(d, s, driver._uint(count, "count"), stream, True)


@_api(0)
def cudaMemcpyPeer(dst, dstDevice, src, srcDevice, count):
    f = _f()
    dctx, sctx = f.primary(f.device(int(dstDevice))), f.primary(f.device(int(srcDevice)))
    f.memory.copy(f.memory.where(dst, device=True, ctx=dctx),
                  f.memory.where(src, device=True, ctx=sctx), driver._uint(count, "count"))


@_api(0)
def cudaMemset(devPtr, value, count):
    driver._memset(devPtr, value, 1, count)


@_api(0)
def cudaMemsetAsync(devPtr, value, count, stream):
    driver._memset(devPtr, value, 1, count, stream, True)


# ---------------------------------------------------------------------- streams and events
@_api(1)
def cudaStreamCreate():
    return driver.stream_create(0)


@_api(1)
def cudaStreamCreateWithFlags(flags):
    return driver.stream_create(driver._uint(flags, "flags"))


@_api(0)
def cudaStreamSynchronize(stream):
    f = _f()
    f.stream(stream, f.stream_ctx(stream)).synchronize()


@_api(0)
def cudaStreamDestroy(stream):
    driver.stream_destroy(stream)


@_api(0)
def cudaStreamQuery(stream):
    driver.stream_query(stream)


@_api(0)
def cudaStreamWaitEvent(stream, event, flags):
    check(driver._uint(flags, "flags") in (0, 1), R.CUDA_ERROR_INVALID_VALUE, "unknown flags")
    driver.stream_wait(stream, event, flags)


@_api(1)
def cudaEventCreate():
    return driver.event_create(0)


@_api(1)
def cudaEventCreateWithFlags(flags):
    return driver.event_create(driver._uint(flags, "flags"))


@_api(0)
def cudaEventRecord(event, stream):
    driver.event_record(event, stream)


@_api(0)
def cudaEventSynchronize(event):
    driver._event(event).guest.synchronize()


@_api(1)
def cudaEventElapsedTime(start, end):
    return driver.event_elapsed(start, end)


@_api(0)
def cudaEventQuery(event):
    driver.event_query(event)


@_api(0)
def cudaEventDestroy(event):
    driver.event_destroy(event)


# ---------------------------------------------------------------------- errors
def _error(error):
    return enums.cudaError_t(int(error))


@_api(1, context=False, records=False)
def cudaGetErrorName(error):
    return _error(error).name.encode()


@_api(1, context=False, records=False)
def cudaGetErrorString(error):
    return enums.error_string(_error(error))


def cudaGetLastError():
    """-> (the thread's last runtime error,), which is reset to cudaSuccess."""
    return (_errors.last_runtime_error(reset=True),)


def cudaPeekAtLastError():
    """-> (the thread's last runtime error,), left as it is."""
    return (_errors.last_runtime_error(reset=False),)
