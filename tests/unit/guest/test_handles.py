"""guest/api/handles.py: the text form of exported handles, for every kind."""

import pickle

import pytest
from hypothesis import given, strategies as st

from pvgpu.guest.api.event import EventHandle
from pvgpu.guest.api.shm import ShmHandle

KINDS = (EventHandle, ShmHandle)
u64 = st.integers(0, (1 << 64) - 1)


@given(st.sampled_from(KINDS), u64, u64)
def test_a_handle_round_trips_through_its_text_and_pickle(kind, handle_id, token):
    h = kind(handle_id, token)
    assert kind.parse(str(h)) == h and kind.parse(h) is h
    assert pickle.loads(pickle.dumps(h)) == h
    assert str(h).startswith(kind.PREFIX + ":")


@given(u64, u64)
def test_a_handle_of_one_kind_is_never_taken_for_the_other(handle_id, token):
    evt, shm = EventHandle(handle_id, token), ShmHandle(handle_id, token)
    assert evt != shm
    with pytest.raises(ValueError, match="not a shared memory handle"):
        ShmHandle.parse(str(evt))
    with pytest.raises(ValueError, match="not an event handle"):
        EventHandle.parse(str(shm))
    with pytest.raises(ValueError):
        ShmHandle.parse(evt)  # an object of the other kind, not only its text
