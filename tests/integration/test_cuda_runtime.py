"""pvgpu.cuda.runtime against a real host, in both memory models: every runtime function the
facade covers, once with success and once with a typical error; cudaMemcpy with every
cudaMemcpyKind; mapped and managed memory in the shared model, their refusal in the
inline model."""

import ctypes

import numpy as np

from cuda_facade import SAXPY_PTX, fails, model, ok  # noqa: F401
from pvgpu.cuda import driver as cuda
from pvgpu.cuda import runtime as cudart
from pvgpu.spec import isa

E = cudart.cudaError_t
K = cudart.cudaMemcpyKind


def test_devices_and_properties(model):
    assert ok(cudart.cudaGetDeviceCount()) == 2
    assert ok(cudart.cudaDriverGetVersion()) == ok(cudart.cudaRuntimeGetVersion()) >= 12000
    assert ok(cudart.cudaGetDevice()) == 0
    ok(cudart.cudaSetDevice(1))
    assert ok(cudart.cudaGetDevice()) == 1
    fails(cudart.cudaSetDevice(2), E.cudaErrorInvalidDevice)
    assert ok(cudart.cudaGetDevice()) == 1
    p = ok(cudart.cudaGetDeviceProperties(0))
    assert p.name == b"pvgpu-emu" and (p.major, p.minor) == (8, 0)
    assert p.totalGlobalMem == 256 << 20 and p.multiProcessorCount == isa.SM_COUNT
    assert p.clockRate == isa.CLOCK_RATE_KHZ and p.warpSize == 32
    assert p.maxThreadsPerBlock == 1024 and p.sharedMemPerBlock == isa.MAX_SHARED_SIZE
    assert p.unifiedAddressing == 1 and p.pageableMemoryAccess == 0
    assert p.canMapHostMemory == p.managedMemory == int(model == "shared")
    assert p.maxGridSize[0] >= 1 << 31 - 1 and len(p.maxThreadsDim) == 3
    assert p.ECCEnabled == 0 and p.concurrentKernels == 1
    fails(cudart.cudaGetDeviceProperties(5), E.cudaErrorInvalidDevice)
    A = cudart.cudaDeviceAttr
    assert ok(cudart.cudaDeviceGetAttribute(A.cudaDevAttrMultiProcessorCount, 1)) == isa.SM_COUNT
    assert ok(cudart.cudaDeviceGetAttribute(A.cudaDevAttrComputeCapabilityMajor, 0)) == 8
    assert ok(cudart.cudaDeviceGetAttribute(A.cudaDevAttrComputeMode, 0)) == \
        cudart.cudaComputeMode.cudaComputeModeDefault
    fails(cudart.cudaDeviceGetAttribute(A.cudaDevAttrMultiProcessorCount, 3), E.cudaErrorInvalidDevice)
    ok(cudart.cudaSetDeviceFlags(cudart.cudaDeviceMapHost))
    assert ok(cudart.cudaGetDeviceFlags()) == cudart.cudaDeviceMapHost
    fails(cudart.cudaSetDeviceFlags(0x1000), E.cudaErrorInvalidValue)
    ok(cudart.cudaDeviceSynchronize())
    free, total = ok(cudart.cudaMemGetInfo())
    assert 0 < free <= total
    ok(cudart.cudaDeviceReset())
    ok(cudart.cudaDeviceSynchronize())  # a new primary context


def test_memory_and_every_memcpy_kind(model):
    n = 1 << 15
    h = np.arange(n, dtype=np.int32)
    assert ok(cudart.cudaMalloc(0)) == 0
    d = ok(cudart.cudaMalloc(h.nbytes))
    e = ok(cudart.cudaMalloc(h.nbytes))
    assert isinstance(d, int)
    ok(cudart.cudaMemcpy(d, h, h.nbytes, K.cudaMemcpyHostToDevice))
    ok(cudart.cudaMemcpy(e, d, h.nbytes, K.cudaMemcpyDeviceToDevice))
    out = np.zeros_like(h)
    ok(cudart.cudaMemcpy(out, e, h.nbytes, K.cudaMemcpyDeviceToHost))
    np.testing.assert_array_equal(out, h)
    other = np.zeros_like(h)
    ok(cudart.cudaMemcpy(other, out, h.nbytes, K.cudaMemcpyHostToHost))
    np.testing.assert_array_equal(other, h)
    pinned = ok(cudart.cudaMallocHost(h.nbytes))
    pv = np.ctypeslib.as_array((ctypes.c_int32 * n).from_address(pinned))
    ok(cudart.cudaMemset(d, 0xFF, h.nbytes))
    for dst, src in ((pinned, d), (e, pinned), (out.ctypes.data, e)):  # int addresses
        ok(cudart.cudaMemcpy(dst, src, h.nbytes, K.cudaMemcpyDefault))
    assert (pv == -1).all() and (out == -1).all()
    s = ok(cudart.cudaStreamCreate())
    ok(cudart.cudaMemsetAsync(e, 0, h.nbytes, s))
    ok(cudart.cudaMemcpyAsync(d, h, h.nbytes, K.cudaMemcpyDefault, s))
    ok(cudart.cudaMemcpyAsync(out, d, h.nbytes, K.cudaMemcpyDeviceToHost, s))
    ok(cudart.cudaStreamSynchronize(s))
    np.testing.assert_array_equal(out, h)
    ok(cudart.cudaMemcpyPeer(e, 0, d, 0, 64))
    ok(cudart.cudaMemcpy(out, e, h.nbytes, K.cudaMemcpyDefault))
    np.testing.assert_array_equal(out[:16], h[:16])
    assert not out[16:].any()
    # errors
    fails(cudart.cudaMemcpy(d, h, h.nbytes, 9), E.cudaErrorInvalidValue)
    fails(cudart.cudaMemcpy(out, d, h.nbytes, K.cudaMemcpyHostToHost), E.cudaErrorInvalidValue)
    fails(cudart.cudaMemcpy(d, h, 2 * h.nbytes, K.cudaMemcpyHostToDevice), E.cudaErrorInvalidValue)
    ok(cudart.cudaFree(0))
    ok(cudart.cudaFree(d))
    fails(cudart.cudaFree(d), E.cudaErrorInvalidValue)
    ok(cudart.cudaFreeHost(pinned))
    fails(cudart.cudaFreeHost(pinned), E.cudaErrorInvalidValue)
    ok(cudart.cudaStreamDestroy(s))
    ok(cudart.cudaFree(e))


def test_mapped_and_managed_memory(model):
    # [MEM-WINDOW-5] mapped and managed memory in place in the shared model, cudaErrorNotSupported inline
    n = 1 << 12
    mapped = ok(cudart.cudaHostAlloc(n * 4, cudart.cudaHostAllocDefault))
    ok(cudart.cudaFreeHost(mapped))
    fails(cudart.cudaHostAlloc(n * 4, 0x40), E.cudaErrorInvalidValue)
    if model == "inline":  # the device's writes would not reach the guest: refused
        fails(cudart.cudaHostAlloc(n * 4, cudart.cudaHostAllocMapped), E.cudaErrorNotSupported)
        fails(cudart.cudaMallocManaged(n * 4, cudart.cudaMemAttachGlobal), E.cudaErrorNotSupported)
        p = ok(cudart.cudaMallocHost(64))
        fails(cudart.cudaHostGetDevicePointer(p, 0), E.cudaErrorNotSupported)
        ok(cudart.cudaFreeHost(p))
        return
    x_addr = ok(cudart.cudaHostAlloc(n * 4, cudart.cudaHostAllocMapped))
    x = (ctypes.c_float * n).from_address(x_addr)
    np.ctypeslib.as_array(x)[:] = np.arange(n)
    y_addr = ok(cudart.cudaMallocManaged(n * 4, cudart.cudaMemAttachGlobal))
    y = np.ctypeslib.as_array((ctypes.c_float * n).from_address(y_addr))
    y[:] = 0.5
    dx = ok(cudart.cudaHostGetDevicePointer(x, 0))  # a ctypes array as the host pointer
    assert dx != x_addr
    fails(cudart.cudaHostGetDevicePointer(np.zeros(4), 0), E.cudaErrorInvalidValue)
    mod = ok(cuda.cuModuleLoadData(SAXPY_PTX))
    fn = ok(cuda.cuModuleGetFunction(mod, b"saxpy"))
    block, grid = cudart.dim3(256), cudart.dim3()
    grid.x = n / block.x  # a float, truncated as by cuda-python's struct
    ok(cuda.cuLaunchKernel(fn, grid.x, grid.y, grid.z, block.x, block.y, block.z, 0, 0,
                           ((4.0, dx, y_addr, n), (ctypes.c_float, ctypes.c_void_p,
                                                   ctypes.c_void_p, ctypes.c_int)), 0))
    ok(cudart.cudaDeviceSynchronize())
    np.testing.assert_array_equal(y, 4.0 * np.arange(n) + 0.5)  # in place, no copy
    d = ok(cudart.cudaMalloc(n * 4))
    ok(cudart.cudaMemcpy(d, y_addr, n * 4, K.cudaMemcpyDefault))  # managed memory is host memory
    ok(cudart.cudaMemset(y_addr, 0, n * 4))
    assert not y.any()
    ok(cudart.cudaMemcpy(y_addr, d, n * 4, K.cudaMemcpyDefault))
    np.testing.assert_array_equal(y, 4.0 * np.arange(n) + 0.5)
    fails(cudart.cudaMallocManaged(16, 9), E.cudaErrorInvalidValue)
    ok(cudart.cudaFree(y_addr))
    ok(cudart.cudaFreeHost(x))
    ok(cudart.cudaFree(d))


def test_peer_access(model):
    assert ok(cudart.cudaDeviceCanAccessPeer(0, 1)) == 1
    assert ok(cudart.cudaDeviceCanAccessPeer(1, 1)) == 0
    fails(cudart.cudaDeviceCanAccessPeer(0, 4), E.cudaErrorInvalidDevice)
    ok(cudart.cudaSetDevice(0))
    ok(cudart.cudaDeviceEnablePeerAccess(1, 0))
    fails(cudart.cudaDeviceEnablePeerAccess(1, 0), E.cudaErrorPeerAccessAlreadyEnabled)
    fails(cudart.cudaDeviceEnablePeerAccess(0, 0), E.cudaErrorInvalidDevice)
    g0 = ok(cudart.cudaMalloc(1 << 16))
    ok(cudart.cudaSetDevice(1))
    g1 = ok(cudart.cudaMalloc(1 << 16))
    h = np.arange(1 << 14, dtype=np.float32)
    ok(cudart.cudaMemcpy(g0, h, h.nbytes, K.cudaMemcpyDefault))  # g0's own device does it
    ok(cudart.cudaMemcpy(g1, g0, h.nbytes, K.cudaMemcpyDefault))  # device 0 writes device 1
    out = np.zeros_like(h)
    ok(cudart.cudaMemcpy(out, g1, h.nbytes, K.cudaMemcpyDefault))
    np.testing.assert_array_equal(out, h)
    ok(cudart.cudaSetDevice(0))
    ok(cudart.cudaDeviceDisablePeerAccess(1))
    fails(cudart.cudaDeviceDisablePeerAccess(1), E.cudaErrorPeerAccessNotEnabled)
    ok(cudart.cudaFree(g0))
    ok(cudart.cudaFree(g1))


def test_streams_and_events(model):
    s = ok(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking))
    t = ok(cudart.cudaStreamCreate())
    fails(cudart.cudaStreamCreateWithFlags(4), E.cudaErrorInvalidValue)
    a = ok(cudart.cudaEventCreate())
    b = ok(cudart.cudaEventCreateWithFlags(cudart.cudaEventBlockingSync))
    fails(cudart.cudaEventCreateWithFlags(0x40), E.cudaErrorInvalidValue)
    d = ok(cudart.cudaMalloc(1 << 20))
    ok(cudart.cudaEventRecord(a, s))
    ok(cudart.cudaMemsetAsync(d, 1, 1 << 20, s))
    ok(cudart.cudaEventRecord(b, s))
    ok(cudart.cudaStreamWaitEvent(t, b, 0))
    out = np.zeros(1 << 20, np.uint8)
    ok(cudart.cudaMemcpyAsync(out, d, out.nbytes, K.cudaMemcpyDeviceToHost, t))
    ok(cudart.cudaEventSynchronize(b))
    ok(cudart.cudaEventQuery(b))
    assert ok(cudart.cudaEventElapsedTime(a, b)) >= 0.0
    ok(cudart.cudaStreamSynchronize(t))
    ok(cudart.cudaStreamQuery(t))
    assert (out == 1).all()
    ok(cudart.cudaEventRecord(a, cudart.cudaStream_t(0)))  # the NULL stream
    ok(cudart.cudaEventSynchronize(a))
    for ev in (a, b):
        ok(cudart.cudaEventDestroy(ev))
    fails(cudart.cudaEventSynchronize(a), E.cudaErrorInvalidResourceHandle)
    fails(cudart.cudaEventElapsedTime(a, b), E.cudaErrorInvalidResourceHandle)
    for st in (s, t):
        ok(cudart.cudaStreamDestroy(st))
    fails(cudart.cudaStreamSynchronize(s), E.cudaErrorInvalidResourceHandle)
    fails(cudart.cudaStreamQuery(s), E.cudaErrorInvalidResourceHandle)
    fails(cudart.cudaStreamWaitEvent(0, a, 0), E.cudaErrorInvalidResourceHandle)
    fails(cudart.cudaEventRecord(a, 0), E.cudaErrorInvalidResourceHandle)
    ok(cudart.cudaFree(d))


def test_error_names_and_the_last_error(model):
    assert cudart.cudaGetErrorName(E.cudaErrorIllegalAddress) == (E.cudaSuccess, b"cudaErrorIllegalAddress")
    assert cudart.cudaGetErrorString(E.cudaErrorMemoryAllocation) == (E.cudaSuccess, b"out of memory")
    assert cudart.cudaGetLastError() == (E.cudaSuccess,)
    fails(cudart.cudaSetDevice(9), E.cudaErrorInvalidDevice)
    assert cudart.cudaGetErrorName(cudart.cudaPeekAtLastError()[0])[1] == b"cudaErrorInvalidDevice"
    assert cudart.cudaGetLastError() == (E.cudaErrorInvalidDevice,)
    assert cudart.cudaGetLastError() == (E.cudaSuccess,)
    dims = cudart.dim3(4, 2)
    assert tuple(dims) == (4, 2, 1)


def test_typical_errors_of_the_other_functions(model):
    d = ok(cudart.cudaMalloc(64))
    s = ok(cudart.cudaStreamCreate())
    fails(cudart.cudaMemcpyAsync(d, np.zeros(4), 64, K.cudaMemcpyHostToDevice, s), E.cudaErrorInvalidValue)
    fails(cudart.cudaMemcpyAsync(d, d, 8, 7, s), E.cudaErrorInvalidValue)
    fails(cudart.cudaMemset(d, 0, 65), E.cudaErrorInvalidValue)
    fails(cudart.cudaMemsetAsync(d, 0, 65, s), E.cudaErrorInvalidValue)
    fails(cudart.cudaMemcpyPeer(d, 0, d, 5, 8), E.cudaErrorInvalidDevice)
    ev = ok(cudart.cudaEventCreate())
    ok(cudart.cudaEventDestroy(ev))
    fails(cudart.cudaEventDestroy(ev), E.cudaErrorInvalidResourceHandle)
    fails(cudart.cudaEventQuery(ev), E.cudaErrorInvalidResourceHandle)
    ok(cudart.cudaStreamDestroy(s))
    fails(cudart.cudaStreamDestroy(s), E.cudaErrorInvalidResourceHandle)
    fails(cudart.cudaStreamWaitEvent(s, ev, 0), E.cudaErrorInvalidResourceHandle)
    ok(cudart.cudaFree(d))


def test_no_host_is_no_device(tmp_endpoint, monkeypatch):
    import pvgpu.cuda
    pvgpu.cuda.shutdown()
    monkeypatch.setenv("PVGPU_ENDPOINT", tmp_endpoint)
    try:
        fails(cudart.cudaGetDeviceCount(), E.cudaErrorNoDevice)
    finally:
        pvgpu.cuda.shutdown()
