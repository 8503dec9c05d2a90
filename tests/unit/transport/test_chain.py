"""Descriptor chains: byte streams and extents, and every validation clause (VQ-*).

Malformed chains are built by writing raw descriptor bytes, as a hostile guest would;
each clause test checks the exact clause ID the spec cites.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pvgpu.spec.wire import (
    VIRTQ_DESC_F_INDIRECT as IND,
    VIRTQ_DESC_F_NEXT as NEXT,
    VIRTQ_DESC_F_WRITE as WRITE,
    VIRTQ_DESC_FORMAT,
    VIRTQ_MAX_INDIRECT,
)
from pvgpu.transport.chain import DescriptorChain, walk_chain
from pvgpu.transport.errors import DEVICE_CLAUSES, ChainError, VirtqError
from pvgpu.transport.memory import GuestMemory, InlineGuestMemory
from pvgpu.transport.virtqueue import DeviceQueue, VirtqLayout

Q = 8
MEM = 1 << 16
TABLE = 0x4000  # where the tests put indirect tables
DATA = 0x8000


# ---------------------------------------------------------------- streams and extents
@pytest.fixture
def chain():
    # readable: 3 + 0-skipped + 5 bytes; writable: 4 + 6 bytes
    return DescriptorChain(7, [(100, 3), (200, 5)], [(300, 4), (400, 6)])


def test_lengths(chain):
    assert chain.head == 7 and chain.readable_len == 8 and chain.writable_len == 10


@pytest.mark.parametrize("offset,n,expected", [
    (0, 8, [(100, 3), (200, 5)]),
    (0, 3, [(100, 3)]),
    (2, 2, [(102, 1), (200, 1)]),
    (3, 5, [(200, 5)]),
    (4, 3, [(201, 3)]),
    (8, 0, []),
    (0, 0, []),
])
def test_readable_extents(chain, offset, n, expected):
    assert chain.readable_extents(offset, n) == expected


def test_writable_extents_and_written(chain):
    assert chain.writable_extents(3, 4) == [(303, 1), (400, 3)]
    assert chain.writable_written(5) == [(300, 4), (400, 1)]
    assert chain.writable_written(0) == []
    assert chain.writable_written(10) == [(300, 4), (400, 6)]


@pytest.mark.parametrize("offset,n", [(0, 9), (8, 1), (-1, 1), (0, -1), (9, 0)])
def test_readable_extents_beyond_raise(chain, offset, n):
    with pytest.raises(ChainError):
        chain.readable_extents(offset, n)
    with pytest.raises(ChainError):
        chain.read(GuestMemory(MEM), offset, n)


def test_writable_beyond_raise(chain):
    mem = GuestMemory(MEM)
    with pytest.raises(ChainError):
        chain.writable_written(11)
    with pytest.raises(ChainError):
        chain.writable_extents(10, 1)
    with pytest.raises(ChainError):
        chain.write(mem, 5, b"123456")
    assert not mem.buf.any()  # nothing written on failure
    with pytest.raises(ValueError):  # ChainError is a ValueError
        chain.write(mem, 11, b"")


def test_read_and_write_across_segments(chain):
    mem = InlineGuestMemory(MEM)
    mem.write(100, b"abc")
    mem.write(200, b"defgh")
    mem.take_dirty()
    assert chain.read(mem, 0, 8) == b"abcdefgh"
    assert chain.read(mem, 2, 3) == b"cde"
    assert chain.read(mem, 5, 0) == b""
    assert chain.write(mem, 2, b"WXYZ") == 4
    assert mem.read(300, 4) == b"\x00\x00WX" and mem.read(400, 2) == b"YZ"
    # writes through chain.write are dirty in the inline model
    assert mem.take_dirty() == [(302, 2), (400, 2)]
    assert chain.write(mem, 0, np.arange(10, dtype=np.uint8)) == 10
    assert mem.read(300, 4) == bytes(range(4)) and mem.read(400, 6) == bytes(range(4, 10))
    assert chain.write(mem, 1, memoryview(b"q")) == 1
    assert mem.read(301, 1) == b"q"


def test_lengths_computed_when_not_given():
    c = DescriptorChain(0, [(0, 2)], [])
    assert c.readable_len == 2 and c.writable_len == 0
    assert "head=0" in repr(c)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=6), st.data())
def test_extents_reassemble_the_stream(lengths, data):
    # [VQ-DESC-3] any split of the stream into descriptors reads the same
    segs, gpa = [], 0
    for n in lengths:
        segs.append((gpa, n))
        gpa += n + 7  # gaps between segments
    mem = GuestMemory(gpa + 8)
    mem.buf[:] = np.arange(mem.size) % 251
    c = DescriptorChain(0, segs, [])
    stream = b"".join(mem.read(g, n) for g, n in segs)
    offset = data.draw(st.integers(0, len(stream)))
    n = data.draw(st.integers(0, len(stream) - offset))
    ext = c.readable_extents(offset, n)
    assert b"".join(mem.read(g, ln) for g, ln in ext) == stream[offset:offset + n]
    assert all(ln > 0 for _, ln in ext)
    assert c.read(mem, offset, n) == stream[offset:offset + n]


# ---------------------------------------------------------------- walking valid chains
@pytest.fixture
def ring(raw_ring):
    mem = GuestMemory(MEM)
    layout = VirtqLayout.at(0, Q)
    return mem, layout, raw_ring(mem, layout)


def device(mem, layout, indirect=True):
    return DeviceQueue(mem, layout, indirect=indirect)


def test_direct_chain_with_zero_length_buffers(ring):
    # [VQ-DESC-3] descriptors of length 0 are allowed
    mem, layout, raw = ring
    raw.desc(3, DATA, 10, NEXT, 5)
    raw.desc(5, 0xFFFF_FFFF_FFFF, 0, NEXT, 1)  # zero length: skipped, address unchecked
    raw.desc(1, DATA + 100, 20, WRITE | NEXT, 0)
    raw.desc(0, 0, 0, WRITE, 0)
    raw.publish(3)
    c = device(mem, layout).pop()
    assert (c.head, c.readable, c.writable) == (3, [(DATA, 10)], [(DATA + 100, 20)])


def test_full_length_direct_chain_is_accepted(ring):
    mem, layout, raw = ring
    for i in range(Q):
        raw.desc(i, DATA + i, 1, (NEXT if i < Q - 1 else 0), i + 1)
    raw.publish(0)
    c = device(mem, layout).pop()
    assert c.readable_len == Q and c.readable[-1] == (DATA + Q - 1, 1)


def test_direct_then_indirect_and_write_flag_of_table_pointer_ignored(ring):
    # [VQ-INDIRECT-2] direct descriptors then one indirect; WRITE on it ignored
    mem, layout, raw = ring
    raw.desc(2, DATA, 4, NEXT, 6)
    raw.desc(6, TABLE, 3 * 16, IND | WRITE)  # WRITE on the table pointer is ignored
    raw.desc(0, DATA + 10, 5, NEXT, 2, table=TABLE)  # readable after the direct one: fine
    raw.desc(2, DATA + 20, 6, WRITE | NEXT, 1, table=TABLE)
    raw.desc(1, DATA + 30, 7, WRITE, 0, table=TABLE)
    raw.publish(2)
    c = device(mem, layout).pop()
    assert c.readable == [(DATA, 4), (DATA + 10, 5)]
    assert c.writable == [(DATA + 20, 6), (DATA + 30, 7)]
    assert (c.readable_len, c.writable_len) == (9, 13)


def test_indirect_table_may_exceed_queue_size(ring):
    mem, layout, raw = ring
    n = 3 * Q
    for i in range(n):
        raw.desc(i, DATA + i, 1, WRITE | (NEXT if i < n - 1 else 0), i + 1, table=TABLE)
    raw.desc(0, TABLE, 16 * n, IND)
    raw.publish(0)
    c = device(mem, layout).pop()
    assert c.writable_len == n


def test_largest_indirect_table_is_accepted(raw_ring):
    mem = GuestMemory(VIRTQ_MAX_INDIRECT * 16 + 4096)
    layout = VirtqLayout.at(0, Q)
    raw = raw_ring(mem, layout)
    table = 4096
    # every entry zero-length readable with NEXT, the last one without
    entries = np.zeros((VIRTQ_MAX_INDIRECT, 16), dtype=np.uint8)
    nxt = np.arange(1, VIRTQ_MAX_INDIRECT + 1, dtype=np.uint16)
    entries[:, 12] = NEXT
    entries[:, 14:16] = nxt.view(np.uint8).reshape(-1, 2)
    entries[-1, 12:16] = 0
    mem.write(table, entries)
    raw.desc(0, table, VIRTQ_MAX_INDIRECT * 16, IND)
    raw.publish(0)
    c = device(mem, layout).pop()
    assert (c.readable, c.writable) == ([], [])


# ---------------------------------------------------------------- one test per clause
def expect(mem, layout, clause, *, indirect=True, head=...):
    with pytest.raises(VirtqError) as info:
        device(mem, layout, indirect).pop()
    assert info.value.clause == clause, info.value
    assert info.value.message and str(info.value).startswith(clause)
    if head is not ...:
        assert info.value.head == head
    return info.value


def test_vq_avail_jump(ring):
    mem, layout, raw = ring
    raw.desc(0, DATA, 1)
    raw.set_avail_idx(Q + 1)
    err = expect(mem, layout, "VQ-AVAIL-JUMP", head=None)
    assert "queue size" in err.message


def test_vq_avail_jump_is_not_consumed(ring):
    mem, layout, raw = ring
    raw.set_avail_idx(0xFFFF)  # i.e. -1: moved backwards
    dev = device(mem, layout)
    for _ in range(2):
        with pytest.raises(VirtqError, match="VQ-AVAIL-JUMP"):
            dev.pop()
    assert dev.next_avail == 0


def test_vq_head_range(ring):
    mem, layout, raw = ring
    raw.publish(Q)
    expect(mem, layout, "VQ-HEAD-RANGE", head=None)


def test_vq_next_range_direct(ring):
    mem, layout, raw = ring
    raw.desc(0, DATA, 1, NEXT, Q)
    raw.publish(0)
    expect(mem, layout, "VQ-NEXT-RANGE", head=0)


def test_vq_next_range_indirect(ring):
    mem, layout, raw = ring
    raw.desc(0, DATA, 1, NEXT, 2, table=TABLE)  # table has 2 entries: next 2 is outside
    raw.desc(4, TABLE, 32, IND)
    raw.publish(4)
    expect(mem, layout, "VQ-NEXT-RANGE", head=4)


def test_vq_loop_direct(ring):
    mem, layout, raw = ring
    raw.desc(1, DATA, 1, NEXT, 2)
    raw.desc(2, DATA, 1, NEXT, 1)
    raw.publish(1)
    expect(mem, layout, "VQ-LOOP", head=1)


def test_vq_loop_direct_self(ring):
    mem, layout, raw = ring
    raw.desc(5, DATA, 0, NEXT, 5)
    raw.publish(5)
    expect(mem, layout, "VQ-LOOP", head=5)


def test_vq_loop_indirect(ring):
    mem, layout, raw = ring
    for i in range(4):
        raw.desc(i, DATA, 1, NEXT, (i + 1) % 4, table=TABLE)
    raw.desc(0, TABLE, 4 * 16, IND)
    raw.publish(0)
    expect(mem, layout, "VQ-LOOP", head=0)


def test_vq_indirect_not_negotiated(ring):
    # [DEV-FEAT-3] indirect descriptors without the negotiated feature are invalid
    mem, layout, raw = ring
    raw.desc(0, DATA, 1, 0, 0, table=TABLE)
    raw.desc(0, TABLE, 16, IND)
    raw.publish(0)
    expect(mem, layout, "VQ-INDIRECT-NOT-NEGOTIATED", indirect=False, head=0)
    # the same bytes are fine once negotiated
    raw.publish(0)
    assert device(mem, layout).pop().readable == [(DATA, 1)]


def test_vq_indirect_next(ring):
    mem, layout, raw = ring
    raw.desc(0, DATA, 1, 0, 0, table=TABLE)
    raw.desc(0, TABLE, 16, IND | NEXT, 1)
    raw.desc(1, DATA, 1)
    raw.publish(0)
    expect(mem, layout, "VQ-INDIRECT-NEXT", head=0)


def test_vq_indirect_nested(ring):
    mem, layout, raw = ring
    raw.desc(0, DATA, 1, NEXT, 1, table=TABLE)
    raw.desc(1, TABLE + 0x100, 16, IND, 0, table=TABLE)  # §2.7.5.3.1: no nesting
    raw.desc(0, DATA, 1, 0, 0, table=TABLE + 0x100)
    raw.desc(0, TABLE, 32, IND)
    raw.publish(0)
    expect(mem, layout, "VQ-INDIRECT-NESTED", head=0)


@pytest.mark.parametrize("length", [0, 8, 17, 16 * VIRTQ_MAX_INDIRECT + 16])
def test_vq_indirect_len(raw_ring, length):
    mem = GuestMemory(VIRTQ_MAX_INDIRECT * 16 + 8192)
    layout = VirtqLayout.at(0, Q)
    raw = raw_ring(mem, layout)
    raw.desc(0, 4096, length, IND)
    raw.publish(0)
    expect(mem, layout, "VQ-INDIRECT-LEN", head=0)


@pytest.mark.parametrize("where", ["first", "across-indirect", "zero-length"])
def test_vq_write_order(ring, where):
    mem, layout, raw = ring
    if where == "first":
        raw.desc(0, DATA, 4, WRITE | NEXT, 1)
        raw.desc(1, DATA, 4, 0)
    elif where == "across-indirect":
        raw.desc(0, DATA, 4, WRITE | NEXT, 1)
        raw.desc(1, TABLE, 16, IND)
        raw.desc(0, DATA, 4, 0, 0, table=TABLE)
    else:
        raw.desc(0, DATA, 0, WRITE | NEXT, 1)
        raw.desc(1, DATA, 0, 0)
    raw.publish(0)
    expect(mem, layout, "VQ-WRITE-ORDER", head=0)


@pytest.mark.parametrize("addr,length,flags", [
    (MEM - 4, 5, 0),                      # one byte past the end
    (MEM, 1, WRITE),                      # starts at the end
    (2**64 - 1, 2, 0),                    # addr + len overflows 64 bits
    (2**64 - 16, 16, IND),                # table overflows
    (MEM - 16, 32, IND),                  # table past the end
])
def test_vq_addr_range(ring, addr, length, flags):
    # [MEM-GPA-2] the device checks addr + len <= mem_size before using a range
    mem, layout, raw = ring
    raw.desc(0, addr, length, flags)
    raw.publish(0)
    expect(mem, layout, "VQ-ADDR-RANGE", head=0)


def test_vq_addr_range_inside_table(ring):
    # [MEM-GPA-2] ... inside an indirect table too
    mem, layout, raw = ring
    raw.desc(0, DATA, 4, NEXT, 1, table=TABLE)
    raw.desc(1, MEM - 1, 2, WRITE, 0, table=TABLE)
    raw.desc(0, TABLE, 32, IND)
    raw.publish(0)
    expect(mem, layout, "VQ-ADDR-RANGE", head=0)


def test_vq_chain_len(raw_ring):
    # 4096 table entries of 1 MiB each, all over the same memory: exactly 2**32 bytes.
    n, each = 4096, 1 << 20
    mem = GuestMemory(each + n * 16 + 4096)
    layout = VirtqLayout.at(0, Q)
    raw = raw_ring(mem, layout)
    table = each
    entries = np.zeros(n, dtype=np.dtype([("addr", "<u8"), ("len", "<u4"), ("flags", "<u2"),
                                          ("next", "<u2")]))
    entries["addr"] = 0
    entries["len"] = each
    entries["flags"] = NEXT
    entries["next"] = np.arange(1, n + 1)
    entries["flags"][-1] = 0
    mem.write(table, entries.view(np.uint8))
    raw.desc(0, table, n * 16, IND)
    raw.publish(0)
    expect(mem, layout, "VQ-CHAIN-LEN", head=0)
    # one byte less is a valid (if large) chain
    entries["len"][-1] = each - 1
    mem.write(table, entries.view(np.uint8))
    raw.publish(0)
    c = DeviceQueue(mem, layout, indirect=True, start_idx=1).pop()  # the second entry
    assert c.readable_len == 2**32 - 1


def test_chain_error_leaves_the_queue_usable(ring):
    mem, layout, raw = ring
    raw.desc(0, DATA, 1, NEXT, Q)  # bad
    raw.desc(1, DATA, 2, 0)  # good
    raw.publish(0)
    raw.publish(1)
    dev = device(mem, layout)
    with pytest.raises(VirtqError) as info:
        dev.pop()
    dev.add_used(info.value.head, 0)  # fail just that request
    assert dev.pop().readable == [(DATA, 2)]
    assert dev.pop() is None


def test_walk_chain_directly():
    mem = GuestMemory(MEM)
    struct.pack_into(VIRTQ_DESC_FORMAT, mem.mv, 16 * 2, DATA, 9, WRITE, 0)
    c = walk_chain(mem, 0, Q, 2, indirect=False)
    assert c.writable == [(DATA, 9)] and c.head == 2
    with pytest.raises(VirtqError, match="VQ-HEAD-RANGE"):
        walk_chain(mem, 0, Q, Q, indirect=False)


# ---------------------------------------------------------------- fuzz
FUZZ_MEM = 4096
def _mostly(good, wild):
    """``good`` nine times in ten, ``wild`` otherwise."""
    return st.integers(0, 9).flatmap(lambda k: wild if k == 0 else good)


_desc = st.tuples(
    _mostly(st.integers(0, FUZZ_MEM - 64),
            st.one_of(st.integers(0, FUZZ_MEM + 64), st.integers(0, 2**64 - 1))),
    _mostly(st.one_of(st.integers(0, 64), st.sampled_from([0, 16, 32, 48])),
            st.one_of(st.sampled_from([2**32 - 1, 2**31]), st.integers(0, 2**32 - 1))),
    _mostly(st.sampled_from([0, NEXT, WRITE, NEXT | WRITE, NEXT, NEXT | WRITE, IND]),
            st.one_of(st.sampled_from([IND | WRITE, IND | NEXT]), st.integers(0, 0xFFFF))),
    _mostly(st.integers(0, 4), st.one_of(st.integers(0, 20), st.integers(0, 0xFFFF))),
)


@st.composite
def garbage_memory(draw):
    """4 KiB of guest memory: descriptor-shaped records, or noise, tiled to fill it."""
    if draw(st.booleans()):
        descs = draw(st.lists(_desc, min_size=1, max_size=48))
        tile = b"".join(struct.pack(VIRTQ_DESC_FORMAT, *d) for d in descs)
    else:
        tile = draw(st.binary(min_size=1, max_size=1024))
    return (tile * (FUZZ_MEM // len(tile) + 1))[:FUZZ_MEM]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(garbage_memory(), st.sampled_from([1, 2, 4, 8, 16]), st.booleans(), st.booleans(),
       st.integers(0, 0xFFFF), st.data())
def test_fuzz_pop_raises_only_virtq_error(content, qsize, indirect, event_idx, start, data):
    mem = GuestMemory(bytearray(content))
    layout = VirtqLayout.at(0, qsize)
    # a plausible avail ring most of the time, the noise already there otherwise
    heads = data.draw(st.lists(_mostly(st.integers(0, qsize - 1), st.integers(0, 0xFFFF)),
                               max_size=qsize))
    if heads or data.draw(st.booleans()):
        for i, h in enumerate(heads):
            mem.write_u16(layout.avail + 4 + 2 * ((start + i) % qsize), h)
        mem.write_u16(layout.avail + 2, (start + len(heads)) & 0xFFFF)
    dev = DeviceQueue(mem, layout, event_idx=event_idx, indirect=indirect, start_idx=start)
    for _ in range(qsize + 1):
        try:
            c = dev.pop()
        except VirtqError as e:
            assert e.clause in DEVICE_CLAUSES
            if e.clause == "VQ-AVAIL-JUMP":
                break  # consumes nothing: the queue is broken until reset
            if e.head is not None:
                assert 0 <= e.head < qsize
                dev.add_used(e.head, 0)
            continue
        if c is None:
            break
        assert 0 <= c.head < qsize
        for gpa, n in c.readable + c.writable:
            assert n > 0 and mem.check_range(gpa, n)
        assert c.readable_len == sum(n for _, n in c.readable)
        assert c.writable_len == sum(n for _, n in c.writable)
        assert c.readable_len + c.writable_len < 2**32
        c.read(mem, 0, c.readable_len)
        c.writable_written(c.writable_len)
        dev.add_used(c.head, c.writable_len)
