"""The CUDA error codes pvgpu.cuda gives for what goes wrong on a real host: a page fault
is CUDA_ERROR_ILLEGAL_ADDRESS (and the host, the context and another guest carry on), a
bad launch configuration CUDA_ERROR_INVALID_VALUE, an unknown kernel CUDA_ERROR_NOT_FOUND,
an illegal instruction CUDA_ERROR_ILLEGAL_INSTRUCTION, a trap CUDA_ERROR_LAUNCH_FAILED, a
kernel stopped by the job timeout CUDA_ERROR_LAUNCH_TIMEOUT, a lost host
CUDA_ERROR_DEVICE_UNAVAILABLE; the runtime gives the cudaError_t of the same value."""

import ctypes
import struct

import numpy as np
import pytest

from pvgpu.conformance import codeobj
from pvgpu import guest
import pvgpu.cuda
from cuda_facade import LAUNCH_PTX, ctx, fails, model, ok  # noqa: F401
from pvgpu.cuda import driver as cuda
from pvgpu.cuda import runtime as cudart
from pvgpu.spec import isa

R = cuda.CUresult
E = cudart.cudaError_t
UNMAPPED = 0x7E00_0000_0000  # in the user range, never mapped


def test_an_out_of_bounds_store_is_an_illegal_address_the_others_survive(ctx, model, shared_host):
    mod = ok(cuda.cuModuleLoadData(LAUNCH_PTX))
    store_at = ok(cuda.cuModuleGetFunction(mod, b"store_at"))
    small = ok(cuda.cuModuleGetFunction(mod, b"small_block"))
    with guest.connect(shared_host.endpoint, memory=model, mem_size=16 << 20) as other:
        octx = other.devices[0].create_context("bystander")
        before = octx.to_device(np.arange(1000, dtype=np.float32))
        ok(cuda.cuLaunchKernel(store_at, 1, 1, 1, 1, 1, 1, 0, 0,
                               ((UNMAPPED, 7), (ctypes.c_uint64, ctypes.c_uint32)), 0))
        fails(cuda.cuCtxSynchronize(), R.CUDA_ERROR_ILLEGAL_ADDRESS)
        assert f"{UNMAPPED:#x}" in pvgpu.cuda.error_detail()
        # the context carries on (pvgpu's errors are not sticky), and so does the other guest
        out = ok(cuda.cuMemAlloc(64 * 4))
        ok(cuda.cuLaunchKernel(small, 1, 1, 1, 64, 1, 1, 0, 0, ((out,), (None,)), 0))
        got = np.zeros(64, np.int32)
        ok(cuda.cuMemcpyDtoH(got, out, got.nbytes))
        np.testing.assert_array_equal(got, np.arange(64))
        np.testing.assert_array_equal(before.to_host(), np.arange(1000, dtype=np.float32))
    # through the runtime: the same code, as cudaError_t, and the thread's last error
    ok(cuda.cuLaunchKernel(store_at, 1, 1, 1, 1, 1, 1, 0, 0,
                           ((UNMAPPED, 7), (ctypes.c_uint64, ctypes.c_uint32)), 0))
    fails(cudart.cudaDeviceSynchronize(), E.cudaErrorIllegalAddress)
    assert cudart.cudaPeekAtLastError() == (E.cudaErrorIllegalAddress,)
    assert cudart.cudaGetLastError() == (E.cudaErrorIllegalAddress,)
    assert cudart.cudaGetLastError() == (E.cudaSuccess,)


def test_bad_launch_configurations_are_invalid_values(ctx):
    mod = ok(cuda.cuModuleLoadData(LAUNCH_PTX))
    small = ok(cuda.cuModuleGetFunction(mod, b"small_block"))
    out = ok(cuda.cuMemAlloc(4096))
    args = ((out,), (None,))
    for grid, block, shared in (((1, 1, 1), (65, 1, 1), 0),  # beyond the kernel's .maxntid
                                ((1, 1, 1), (2048, 1, 1), 0),  # beyond the device's
                                ((0, 1, 1), (32, 1, 1), 0),  # an empty grid
                                ((1, 1, 1), (32, 1, 1), isa.MAX_DYNAMIC_SHARED + 1)):
        fails(cuda.cuLaunchKernel(small, *grid, *block, shared, 0, args, 0),
              R.CUDA_ERROR_INVALID_VALUE)
    fails(cuda.cuLaunchKernel(small, 1, 1, 1, 32, 1, 1, 0, 0, ((out, out), (None, None)), 0),
          R.CUDA_ERROR_INVALID_VALUE)  # a wrong count of arguments
    fails(cuda.cuLaunchKernel(small, 1, 1, 1, 32, 1, 1, 0, cuda.CUstream(0x4242), args, 0),
          R.CUDA_ERROR_INVALID_HANDLE)  # no such stream
    with pytest.raises(TypeError):  # not a kernelParams form at all
        cuda.cuLaunchKernel(small, 1, 1, 1, 32, 1, 1, 0, 0, [out], 0)
    ok(cuda.cuCtxSynchronize())  # nothing reached the device


def test_unknown_names_are_not_found(ctx):
    mod = ok(cuda.cuModuleLoadData(LAUNCH_PTX))
    fails(cuda.cuModuleGetFunction(mod, b"no_such_kernel"), R.CUDA_ERROR_NOT_FOUND)
    assert "saxpy" in pvgpu.cuda.error_detail()  # the detail lists what the module has
    fails(cuda.cuModuleGetGlobal(mod, b"no_such_symbol"), R.CUDA_ERROR_NOT_FOUND)


def _bad_instruction() -> bytes:
    raw = bytearray(struct.pack(isa.INSTR_FORMAT, *([0] * len(struct.unpack(
        isa.INSTR_FORMAT, bytes(isa.INSTR_SIZE))))))
    raw[0:2] = (0x7FFF).to_bytes(2, "little")  # no such opcode
    return bytes(raw)


def test_illegal_code_and_traps(ctx):
    obj = codeobj.build([codeobj.Entry("bad", [_bad_instruction()]),
                         codeobj.Entry("trap", codeobj.trap_code()),
                         codeobj.Entry("store_index", codeobj.store_index_code(),
                                       params=codeobj.OUT_N, param_size=12)])
    mod = ok(cuda.cuModuleLoadData(obj))  # a code object is loaded as it is
    bad = ok(cuda.cuModuleGetFunction(mod, b"bad"))
    trap = ok(cuda.cuModuleGetFunction(mod, b"trap"))
    good = ok(cuda.cuModuleGetFunction(mod, b"store_index"))
    ok(cuda.cuLaunchKernel(bad, 1, 1, 1, 32, 1, 1, 0, 0, None, 0))
    fails(cuda.cuCtxSynchronize(), R.CUDA_ERROR_ILLEGAL_INSTRUCTION)
    ok(cuda.cuLaunchKernel(trap, 1, 1, 1, 32, 1, 1, 0, 0, None, 0))
    fails(cuda.cuCtxSynchronize(), R.CUDA_ERROR_LAUNCH_FAILED)
    out = ok(cuda.cuMemAlloc(32 * 4))
    ok(cuda.cuLaunchKernel(good, 1, 1, 1, 32, 1, 1, 0, 0,
                           ((out, 32), (None, ctypes.c_uint32)), 0))
    got = np.zeros(32, np.uint32)
    ok(cuda.cuMemcpyDtoH(got, out, got.nbytes))
    np.testing.assert_array_equal(got, np.arange(32))
    fails(cuda.cuModuleLoadData(obj[:40]), R.CUDA_ERROR_INVALID_IMAGE)  # a cut object


def test_a_kernel_that_never_ends_is_a_launch_timeout(host_factory, tmp_endpoint):
    host_factory([tmp_endpoint], extra_args=("--job-timeout-ms", "400"))
    pvgpu.cuda.connect(tmp_endpoint, memory="shared", mem_size=16 << 20)
    try:
        ok(cuda.cuInit(0))
        ok(cuda.cuCtxCreate(None, 0, 0))
        mod = ok(cuda.cuModuleLoadData(LAUNCH_PTX))
        spin = ok(cuda.cuModuleGetFunction(mod, b"spin"))
        flag = ok(cuda.cuMemAlloc(4))
        ok(cuda.cuMemsetD32(flag, 0, 1))
        ok(cuda.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, 0, ((flag,), (None,)), 0))
        fails(cuda.cuCtxSynchronize(), R.CUDA_ERROR_LAUNCH_TIMEOUT)
        # the context is lost: it takes no more work, as after CUDA's launch timeout
        fails(cuda.cuMemsetD32(flag, 1, 1), R.CUDA_ERROR_LAUNCH_FAILED)
        ok(cuda.cuCtxDestroy(ok(cuda.cuCtxGetCurrent())))
        fresh = ok(cuda.cuCtxCreate(None, 0, 0))  # a new one works
        ok(cuda.cuMemAlloc(4))
        ok(cuda.cuCtxDestroy(fresh))
    finally:
        pvgpu.cuda.shutdown()


def test_a_lost_host_is_device_unavailable(host_factory, tmp_endpoint):
    host = host_factory([tmp_endpoint], heartbeat_ms=200)
    pvgpu.cuda.connect(tmp_endpoint, memory="shared", mem_size=16 << 20)
    try:
        ok(cuda.cuInit(0))
        ok(cuda.cuCtxCreate(None, 0, 0))
        d = ok(cuda.cuMemAlloc(4096))
        host.stop()
        fails(cuda.cuMemsetD32(d, 1, 1024), R.CUDA_ERROR_DEVICE_UNAVAILABLE)
        fails(cudart.cudaMalloc(16), E.cudaErrorDevicesUnavailable)
    finally:
        pvgpu.cuda.shutdown()


def test_out_of_memory(ctx):
    fails(cuda.cuMemAlloc(300 << 20), R.CUDA_ERROR_OUT_OF_MEMORY)  # the host has 256 MiB
    fails(cudart.cudaMalloc(300 << 20), E.cudaErrorMemoryAllocation)
    fails(cudart.cudaMallocHost(1 << 30), E.cudaErrorMemoryAllocation)
