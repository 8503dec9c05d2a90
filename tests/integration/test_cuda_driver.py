"""pvgpu.cuda.driver against a real host, in both memory models: every function of the
driver API the facade covers, once with success and once with a typical error."""

import ctypes
import threading

import numpy as np
import pytest

import pvgpu.cuda
from cuda_facade import (LAUNCH_PTX, SAXPY_PTX, ctx, fails, model, ok, shared_ctx,  # noqa: F401
                         shared_model)
from pvgpu.cuda import driver as cuda
from pvgpu.cuda import _state
from pvgpu.spec import isa, wire

R = cuda.CUresult
A = cuda.CUdevice_attribute


def test_nothing_before_cuinit(model):
    fails(cuda.cuDeviceGetCount(), R.CUDA_ERROR_NOT_INITIALIZED)
    assert ok(cuda.cuDriverGetVersion()) >= 12000
    fails(cuda.cuInit(1), R.CUDA_ERROR_INVALID_VALUE)
    ok(cuda.cuInit(0))
    assert ok(cuda.cuDeviceGetCount()) == 2


def test_no_host_is_no_device(tmp_endpoint, monkeypatch):
    pvgpu.cuda.shutdown()
    monkeypatch.setenv("PVGPU_ENDPOINT", tmp_endpoint)
    try:
        fails(cuda.cuInit(0), R.CUDA_ERROR_NO_DEVICE)
        assert "no pvgpu host" in pvgpu.cuda.error_detail()
        pvgpu.cuda.shutdown()
        monkeypatch.setenv("PVGPU_ENDPOINT", "not-an-endpoint")
        fails(cuda.cuInit(0), R.CUDA_ERROR_NO_DEVICE)
        assert "cannot connect to not-an-endpoint" in pvgpu.cuda.error_detail()
        pvgpu.cuda.shutdown()
        monkeypatch.setenv("PVGPU_MEMORY", "remote")
        fails(cuda.cuInit(0), R.CUDA_ERROR_INVALID_VALUE)
        assert "PVGPU_MEMORY='remote'" in pvgpu.cuda.error_detail()
    finally:
        pvgpu.cuda.shutdown()


def test_devices_and_their_attributes(model):
    ok(cuda.cuInit(0))
    dev = ok(cuda.cuDeviceGet(0))
    assert int(dev) == 0 and dev == cuda.CUdevice(0)
    fails(cuda.cuDeviceGet(2), R.CUDA_ERROR_INVALID_DEVICE)
    name = ok(cuda.cuDeviceGetName(64, dev))
    assert len(name) == 64 and name.split(b"\0")[0] == b"pvgpu-emu"
    assert ok(cuda.cuDeviceTotalMem(dev)) == 256 << 20
    attr = lambda a: ok(cuda.cuDeviceGetAttribute(a, dev))  # noqa: E731
    assert attr(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) == isa.SM_COUNT
    assert attr(A.CU_DEVICE_ATTRIBUTE_CLOCK_RATE) == isa.CLOCK_RATE_KHZ
    assert attr(A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK) == isa.MAX_BLOCK_THREADS
    assert attr(A.CU_DEVICE_ATTRIBUTE_WARP_SIZE) == 32
    assert attr(A.CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING) == 1
    assert (attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)) == (8, 0)
    mappable = int(model == "shared")
    assert attr(A.CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY) == mappable
    assert attr(A.CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY) == mappable
    assert attr(A.CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS) == 0
    assert attr(A.CU_DEVICE_ATTRIBUTE_MAX_TEXTURE1D_WIDTH if hasattr(
        A, "CU_DEVICE_ATTRIBUTE_MAX_TEXTURE1D_WIDTH") else A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH) == 0
    fails(cuda.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_MAX, dev), R.CUDA_ERROR_INVALID_VALUE)
    assert ok(cuda.cuDeviceComputeCapability(dev)) == (8, 0)
    assert ok(cuda.cuDeviceCanAccessPeer(dev, ok(cuda.cuDeviceGet(1)))) == 1
    assert ok(cuda.cuDeviceCanAccessPeer(dev, dev)) == 0
    fails(cuda.cuDeviceCanAccessPeer(dev, 7), R.CUDA_ERROR_INVALID_DEVICE)


def test_contexts_and_the_current_context_of_each_thread(model):
    ok(cuda.cuInit(0))
    d0, d1 = ok(cuda.cuDeviceGet(0)), ok(cuda.cuDeviceGet(1))
    assert int(ok(cuda.cuCtxGetCurrent())) == 0
    fails(cuda.cuCtxSynchronize(), R.CUDA_ERROR_INVALID_CONTEXT)
    c0 = ok(cuda.cuCtxCreate(None, 0, d0))  # CUDA 13's signature
    c1 = ok(cuda.cuCtxCreate(0, d1))  # CUDA 12's
    assert ok(cuda.cuCtxGetCurrent()) == c1 and int(ok(cuda.cuCtxGetDevice())) == 1
    assert ok(cuda.cuCtxPopCurrent()) == c1
    assert ok(cuda.cuCtxGetCurrent()) == c0
    ok(cuda.cuCtxPushCurrent(c1))
    ok(cuda.cuCtxSetCurrent(c0))  # replaces the top of the stack
    assert ok(cuda.cuCtxGetCurrent()) == c0
    ok(cuda.cuCtxSynchronize())
    assert ok(cuda.cuCtxGetApiVersion(c0)) > 0
    seen = {}

    def other_thread():
        seen["before"] = int(ok(cuda.cuCtxGetCurrent()))
        ok(cuda.cuCtxSetCurrent(c1))
        seen["after"] = int(ok(cuda.cuCtxGetDevice()))
    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert seen == {"before": 0, "after": 1}
    assert ok(cuda.cuCtxGetCurrent()) == c0  # this thread's is unchanged
    ok(cuda.cuCtxDestroy(c1))
    fails(cuda.cuCtxDestroy(c1), R.CUDA_ERROR_INVALID_CONTEXT)
    fails(cuda.cuCtxSetCurrent(cuda.CUcontext(0x77)), R.CUDA_ERROR_INVALID_CONTEXT)
    fails(cuda.cuCtxCreate(None, 0, 9), R.CUDA_ERROR_INVALID_DEVICE)
    ok(cuda.cuCtxDestroy(c0))
    assert int(ok(cuda.cuCtxGetCurrent())) == 0
    fails(cuda.cuCtxPopCurrent(), R.CUDA_ERROR_INVALID_CONTEXT)


def test_primary_contexts(model):
    ok(cuda.cuInit(0))
    p = ok(cuda.cuDevicePrimaryCtxRetain(0))
    assert ok(cuda.cuDevicePrimaryCtxRetain(0)) == p
    ok(cuda.cuCtxSetCurrent(p))
    ok(cuda.cuDevicePrimaryCtxRelease(0))
    ok(cuda.cuDevicePrimaryCtxRelease(0))
    fails(cuda.cuDevicePrimaryCtxRelease(0), R.CUDA_ERROR_INVALID_CONTEXT)
    ok(cuda.cuDevicePrimaryCtxReset(0))
    fails(cuda.cuCtxSynchronize(), R.CUDA_ERROR_INVALID_CONTEXT)


def _saxpy(ctx, source=SAXPY_PTX):
    mod = ok(cuda.cuModuleLoadData(source))
    return mod, ok(cuda.cuModuleGetFunction(mod, b"saxpy"))


def test_modules_functions_and_launch_forms(ctx, tmp_path):
    rng = np.random.default_rng(3)
    n = 3000
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    for source in (SAXPY_PTX, SAXPY_PTX.encode(), np.char.array(SAXPY_PTX.encode())):
        mod, fn = _saxpy(ctx, source)
        ok(cuda.cuModuleUnload(mod))
    path = tmp_path / "saxpy.ptx"
    path.write_text(SAXPY_PTX)
    mod = ok(cuda.cuModuleLoad(str(path).encode()))
    fails(cuda.cuModuleLoad(str(tmp_path / "nope.ptx")), R.CUDA_ERROR_FILE_NOT_FOUND)
    fn = ok(cuda.cuModuleGetFunction(mod, "saxpy"))
    assert ok(cuda.cuModuleGetFunction(mod, b"saxpy")) == fn
    fails(cuda.cuModuleGetFunction(mod, b"nope"), R.CUDA_ERROR_NOT_FOUND)
    F = cuda.CUfunction_attribute
    assert ok(cuda.cuFuncGetAttribute(F.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn)) == 1024
    assert ok(cuda.cuFuncGetAttribute(F.CU_FUNC_ATTRIBUTE_NUM_REGS, fn)) > 0
    assert ok(cuda.cuFuncGetAttribute(F.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn)) == 0
    assert ok(cuda.cuFuncGetAttribute(F.CU_FUNC_ATTRIBUTE_PTX_VERSION, fn)) >= 70
    assert ok(cuda.cuFuncGetAttribute(F.CU_FUNC_ATTRIBUTE_BINARY_VERSION, fn)) == 80
    fails(cuda.cuFuncGetAttribute(F.CU_FUNC_ATTRIBUTE_MAX, fn), R.CUDA_ERROR_INVALID_VALUE)
    dx, dy = ok(cuda.cuMemAlloc(x.nbytes)), ok(cuda.cuMemAlloc(y.nbytes))
    ok(cuda.cuMemcpyHtoD(dx, x, x.nbytes))
    ok(cuda.cuMemcpyHtoD(dy, y, y.nbytes))
    want = y.copy()
    # 1. ((values), (types)): None for handles
    ok(cuda.cuLaunchKernel(fn, 12, 1, 1, 256, 1, 1, 0, 0,
                           ((2.0, dx, dy, n), (ctypes.c_float, None, None, ctypes.c_uint)), 0))
    want = 2.0 * x + want
    # 2. an array of pointers to the values, by its address
    vals = [np.array([-1.0], np.float32), np.array([int(dx)], np.uint64),
            np.array([int(dy)], np.uint64), np.array([n], np.uint32)]
    ptrs = np.array([v.ctypes.data for v in vals], np.uint64)
    ok(cuda.cuLaunchKernel(fn, 12, 1, 1, 256, 1, 1, 0, cuda.CU_STREAM_LEGACY, ptrs.ctypes.data, 0))
    want = -1.0 * x + want
    # 3. handles by their getPtr() cells
    a = ctypes.c_float(0.5)
    nn = ctypes.c_uint32(n)
    ptrs = np.array([ctypes.addressof(a), dx.getPtr(), dy.getPtr(), ctypes.addressof(nn)], np.uint64)
    ok(cuda.cuLaunchKernel(fn, 12, 1, 1, 256, 1, 1, 0, 0, ptrs, 0))
    want = 0.5 * x + want
    # 4. extra: the whole parameter buffer (f32 a at 0, u64 x at 8, u64 y at 16, u32 n at 24)
    params_size = 28
    layout = np.zeros(params_size, np.uint8)
    layout[0:4].view(np.float32)[0] = 3.0
    layout[8:16].view(np.uint64)[0] = int(dx)
    layout[16:24].view(np.uint64)[0] = int(dy)
    layout[24:28].view(np.uint32)[0] = n
    size = ctypes.c_size_t(params_size)
    extra = np.array([cuda.CU_LAUNCH_PARAM_BUFFER_POINTER, layout.ctypes.data,
                      cuda.CU_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(size),
                      cuda.CU_LAUNCH_PARAM_END], np.uint64)
    ok(cuda.cuLaunchKernel(fn, 12, 1, 1, 256, 1, 1, 0, 0, None, extra.ctypes.data))
    want = 3.0 * x + want
    out = np.empty_like(y)
    ok(cuda.cuMemcpyDtoH(out, dy, out.nbytes))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    # wrong arguments are refused before anything runs
    fails(cuda.cuLaunchKernel(fn, 12, 1, 1, 256, 1, 1, 0, 0, ((dx, dy), (None, None)), 0),
          R.CUDA_ERROR_INVALID_VALUE)
    fails(cuda.cuLaunchKernel(fn, 12, 1, 1, 256, 1, 1, 0, 0,
                              ((2.0, dx, dy, n), (ctypes.c_double, None, None, ctypes.c_uint)), 0),
          R.CUDA_ERROR_INVALID_VALUE)
    size.value = 12
    fails(cuda.cuLaunchKernel(fn, 12, 1, 1, 256, 1, 1, 0, 0, None, extra.ctypes.data),
          R.CUDA_ERROR_INVALID_VALUE)
    ok(cuda.cuMemcpyDtoH(out, dy, out.nbytes))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    ok(cuda.cuModuleUnload(mod))
    fails(cuda.cuModuleGetFunction(mod, b"saxpy"), R.CUDA_ERROR_INVALID_HANDLE)
    fails(cuda.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, 0, None, 0), R.CUDA_ERROR_INVALID_HANDLE)


def test_module_globals(ctx):
    mod = ok(cuda.cuModuleLoadData(LAUNCH_PTX))
    coeffs, nbytes = ok(cuda.cuModuleGetGlobal(mod, b"coeffs"))
    assert nbytes == 16
    counter, cbytes = ok(cuda.cuModuleGetGlobal(mod, "counter"))
    assert cbytes == 4
    fails(cuda.cuModuleGetGlobal(mod, b"nope"), R.CUDA_ERROR_NOT_FOUND)
    c = np.array([1.0, -2.0, 0.5, 0.25], np.float32)
    ok(cuda.cuMemcpyHtoD(coeffs, c, 16))
    assert ok(cuda.cuMemGetAddressRange(coeffs)) == (coeffs, 16)
    fails(cuda.cuMemFree(coeffs), R.CUDA_ERROR_INVALID_VALUE)  # the module's memory
    n = 500
    x = np.linspace(-2, 2, n, dtype=np.float32)
    dx, dy = ok(cuda.cuMemAlloc(x.nbytes)), ok(cuda.cuMemAlloc(x.nbytes))
    ok(cuda.cuMemcpyHtoD(dx, x, x.nbytes))
    poly = ok(cuda.cuModuleGetFunction(mod, b"poly"))
    ok(cuda.cuLaunchKernel(poly, 2, 1, 1, 256, 1, 1, 0, 0,
                           ((dx, dy, n), (None, None, ctypes.c_uint32)), 0))
    out, cnt = np.empty_like(x), np.zeros(1, np.uint32)
    ok(cuda.cuMemcpyDtoH(out, dy, out.nbytes))
    ok(cuda.cuMemcpy(cnt, counter, 4))  # unified addressing: device -> host
    np.testing.assert_allclose(out, c[0] + x * (c[1] + x * (c[2] + x * c[3])), rtol=1e-5, atol=1e-5)
    assert cnt[0] == n


def test_jit_error_log_of_ptx_that_does_not_compile(ctx):
    bad = SAXPY_PTX.replace("ld.param.f32", "ld.param.f99", 1)
    J = cuda.CUjit_option
    log = bytearray(512)
    info = b" " * 256  # filled in place, as cuda-python does with bytes
    result = cuda.cuModuleLoadDataEx(bad, 3, [J.CU_JIT_ERROR_LOG_BUFFER,
                                               J.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                                               J.CU_JIT_INFO_LOG_BUFFER], [log, len(log), info])
    fails(result, R.CUDA_ERROR_INVALID_PTX)
    text = log.split(b"\0")[0].decode()
    assert "f99" in text and "line" in text, text
    small = np.zeros(16, np.uint8)
    fails(cuda.cuModuleLoadDataEx(bad, 2, [J.CU_JIT_ERROR_LOG_BUFFER, J.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES],
                                  [small, 16]), R.CUDA_ERROR_INVALID_PTX)
    assert small[15] == 0 and small[0] != 0  # cut to the buffer, NUL-terminated
    mod = ok(cuda.cuModuleLoadDataEx(SAXPY_PTX, 2, [J.CU_JIT_INFO_LOG_BUFFER,
                                                    J.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES],
                                     [info, len(info)]))
    assert info.startswith(b"pvgpu: compiled PTX")
    fails(cuda.cuModuleLoadDataEx(SAXPY_PTX, 2, [J.CU_JIT_INFO_LOG_BUFFER], [info]),
          R.CUDA_ERROR_INVALID_VALUE)
    fails(cuda.cuModuleLoadData(b"\x7fELF\x02\x01\x01" + bytes(64)), R.CUDA_ERROR_NO_BINARY_FOR_GPU)
    fails(cuda.cuModuleLoadData(b"hello"), R.CUDA_ERROR_INVALID_IMAGE)
    ok(cuda.cuModuleUnload(mod))


def test_device_memory_copies_and_memsets(ctx):
    free, total = ok(cuda.cuMemGetInfo())
    assert 0 < free <= total == 256 << 20
    n = 1 << 16
    h = np.arange(n, dtype=np.uint32)
    d = ok(cuda.cuMemAlloc(h.nbytes))
    e = ok(cuda.cuMemAlloc(h.nbytes))
    assert ok(cuda.cuMemGetAddressRange(cuda.CUdeviceptr(int(d) + 100))) == (d, h.nbytes)
    ok(cuda.cuMemcpyHtoD(d, h, h.nbytes))
    ok(cuda.cuMemcpyDtoD(e, d, h.nbytes))
    out = np.zeros_like(h)
    ok(cuda.cuMemcpyDtoH(out, e, h.nbytes))
    np.testing.assert_array_equal(out, h)
    ok(cuda.cuMemsetD32(e, 0xDEADBEEF, n // 2))
    ok(cuda.cuMemsetD16(cuda.CUdeviceptr(int(e) + 2 * n), 0x1234, 2))
    ok(cuda.cuMemsetD8(cuda.CUdeviceptr(int(e) + 2 * n + 4), 0xAB, 3))
    ok(cuda.cuMemcpyDtoH(out, e, h.nbytes))
    assert (out[:n // 2] == 0xDEADBEEF).all() and out[n // 2] == 0x12341234
    assert out[n // 2 + 1] == (h[n // 2 + 1] & 0xFF000000) | 0xABABAB
    np.testing.assert_array_equal(out[n // 2 + 2:], h[n // 2 + 2:])
    s = ok(cuda.cuStreamCreate(0))
    ok(cuda.cuMemsetD8Async(e, 0, h.nbytes, s))
    ok(cuda.cuMemsetD32Async(d, 7, 4, s))
    ok(cuda.cuMemsetD16Async(cuda.CUdeviceptr(int(d) + 16), 9, 2, s))
    ok(cuda.cuMemcpyHtoDAsync(e, h[::-1].copy(), h.nbytes, s))
    ok(cuda.cuMemcpyDtoDAsync(d, e, 64, s))
    back = np.zeros_like(h)
    ok(cuda.cuMemcpyDtoHAsync(back, d, h.nbytes, s))
    ok(cuda.cuStreamSynchronize(s))
    np.testing.assert_array_equal(back[:16], h[::-1][:16])
    np.testing.assert_array_equal(back[16:], h[16:])
    ok(cuda.cuMemcpyAsync(out, e, h.nbytes, s))
    ok(cuda.cuStreamSynchronize(s))
    np.testing.assert_array_equal(out, h[::-1])
    # errors
    fails(cuda.cuMemsetD32(cuda.CUdeviceptr(int(d) + 2), 0, 1), R.CUDA_ERROR_INVALID_VALUE)
    fails(cuda.cuMemcpyHtoD(d, h, h.nbytes + 4), R.CUDA_ERROR_INVALID_VALUE)  # past both ends
    fails(cuda.cuMemcpyDtoH(np.zeros(4, np.uint8), d, 8), R.CUDA_ERROR_INVALID_VALUE)
    fails(cuda.cuMemcpyDtoH(np.zeros(4, np.uint8)[::2], d, 2), R.CUDA_ERROR_INVALID_VALUE)
    fails(cuda.cuMemAlloc(0), R.CUDA_ERROR_INVALID_VALUE)
    fails(cuda.cuMemAlloc(1 << 40), R.CUDA_ERROR_OUT_OF_MEMORY)
    with pytest.raises(TypeError):
        cuda.cuMemAlloc("big")
    ok(cuda.cuMemFree(d))
    fails(cuda.cuMemFree(d), R.CUDA_ERROR_INVALID_VALUE)
    fails(cuda.cuMemcpyDtoH(out, d, 4), R.CUDA_ERROR_ILLEGAL_ADDRESS)  # freed: the device faults
    ok(cuda.cuStreamDestroy(s))
    ok(cuda.cuMemFree(e))


def test_pinned_host_memory(ctx, model):
    n = 4096
    p = ok(cuda.cuMemAllocHost(n * 4))
    view = np.ctypeslib.as_array((ctypes.c_float * n).from_address(p))
    view[:] = np.arange(n, dtype=np.float32)
    d = ok(cuda.cuMemAlloc(n * 4))
    dev = _state.get().devices[0].guest
    before = dev.copy_stats["pinned_requests"]
    ok(cuda.cuMemcpyHtoD(d, p, n * 4))  # pinned: one DMA from the block itself
    assert dev.copy_stats["pinned_requests"] == before + 1
    q = ok(cuda.cuMemHostAlloc(n * 4, cuda.CU_MEMHOSTALLOC_PORTABLE))
    ok(cuda.cuMemcpy(q, d, n * 4))  # unified: device -> pinned
    np.testing.assert_array_equal(np.ctypeslib.as_array((ctypes.c_float * n).from_address(q)), view)
    if model == "shared":
        dp = ok(cuda.cuMemHostGetDevicePointer(p, 0))
        assert int(dp) == wire.GUEST_WINDOW_VA + _state.get().memory.host.find(p)[0].gpa
        mapped = ok(cuda.cuMemHostAlloc(n * 4, cuda.CU_MEMHOSTALLOC_DEVICEMAP))
        ok(cuda.cuMemFreeHost(mapped))
    else:
        fails(cuda.cuMemHostGetDevicePointer(p, 0), R.CUDA_ERROR_NOT_SUPPORTED)
        fails(cuda.cuMemHostAlloc(n * 4, cuda.CU_MEMHOSTALLOC_DEVICEMAP), R.CUDA_ERROR_NOT_SUPPORTED)
        fails(cuda.cuMemAllocManaged(n, 1), R.CUDA_ERROR_NOT_SUPPORTED)
    fails(cuda.cuMemHostGetDevicePointer(view[1:].ctypes.data + 12345678, 0), R.CUDA_ERROR_INVALID_VALUE)
    fails(cuda.cuMemHostAlloc(16, 64), R.CUDA_ERROR_INVALID_VALUE)
    ok(cuda.cuMemFreeHost(p))
    fails(cuda.cuMemFreeHost(p), R.CUDA_ERROR_INVALID_VALUE)
    ok(cuda.cuMemFreeHost(q))
    fails(cuda.cuMemAllocHost(1 << 30), R.CUDA_ERROR_OUT_OF_MEMORY)  # beyond the guest memory


def test_zero_copy_kernels_on_mapped_and_managed_memory(shared_ctx):
    mod = ok(cuda.cuModuleLoadData(SAXPY_PTX))
    fn = ok(cuda.cuModuleGetFunction(mod, b"saxpy"))
    n = 2000
    hx = ok(cuda.cuMemHostAlloc(n * 4, cuda.CU_MEMHOSTALLOC_DEVICEMAP))
    x = np.ctypeslib.as_array((ctypes.c_float * n).from_address(hx))
    x[:] = np.arange(n)
    m = ok(cuda.cuMemAllocManaged(n * 4, 1))  # CU_MEM_ATTACH_GLOBAL
    y = np.ctypeslib.as_array((ctypes.c_float * n).from_address(int(m)))
    y[:] = 1.0
    dx = ok(cuda.cuMemHostGetDevicePointer(hx, 0))
    # the mapped memory by its device pointer, the managed memory by its host address
    ok(cuda.cuLaunchKernel(fn, 8, 1, 1, 256, 1, 1, 0, 0,
                           ((2.0, dx, m, n), (ctypes.c_float, None, None, ctypes.c_int)), 0))
    ok(cuda.cuCtxSynchronize())
    np.testing.assert_array_equal(y, 2.0 * np.arange(n) + 1.0)  # written in place
    ok(cuda.cuMemsetD32(m, 0, n))
    assert not y.any()
    ok(cuda.cuMemFreeHost(hx))
    fails(cuda.cuMemFreeHost(m), R.CUDA_ERROR_INVALID_VALUE)  # managed memory goes with cuMemFree
    ok(cuda.cuMemFree(m))
    fails(cuda.cuMemAllocManaged(16, 7), R.CUDA_ERROR_INVALID_VALUE)


def test_streams_and_events(ctx, model):
    s = ok(cuda.cuStreamCreate(0))
    fails(cuda.cuStreamCreate(8), R.CUDA_ERROR_INVALID_VALUE)
    a, b = ok(cuda.cuEventCreate(0)), ok(cuda.cuEventCreate(0))
    nt = ok(cuda.cuEventCreate(2))  # CU_EVENT_DISABLE_TIMING
    fails(cuda.cuEventCreate(64), R.CUDA_ERROR_INVALID_VALUE)
    ok(cuda.cuEventQuery(a))  # never recorded: complete
    fails(cuda.cuEventElapsedTime(a, b), R.CUDA_ERROR_INVALID_HANDLE)
    mod, fn = _saxpy(ctx)
    n = 1 << 14
    d = ok(cuda.cuMemAlloc(4 * n))
    ok(cuda.cuMemsetD32Async(d, 0, n, s))
    ok(cuda.cuEventRecord(a, s))
    ok(cuda.cuLaunchKernel(fn, 64, 1, 1, 256, 1, 1, 0, s,
                           ((1.0, d, d, n), (ctypes.c_float, None, None, ctypes.c_int)), 0))
    ok(cuda.cuEventRecord(b, s))
    ok(cuda.cuEventRecord(nt, s))
    ok(cuda.cuStreamWaitEvent(0, b, 0))  # the NULL stream waits for s's work
    out = np.empty(n, np.float32)
    ok(cuda.cuMemcpyDtoHAsync(out, d, 4 * n, 0))
    ok(cuda.cuEventSynchronize(b))
    ok(cuda.cuEventQuery(b))
    ok(cuda.cuStreamQuery(s))
    assert ok(cuda.cuEventElapsedTime(a, b)) >= 0.0
    fails(cuda.cuEventElapsedTime(a, nt), R.CUDA_ERROR_INVALID_HANDLE)
    ok(cuda.cuStreamSynchronize(0))
    ok(cuda.cuStreamSynchronize(cuda.CUstream(0)))
    assert not out.any()
    other = ok(cuda.cuCtxCreate(None, 0, 1))
    ok(cuda.cuCtxPopCurrent())
    ok(cuda.cuCtxPushCurrent(other))
    s2 = ok(cuda.cuStreamCreate(1))  # CU_STREAM_NON_BLOCKING, in `other`
    ok(cuda.cuCtxPopCurrent())
    fails(cuda.cuEventRecord(a, s2), R.CUDA_ERROR_INVALID_HANDLE)  # another context's stream
    ok(cuda.cuStreamWaitEvent(s2, b, 0))  # across devices: through an exported event
    ok(cuda.cuStreamSynchronize(s2))
    ok(cuda.cuEventDestroy(a))
    fails(cuda.cuEventDestroy(a), R.CUDA_ERROR_INVALID_HANDLE)
    fails(cuda.cuEventQuery(a), R.CUDA_ERROR_INVALID_HANDLE)
    ok(cuda.cuStreamDestroy(s))
    fails(cuda.cuStreamDestroy(s), R.CUDA_ERROR_INVALID_HANDLE)
    fails(cuda.cuStreamSynchronize(s), R.CUDA_ERROR_INVALID_HANDLE)
    fails(cuda.cuStreamQuery(cuda.CUstream(0x5555)), R.CUDA_ERROR_INVALID_HANDLE)
    for ev in (b, nt):
        ok(cuda.cuEventDestroy(ev))
    ok(cuda.cuCtxDestroy(other))


def test_queries_report_work_in_progress(shared_ctx):
    """A kernel that spins until the host writes a flag (mapped memory): the stream and
    an event recorded behind the kernel are not ready until then."""
    mod = ok(cuda.cuModuleLoadData(LAUNCH_PTX))
    spin = ok(cuda.cuModuleGetFunction(mod, b"spin"))
    flag = ok(cuda.cuMemHostAlloc(4, cuda.CU_MEMHOSTALLOC_DEVICEMAP))
    cell = ctypes.c_uint32.from_address(flag)
    cell.value = 0
    s = ok(cuda.cuStreamCreate(0))
    ev = ok(cuda.cuEventCreate(0))
    ok(cuda.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s, ((flag,), (ctypes.c_void_p,)), 0))
    ok(cuda.cuEventRecord(ev, s))
    fails(cuda.cuStreamQuery(s), R.CUDA_ERROR_NOT_READY)
    fails(cuda.cuEventQuery(ev), R.CUDA_ERROR_NOT_READY)
    fails(cuda.cuEventElapsedTime(ev, ev), R.CUDA_ERROR_NOT_READY)
    cell.value = 1  # the kernel sees it through the guest window and ends
    ok(cuda.cuEventSynchronize(ev))
    ok(cuda.cuStreamQuery(s))
    ok(cuda.cuEventQuery(ev))


def test_errors_by_name_and_string(model):
    assert ok(cuda.cuGetErrorName(R.CUDA_ERROR_ILLEGAL_ADDRESS)) == b"CUDA_ERROR_ILLEGAL_ADDRESS"
    assert ok(cuda.cuGetErrorString(R.CUDA_ERROR_ILLEGAL_ADDRESS)) == b"an illegal memory access was encountered"
    assert ok(cuda.cuGetErrorName(0)) == b"CUDA_SUCCESS"
    fails(cuda.cuGetErrorName(123456), R.CUDA_ERROR_INVALID_VALUE)
    fails(cuda.cuGetErrorString(123456), R.CUDA_ERROR_INVALID_VALUE)


def test_typical_errors_of_the_other_functions(ctx, model):
    dev = ok(cuda.cuDeviceGet(0))
    fails(cuda.cuDeviceGetName(0, dev), R.CUDA_ERROR_INVALID_VALUE)
    fails(cuda.cuDeviceTotalMem(9), R.CUDA_ERROR_INVALID_DEVICE)
    fails(cuda.cuDeviceComputeCapability(9), R.CUDA_ERROR_INVALID_DEVICE)
    mod = ok(cuda.cuModuleLoadData(SAXPY_PTX))
    ok(cuda.cuModuleUnload(mod))
    fails(cuda.cuModuleUnload(mod), R.CUDA_ERROR_INVALID_HANDLE)
    d = ok(cuda.cuMemAlloc(64))
    fails(cuda.cuMemcpyDtoD(d, d, 65), R.CUDA_ERROR_INVALID_VALUE)
    fails(cuda.cuMemcpyDtoDAsync(d, d, 65, 0), R.CUDA_ERROR_INVALID_VALUE)
    fails(cuda.cuMemcpy(d, np.zeros(4), 64), R.CUDA_ERROR_INVALID_VALUE)  # the host array is 32 bytes
    other = ok(cuda.cuCtxCreate(None, 0, 0))
    s = ok(cuda.cuStreamCreate(0))  # a stream of `other`
    ok(cuda.cuCtxPopCurrent())
    fails(cuda.cuMemcpyHtoDAsync(d, np.zeros(16, np.float32), 64, s), R.CUDA_ERROR_INVALID_VALUE)
    fails(cuda.cuMemsetD8Async(d, 0, 64, s), R.CUDA_ERROR_INVALID_VALUE)
    fails(cuda.cuStreamWaitEvent(s, cuda.CUevent(0x4444), 0), R.CUDA_ERROR_INVALID_HANDLE)
    fails(cuda.cuStreamWaitEvent(s, ok(cuda.cuEventCreate(0)), 8), R.CUDA_ERROR_INVALID_VALUE)
    ev = ok(cuda.cuEventCreate(0))
    ok(cuda.cuEventDestroy(ev))
    fails(cuda.cuEventSynchronize(ev), R.CUDA_ERROR_INVALID_HANDLE)
    fails(cuda.cuEventRecord(ev, 0), R.CUDA_ERROR_INVALID_HANDLE)
    ok(cuda.cuCtxDestroy(other))
    fails(cuda.cuStreamSynchronize(s), R.CUDA_ERROR_INVALID_HANDLE)  # went with its context
    ok(cuda.cuMemFree(d))
    ok(cuda.cuCtxSetCurrent(None))
    fails(cuda.cuMemGetInfo(), R.CUDA_ERROR_INVALID_CONTEXT)
    fails(cuda.cuMemAlloc(64), R.CUDA_ERROR_INVALID_CONTEXT)
    fails(cuda.cuModuleLoadData(SAXPY_PTX), R.CUDA_ERROR_INVALID_CONTEXT)
    ok(cuda.cuCtxSetCurrent(ctx))
