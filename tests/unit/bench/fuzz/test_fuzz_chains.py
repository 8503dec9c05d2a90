"""bench/fuzz/chains.py: every invalid-chain family breaks exactly its rule of spec §4.7,
as the transport's own validator (transport/chain.py via DeviceQueue.pop) sees it, and a
family's chain is a function of its seed."""

import random

import pytest
from hypothesis import given, settings, strategies as st

from pvgpu.bench.fuzz import chains
from pvgpu.transport.errors import DEVICE_CLAUSES, VirtqError
from pvgpu.transport.memory import GuestMemory, InlineGuestMemory
from pvgpu.transport.virtqueue import DeviceQueue, DriverQueue, VirtqLayout

MEM = 2 << 20
SCRATCH = 1 << 20


def geometry(qsize, indirect):
    return chains.Geometry(qsize, MEM, SCRATCH, MEM - SCRATCH, indirect)


def rejected_with(bad, qsize, indirect, mem=None):
    mem = mem or GuestMemory(MEM)
    layout = VirtqLayout.at(0x1000, qsize)
    DriverQueue(mem, layout, indirect=indirect)
    chains.publish(mem, layout, 0, bad)
    with pytest.raises(VirtqError) as e:
        DeviceQueue(mem, layout, indirect=indirect).pop()
    return e.value.clause


def test_one_family_per_device_clause():
    assert set(chains.FAMILIES) == DEVICE_CLAUSES
    assert set(chains.families_for(True)) | set(chains.families_for(False)) == DEVICE_CLAUSES


@settings(max_examples=60)
@given(seed=st.integers(0, 2**32), qsize=st.sampled_from([1, 2, 8, 64, 256]),
       indirect=st.booleans(), data=st.data())
def test_each_family_is_rejected_by_the_transport_with_its_clause(seed, qsize, indirect, data):
    clause = data.draw(st.sampled_from(chains.families_for(indirect, qsize)))
    bad = chains.bad_chain(random.Random(seed), geometry(qsize, indirect), clause)
    assert bad.clause == clause
    assert rejected_with(bad, qsize, indirect) == clause


@pytest.mark.parametrize("indirect", [True, False])
def test_every_family_many_seeds(indirect):
    for clause in chains.families_for(indirect):
        for seed in range(40):
            bad = chains.bad_chain(random.Random(seed), geometry(64, indirect), clause)
            assert rejected_with(bad, 64, indirect) == clause, (clause, seed, bad)


def test_publish_marks_the_chain_dirty_in_the_inline_model():
    """The fuzzer ships the chain to the host's mirror with the next kick's patches."""
    mem = InlineGuestMemory(MEM)
    layout = VirtqLayout.at(0x1000, 8)
    DriverQueue(mem, layout, indirect=True)
    mem.take_dirty()
    bad = chains.bad_chain(random.Random(3), geometry(8, True), "VQ-INDIRECT-NESTED")
    chains.publish(mem, layout, 0, bad)
    copy = GuestMemory(MEM)
    dirty = mem.take_dirty()
    for gpa, n in dirty:
        copy.write(gpa, mem.read(gpa, n))
    with pytest.raises(VirtqError) as e:
        DeviceQueue(copy, layout, indirect=True).pop()
    assert e.value.clause == "VQ-INDIRECT-NESTED"


def test_a_family_is_a_function_of_its_seed():
    g = geometry(64, True)
    for clause in chains.families_for(True):
        assert chains.bad_chain(random.Random(5), g, clause) == \
            chains.bad_chain(random.Random(5), g, clause)
