"""The driver reads its two used rings in the order that keeps a job's event ahead of the
response reporting its error (spec EVTQ-EVENT-1), however the device's writes interleave
with the driver's reads (guest/frontend/driver.py reap)."""

import collections
import struct

from pvgpu.guest.frontend.driver import Request, VirtioGpuDriver
from pvgpu.spec import wire


class Device:
    """Writes one job's fault event, then the response reporting its error, at a moment
    the test chooses: between the driver's read of one used ring and of the other."""

    def __init__(self):
        self.events = []  # used entries of the event queue, written so far
        self.used = []  # used entries of the control queue, written so far
        self.wrote = False

    def write_event_then_response(self):
        if not self.wrote:
            self.wrote = True
            self.events.append((7, 64))
            self.used.append((3, 16))


class UsedRing:
    """A DriverQueue's pop_used over the device's list; `then` runs after the snapshot,
    as a device writing just after the driver read used.idx."""

    def __init__(self, entries, then=lambda: None):
        self.entries, self.then = entries, then

    def pop_used(self):
        got = list(self.entries)
        self.entries.clear()
        self.then()
        return got

    def add_chain(self, readable, writable):
        return 7

    def enable_interrupts(self):
        return True

    def should_kick(self):
        return False


class Session:
    inline = False


def driver_with(device, first_read):
    """A driver whose control queue and event queue read `device`; the device writes
    right after the driver's first read of `first_read` ("control" or "events")."""
    drv = object.__new__(VirtioGpuDriver)
    drv.session = Session()
    drv.index = 0
    write = device.write_event_then_response
    drv.queue = UsedRing(device.used, write if first_read == "control" else lambda: None)
    drv.eventq = UsedRing(device.events, write if first_read == "events" else lambda: None)
    drv._event_bufs = {7: 0x1000}
    drv.events = collections.deque()
    drv.event_handler = None
    drv._free_slots = []
    req = Request(drv, 0, 0, [])
    req.head = 3
    drv._by_head = {3: req}
    drv.mem = EventMemory()
    return drv, req


class EventMemory:
    """Guest memory holding one page-fault event in every event buffer."""

    def read(self, gpa, n):
        hdr = struct.pack(wire.CTRL_HDR_FORMAT, wire.EVTQ_PAGE_FAULT, 0, 0, 1, 0)
        return hdr + bytes(n - len(hdr))


def test_a_response_never_completes_before_the_event_written_ahead_of_it():
    for first in ("control", "events"):  # the device writes after either read
        device = Device()
        drv, req = driver_with(device, first)
        for _ in range(3):
            drv.reap()
            if req.done:
                assert len(drv.events) == 1, f"the response came without its event ({first})"
        assert req.done and len(drv.events) == 1
