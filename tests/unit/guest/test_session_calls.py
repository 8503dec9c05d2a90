"""The driver side of device initialization and of `call`s (spec CTL-STATUS-6,
CTL-CALL-4): the real FrontendSession and VirtioGpuDriver over the in-process loopback
channel of test_kick_policy (sans-IO, no host process)."""

import pytest

from guest.frontend.driver import VirtioGpuDriver
from guest.frontend.session import FrontendSession
from spec import wire
from transport.memory import InlineGuestMemory

from test_kick_policy import MEM, LoopbackChannel, nop


class RefusingChannel(LoopbackChannel):
    """A device that does not keep FEATURES_OK: get_status shows it clear."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def request(self, msg, frames=(), timeout=None):
        self.ops.append((msg["op"], msg.get("status")))
        reply, extra = super().request(msg, frames, timeout)
        if msg["op"] == wire.OP_GET_STATUS:
            reply["status"] = wire.STATUS_ACKNOWLEDGE | wire.STATUS_DRIVER
        return reply, extra


def _session(channel):
    s = FrontendSession.__new__(FrontendSession)
    s.endpoint, s.memory, s.inline, s.timeout = "loopback", wire.MEMORY_INLINE, True, 5.0
    s.mem, s.devices, s.closed, s.host_lost = InlineGuestMemory(MEM), [], False, False
    s._wait_ewma, s._kicks = 0.0, {}
    s.channel = channel
    return s


def test_ctl_status_6_the_driver_rereads_features_ok_and_stops_when_it_is_clear():
    s = _session(RefusingChannel())
    with pytest.raises(RuntimeError, match="refused features"):
        VirtioGpuDriver(s, 0, {}, base=0).initialize()
    ops = s.channel.ops
    features_ok = ops.index((wire.OP_SET_STATUS, wire.STATUS_ACKNOWLEDGE | wire.STATUS_DRIVER
                             | wire.STATUS_FEATURES_OK))
    assert ops[features_ok + 1] == (wire.OP_GET_STATUS, None)  # re-read at once
    later = ops[features_ok + 2:]
    assert not any(op in (wire.OP_SET_VRING, wire.OP_ENABLE_VRING) for op, _ in later)
    assert not any(op == wire.OP_SET_STATUS and st & wire.STATUS_DRIVER_OK for op, st in later)


def test_ctl_call_4_patches_land_before_the_used_ring_is_read_and_empty_calls_are_fine():
    s = _session(LoopbackChannel())
    drv = VirtioGpuDriver(s, 0, {}, base=0)
    drv.initialize()
    s.devices.append(drv)
    req = drv.submit(nop())
    # the device answered in a call that has not been received: nothing is used yet
    assert not req.done and drv.reap() == 0
    s.channel.calls.insert(0, ({"op": wire.OP_CALL, "dev": 0, "queue": 0, "notify": False}, []))
    assert drv.call(nop())[0] == wire.RESP_OK_NODATA  # the wait applied both calls, then reaped
    assert req.done and req.response()[0] == wire.RESP_OK_NODATA


def test_ctl_hb_5_a_session_whose_host_is_lost_is_not_used_again():
    s = _session(LoopbackChannel())
    drv = VirtioGpuDriver(s, 0, {}, base=0)
    drv.initialize()
    s.devices.append(drv)
    sent = len(s.channel.sent)
    s.host_lost = True  # as a wait that saw HEARTBEAT_MISSES silent periods leaves it
    s.close()
    assert s.channel.sent[sent:] == []  # not even a bye, nor a kick of deferred chains


class _Log:
    def __init__(self):
        self.events = []


class _Queue:
    """A used ring that has an entry pending the first time interrupts are re-enabled."""

    def __init__(self, log):
        self.log, self.enabled, self.pending = log, False, True

    def enable_interrupts(self):
        self.log.events.append("enable")
        self.enabled = True
        pending, self.pending = self.pending, False
        return not pending

    def disable_interrupts(self):
        self.log.events.append("disable")
        self.enabled = False


class _Device:
    deferred = False

    def __init__(self, log):
        self.log, self.queue, self.done = log, _Queue(log), False

    def reap(self):
        self.log.events.append("reap")


class _BlockingChannel:
    heartbeat_ms = 0

    def __init__(self, device):
        self.device = device

    def recv_until(self, predicate, timeout=None):
        self.device.log.events.append(("block", self.device.queue.enabled))
        self.device.done = True
        return {"op": wire.OP_CALL, "dev": 0, "queue": 0, "notify": True}, []


def test_vq_notify_5_a_polling_driver_reenables_and_rereads_before_it_blocks(monkeypatch):
    log = _Log()
    dev = _Device(log)
    s = _session(_BlockingChannel(dev))
    s.inline, s.memory, s.devices = False, wire.MEMORY_SHARED, [dev]
    s.POLL_MAX = -1.0  # no busy-poll window: straight to the blocking path
    s.wait_for(lambda: dev.done)
    ev = log.events
    first_block = next(i for i, e in enumerate(ev) if isinstance(e, tuple))
    assert ev[first_block] == ("block", True)  # blocks only with notifications enabled
    # the first enable found an entry pending: suppressed again and re-read, no block
    first_enable = ev.index("enable")
    assert ev[first_enable + 1:first_enable + 3] == ["disable", "reap"]
    assert ev[first_block - 1] == "enable" and ev.count("enable") == 2
