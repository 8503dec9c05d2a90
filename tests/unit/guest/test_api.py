"""pvgpu.guest.api pieces that need no host: event handles and the mapping of device errors."""

import pickle

import pytest

from pvgpu import guest
from pvgpu.guest.api import errors
from pvgpu.guest.frontend.driver import DeviceResponseError
from pvgpu.spec import wire


def test_event_handle_string_form_round_trips_and_pickles():
    h = guest.EventHandle(42, 0x0123_4567_89AB_CDEF)
    assert str(h) == "evt:42:0123456789abcdef"
    assert guest.EventHandle.parse(str(h)) == h
    assert guest.EventHandle.parse(h) is h
    assert pickle.loads(pickle.dumps(h)) == h
    assert guest.EventHandle.parse("evt:7:ff") == guest.EventHandle(7, 255)


@pytest.mark.parametrize("bad", ["", "evt:1", "evt:x:ff", "evt:1:" + "f" * 17, "evt:-1:ff",
                                 f"evt:{1 << 64}:ff", 12, None])
def test_event_handle_rejects_malformed_strings(bad):
    with pytest.raises(ValueError):
        guest.EventHandle.parse(bad)


@pytest.mark.parametrize("code, cls", [
    (wire.RESP_ERR_CONTEXT_LOST, guest.ContextLostError),
    (wire.RESP_ERR_JOB_TIMEOUT, guest.JobTimeoutError),
    (wire.RESP_ERR_INVALID_EVENT, guest.InvalidEventError),
    (wire.RESP_ERR_PAGE_FAULT, guest.PageFaultError),
    (wire.RESP_ERR_LIMIT, guest.LimitError),
    (0x12EE, guest.DeviceError),  # unknown error codes are still device errors
])
def test_device_error_codes_map_to_exceptions(code, cls):
    # [ERR-RESP-2] an unknown 0x12xx code is still an error
    e = errors.translate(DeviceResponseError(code, "boom", 0x1000, 2, command=wire.CMD_CTX_SYNC))
    assert type(e) is cls and e.code == code and isinstance(e, guest.DeviceError)
    assert "CTX_SYNC" in str(e) and "boom" in str(e)
    assert errors.error_for(code, "x").code == code


def test_a_limit_is_an_out_of_memory_error_for_callers_and_cuda():
    from pvgpu.cuda import _errors
    e = errors.error_for(wire.RESP_ERR_LIMIT, "at most 32 contexts per device and session")
    assert isinstance(e, guest.OutOfMemoryError) and e.name == "ERR_LIMIT"
    assert _errors.code_of(e) == _errors.R.CUDA_ERROR_OUT_OF_MEMORY


def test_not_ready_is_not_a_device_error():
    assert issubclass(guest.NotReadyError, guest.PvgpuError)
    assert not issubclass(guest.NotReadyError, guest.DeviceError)
