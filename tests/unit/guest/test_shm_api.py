"""guest/api/shm.py without a host: handles and keys."""

import pickle

import pytest

from pvgpu.guest.api.shm import ShmHandle, key_of
from pvgpu.spec import wire


def test_handle_string_form_round_trips():
    h = ShmHandle(42, 0xDEADBEEF00C0FFEE)
    assert str(h) == "shm:42:deadbeef00c0ffee"
    assert ShmHandle.parse(str(h)) == h and ShmHandle.parse(h) is h
    assert pickle.loads(pickle.dumps(h)) == h
    for bad in ("evt:1:ff", "shm:1:", "shm:x:ff", "shm:1:" + "f" * 17, 7, None,
                f"shm:{1 << 64}:ff"):
        with pytest.raises(ValueError):
            ShmHandle.parse(bad)


def test_keys():
    assert key_of(5) == 5 and key_of(wire.SHM_KEY_PRIVATE) == 0
    assert key_of("frames") == key_of(b"frames") != key_of("frames2")
    assert 0 < key_of("frames") < 1 << 64
    for bad in (-1, 1 << 64, 1.5, True, None):
        with pytest.raises(ValueError):
            key_of(bad)
