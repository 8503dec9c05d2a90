"""The virtio 1.x split virtqueue (virtio §2.7), both sides, sans-IO.

Layout (``VirtqLayout``): three physically contiguous parts in guest memory,

  descriptor table  align 16   Q x {le64 addr, le32 len, le16 flags, le16 next}
  avail ring        align 2    le16 flags, le16 idx, le16 ring[Q], le16 used_event
  used ring         align 4    le16 flags, le16 idx, {le32 id, le32 len} ring[Q], le16 avail_event

The driver owns the descriptor table and the avail ring, the device owns the used ring.
Indices are free-running 16-bit counters; the ring slot of index i is ``i % Q``
(``i & (Q - 1)``, Q a power of two). A side publishes an entry by writing the ring slot
first and the idx second, so the peer never sees an idx that covers an unwritten slot.

``DriverQueue`` is the guest side (rust-vmm's mock.rs, made production quality): it hands
out descriptors from a free list, builds direct or indirect chains, publishes them, and
reclaims them from the used ring. ``DeviceQueue`` is the host side (rust-vmm's queue.rs):
it pops validated ``DescriptorChain``s (transport/chain.py), adds used elements and
decides whether to notify. Neither does any I/O: each method takes its effect on the
guest-memory object it was given and says what to do next (kick? notify?).

Notification suppression (§2.7.7, §2.7.10): without EVENT_IDX the flags words do it
(avail.flags NO_INTERRUPT, used.flags NO_NOTIFY); with EVENT_IDX the flags stay 0 and
``used_event`` / ``avail_event`` name the index whose crossing asks for a notification,
tested with ``vring_need_event``. Spurious notifications are harmless on both sides.

Both sides accept ``start_idx``: the index both counters start from (vhost-user's
SET_VRING_BASE; on the wire, set_vring `base`, spec CTL-VRING-5). It is 0 after a reset;
tests use values near 65535 to cross the wrap.

Inline model: every ring write is followed by ``mem.mark_dirty`` so take_dirty() ships
it to the peer. Memory ordering across processes relies on x86-TSO store order for the
"slot before idx" rule; the store->load ordering EVENT_IDX ideally wants (a full barrier
between publishing an idx and reading the peer's event index) cannot be expressed in
Python, so the process loops must not sleep forever on a missing notification (they
re-poll on a timeout).
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass

from pvgpu.spec.wire import (
    VIRTQ_AVAIL_ALIGN,
    VIRTQ_AVAIL_F_NO_INTERRUPT,
    VIRTQ_DESC_ALIGN,
    VIRTQ_DESC_F_INDIRECT,
    VIRTQ_DESC_F_NEXT,
    VIRTQ_DESC_F_WRITE,
    VIRTQ_DESC_FORMAT,
    VIRTQ_DESC_SIZE,
    VIRTQ_MAX_CHAIN_BYTES,
    VIRTQ_MAX_INDIRECT,
    VIRTQ_MAX_SIZE,
    VIRTQ_USED_ALIGN,
    VIRTQ_USED_ELEM_SIZE,
    VIRTQ_USED_F_NO_NOTIFY,
    virtq_avail_size,
    virtq_desc_table_size,
    virtq_used_size,
)
from pvgpu.transport.chain import DescriptorChain, walk_chain
from pvgpu.transport.errors import (
    VQ_AVAIL_JUMP,
    VQ_USED_ID,
    VQ_USED_JUMP,
    VQ_USED_LEN,
    QueueFull,
    VirtqError,
    VirtqLayoutError,
)
from pvgpu.transport.memory import GuestMemory

__all__ = [
    "VirtqLayout", "DriverQueue", "DeviceQueue", "DescriptorChain", "vring_need_event",
]

# Ring field offsets, derived from the le16 field width and the sizes in pvgpu.spec.wire: each
# ring is le16 flags, le16 idx, ring[Q], le16 event.
_LE16 = struct.Struct("<H")
_USED_ELEM = struct.Struct("<II")  # le32 id, le32 len
_DESC = struct.Struct(VIRTQ_DESC_FORMAT)
_F = _LE16.size
_RING_FLAGS = 0
_RING_IDX = _F
_RING_ENTRIES = 2 * _F
_AVAIL_ENTRY = virtq_avail_size(1) - virtq_avail_size(0)
IDX_MASK = (1 << (8 * _F)) - 1  # indices are free-running le16 counters
PARKED = 0x8000  # event-index offset that suppresses notifications (beyond any window)
assert _USED_ELEM.size == VIRTQ_USED_ELEM_SIZE
assert _AVAIL_ENTRY == _F and virtq_avail_size(0) == 3 * _F and virtq_used_size(0) == 3 * _F

# Ring indices and event fields are read by the other side while they change, so they
# are loaded and stored as whole 16-bit words through a memoryview cast: struct.pack_into
# zero-fills its target before writing (a reader can see a transient 0) and unpack_from
# assembles bytes one at a time (a reader can see a torn value).
assert sys.byteorder == "little", "virtqueue fields are little-endian; this host is not"


def _halfwords(mem) -> memoryview:
    mv = mem.mv
    return mv[:len(mv) & ~1].cast("B").cast("H")


_get_used = _USED_ELEM.unpack_from
_put_used = _USED_ELEM.pack_into
_put_desc = _DESC.pack_into


def vring_need_event(event_idx: int, new_idx: int, old_idx: int) -> bool:
    """virtio's vring_need_event: did moving an index from old to new cross event_idx?

    True iff event_idx lies in [old_idx, new_idx) modulo 2**16.
    """
    return ((new_idx - event_idx - 1) & IDX_MASK) < ((new_idx - old_idx) & IDX_MASK)


def _align_up(x: int, align: int) -> int:
    return (x + align - 1) & ~(align - 1)


def _check_qsize(qsize) -> None:
    if (isinstance(qsize, bool) or not isinstance(qsize, int) or qsize < 1
            or qsize > VIRTQ_MAX_SIZE or qsize & (qsize - 1)):
        raise VirtqLayoutError(
            f"queue size {qsize!r} is not a power of two between 1 and {VIRTQ_MAX_SIZE}")


@dataclass(frozen=True)
class VirtqLayout:
    """Guest-physical addresses of one split virtqueue's three parts (what set_vring carries)."""

    size: int
    desc: int
    avail: int
    used: int

    @classmethod
    def at(cls, base: int, qsize: int) -> "VirtqLayout":
        """Lay the parts out contiguously from ``base`` with the virtio alignments."""
        _check_qsize(qsize)
        desc = _align_up(base, VIRTQ_DESC_ALIGN)
        avail = _align_up(desc + virtq_desc_table_size(qsize), VIRTQ_AVAIL_ALIGN)
        used = _align_up(avail + virtq_avail_size(qsize), VIRTQ_USED_ALIGN)
        return cls(qsize, desc, avail, used)

    @property
    def end(self) -> int:
        """First byte after the used ring (of a layout made by ``at``: its total extent)."""
        return self.used + virtq_used_size(self.size)

    def validate(self, mem) -> None:
        """Raise VirtqLayoutError unless size, alignment and ranges are valid in ``mem``."""
        self.validate_in(mem.size)

    def validate_in(self, mem_size: int) -> None:
        """Like validate(), against a guest memory of ``mem_size`` bytes."""
        _check_qsize(self.size)
        for what, addr, align, nbytes in (
            ("descriptor table", self.desc, VIRTQ_DESC_ALIGN, virtq_desc_table_size(self.size)),
            ("avail ring", self.avail, VIRTQ_AVAIL_ALIGN, virtq_avail_size(self.size)),
            ("used ring", self.used, VIRTQ_USED_ALIGN, virtq_used_size(self.size)),
        ):
            if isinstance(addr, bool) or not isinstance(addr, int):
                raise VirtqLayoutError(f"{what} address {addr!r} is not an integer")
            if addr % align:
                raise VirtqLayoutError(f"{what} at {addr:#x} is not {align}-byte aligned")
            if addr < 0 or addr + nbytes > mem_size:
                raise VirtqLayoutError(
                    f"{what} [{addr:#x}, +{nbytes:#x}) lies outside guest memory "
                    f"of {mem_size:#x} bytes")


class _SplitRing:
    """Geometry both sides share: where each field of the three parts lives."""

    def _init_ring(self, mem, layout: VirtqLayout, event_idx: bool, indirect: bool,
                   start_idx: int) -> int:
        layout.validate(mem)
        if not 0 <= start_idx <= IDX_MASK:
            raise ValueError(f"start_idx {start_idx} is not a 16-bit index")
        q = layout.size
        self.mem = mem
        self._h = _halfwords(mem)
        self.layout = layout
        self.size = q
        self.event_idx = bool(event_idx)
        self.indirect = bool(indirect)
        self._qmask = q - 1
        self._avail_ring = layout.avail + _RING_ENTRIES
        self._avail_idx_addr = layout.avail + _RING_IDX
        self._used_event_addr = layout.avail + virtq_avail_size(q) - _F
        self._used_ring = layout.used + _RING_ENTRIES
        self._used_idx_addr = layout.used + _RING_IDX
        self._avail_event_addr = layout.used + virtq_used_size(q) - _F
        return q


class DriverQueue(_SplitRing):
    """The guest (driver) side of a split virtqueue over ``mem``.

    Creating it initialises the rings: the descriptor table and both rings are zeroed and
    the indices (and event indices) set to ``start_idx``. ``event_idx`` / ``indirect`` are
    the negotiated VIRTIO_F_EVENT_IDX / VIRTIO_F_INDIRECT_DESC.
    """

    def __init__(self, mem, layout: VirtqLayout, *, event_idx: bool = False,
                 indirect: bool = False, start_idx: int = 0):
        q = self._init_ring(mem, layout, event_idx, indirect, start_idx)

        mem.write(layout.desc, bytes(virtq_desc_table_size(q)))
        mem.write(layout.avail, bytes(virtq_avail_size(q)))
        mem.write(layout.used, bytes(virtq_used_size(q)))
        for addr in (self._avail_idx_addr, self._used_idx_addr, self._used_event_addr,
                     self._avail_event_addr):
            mem.write_u16(addr, start_idx)

        self._free = list(range(q - 1, -1, -1))  # a stack: descriptors 0, 1, 2... first
        self._chains: dict = {}  # head -> (descriptor ids, writable bytes)
        self._avail_idx = start_idx  # next avail index to publish
        self._kicked_idx = start_idx  # avail idx at the last should_kick()
        self._last_used = start_idx  # next used index to consume
        self._interrupts = True
        # mem.mark_dirty, or None where it does nothing (shared memory): the hot paths skip it
        self._mark_dirty = None if type(mem).mark_dirty is GuestMemory.mark_dirty \
            else mem.mark_dirty

    # ------------------------------------------------------------------ state
    @property
    def num_free(self) -> int:
        """Free descriptors in the descriptor table."""
        return len(self._free)

    @property
    def in_flight(self) -> int:
        """Chains published and not yet returned through the used ring."""
        return len(self._chains)

    def writable_len(self, head: int) -> int:
        """The device-writable bytes of the chain at ``head``, in flight."""
        return self._chains[head][1]

    @property
    def avail_idx(self) -> int:
        return self._avail_idx

    @property
    def last_used_idx(self) -> int:
        return self._last_used

    # ------------------------------------------------------------------ submission
    def add_chain(self, readable, writable, *, indirect_table: int | None = None) -> int:
        """Publish a chain of device-readable then device-writable (gpa, len) buffers.

        With ``indirect_table`` (the gpa of a caller-owned area of 16 * n bytes; needs
        INDIRECT_DESC) every buffer goes into that table and the chain takes one ring
        descriptor; otherwise one descriptor per buffer is taken from the free list.
        Returns the head descriptor index (the id that comes back in the used ring).
        Raises QueueFull if the free descriptors do not suffice, ValueError on bad input.
        """
        mem = self.mem
        mark_dirty = self._mark_dirty
        segs = list(readable)
        nread = len(segs)
        segs.extend(writable)
        n = len(segs)
        if n == 0:
            raise ValueError("a chain needs at least one buffer")
        total = wlen = 0
        size = mem.size
        for i, (gpa, length) in enumerate(segs):
            if not (0 <= gpa and 0 <= length and gpa <= size - length):  # mem.check_range
                raise ValueError(f"buffer {i} [{gpa:#x}, +{length:#x}) outside guest memory")
            total += length
            if i >= nread:
                wlen += length
        if total >= VIRTQ_MAX_CHAIN_BYTES:
            raise ValueError(f"chain of {total} bytes, not fewer than {VIRTQ_MAX_CHAIN_BYTES}")
        free = self._free
        if indirect_table is not None:
            if not self.indirect:
                raise ValueError("indirect table given but INDIRECT_DESC was not negotiated")
            if n > VIRTQ_MAX_INDIRECT:
                raise ValueError(f"{n} buffers exceed {VIRTQ_MAX_INDIRECT} table entries")
            if not free:
                raise QueueFull("no free descriptor for the indirect chain")
            table_len = n * VIRTQ_DESC_SIZE
            if not mem.check_range(indirect_table, table_len):
                raise ValueError(f"indirect table at {indirect_table:#x} outside guest memory")
            mv = mem.mv
            last = n - 1
            addr = indirect_table
            for i, (gpa, length) in enumerate(segs):  # written in place, then marked once
                flags = VIRTQ_DESC_F_WRITE if i >= nread else 0
                if i < last:
                    _put_desc(mv, addr, gpa, length, flags | VIRTQ_DESC_F_NEXT, i + 1)
                else:
                    _put_desc(mv, addr, gpa, length, flags, 0)
                addr += VIRTQ_DESC_SIZE
            if mark_dirty:
                mark_dirty(indirect_table, table_len)
            head = free.pop()
            addr = self.layout.desc + head * VIRTQ_DESC_SIZE
            _put_desc(mv, addr, indirect_table, table_len, VIRTQ_DESC_F_INDIRECT, 0)
            if mark_dirty:
                mark_dirty(addr, VIRTQ_DESC_SIZE)
            ids: tuple | list = (head,)
        else:
            if n > self.size:
                raise ValueError(f"{n} buffers exceed the queue size {self.size}; "
                                 "use an indirect table")
            if n > len(free):
                raise QueueFull(f"{n} descriptors needed, {len(free)} free")
            ids = free[-n:][::-1]
            del free[-n:]
            mv = mem.mv
            desc = self.layout.desc
            last = n - 1
            for i, (gpa, length) in enumerate(segs):
                flags = VIRTQ_DESC_F_WRITE if i >= nread else 0
                addr = desc + ids[i] * VIRTQ_DESC_SIZE
                if i < last:
                    _put_desc(mv, addr, gpa, length, flags | VIRTQ_DESC_F_NEXT, ids[i + 1])
                else:
                    _put_desc(mv, addr, gpa, length, flags, 0)
                if mark_dirty:
                    mark_dirty(addr, VIRTQ_DESC_SIZE)
            head = ids[0]
        self._publish(head, ids, wlen)
        return head

    def add_indirect(self, table: int, n: int, wlen: int) -> int:
        """Publish a chain through the indirect table of ``n`` descriptors (``wlen``
        device-writable bytes) that an earlier ``add_chain(..., indirect_table=table)``
        wrote and validated, unchanged since: a driver that reuses a request slot's table
        for the same buffers does not write it again. -> the head descriptor index."""
        free = self._free
        if not free:
            raise QueueFull("no free descriptor for the indirect chain")
        head = free.pop()
        addr = self.layout.desc + head * VIRTQ_DESC_SIZE
        _put_desc(self.mem.mv, addr, table, n * VIRTQ_DESC_SIZE, VIRTQ_DESC_F_INDIRECT, 0)
        if self._mark_dirty:
            self._mark_dirty(addr, VIRTQ_DESC_SIZE)
        self._publish(head, (head,), wlen)
        return head

    def _publish(self, head: int, ids, wlen: int) -> None:
        """Make the chain at ``head`` (descriptors ``ids``) available: ring slot first,
        then the index that covers it."""
        slot_addr = self._avail_ring + (self._avail_idx & self._qmask) * _AVAIL_ENTRY
        self._h[(slot_addr) >> 1] = head
        self._avail_idx = (self._avail_idx + 1) & IDX_MASK
        self._h[(self._avail_idx_addr) >> 1] = self._avail_idx
        if self._mark_dirty:
            self._mark_dirty(slot_addr, _AVAIL_ENTRY)
            self._mark_dirty(self._avail_idx_addr, _F)
        self._chains[head] = (ids, wlen)

    def should_kick(self) -> bool:
        """Whether the device wants an available-buffer notification for the chains added
        since the last call (False if none were added)."""
        old, new = self._kicked_idx, self._avail_idx
        if old == new:
            return False
        self._kicked_idx = new
        if self.event_idx:
            return vring_need_event(self._h[(self._avail_event_addr) >> 1], new, old)
        return not self._h[(self.layout.used + _RING_FLAGS) >> 1] & VIRTQ_USED_F_NO_NOTIFY

    # ------------------------------------------------------------------ completion
    def pop_used(self) -> list:
        """Every new used element as (head, len), returning its descriptors to the free list.

        Validates what the device wrote: raises VirtqError (VQ-USED-JUMP, VQ-USED-ID,
        VQ-USED-LEN) and consumes nothing if the first new element is bad; a bad element
        after good ones ends the batch early and is reported by the next call.
        """
        mv = self.mem.mv
        last = self._last_used
        n = (self._h[(self._used_idx_addr) >> 1] - last) & IDX_MASK
        if n == 0:
            return []
        chains = self._chains
        if n > len(chains):
            raise VirtqError(VQ_USED_JUMP, f"used idx moved by {n} with {len(chains)} chains "
                             "in flight")
        out: list = []
        qmask = self._qmask
        ring = self._used_ring
        free = self._free
        for _ in range(n):
            head, length = _get_used(mv, ring + (last & qmask) * VIRTQ_USED_ELEM_SIZE)
            entry = chains.get(head)
            if entry is None:
                if out:
                    break
                raise VirtqError(VQ_USED_ID, f"used id {head} is not the head of a chain "
                                 "in flight")
            if length > entry[1]:
                if out:
                    break
                raise VirtqError(VQ_USED_LEN, f"used len {length} for chain {head} exceeds its "
                                 f"{entry[1]} writable bytes", head)
            del chains[head]
            free.extend(entry[0])
            out.append((head, length))
            last = (last + 1) & IDX_MASK
        self._last_used = last
        if self.event_idx:
            self._write_used_event()
        return out

    def enable_interrupts(self) -> bool:
        """Ask for used-buffer notifications again.

        Returns False if used elements are already pending (call pop_used() before waiting),
        like Linux's virtqueue_enable_cb.
        """
        self._interrupts = True
        if self.event_idx:
            self._write_used_event()
        else:
            self._write_avail_flags(0)
        return self._h[(self._used_idx_addr) >> 1] == self._last_used

    def disable_interrupts(self) -> None:
        """Ask the device not to send used-buffer notifications (a hint; it may anyway)."""
        self._interrupts = False
        if self.event_idx:
            self._write_used_event()
        else:
            self._write_avail_flags(VIRTQ_AVAIL_F_NO_INTERRUPT)

    def _write_used_event(self) -> None:
        # Enabled: notify when the used idx passes the next one we will consume. Disabled:
        # park it half the index space ahead, where no window of in-flight entries (at
        # most the queue size, <= 32768) can reach it. "One behind" is not enough: a
        # polling driver pops an entry before the device evaluates need_event for it,
        # re-parks at exactly that entry, and the device notifies (Linux parks far away
        # too, and updates used_event on pop only while callbacks are enabled).
        value = self._last_used if self._interrupts else (self._last_used + PARKED) & IDX_MASK
        self._h[(self._used_event_addr) >> 1] = value
        if self._mark_dirty:
            self._mark_dirty(self._used_event_addr, _F)

    def _write_avail_flags(self, flags: int) -> None:
        addr = self.layout.avail + _RING_FLAGS
        self._h[(addr) >> 1] = flags
        self.mem.mark_dirty(addr, _F)


class DeviceQueue(_SplitRing):
    """The host (device) side of a split virtqueue over ``mem``.

    ``event_idx`` / ``indirect`` are the negotiated features. It writes nothing on
    creation; the driver initialised the rings.
    """

    def __init__(self, mem, layout: VirtqLayout, *, event_idx: bool = False,
                 indirect: bool = False, start_idx: int = 0):
        self._init_ring(mem, layout, event_idx, indirect, start_idx)
        self._next_avail = start_idx
        self._next_used = start_idx
        self._signalled_used = start_idx  # used idx at the last should_notify()
        self._no_notify = False
        self._track = mem.tracks_dirty  # the inline model: ring writes are marked dirty

    @property
    def next_avail(self) -> int:
        """The next avail index the device will pop (vhost-user GET_VRING_BASE)."""
        return self._next_avail

    @property
    def next_used(self) -> int:
        return self._next_used

    def has_available(self) -> bool:
        """Whether the driver has published entries the device has not popped yet."""
        return self._h[(self._avail_idx_addr) >> 1] != self._next_avail

    def pop(self) -> DescriptorChain | None:
        """The next available chain, validated, or None if the ring is empty.

        Raises VirtqError for a malformed ring or chain. Apart from VQ-AVAIL-JUMP (which
        consumes nothing and repeats on every call) the avail entry is consumed; when
        ``err.head`` is not None the caller may fail just that request with
        ``add_used(err.head, 0)``, or else mark the device DEVICE_NEEDS_RESET.
        """
        mem = self.mem
        nxt = self._next_avail
        pending = (self._h[(self._avail_idx_addr) >> 1] - nxt) & IDX_MASK
        if pending == 0:
            return None
        if pending > self.size:
            raise VirtqError(VQ_AVAIL_JUMP, f"avail idx is {pending} entries ahead of the "
                             f"device's {nxt}, more than the queue size {self.size}")
        head = self._h[(self._avail_ring + (nxt & self._qmask) * _AVAIL_ENTRY) >> 1]
        nxt = self._next_avail = (nxt + 1) & IDX_MASK
        if self.event_idx and not self._no_notify:
            self._h[(self._avail_event_addr) >> 1] = nxt
            if self._track:
                mem.mark_dirty(self._avail_event_addr, _F)
        return walk_chain(mem, self.layout.desc, self.size, head, indirect=self.indirect)

    def add_used(self, head: int, length: int) -> None:
        """Return chain ``head`` with ``length`` bytes written to its writable part."""
        self.add_used_batch(((head, length),))

    def add_used_batch(self, entries) -> None:
        """Return several chains: write all the used elements, then publish the idx once."""
        mem = self.mem
        mv = mem.mv
        q = self.size
        qmask = self._qmask
        ring = self._used_ring
        track = self._track
        idx = self._next_used
        for head, length in entries:
            if not 0 <= head < q:
                raise ValueError(f"used id {head} outside the queue of {q}")
            if not 0 <= length < VIRTQ_MAX_CHAIN_BYTES:
                raise ValueError(f"used len {length} is not a 32-bit length")
            addr = ring + (idx & qmask) * VIRTQ_USED_ELEM_SIZE
            _put_used(mv, addr, head, length)
            if track:
                mem.mark_dirty(addr, VIRTQ_USED_ELEM_SIZE)
            idx = (idx + 1) & IDX_MASK
        if idx != self._next_used:
            self._next_used = idx
            self._h[(self._used_idx_addr) >> 1] = idx
            if track:
                mem.mark_dirty(self._used_idx_addr, _F)

    def should_notify(self) -> bool:
        """Whether the driver wants a used-buffer notification for the elements added since
        the last call (False if none were added)."""
        old, new = self._signalled_used, self._next_used
        if old == new:
            return False
        self._signalled_used = new
        if self.event_idx:
            return vring_need_event(self._h[(self._used_event_addr) >> 1], new, old)
        return not (self._h[(self.layout.avail + _RING_FLAGS) >> 1]
                    & VIRTQ_AVAIL_F_NO_INTERRUPT)

    def set_no_notify(self, no_notify: bool) -> None:
        """Ask the driver not to kick (True) or to kick again (False); a hint.

        Without EVENT_IDX this sets/clears used.flags NO_NOTIFY. With EVENT_IDX (flags stay
        0, §2.7.10) True parks avail_event half the index space away and stops
        updating it; False sets it to the next avail index. After re-enabling, check
        has_available() before waiting: the driver may have added entries meanwhile.
        """
        self._no_notify = bool(no_notify)
        mem = self.mem
        if self.event_idx:
            value = (self._next_avail + PARKED) & IDX_MASK if no_notify else self._next_avail
            self._h[(self._avail_event_addr) >> 1] = value
            mem.mark_dirty(self._avail_event_addr, _F)
        else:
            addr = self.layout.used + _RING_FLAGS
            self._h[(addr) >> 1] = VIRTQ_USED_F_NO_NOTIFY if no_notify else 0
            mem.mark_dirty(addr, _F)
