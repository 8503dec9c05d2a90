"""Split virtqueue: layout, driver/device round trips, index wrap, notification suppression,
driver-side used-ring validation, and a Hypothesis state machine over both memory models."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from pvgpu.spec.wire import (
    VIRTQ_AVAIL_F_NO_INTERRUPT,
    VIRTQ_DESC_F_INDIRECT,
    VIRTQ_MAX_SIZE,
    VIRTQ_USED_F_NO_NOTIFY,
    virtq_used_size,
)
from pvgpu.transport.errors import QueueFull, VirtqError, VirtqLayoutError
from pvgpu.transport.memory import GuestMemory
from pvgpu.transport.virtqueue import DeviceQueue, DriverQueue, VirtqLayout, vring_need_event

DATA = 0x4000  # buffers and indirect tables live above the rings in these tests


# ---------------------------------------------------------------- layout
@pytest.mark.parametrize("base", [0, 1, 15, 16, 0x1001])
@pytest.mark.parametrize("qsize", [1, 2, 8, 256, VIRTQ_MAX_SIZE])
def test_layout_at_aligns_and_packs(base, qsize):
    lay = VirtqLayout.at(base, qsize)
    assert lay.size == qsize
    assert lay.desc % 16 == 0 and base <= lay.desc < base + 16
    assert lay.avail == lay.desc + 16 * qsize
    assert lay.avail % 2 == 0 and lay.used % 4 == 0
    assert 0 <= lay.used - (lay.avail + 6 + 2 * qsize) < 4
    assert lay.end == lay.used + 6 + 8 * qsize == lay.used + virtq_used_size(qsize)
    lay.validate(GuestMemory(lay.end))
    with pytest.raises(VirtqLayoutError, match="outside guest memory"):
        lay.validate(GuestMemory(lay.end - 1))


@pytest.mark.parametrize("qsize", [0, 3, 6, VIRTQ_MAX_SIZE * 2, -4, True, 2.0])
def test_layout_rejects_bad_queue_size(qsize):
    with pytest.raises(VirtqLayoutError, match="power of two"):
        VirtqLayout.at(0, qsize)
    with pytest.raises(VirtqLayoutError):
        VirtqLayout(qsize, 0, 4096, 8192).validate(GuestMemory(1 << 16))


@pytest.mark.parametrize("desc,avail,used,match", [
    (8, 4096, 8192, "descriptor table at 0x8 is not 16-byte"),
    (0, 4097, 8192, "avail ring at 0x1001 is not 2-byte"),
    (0, 4096, 8194, "used ring at 0x2002 is not 4-byte"),
    (-16, 4096, 8192, "descriptor table .* outside"),
    (0, 4096, (1 << 16) - 4, "used ring .* outside"),
    (0, None, 8192, "not an integer"),
])
def test_layout_validate_alignment_and_range(desc, avail, used, match):
    with pytest.raises(VirtqLayoutError, match=match):
        VirtqLayout(8, desc, avail, used).validate(GuestMemory(1 << 16))


def test_queues_validate_layout():
    bad = VirtqLayout(8, 0, 4097, 8192)
    for cls in (DriverQueue, DeviceQueue):
        with pytest.raises(VirtqLayoutError):
            cls(GuestMemory(1 << 16), bad)
        with pytest.raises(ValueError):
            cls(GuestMemory(1 << 16), VirtqLayout.at(0, 8), start_idx=1 << 16)


# ---------------------------------------------------------------- vring_need_event
@pytest.mark.parametrize("event,new,old,expected", [
    (0, 1, 0, True),          # crossed exactly the event
    (5, 5, 4, False),         # event not reached yet (needs idx to move past it)
    (5, 6, 5, True),
    (5, 10, 0, True),         # batch over the event
    (5, 3, 0, False),
    (5, 7, 6, False),         # already past before this batch
    (0xFFFF, 0, 0xFFFF, True),     # wrap: crossing 65535 -> 0
    (0xFFFE, 2, 0xFFF0, True),     # batch across the wrap containing the event
    (3, 2, 0xFFF0, False),         # batch across the wrap, event still ahead
    (0xFFF0, 2, 0xFFFE, False),    # event far behind
    (7, 7, 7, False),         # nothing moved
])
def test_vring_need_event(event, new, old, expected):
    assert vring_need_event(event, new, old) is expected


def test_vring_need_event_matches_definition_everywhere():
    # [VQ-NOTIFY-2] need_event as the spec defines it
    rng = np.random.default_rng(1)
    for _ in range(2000):
        old = int(rng.integers(0, 1 << 16))
        moved = int(rng.integers(0, 64))
        new = (old + moved) & 0xFFFF
        event = (old + int(rng.integers(-8, 72))) & 0xFFFF
        crossed = any((old + k) & 0xFFFF == event for k in range(moved))
        assert vring_need_event(event, new, old) is crossed


# ---------------------------------------------------------------- round trips
def make_pair(link, qsize=8, base=0, **kw):
    lay = VirtqLayout.at(base, qsize)
    drv = DriverQueue(link.guest, lay, **kw)
    dev = DeviceQueue(link.host, lay, **kw)
    return drv, dev


def round_trip(link, drv, dev, readable_data, writable_lens, *, table=None, reply=b""):
    """Guest writes request buffers and adds a chain; the device echoes; the guest reaps."""
    g = link.guest
    readable, writable, gpa = [], [], DATA
    for data in readable_data:
        g.write(gpa, data)
        readable.append((gpa, len(data)))
        gpa += len(data) + 3
    for n in writable_lens:
        writable.append((gpa, n))
        gpa += n + 5
    head = drv.add_chain(readable, writable, indirect_table=table)
    link.kick()
    chain = dev.pop()
    assert chain.head == head
    assert chain.readable == [s for s in readable if s[1]]
    assert chain.writable == [s for s in writable if s[1]]
    assert chain.read(link.host, 0, chain.readable_len) == b"".join(readable_data)
    assert chain.write(link.host, 0, reply) == len(reply)
    dev.add_used(chain.head, len(reply))
    dev.should_notify()
    link.call()
    assert drv.pop_used() == [(head, len(reply))]
    got = b"".join(g.read(a, n) for a, n in writable)[:len(reply)]
    assert got == reply
    link.kick()  # used_event (EVENT_IDX) rides on the next kick
    link.assert_in_step()
    return head


def test_direct_round_trip(link):
    drv, dev = make_pair(link)
    round_trip(link, drv, dev, [b"hello", b"", b"world!"], [4, 0, 9], reply=b"0123456789ab")
    assert drv.num_free == 8 and drv.in_flight == 0
    assert dev.pop() is None


def test_indirect_round_trip(link):
    drv, dev = make_pair(link, indirect=True)
    head = round_trip(link, drv, dev, [b"abc", b"defg"], [3, 3, 3], table=DATA - 0x200,
                      reply=b"xyzuvw!")
    d = link.guest.read_u64(0 + 16 * head), link.guest.read_u32(16 * head + 8)
    assert d == (DATA - 0x200, 5 * 16)
    assert link.guest.read_u16(16 * head + 12) == VIRTQ_DESC_F_INDIRECT
    assert drv.num_free == 8


def test_readable_only_and_writable_only_chains(link):
    drv, dev = make_pair(link, indirect=True)
    round_trip(link, drv, dev, [b"only readable"], [])
    round_trip(link, drv, dev, [], [16], reply=b"only writable")
    round_trip(link, drv, dev, [], [16], table=DATA - 0x100, reply=b"w")


def test_many_chains_in_flight_completed_out_of_order(link):
    # [VQ-DESC-5] descriptors of chains in flight are not reused (QueueFull) until returned
    drv, dev = make_pair(link, qsize=4)
    heads = [drv.add_chain([(DATA + 64 * i, 8)], [(DATA + 1024 + 64 * i, 8)]) for i in range(2)]
    assert drv.num_free == 0 and drv.in_flight == 2
    with pytest.raises(QueueFull):
        drv.add_chain([(DATA, 1)], [])
    link.kick()
    chains = [dev.pop(), dev.pop()]
    assert [c.head for c in chains] == heads and dev.pop() is None
    dev.add_used(chains[1].head, 2)
    dev.add_used(chains[0].head, 0)
    link.call()
    assert drv.pop_used() == [(heads[1], 2), (heads[0], 0)]
    assert drv.num_free == 4 and drv.in_flight == 0
    link.assert_in_step()


def test_add_used_batch_publishes_once(link):
    drv, dev = make_pair(link, qsize=4)
    heads = [drv.add_chain([], [(DATA + 64 * i, 8)]) for i in range(3)]
    link.kick()
    chains = [dev.pop() for _ in range(3)]
    dev.add_used_batch([(c.head, 8) for c in chains])
    assert link.host.read_u16(VirtqLayout.at(0, 4).used + 2) == 3
    link.call()
    assert drv.pop_used() == [(h, 8) for h in heads]
    dev.add_used_batch([])
    assert dev.next_used == 3


class _CountingMemory(GuestMemory):
    """Shared-style memory (no dirty tracking) that counts mark_dirty calls."""

    marks = 0

    def mark_dirty(self, gpa, n):
        self.marks += 1


@pytest.mark.parametrize("event_idx", [False, True])
def test_device_marks_ring_writes_only_in_memory_that_tracks_them(event_idx):
    """In the shared model nothing reads dirty ranges: pop and add_used skip marking them."""
    mem = _CountingMemory(1 << 16)
    lay = VirtqLayout.at(0, 4)
    drv = DriverQueue(GuestMemory(mem.buf), lay, event_idx=event_idx)
    dev = DeviceQueue(mem, lay, event_idx=event_idx)
    drv.add_chain([], [(DATA, 8)])
    chain = dev.pop()
    dev.add_used(chain.head, 8)
    assert mem.marks == 0
    assert drv.pop_used() == [(chain.head, 8)]


def test_driver_rejects_bad_chains():
    # [MEM-GPA-1] the driver refuses buffers outside guest memory
    mem = GuestMemory(1 << 16)
    drv = DriverQueue(mem, VirtqLayout.at(0, 4))
    with pytest.raises(ValueError, match="at least one"):
        drv.add_chain([], [])
    with pytest.raises(ValueError, match="indirect"):
        drv.add_chain([(DATA, 1)], [], indirect_table=DATA + 64)
    with pytest.raises(ValueError, match="queue size"):
        drv.add_chain([(DATA, 1)] * 5, [])
    with pytest.raises(ValueError, match="outside guest memory"):
        drv.add_chain([(DATA, 1)], [((1 << 16) - 1, 2)])
    with pytest.raises(ValueError, match="outside guest memory"):
        drv.add_chain([(-1, 1)], [])
    assert drv.num_free == 4 and drv.in_flight == 0 and drv.avail_idx == 0
    ind = DriverQueue(mem, VirtqLayout.at(0, 4), indirect=True)
    with pytest.raises(ValueError, match="indirect table"):
        ind.add_chain([(DATA, 1)], [], indirect_table=(1 << 16) - 8)
    assert ind.num_free == 4
    ind.add_chain([(DATA, 1)], [], indirect_table=DATA + 64)
    ind.add_chain([(DATA, 1)], [], indirect_table=DATA + 64)
    ind.add_chain([(DATA, 1)], [], indirect_table=DATA + 64)
    ind.add_chain([(DATA, 1)], [], indirect_table=DATA + 64)
    with pytest.raises(QueueFull):
        ind.add_chain([(DATA, 1)], [], indirect_table=DATA + 64)


def test_driver_init_zeroes_rings_and_sets_indices():
    # [VQ-LAYOUT-3] the driver zeroes the avail and used rings before set_vring
    mem = GuestMemory(np.full(1 << 14, 0xAA, dtype=np.uint8))
    lay = VirtqLayout.at(16, 8)
    DriverQueue(mem, lay, start_idx=0x1234)
    fields = (lay.avail + 2, lay.used + 2, lay.avail + 4 + 16, lay.used + 4 + 64)
    for off in fields:
        assert mem.read_u16(off) == 0x1234
    ring = mem.buf.copy()
    for off in fields:
        ring[off:off + 2] = 0
    for start, n in ((lay.desc, 16 * 8), (lay.avail, 6 + 2 * 8), (lay.used, 6 + 8 * 8)):
        assert not ring[start:start + n].any()
    # nothing outside the three parts is touched (not even the alignment padding)
    assert ring[lay.desc - 1] == 0xAA and ring[lay.end] == 0xAA
    assert (ring[lay.avail + 22:lay.used] == 0xAA).all() and lay.used > lay.avail + 22


# ---------------------------------------------------------------- index wrap at 2**16
@pytest.mark.parametrize("event_idx", [False, True])
@pytest.mark.parametrize("indirect", [False, True])
def test_indices_wrap_at_65536(link, event_idx, indirect):
    # [VQ-LAYOUT-2] indices wrap 65535 -> 0 on both sides, slots are i mod Q
    q = 4
    drv, dev = make_pair(link, qsize=q, event_idx=event_idx, indirect=indirect,
                         start_idx=65533)
    seen = []
    for i in range(12):
        table = DATA - 0x400 if indirect else None
        head = round_trip(link, drv, dev, [bytes([i]) * 3], [4], table=table,
                          reply=bytes([i + 100]) * (i % 5))
        seen.append(head)
    assert drv.avail_idx == drv.last_used_idx == dev.next_avail == dev.next_used == 9
    lay = VirtqLayout.at(0, q)
    assert link.guest.read_u16(lay.avail + 2) == 9 and link.guest.read_u16(lay.used + 2) == 9
    assert drv.num_free == q


def test_batches_across_wrap(link):
    # [VQ-AVAIL-2] the device takes the heads from its next avail index to avail.idx, in ring order
    drv, dev = make_pair(link, qsize=8, start_idx=65531)
    for rnd in range(5):
        heads = [drv.add_chain([(DATA + 32 * i, 4)], [(DATA + 1024 + 32 * i, 4)])
                 for i in range(3)]
        link.kick()
        chains = []
        while (c := dev.pop()) is not None:
            chains.append(c)
        assert [c.head for c in chains] == heads
        for c in reversed(chains):
            dev.add_used(c.head, 4)
        link.call()
        assert drv.pop_used() == [(h, 4) for h in reversed(heads)]
    assert dev.next_avail == (65531 + 15) & 0xFFFF == 10


# ---------------------------------------------------------------- notifications
def test_kick_and_notify_without_event_idx(link):
    # [VQ-NOTIFY-1] no notification while NO_INTERRUPT is set; flags 0 or 1
    drv, dev = make_pair(link)
    lay = drv.layout
    assert drv.should_kick() is False  # nothing added
    drv.add_chain([(DATA, 1)], [])
    drv.add_chain([(DATA, 1)], [])
    assert drv.should_kick() is True
    assert drv.should_kick() is False  # already decided for these
    dev.set_no_notify(True)
    assert link.host.read_u16(lay.used) == VIRTQ_USED_F_NO_NOTIFY
    link.call()
    drv.add_chain([(DATA, 1)], [])
    assert drv.should_kick() is False
    dev.set_no_notify(False)
    link.call()
    drv.add_chain([(DATA, 1)], [])
    assert drv.should_kick() is True
    link.kick()
    assert dev.has_available()
    chains = [dev.pop() for _ in range(4)]
    assert not dev.has_available()
    assert dev.should_notify() is False  # nothing used yet
    dev.add_used(chains[0].head, 0)
    assert dev.should_notify() is True
    drv.disable_interrupts()
    assert link.guest.read_u16(lay.avail) == VIRTQ_AVAIL_F_NO_INTERRUPT
    link.kick()
    dev.add_used(chains[1].head, 0)
    assert dev.should_notify() is False
    link.call()
    assert drv.enable_interrupts() is False  # two used entries pending
    assert link.guest.read_u16(lay.avail) == 0
    assert len(drv.pop_used()) == 2
    assert drv.enable_interrupts() is True
    link.kick()
    dev.add_used(chains[2].head, 0)
    assert dev.should_notify() is True


def test_vq_notify_3_avail_event_stays_current_under_event_idx(link):
    drv, dev = make_pair(link, event_idx=True, start_idx=65534)
    lay = drv.layout
    avail_event = lay.used + 4 + 8 * 8
    drv.add_chain([(DATA, 1)], [])
    assert drv.should_kick() is True  # avail_event == 65534 initially: first add crosses it
    drv.add_chain([(DATA, 1)], [])
    assert drv.should_kick() is False  # device has not popped: no new kick wanted
    link.kick()
    dev.pop()
    assert link.host.read_u16(avail_event) == 65535  # device asks for a kick past 65534
    link.call()
    drv.add_chain([(DATA, 1)], [])  # idx 0: the device is still behind (65535 pending)
    assert drv.should_kick() is False
    link.kick()
    dev.pop()
    dev.pop()
    assert dev.pop() is None and link.host.read_u16(avail_event) == 1
    link.call()
    drv.add_chain([(DATA, 1)], [])  # 1 -> 2 crosses avail_event 1 (across the wrap earlier)
    assert drv.should_kick() is True
    # device suppression with EVENT_IDX: flags stay 0, avail_event parked far away
    link.kick()
    dev.set_no_notify(True)
    assert link.host.read_u16(lay.used) == 0
    assert link.host.read_u16(avail_event) == 1 + 0x8000  # half the index space ahead
    dev.pop()
    assert link.host.read_u16(avail_event) == 1 + 0x8000  # not advanced while suppressed
    link.call()
    drv.add_chain([(DATA, 1)], [])
    assert drv.should_kick() is False
    dev.set_no_notify(False)
    assert link.host.read_u16(avail_event) == dev.next_avail == 2
    link.kick()
    assert dev.has_available()
    assert dev.pop() is not None and dev.pop() is None
    assert link.host.read_u16(avail_event) == 3  # caught up: kick at the next entry
    link.call()
    drv.add_chain([(DATA, 1)], [])  # 3 -> 4 crosses 3
    assert drv.should_kick() is True
    drv.add_chain([(DATA, 1)], [])  # 4 -> 5: the device has not popped 3 yet
    assert drv.should_kick() is False


def test_notify_with_event_idx(link):
    # [VQ-NOTIFY-2] need_event decides both directions under EVENT_IDX
    drv, dev = make_pair(link, event_idx=True, start_idx=65535)
    lay = drv.layout
    used_event = lay.avail + 4 + 2 * 8
    for _ in range(4):
        drv.add_chain([], [(DATA, 4)])
    link.kick()
    chains = [dev.pop() for _ in range(4)]
    dev.add_used(chains[0].head, 1)
    assert dev.should_notify() is True  # used_event == 65535, crossed
    dev.add_used(chains[1].head, 1)
    assert dev.should_notify() is False  # driver has not consumed: no second interrupt
    link.call()
    assert len(drv.pop_used()) == 2
    assert link.guest.read_u16(used_event) == 1  # pop_used re-arms at the next index
    link.kick()
    dev.add_used(chains[2].head, 1)
    assert dev.should_notify() is True
    link.call()
    drv.pop_used()
    drv.disable_interrupts()
    assert link.guest.read_u16(lay.avail) == 0  # flags stay 0 with EVENT_IDX
    link.kick()
    dev.add_used(chains[3].head, 1)
    assert dev.should_notify() is False
    link.call()
    assert drv.enable_interrupts() is False  # one pending
    assert drv.pop_used() == [(chains[3].head, 1)]
    assert drv.enable_interrupts() is True
    assert dev.should_notify() is False  # nothing new


# ---------------------------------------------------------------- driver-side validation
def _device_writes_used(mem, lay, idx, head, length):
    slot = lay.used + 4 + 8 * (idx % lay.size)
    mem.write_u32(slot, head)
    mem.write_u32(slot + 4, length)
    mem.write_u16(lay.used + 2, (idx + 1) & 0xFFFF)


def test_pop_used_rejects_used_jump():
    mem = GuestMemory(1 << 16)
    drv = DriverQueue(mem, VirtqLayout.at(0, 8))
    drv.add_chain([], [(DATA, 8)])
    mem.write_u16(drv.layout.used + 2, 2)
    with pytest.raises(VirtqError) as info:
        drv.pop_used()
    assert info.value.clause == "VQ-USED-JUMP" and drv.in_flight == 1


@pytest.mark.parametrize("bad_head", [1, 7, 8, 0xFFFFFFFF])
def test_pop_used_rejects_unknown_id(bad_head):
    mem = GuestMemory(1 << 16)
    lay = VirtqLayout.at(0, 8)
    drv = DriverQueue(mem, lay)
    h0 = drv.add_chain([], [(DATA, 8)])
    h1 = drv.add_chain([(DATA, 1)], [(DATA, 8)])  # uses descriptors 1 and 2
    assert (h0, h1) == (0, 1)
    _device_writes_used(mem, lay, 0, h0, 8)
    _device_writes_used(mem, lay, 1, bad_head if bad_head != 1 else 2, 0)  # 2: not a head
    # the good element comes back; the bad one is reported by the next call
    assert drv.pop_used() == [(h0, 8)]
    with pytest.raises(VirtqError) as info:
        drv.pop_used()
    assert info.value.clause == "VQ-USED-ID"
    assert drv.last_used_idx == 1 and drv.in_flight == 1


def test_pop_used_rejects_len_beyond_writable():
    mem = GuestMemory(1 << 16)
    lay = VirtqLayout.at(0, 8)
    drv = DriverQueue(mem, lay)
    h = drv.add_chain([(DATA, 100)], [(DATA, 8)])
    _device_writes_used(mem, lay, 0, h, 9)
    with pytest.raises(VirtqError) as info:
        drv.pop_used()
    assert info.value.clause == "VQ-USED-LEN" and info.value.head == h
    assert drv.in_flight == 1 and drv.num_free == 6


def test_device_add_used_rejects_bad_arguments():
    mem = GuestMemory(1 << 16)
    dev = DeviceQueue(mem, VirtqLayout.at(0, 8))
    for head, length in [(8, 0), (-1, 0), (0, -1), (0, 2**32)]:
        with pytest.raises(ValueError):
            dev.add_used(head, length)
    assert dev.next_used == 0 and mem.read_u16(VirtqLayout.at(0, 8).used + 2) == 0


# ---------------------------------------------------------------- state machine
CHUNK = 96  # each buffer / indirect table gets one chunk of the data area
NCHUNKS = 160


class VirtqPair(RuleBasedStateMachine):
    """Random add_chain / pop / add_used / pop_used sequences; contents and ids preserved."""

    def __init__(self, link_cls):
        super().__init__()
        self.link_cls = link_cls

    @initialize(kind=st.sampled_from(["numpy", "inline"]), qsize=st.sampled_from([1, 2, 4, 8]),
                start=st.sampled_from([0, 1, 65530, 65535]), event_idx=st.booleans(),
                indirect=st.booleans())
    def setup(self, kind, qsize, start, event_idx, indirect):
        self.link = self.link_cls(kind, DATA + CHUNK * NCHUNKS)
        self.drv, self.dev = make_pair(self.link, qsize=qsize, start_idx=start,
                                       event_idx=event_idx, indirect=indirect)
        self.link.kick()  # the driver's ring initialisation travels with the first kick
        self.q = qsize
        self.indirect = indirect
        self.free_chunks = list(range(NCHUNKS))
        self.serial = 0
        self.expected = {}  # head -> (readable bytes, writable segments, chunks)
        self.popped = []  # chains the device holds
        self.completed = {}  # head -> reply bytes the device wrote

    def _chunk(self):
        return DATA + CHUNK * self.free_chunks.pop()

    @rule(rlens=st.lists(st.integers(0, CHUNK), max_size=2),
          wlens=st.lists(st.integers(0, CHUNK), max_size=3), use_indirect=st.booleans())
    def add(self, rlens, wlens, use_indirect):
        if not rlens and not wlens:
            rlens = [1]
        use_indirect = use_indirect and self.indirect
        n = len(rlens) + len(wlens)
        chunks = [self._chunk() for _ in range(n + 1)]
        self.serial += 1
        g = self.link.guest
        readable, writable, payload = [], [], b""
        for gpa, ln in zip(chunks, rlens):
            data = ((np.arange(ln) * 7 + self.serial * 13) % 251).astype(np.uint8).tobytes()
            g.write(gpa, data)
            readable.append((gpa, ln))
            payload += data
        for gpa, ln in zip(chunks[len(rlens):], wlens):
            writable.append((gpa, ln))
        table = chunks[-1] if use_indirect else None
        fits = self.drv.num_free >= (1 if use_indirect else n) and (use_indirect or n <= self.q)
        try:
            head = self.drv.add_chain(readable, writable, indirect_table=table)
        except (QueueFull, ValueError):
            assert not fits
            self.free_chunks.extend((c - DATA) // CHUNK for c in chunks)
            self.link.kick()  # the request bytes were written all the same
            return
        assert fits
        assert head not in self.expected
        self.expected[head] = (payload, writable, chunks)
        self.drv.should_kick()
        self.link.kick()

    @rule(k=st.integers(1, 4))
    def device_pop(self, k):
        for _ in range(k):
            c = self.dev.pop()
            if c is None:
                break
            payload, writable, _ = self.expected[c.head]
            assert c.read(self.link.host, 0, c.readable_len) == payload
            assert c.writable == [s for s in writable if s[1]]
            self.popped.append(c)
        self.link.call()

    @precondition(lambda self: self.popped)
    @rule(data=st.data())
    def device_complete(self, data):
        for _ in range(data.draw(st.integers(1, len(self.popped)))):
            self._complete(data)
        self.dev.should_notify()
        self.link.call()

    def _complete(self, data):
        c = self.popped.pop(data.draw(st.integers(0, len(self.popped) - 1)))
        n = data.draw(st.integers(0, c.writable_len))
        reply = bytes((c.head * 31 + self.serial + i) & 0xFF for i in range(n))
        if data.draw(st.booleans()):
            c.write(self.link.host, 0, reply)
        else:  # zero-copy: through views, marking what was written
            pos = 0
            for gpa, ln in c.writable_written(n):
                self.link.host.view(gpa, ln)[:] = np.frombuffer(reply[pos:pos + ln], np.uint8)
                self.link.host.mark_dirty(gpa, ln)
                pos += ln
        self.dev.add_used(c.head, n)
        self.completed[c.head] = reply

    @rule()
    def driver_reap(self):
        for head, length in self.drv.pop_used():
            reply = self.completed.pop(head)
            assert length == len(reply)
            _, writable, chunks = self.expected.pop(head)
            got = b"".join(self.link.guest.read(g, n) for g, n in writable)[:length]
            assert got == reply
            self.free_chunks.extend((c - DATA) // CHUNK for c in chunks)
        self.link.kick()

    @invariant()
    def consistent(self):
        if not hasattr(self, "drv"):
            return
        assert self.drv.in_flight == len(self.expected)
        assert set(self.completed) <= set(self.expected)
        assert 0 <= self.drv.num_free <= self.q
        self.link.assert_in_step()


def test_virtq_pair_state_machine(make_link):
    # [VQ-USED-3] every chain taken comes back exactly once (the state machine's invariant)
    run_state_machine_as_test(
        lambda: VirtqPair(make_link),
        settings=settings(max_examples=200, stateful_step_count=50, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]))


def test_polling_driver_that_pops_first_gets_no_notification(link):
    """Regression: with notifications disabled, a driver that polls pops the new entry
    before the device evaluates need_event; the event index it re-parks at must not be
    the entry just added (with "one behind" every completion sent an unwanted call)."""
    drv, dev = make_pair(link, event_idx=True)
    drv.disable_interrupts()
    for i in range(3 * drv.size):  # across the 2^16 wrap of nothing, but many windows
        link.kick()
        drv.add_chain([(0x8000, 16)], [(0x9000, 16)])
        link.kick()
        chain = dev.pop()
        dev.add_used(chain.head, 4)
        link.call()
        assert drv.pop_used() == [(chain.head, 4)]  # the driver polls first...
        link.kick()
        assert dev.should_notify() is False  # ...so the device must stay quiet
    assert drv.enable_interrupts() is True
    link.kick()
    drv.add_chain([(0x8000, 16)], [(0x9000, 16)])
    link.kick()
    dev.add_used(dev.pop().head, 4)
    assert dev.should_notify() is True  # enabled again: notified
