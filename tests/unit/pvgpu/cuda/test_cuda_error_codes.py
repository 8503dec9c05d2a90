"""pvgpu.cuda's error mapping: the guest API's exceptions -> CUDA codes, and the wrappers
that turn results and failures into cuda-python's tuples (no host needed)."""

import threading

import pytest

from pvgpu.guest.api import errors as gerr
from pvgpu.guest.api.pinned import PinnedMemoryError
from pvgpu.guest.frontend.heap import OutOfGuestMemory
from pvgpu.cuda import _errors, enums
from pvgpu.cuda._errors import CudaError, code_of
from pvgpu.spec import isa

R, E = enums.CUresult, enums.cudaError_t


@pytest.mark.parametrize("exc, code", [
    (gerr.PageFaultError("x", info0=0x1000, info1=2), R.CUDA_ERROR_ILLEGAL_ADDRESS),
    (gerr.IllegalCodeError("x", info1=isa.COBJ_ERR_TRAP), R.CUDA_ERROR_LAUNCH_FAILED),
    (gerr.IllegalCodeError("x", info1=isa.COBJ_ERR_LAUNCH), R.CUDA_ERROR_INVALID_VALUE),
    (gerr.IllegalCodeError("x", info1=isa.COBJ_ERR_INSTR), R.CUDA_ERROR_ILLEGAL_INSTRUCTION),
    (gerr.IllegalCodeError("x", info1=isa.COBJ_ERR_HEADER), R.CUDA_ERROR_ILLEGAL_INSTRUCTION),
    (gerr.InvalidParameterError("x"), R.CUDA_ERROR_INVALID_VALUE),
    (gerr.NotFoundError("x"), R.CUDA_ERROR_NOT_FOUND),
    (gerr.OutOfMemoryError("x"), R.CUDA_ERROR_OUT_OF_MEMORY),
    (OutOfGuestMemory("x"), R.CUDA_ERROR_OUT_OF_MEMORY),
    (gerr.PtxCompileError("x"), R.CUDA_ERROR_INVALID_PTX),
    (gerr.ModuleLoadError("x"), R.CUDA_ERROR_INVALID_IMAGE),
    (gerr.JobTimeoutError("x"), R.CUDA_ERROR_LAUNCH_TIMEOUT),
    (gerr.ContextLostError("x"), R.CUDA_ERROR_LAUNCH_FAILED),
    (gerr.InvalidContextError("x"), R.CUDA_ERROR_CONTEXT_IS_DESTROYED),
    (gerr.InvalidEventError("x"), R.CUDA_ERROR_INVALID_HANDLE),
    (gerr.NotReadyError("x"), R.CUDA_ERROR_NOT_READY),
    (gerr.HostLost("x"), R.CUDA_ERROR_DEVICE_UNAVAILABLE),
    (gerr.DeviceNeedsReset("x"), R.CUDA_ERROR_DEVICE_UNAVAILABLE),
    (PinnedMemoryError("x"), R.CUDA_ERROR_INVALID_VALUE),
    (gerr.PermissionDeniedError("x"), R.CUDA_ERROR_NOT_PERMITTED),
    (gerr.ControlError("x"), R.CUDA_ERROR_UNKNOWN),
    (CudaError(R.CUDA_ERROR_PEER_ACCESS_UNSUPPORTED), R.CUDA_ERROR_PEER_ACCESS_UNSUPPORTED),
])
def test_guest_errors_map_to_cuda_codes(exc, code):
    assert code_of(exc) is code


def test_other_exceptions_are_not_cuda_errors():
    assert code_of(TypeError("x")) is None and code_of(KeyError(1)) is None


def test_driver_results_are_tuples_with_none_for_each_output_on_failure():
    @_errors.driver_api(2)
    def two(fail):
        if fail:
            raise gerr.PageFaultError("boom at 0x10")
        return 1, 2

    @_errors.driver_api(1)
    def one():
        return (3, 4)  # one output that happens to be a tuple

    @_errors.driver_api(0)
    def none():
        pass

    assert two(False) == (R.CUDA_SUCCESS, 1, 2)
    assert two(True) == (R.CUDA_ERROR_ILLEGAL_ADDRESS, None, None)
    assert "boom at 0x10" in _errors.detail()
    assert one() == (R.CUDA_SUCCESS, (3, 4)) and none() == (R.CUDA_SUCCESS,)

    @_errors.driver_api(0)
    def typo():
        raise TypeError("wrong argument type")
    with pytest.raises(TypeError):  # as cuda-python's Cython signatures raise
        typo()


def test_runtime_results_and_the_last_error_per_thread():
    _errors.reset_thread()

    @_errors.runtime_api(1)
    def alloc(fail):
        if fail:
            raise gerr.OutOfMemoryError("full")
        return 0x1000

    assert alloc(False) == (E.cudaSuccess, 0x1000)
    assert _errors.last_runtime_error(reset=False) is E.cudaSuccess
    assert alloc(True) == (E.cudaErrorMemoryAllocation, None)
    seen = []
    t = threading.Thread(target=lambda: seen.append(_errors.last_runtime_error(reset=True)))
    t.start()
    t.join()
    assert seen == [E.cudaSuccess]  # another thread's last error is its own
    assert _errors.last_runtime_error(reset=False) is E.cudaErrorMemoryAllocation
    assert _errors.last_runtime_error(reset=True) is E.cudaErrorMemoryAllocation
    assert _errors.last_runtime_error(reset=True) is E.cudaSuccess
