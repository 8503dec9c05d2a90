"""The virtio driver against an in-process inline-model device (sans-IO): reset ordering
(spec DEV-RESET-4, DEV-RESET-5) and the driver's used-ring checks (VQ-USED-CHECK-1)."""

import struct

import pytest

from pvgpu.guest.frontend.driver import DeviceNeedsReset, VirtioGpuDriver, command
from pvgpu.spec import wire
from pvgpu.transport.memory import InlineGuestMemory
from pvgpu.transport.virtqueue import DeviceQueue, VirtqLayout

MEM = 4 << 20
OK = struct.pack(wire.CTRL_HDR_FORMAT, wire.RESP_OK_NODATA, 0, 0, 0, 0)


class InlineLoopback:
    """A session whose device lives in this process: a mirror of guest memory kept by kick
    patches, a DeviceQueue on it that answers every chain at once, and the `call`s that
    carry its writes back queued until the driver waits or drains, as on a real channel."""

    inline = True

    def __init__(self):
        self.mem = InlineGuestMemory(MEM)
        self.mirror = InlineGuestMemory(MEM)
        self.calls = []  # patches of calls sent and not yet applied by the driver
        self.layout = None
        self.device_queue = None

    def control(self, op, dev, **fields):
        if op == wire.OP_GET_FEATURES:
            return {"features": wire.DEVICE_FEATURES}
        if op == wire.OP_GET_STATUS:
            return {"status": wire.STATUS_FEATURES_OK}
        if op == wire.OP_GET_CONFIG:
            return {"config": struct.pack(wire.CONFIG_FORMAT, 1 << 30, 2, 1024, 4096, 16, dev, 0,
                                          b"loopback")}
        if op == wire.OP_SET_VRING and fields["queue"] == wire.CONTROLQ:
            self.layout = VirtqLayout(fields["size"], fields["desc"], fields["avail"], fields["used"])
        if op == wire.OP_SET_STATUS:
            if fields["status"] == 0:
                self.device_queue = None
            elif fields["status"] & wire.STATUS_DRIVER_OK:
                self.device_queue = DeviceQueue(self.mirror, self.layout, event_idx=True,
                                                indirect=True)
        return {}

    def kick(self, dev, queue=wire.CONTROLQ):
        for gpa, n in self.mem.take_dirty():
            self.mirror.write(gpa, self.mem.read(gpa, n))
        self.mirror.take_dirty()
        if queue != wire.CONTROLQ or self.device_queue is None:
            return
        while (chain := self.device_queue.pop()) is not None:
            chain.write(self.mirror, 0, OK)
            self.device_queue.add_used(chain.head, len(OK))
        self.calls.append([(gpa, self.mirror.read(gpa, n)) for gpa, n in self.mirror.take_dirty()])

    def drain_notifications(self):
        while self.calls:
            for gpa, data in self.calls.pop(0):
                self.mem.mv[gpa:gpa + len(data)] = data

    def wait_for(self, cond, timeout=None, kind=None):
        while True:
            self.driver.reap()
            if cond():
                return
            assert self.calls, "waiting for a request the device never answers"
            self.drain_notifications()


@pytest.fixture
def loopback():
    s = InlineLoopback()
    s.driver = VirtioGpuDriver(s, 0, {}, base=0)
    s.driver.initialize()
    return s


def test_calls_sent_before_the_reset_reply_land_before_the_rings_are_set_up(loopback):
    # [DEV-RESET-5] calls from before the reset reply are applied before the new rings are written
    drv = loopback.driver
    stale = [drv.submit(command(wire.CMD_NOP)) for _ in range(3)]
    assert loopback.calls and not any(r.done for r in stale)  # answered, not yet seen
    drv.initialize()  # a reset: set_status 0, then the queue is set up anew
    for req in stale:  # DEV-RESET-4
        assert req.done
        with pytest.raises(DeviceNeedsReset):
            req.response()
    assert not loopback.calls  # applied by the reset, before the rings were written
    for _ in range(3):
        assert drv.call(command(wire.CMD_NOP))[0] == wire.RESP_OK_NODATA


def test_a_used_ring_that_fails_the_checks_fails_the_requests_not_the_caller(loopback):
    # [VQ-USED-CHECK-1] nothing completes from the bad element; pending requests fail; reset before reuse
    drv = loopback.driver
    req = drv.submit(command(wire.CMD_NOP))
    loopback.drain_notifications()
    drv.mem.write_u16(drv.queue.layout.used + 2, drv.queue.last_used_idx + 5)  # VQ-USED-JUMP
    assert drv.reap() == 0
    assert req.done and drv.needs_reset
    with pytest.raises(DeviceNeedsReset, match="VQ-USED-JUMP"):
        req.response()
    with pytest.raises(DeviceNeedsReset):
        drv.submit(command(wire.CMD_NOP))
    drv.initialize()
    assert drv.call(command(wire.CMD_NOP))[0] == wire.RESP_OK_NODATA
