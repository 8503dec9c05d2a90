"""Descriptor chains of a split virtqueue: walking and validating them (virtio 1.x §2.7.5).

``walk_chain`` follows a chain from its head through the descriptor table and, when it
meets an INDIRECT descriptor, through that indirect table, exactly as rust-vmm's
chain.rs does: a ``ttl`` that starts at the queue size (or at the table's entry count once
inside a table) bounds the walk, so a loop ends as an error instead of a hang; every
address sum is checked against guest memory. The guest is untrusted, so every malformed
case raises ``VirtqError`` with a stable clause ID (listed in transport/errors.py) and
nothing else escapes.

What a valid chain looks like (the device's reading of §2.7.4 and §2.7.5.3):
  - zero or more direct descriptors, optionally followed by one INDIRECT descriptor that
    is the last of the direct chain (no NEXT); its WRITE flag is ignored;
  - an indirect table is len/16 descriptors chained from entry 0 through ``next``, none
    of them INDIRECT; 1 <= entries <= VIRTQ_MAX_INDIRECT;
  - device-readable descriptors come before device-writable ones, across the whole chain;
  - total length < 2**32. Zero-length descriptors are allowed and left out of the
    segment lists (their address is not checked).

The result is a ``DescriptorChain``: the head index plus the readable and writable
segments as guest-physical (gpa, len) lists, with helpers that treat each side as one byte
stream and translate sub-ranges of it into extents for zero-copy DMA.
"""

from __future__ import annotations

import struct

from pvgpu.spec.wire import (
    VIRTQ_DESC_F_INDIRECT,
    VIRTQ_DESC_F_NEXT,
    VIRTQ_DESC_F_WRITE,
    VIRTQ_DESC_FORMAT,
    VIRTQ_DESC_SIZE,
    VIRTQ_MAX_CHAIN_BYTES,
    VIRTQ_MAX_INDIRECT,
)
from pvgpu.transport.errors import (
    VQ_ADDR_RANGE,
    VQ_CHAIN_LEN,
    VQ_HEAD_RANGE,
    VQ_INDIRECT_LEN,
    VQ_INDIRECT_NESTED,
    VQ_INDIRECT_NEXT,
    VQ_INDIRECT_NOT_NEGOTIATED,
    VQ_LOOP,
    VQ_NEXT_RANGE,
    VQ_WRITE_ORDER,
    ChainError,
    VirtqError,
)
from pvgpu.transport.memory import as_byte_view

_unpack_desc = struct.Struct(VIRTQ_DESC_FORMAT).unpack_from


def _extents(segments: list, total: int, offset: int, n: int, side: str) -> list:
    if offset < 0 or n < 0 or offset > total - n:
        raise ChainError(f"{side} range [{offset}, +{n}) beyond the chain's {total} {side} bytes")
    out: list = []
    if n == 0:
        return out
    for gpa, length in segments:
        if offset >= length:
            offset -= length
            continue
        take = length - offset
        if take > n:
            take = n
        out.append((gpa + offset, take))
        n -= take
        if n == 0:
            break
        offset = 0
    return out


class DescriptorChain:
    """One popped request: ``head`` and its device-readable / device-writable segments.

    ``readable`` and ``writable`` are lists of (gpa, len) with len > 0 in chain order;
    ``readable_len`` / ``writable_len`` are their sums. Offsets in the methods below count
    bytes in the readable (or writable) stream, i.e. the segments concatenated.
    """

    __slots__ = ("head", "readable", "writable", "readable_len", "writable_len")

    def __init__(self, head: int, readable: list, writable: list,
                 readable_len: int | None = None, writable_len: int | None = None):
        self.head = head
        self.readable = readable
        self.writable = writable
        self.readable_len = sum(n for _, n in readable) if readable_len is None else readable_len
        self.writable_len = sum(n for _, n in writable) if writable_len is None else writable_len

    def __repr__(self) -> str:
        return (f"DescriptorChain(head={self.head}, readable={self.readable}, "
                f"writable={self.writable})")

    def readable_extents(self, offset: int, n: int) -> list:
        """Guest-physical pieces of readable bytes [offset, offset+n)."""
        return _extents(self.readable, self.readable_len, offset, n, "readable")

    def writable_extents(self, offset: int, n: int) -> list:
        """Guest-physical pieces of writable bytes [offset, offset+n)."""
        return _extents(self.writable, self.writable_len, offset, n, "writable")

    def writable_written(self, n: int) -> list:
        """Extents of the first n writable bytes: what to mark dirty after writing them."""
        return _extents(self.writable, self.writable_len, 0, n, "writable")

    def read(self, mem, offset: int, n: int) -> bytes:
        """n bytes of the readable stream from ``offset``; ChainError if beyond its end."""
        if len(self.readable) == 1 and 0 <= offset and 0 <= n <= self.readable_len - offset:
            return mem.read(self.readable[0][0] + offset, n)  # one segment: no extents
        ext = _extents(self.readable, self.readable_len, offset, n, "readable")
        if len(ext) == 1:
            return mem.read(*ext[0])
        return b"".join([mem.read(gpa, ln) for gpa, ln in ext])

    def write(self, mem, offset: int, data) -> int:
        """Write ``data`` into the writable stream at ``offset``; returns the byte count.

        Raises ChainError (writing nothing) if it does not fit. Goes through mem.write, so
        the inline model marks the bytes dirty.
        """
        src = data if isinstance(data, (bytes, bytearray)) else as_byte_view(data)
        n = len(src)
        if len(self.writable) == 1 and 0 <= offset <= self.writable_len - n:
            mem.write(self.writable[0][0] + offset, src)  # one segment: no extents
            return n
        ext = _extents(self.writable, self.writable_len, offset, n, "writable")
        if len(ext) == 1:
            mem.write(ext[0][0], src)
            return n
        src = memoryview(src)
        pos = 0
        for gpa, ln in ext:
            mem.write(gpa, src[pos:pos + ln])
            pos += ln
        return n


def walk_chain(mem, desc_table: int, qsize: int, head: int, *, indirect: bool) -> DescriptorChain:
    """Walk and validate the chain starting at descriptor ``head``.

    ``desc_table`` is the (validated) guest-physical address of the queue's descriptor
    table; ``indirect`` says whether VIRTIO_F_INDIRECT_DESC was negotiated. Raises
    VirtqError(clause, message, head) on any malformed chain.
    """
    if head >= qsize:
        raise VirtqError(VQ_HEAD_RANGE, f"head {head} >= queue size {qsize}")
    mv = mem.mv
    memsize = mem.size
    readable: list = []
    writable: list = []
    rlen = wlen = 0
    seen_write = False
    table = desc_table
    limit = qsize  # valid `next` values in the current table
    ttl = qsize  # descriptors we may still visit in the current table
    in_table = False
    idx = head
    while True:
        if ttl == 0:
            where = "indirect table" if in_table else "queue"
            raise VirtqError(VQ_LOOP, f"chain longer than the {where} ({limit} descriptors): "
                             "a loop", head)
        ttl -= 1
        addr, length, flags, nxt = _unpack_desc(mv, table + idx * VIRTQ_DESC_SIZE)
        if flags & VIRTQ_DESC_F_INDIRECT:
            # §2.7.5.3.1: the driver MUST NOT set INDIRECT inside a table (no nesting).
            if in_table:
                raise VirtqError(VQ_INDIRECT_NESTED,
                                 f"INDIRECT descriptor {idx} inside an indirect table", head)
            if not indirect:
                raise VirtqError(VQ_INDIRECT_NOT_NEGOTIATED,
                                 f"descriptor {idx} is INDIRECT but INDIRECT_DESC was not "
                                 "negotiated", head)
            if flags & VIRTQ_DESC_F_NEXT:
                raise VirtqError(VQ_INDIRECT_NEXT,
                                 f"descriptor {idx} has both INDIRECT and NEXT", head)
            entries, rem = divmod(length, VIRTQ_DESC_SIZE)
            if length == 0 or rem or entries > VIRTQ_MAX_INDIRECT:
                raise VirtqError(VQ_INDIRECT_LEN,
                                 f"indirect table length {length} is not 1..{VIRTQ_MAX_INDIRECT} "
                                 f"descriptors of {VIRTQ_DESC_SIZE} bytes", head)
            if addr > memsize - length:
                raise VirtqError(VQ_ADDR_RANGE,
                                 f"indirect table [{addr:#x}, +{length:#x}) outside guest memory",
                                 head)
            # The WRITE flag of this descriptor is ignored (§2.7.5.3.2).
            table = addr
            limit = ttl = entries
            in_table = True
            idx = 0
            continue
        if length:
            if addr > memsize - length:
                raise VirtqError(VQ_ADDR_RANGE,
                                 f"buffer [{addr:#x}, +{length:#x}) of descriptor {idx} outside "
                                 "guest memory", head)
            if flags & VIRTQ_DESC_F_WRITE:
                seen_write = True
                writable.append((addr, length))
                wlen += length
            elif seen_write:
                raise VirtqError(VQ_WRITE_ORDER,
                                 f"readable descriptor {idx} after a writable one", head)
            else:
                readable.append((addr, length))
                rlen += length
        elif flags & VIRTQ_DESC_F_WRITE:
            seen_write = True
        elif seen_write:
            raise VirtqError(VQ_WRITE_ORDER, f"readable descriptor {idx} after a writable one",
                             head)
        if not flags & VIRTQ_DESC_F_NEXT:
            break
        if nxt >= limit:
            where = "indirect table entries" if in_table else "queue size"
            raise VirtqError(VQ_NEXT_RANGE, f"descriptor {idx} next {nxt} >= {where} {limit}",
                             head)
        idx = nxt
    if rlen + wlen >= VIRTQ_MAX_CHAIN_BYTES:
        raise VirtqError(VQ_CHAIN_LEN, f"chain carries {rlen + wlen} bytes, not fewer than "
                         f"{VIRTQ_MAX_CHAIN_BYTES}", head)
    return DescriptorChain(head, readable, writable, rlen, wlen)
