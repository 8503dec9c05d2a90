"""The driver's kick policy (guest/frontend/driver.py, spec VQ-NOTIFY-6): chains submitted
with kick=False share one kick per `kick_batch`, and whatever is deferred is kicked before
the session waits, with the next request that is waited for, when the queue runs low, and
at close. Sans-IO: the real FrontendSession and driver over an in-process inline-model
device that answers every chain when kicked, no host process and no clock."""

import math
import struct

import pytest

from pvgpu.guest.frontend import driver as driver_mod
from pvgpu.guest.frontend.driver import VirtioGpuDriver, command
from pvgpu.guest.frontend.session import FrontendSession
from pvgpu.spec import wire
from pvgpu.transport import codec
from pvgpu.transport.channel import ChannelTimeout
from pvgpu.transport.memory import InlineGuestMemory
from pvgpu.transport.virtqueue import DeviceQueue, VirtqLayout

MEM = 4 << 20
OK = struct.pack(wire.CTRL_HDR_FORMAT, wire.RESP_OK_NODATA, 0, 0, 0, 0)


class LoopbackChannel:
    """The channel with the device at its other end, in this process: control requests are
    answered at once; a kick applies its patches to the device's mirror of guest memory and
    the device answers every chain it pops, its writes queued as a `call` that a wait
    receives. Waiting with nothing queued is a test failure, never a block."""

    heartbeat_ms = 0
    proven_silence = 0.0

    def __init__(self):
        self.mirror = InlineGuestMemory(MEM)
        self.layout = None
        self.device_queue = None
        self.sent = []  # ("kick", chains the device popped) / ("bye",) in order
        self.calls = []  # (msg, frames) not yet received

    def request(self, msg, frames=(), timeout=None):
        op = msg["op"]
        reply = {"ok": True}
        if op == wire.OP_GET_FEATURES:
            reply["features"] = wire.DEVICE_FEATURES & ~(1 << wire.PVGPU_F_EVENTQ)
        elif op == wire.OP_GET_STATUS:
            reply["status"] = wire.STATUS_FEATURES_OK
        elif op == wire.OP_GET_CONFIG:
            reply["config"] = struct.pack(wire.CONFIG_FORMAT, 1 << 30, 2, 1024, 4096, 16, 0, 0,
                                          b"loopback")
        elif op == wire.OP_SET_VRING:
            self.layout = VirtqLayout(msg["size"], msg["desc"], msg["avail"], msg["used"])
        elif op == wire.OP_SET_STATUS and msg["status"] & wire.STATUS_DRIVER_OK:
            self.device_queue = DeviceQueue(self.mirror, self.layout, event_idx=True,
                                            indirect=True)
        elif op == wire.OP_BYE:
            self.sent.append(("bye",))
        return reply, []

    def send_encoded(self, parts):
        self.send(*codec.decode(parts))

    def send(self, msg, frames=()):
        assert msg["op"] == wire.OP_KICK and msg["queue"] == wire.CONTROLQ
        self.mirror.apply_patches(msg.get("patches", []), frames)
        popped = 0
        while (chain := self.device_queue.pop()) is not None:
            chain.write(self.mirror, 0, OK)
            self.device_queue.add_used(chain.head, len(OK))
            popped += 1
        self.sent.append(("kick", popped))
        dirty = self.mirror.take_dirty()
        self.calls.append(({"op": wire.OP_CALL, "patches": [[g, i] for i, (g, _n) in enumerate(dirty)]},
                           [self.mirror.read(g, n) for g, n in dirty]))

    def recv_until(self, predicate, timeout=None):
        if not self.calls and timeout == 0:  # only what is there: nothing
            raise ChannelTimeout("nothing queued")
        assert self.calls, "the driver waits for chains the device was never told about"
        return self.calls.pop(0)

    def close(self):
        pass

    @property
    def kicks(self) -> list:
        return [popped for what, *popped in self.sent if what == "kick" for popped in popped]


@pytest.fixture
def session():
    s = FrontendSession.__new__(FrontendSession)  # the real session, over the loopback channel
    s.endpoint, s.memory, s.inline, s.timeout = "loopback", wire.MEMORY_INLINE, True, 5.0
    s.mem, s.devices, s.closed, s.host_lost = InlineGuestMemory(MEM), [], False, False
    s._wait_ewma, s._kicks = 0.0, {}
    s.channel = LoopbackChannel()
    drv = VirtioGpuDriver(s, 0, {}, base=0)
    drv.initialize()
    s.devices.append(drv)
    return s


def nop():
    return command(wire.CMD_NOP)


@pytest.mark.parametrize("n, batch", [(1, 8), (8, 8), (21, 8), (100, 32), (40, 1)])
def test_n_deferred_chains_take_ceil_n_over_batch_kicks(session, n, batch):
    drv, ch = session.devices[0], session.channel
    drv.kick_batch = batch
    reqs = [drv.submit(nop(), kick=False) for _ in range(n)]
    assert ch.kicks == [batch] * (n // batch)  # each kick covers a whole batch
    assert drv.deferred == n % batch
    session.wait_for(lambda: all(r.done for r in reqs))  # the wait kicks the rest first
    assert len(ch.kicks) == math.ceil(n / batch) and sum(ch.kicks) == n
    assert drv.deferred == 0
    assert all(r.response()[0] == wire.RESP_OK_NODATA for r in reqs)


def test_a_request_that_is_waited_for_kicks_the_deferred_chains_with_it(session):
    drv, ch = session.devices[0], session.channel
    deferred = [drv.submit(nop(), kick=False) for _ in range(5)]
    assert ch.kicks == []
    assert drv.call(nop())[0] == wire.RESP_OK_NODATA
    assert ch.kicks == [6]  # one kick for the five and the call
    assert all(r.done for r in deferred)


def test_any_wait_kicks_first(session):
    drv, ch = session.devices[0], session.channel
    req = drv.submit(nop(), kick=False)
    session.wait_for(lambda: req.done)
    assert ch.kicks == [1] and req.response()[0] == wire.RESP_OK_NODATA


def test_a_queue_running_low_kicks_without_being_asked(session):
    drv, ch = session.devices[0], session.channel
    drv.kick_batch = 10 ** 6
    reqs = []
    while not ch.kicks:
        reqs.append(drv.submit(nop(), kick=False))
    assert len(reqs) == driver_mod.QUEUE_SIZE - driver_mod.LOW_WATER + 1
    assert drv.deferred == 0


def test_close_kicks_the_deferred_chains_before_saying_bye(session):
    drv, ch = session.devices[0], session.channel
    for _ in range(3):
        drv.submit(nop(), kick=False)
    session.close()
    assert ch.sent == [("kick", 3), ("bye",)]


def test_a_reset_forgets_deferred_chains(session):
    drv, ch = session.devices[0], session.channel
    drv.submit(nop(), kick=False)
    drv.initialize()
    assert drv.deferred == 0
    session.wait_for(lambda: True)
    assert ch.kicks == []
