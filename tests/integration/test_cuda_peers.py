"""pvgpu.cuda's unified addressing across contexts and devices, against a real host in both
memory models: every context's allocations are distinct addresses, copies infer their
direction and route across contexts and devices (through an import, or through pinned
memory without peer access), and a kernel dereferences a peer device's pointer once peer
access is enabled."""

import ctypes

import numpy as np

from cuda_facade import SAXPY_PTX, fails, model, ok  # noqa: F401
from pvgpu.cuda import _state
from pvgpu.cuda import driver as cuda

R = cuda.CUresult


def _two_contexts():
    ok(cuda.cuInit(0))
    c0 = ok(cuda.cuCtxCreate(None, 0, 0))
    c1 = ok(cuda.cuCtxCreate(None, 0, 1))
    ok(cuda.cuCtxPopCurrent())
    return c0, c1


def _in(ctx, fn, *args):
    ok(cuda.cuCtxPushCurrent(ctx))
    try:
        return fn(*args)
    finally:
        ok(cuda.cuCtxPopCurrent())


def test_allocations_of_all_contexts_are_distinct_addresses(model):
    c0, c1 = _two_contexts()
    c2 = ok(cuda.cuCtxCreate(None, 0, 0))  # a second context on device 0
    ok(cuda.cuCtxPopCurrent())
    f = _state.get()
    ptrs = {}
    for c in (c0, c1, c2):
        ptrs[c] = [int(_in(c, lambda: ok(cuda.cuMemAlloc(1 << 20)))) for _ in range(3)]
        slot = f.context(c).slot
        start, end = _state.slot_range(slot)
        assert all(start <= p < end for p in ptrs[c]), (slot, [hex(p) for p in ptrs[c]])
    everything = sorted(p for ps in ptrs.values() for p in ps)
    assert len(set(everything)) == 9
    assert all(b - a >= 1 << 20 for a, b in zip(everything, everything[1:]))
    # the same addresses cannot be host memory of this process
    for p in everything:
        assert f.memory.where(p).on_device
    for c in (c0, c1, c2):
        ok(cuda.cuCtxDestroy(c))


def test_copies_between_contexts_and_devices(model):
    c0, c1 = _two_contexts()
    n = 1 << 18
    h = np.random.default_rng(5).integers(0, 1 << 30, n, dtype=np.uint32)
    a0 = _in(c0, lambda: ok(cuda.cuMemAlloc(h.nbytes)))
    a1 = _in(c1, lambda: ok(cuda.cuMemAlloc(h.nbytes)))
    ok(cuda.cuCtxPushCurrent(c0))
    ok(cuda.cuMemcpyHtoD(a0, h, h.nbytes))
    # no peer access: cuMemcpy and cuMemcpyPeer go through pinned host memory
    ok(cuda.cuMemcpy(a1, a0, h.nbytes))
    out = np.zeros_like(h)
    ok(cuda.cuMemcpy(out, a1, h.nbytes))  # the device pointer's own context does it
    np.testing.assert_array_equal(out, h)
    ok(cuda.cuMemsetD32(a1, 0, 16))
    ok(cuda.cuMemcpyPeer(a1, c1, cuda.CUdeviceptr(int(a0) + 64), c0, 64))
    ok(cuda.cuMemcpyDtoH(out, a1, h.nbytes))
    np.testing.assert_array_equal(out[:16], h[16:32])
    # with peer access: one copy on a device, reading the other's memory through an import
    fails(cuda.cuCtxEnablePeerAccess(c0, 0), R.CUDA_ERROR_INVALID_DEVICE)  # itself
    fails(cuda.cuCtxDisablePeerAccess(c1), R.CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)
    fails(cuda.cuCtxEnablePeerAccess(c1, 4), R.CUDA_ERROR_INVALID_VALUE)
    ok(cuda.cuCtxEnablePeerAccess(c1, 0))
    fails(cuda.cuCtxEnablePeerAccess(c1, 0), R.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
    ok(cuda.cuMemsetD8(a0, 0, h.nbytes))
    ok(cuda.cuMemcpyPeerAsync(a0, c0, a1, c1, h.nbytes, 0))
    ok(cuda.cuCtxSynchronize())
    ok(cuda.cuMemcpyDtoH(out, a0, h.nbytes))
    np.testing.assert_array_equal(out[:16], h[16:32])
    np.testing.assert_array_equal(out[16:], h[16:])
    ok(cuda.cuCtxDisablePeerAccess(c1))
    ok(cuda.cuCtxPopCurrent())
    fails(cuda.cuMemcpyPeer(a1, cuda.CUcontext(0x9999), a0, c0, 4), R.CUDA_ERROR_INVALID_CONTEXT)
    ok(cuda.cuMemFree(a0))
    ok(cuda.cuMemFree(a1))  # freeing drops the imports made of it
    for c in (c0, c1):
        ok(cuda.cuCtxDestroy(c))


def test_a_kernel_dereferences_a_peer_pointer_with_peer_access(model):
    c0, c1 = _two_contexts()
    n = 4096
    x = np.arange(n, dtype=np.float32)
    ok(cuda.cuCtxPushCurrent(c0))
    x0 = ok(cuda.cuMemAlloc(x.nbytes))
    ok(cuda.cuMemcpyHtoD(x0, x, x.nbytes))
    ok(cuda.cuCtxPopCurrent())
    ok(cuda.cuCtxPushCurrent(c1))
    y1 = ok(cuda.cuMemAlloc(x.nbytes))
    ok(cuda.cuMemsetD32(y1, 0, n))
    mod = ok(cuda.cuModuleLoadData(SAXPY_PTX))
    fn = ok(cuda.cuModuleGetFunction(mod, b"saxpy"))
    args = ((3.0, x0, y1, n), (ctypes.c_float, None, None, ctypes.c_int))
    # without peer access the other device's address means nothing here: a page fault
    ok(cuda.cuLaunchKernel(fn, 16, 1, 1, 256, 1, 1, 0, 0, args, 0))
    fails(cuda.cuCtxSynchronize(), R.CUDA_ERROR_ILLEGAL_ADDRESS)
    ok(cuda.cuCtxEnablePeerAccess(c0, 0))
    ok(cuda.cuLaunchKernel(fn, 16, 1, 1, 256, 1, 1, 0, 0, args, 0))
    out = np.empty_like(x)
    ok(cuda.cuMemcpyDtoH(out, y1, x.nbytes))
    np.testing.assert_array_equal(out, 3.0 * x)
    ok(cuda.cuCtxPopCurrent())
    for c in (c0, c1):
        ok(cuda.cuCtxDestroy(c))
