"""Shared fixtures for the transport unit tests.

``make_link(kind, size)`` gives a guest memory and a host memory joined like the real
models: "bytearray" and "numpy" are one plain GuestMemory seen by both sides (the shared
model without processes); "inline" is two InlineGuestMemory objects kept in step by
patches, exactly as kick/call carry them. ``RawRing`` writes descriptors and avail
entries byte by byte, as a misbehaving guest would.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from pvgpu.spec.wire import VIRTQ_DESC_FORMAT, VIRTQ_DESC_SIZE, virtq_avail_size
from pvgpu.transport.memory import GuestMemory, InlineGuestMemory

LINK_KINDS = ("bytearray", "numpy", "inline")

_DESC = struct.Struct(VIRTQ_DESC_FORMAT)


def ship(src, dst) -> int:
    """Send src's dirty ranges to dst as (patches, frames); returns the patch count."""
    ranges = src.take_dirty()
    frames = [src.read(gpa, n) for gpa, n in ranges]
    dst.apply_patches([[gpa, i] for i, (gpa, _) in enumerate(ranges)], frames)
    return len(ranges)


class Link:
    def __init__(self, kind: str, size: int):
        self.kind = kind
        if kind == "bytearray":
            self.guest = self.host = GuestMemory(bytearray(size))
        elif kind == "numpy":
            self.guest = self.host = GuestMemory(np.zeros(size, dtype=np.uint8))
        elif kind == "inline":
            self.guest = InlineGuestMemory(size)
            self.host = InlineGuestMemory(size)
        else:
            raise ValueError(kind)

    @property
    def inline(self) -> bool:
        return self.guest is not self.host

    def kick(self) -> None:
        """Guest -> host: what a kick carries in the inline model."""
        if self.inline:
            ship(self.guest, self.host)

    def call(self) -> None:
        """Host -> guest: what a call carries in the inline model."""
        if self.inline:
            ship(self.host, self.guest)

    def assert_in_step(self) -> None:
        if self.inline:
            assert not self.guest._dirty and not self.host._dirty
            assert np.array_equal(self.guest.buf, self.host.buf)


class RawRing:
    """Write a split virtqueue's driver-owned bytes directly (no DriverQueue)."""

    def __init__(self, mem, layout):
        self.mem = mem
        self.layout = layout
        self.idx = 0

    def desc(self, i, addr, length, flags=0, next_=0, table=None):
        base = self.layout.desc if table is None else table
        _DESC.pack_into(self.mem.mv, base + i * VIRTQ_DESC_SIZE, addr, length, flags, next_)

    def publish(self, head):
        q = self.layout.size
        self.mem.write_u16(self.layout.avail + 4 + 2 * (self.idx % q), head)
        self.idx = (self.idx + 1) & 0xFFFF
        self.mem.write_u16(self.layout.avail + 2, self.idx)

    def set_avail_idx(self, idx):
        self.idx = idx & 0xFFFF
        self.mem.write_u16(self.layout.avail + 2, self.idx)

    def used_event_addr(self):
        return self.layout.avail + virtq_avail_size(self.layout.size) - 2


@pytest.fixture(scope="session")
def make_link():
    return Link


@pytest.fixture(params=LINK_KINDS)
def link(request):
    return Link(request.param, 1 << 16)


@pytest.fixture(scope="session")
def raw_ring():
    return RawRing
