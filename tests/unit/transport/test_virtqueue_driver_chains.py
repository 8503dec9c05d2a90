"""How the driver side of a virtqueue (pvgpu.transport.virtqueue.DriverQueue) lays out the
descriptors of a chain (spec VQ-DESC-2, VQ-INDIRECT-3): readable descriptors before
writable ones, and VIRTQ_DESC_F_INDIRECT only where the spec allows it."""

import struct

import pytest

from pvgpu.spec.wire import (VIRTQ_DESC_F_INDIRECT, VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE,
                       VIRTQ_DESC_FORMAT)
from pvgpu.transport.memory import GuestMemory
from pvgpu.transport.errors import QueueFull
from pvgpu.transport.virtqueue import DriverQueue, VirtqLayout

DESC = struct.Struct(VIRTQ_DESC_FORMAT)
DATA = 0x4000


def walk(mem, table, first):
    """-> [(addr, len, flags)] of a chain from descriptor `first` of `table`."""
    out, i = [], first
    while True:
        addr, n, flags, nxt = DESC.unpack(mem.read(table + DESC.size * i, DESC.size))
        out.append((addr, n, flags))
        if not flags & VIRTQ_DESC_F_NEXT:
            return out
        i = nxt


READABLE = [(DATA, 8), (DATA + 64, 0), (DATA + 128, 24)]
WRITABLE = [(DATA + 512, 240), (DATA + 1024, 16)]


@pytest.mark.parametrize("indirect", [False, True])
def test_vq_desc_2_readable_descriptors_come_before_writable_ones(indirect):
    mem = GuestMemory(1 << 16)
    layout = VirtqLayout.at(0, 8)
    q = DriverQueue(mem, layout, indirect=indirect)
    table = DATA + 4096 if indirect else None
    head = q.add_chain(READABLE, WRITABLE, indirect_table=table)
    chain = walk(mem, layout.desc, head)
    if indirect:
        ((addr, n, flags),) = chain
        chain = walk(mem, addr, 0)
        assert n == DESC.size * len(chain)
    writes = [bool(flags & VIRTQ_DESC_F_WRITE) for _a, _n, flags in chain]
    assert writes == sorted(writes) and writes.count(True) == len(WRITABLE)
    assert [(a, n) for a, n, _f in chain] == READABLE + WRITABLE


def test_vq_indirect_3_indirect_only_when_negotiated_alone_and_never_nested():
    mem = GuestMemory(1 << 16)
    layout = VirtqLayout.at(0, 8)
    with pytest.raises(ValueError, match="indirect"):
        DriverQueue(mem, layout).add_chain(READABLE, WRITABLE, indirect_table=DATA + 4096)
    q = DriverQueue(mem, layout, indirect=True)
    head = q.add_chain(READABLE, WRITABLE, indirect_table=DATA + 4096)
    ((addr, _n, flags),) = walk(mem, layout.desc, head)
    assert flags == VIRTQ_DESC_F_INDIRECT  # not with NEXT (nor WRITE)
    assert not any(f & VIRTQ_DESC_F_INDIRECT for _a, _n, f in walk(mem, addr, 0))
    direct = q.add_chain(READABLE, WRITABLE)  # without a table: no indirect descriptor
    assert not any(f & VIRTQ_DESC_F_INDIRECT for _a, _n, f in walk(mem, layout.desc, direct))


def test_add_indirect_publishes_again_a_table_written_before():
    mem = GuestMemory(1 << 16)
    layout = VirtqLayout.at(0, 2)
    q = DriverQueue(mem, layout, indirect=True)
    table = DATA + 4096
    first = q.add_chain(READABLE, WRITABLE, indirect_table=table)
    again = q.add_indirect(table, len(READABLE) + len(WRITABLE), 256)
    assert again != first and q.avail_idx == 2 and q.num_free == 0
    for head in (first, again):  # both heads lead to the same table, hence the same chain
        ((addr, n, flags),) = walk(mem, layout.desc, head)
        assert (addr, n, flags) == (table, DESC.size * 5, VIRTQ_DESC_F_INDIRECT)
        assert [(a, n) for a, n, _f in walk(mem, table, 0)] == READABLE + WRITABLE
    with pytest.raises(QueueFull):
        q.add_indirect(table, 5, 256)
