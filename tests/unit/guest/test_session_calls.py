"""The driver side of device initialization and of `call`s (spec CTL-STATUS-6,
CTL-CALL-4): the real FrontendSession and VirtioGpuDriver over the in-process loopback
channel of test_kick_policy (sans-IO, no host process)."""

import struct

import pytest

from pvgpu.guest.frontend.driver import VirtioGpuDriver, command
from pvgpu.guest.frontend.session import FrontendSession
from pvgpu.spec import wire
from pvgpu.transport.memory import InlineGuestMemory

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


class RecordingChannel(LoopbackChannel):
    """The loopback device, recording each control request; it offers a bit no driver knows."""

    UNKNOWN_BIT = 1 << 50

    def __init__(self):
        super().__init__()
        self.ops = []

    def request(self, msg, frames=(), timeout=None):
        self.ops.append((msg["op"], msg.get("status", msg.get("features"))))
        reply, extra = super().request(msg, frames, timeout)
        if msg["op"] == wire.OP_GET_FEATURES:
            reply["features"] |= self.UNKNOWN_BIT
        return reply, extra


def test_dev_init_1_the_driver_initializes_in_the_spec_order():
    s = _session(RecordingChannel())
    VirtioGpuDriver(s, 0, {}, base=0).initialize()
    ops = [op for op in s.channel.ops if op[0] != wire.OP_GET_CONFIG]
    A, D, F, K = (wire.STATUS_ACKNOWLEDGE, wire.STATUS_DRIVER, wire.STATUS_FEATURES_OK,
                  wire.STATUS_DRIVER_OK)
    features = ops[4][1]
    assert ops == [(wire.OP_SET_STATUS, 0), (wire.OP_SET_STATUS, A), (wire.OP_SET_STATUS, A | D),
                   (wire.OP_GET_FEATURES, None), (wire.OP_SET_FEATURES, features),
                   (wire.OP_SET_STATUS, A | D | F), (wire.OP_GET_STATUS, None),
                   (wire.OP_SET_VRING, None), (wire.OP_ENABLE_VRING, None),
                   (wire.OP_SET_STATUS, A | D | F | K)]
    assert (wire.OP_GET_CONFIG, None) in s.channel.ops


def test_dev_feat_2_the_driver_accepts_version_1_and_only_offered_known_bits():
    s = _session(RecordingChannel())
    VirtioGpuDriver(s, 0, {}, base=0).initialize()
    (accepted,) = [v for op, v in s.channel.ops if op == wire.OP_SET_FEATURES]
    offered = (wire.DEVICE_FEATURES & ~(1 << wire.PVGPU_F_EVENTQ)) | RecordingChannel.UNKNOWN_BIT
    assert accepted & (1 << wire.VIRTIO_F_VERSION_1)
    assert accepted & ~offered == 0 and not accepted & RecordingChannel.UNKNOWN_BIT


class _NoVersion1(RecordingChannel):
    def request(self, msg, frames=(), timeout=None):
        reply, extra = super().request(msg, frames, timeout)
        if msg["op"] == wire.OP_GET_FEATURES:
            reply["features"] &= ~(1 << wire.VIRTIO_F_VERSION_1)
        return reply, extra


def test_dev_feat_2_without_version_1_the_driver_does_not_go_on():
    s = _session(_NoVersion1())
    with pytest.raises(RuntimeError, match="VIRTIO_F_VERSION_1"):
        VirtioGpuDriver(s, 0, {}, base=0).initialize()
    assert not any(op == wire.OP_SET_FEATURES for op, _ in s.channel.ops)


def _driver():
    s = _session(LoopbackChannel())
    drv = VirtioGpuDriver(s, 0, {}, base=0)
    drv.initialize()
    s.devices.append(drv)
    return s, drv


def test_dev_needs_reset_2_config_changed_fails_what_is_outstanding():
    from pvgpu.guest.frontend.driver import DeviceNeedsReset
    s, drv = _driver()
    req = drv.submit(nop())
    assert not req.done
    s._on_notification({"op": wire.OP_CONFIG_CHANGED, "dev": 0}, [])
    assert req.done
    with pytest.raises(DeviceNeedsReset):
        req.response()
    with pytest.raises(DeviceNeedsReset):
        drv.submit(nop())  # not used again before a reset
    drv.initialize()
    assert drv.call(nop())[0] == wire.RESP_OK_NODATA


def test_cmd_chain_3_every_chain_offers_room_for_any_response():
    s, drv = _driver()
    queue = s.channel.device_queue
    pop, seen = queue.pop, []

    def recording_pop():
        chain = pop()
        if chain is not None:
            seen.append(chain.writable_len)
        return chain
    queue.pop = recording_pop
    drv.call(nop())
    drv.call(command(wire.CMD_GET_DEVICE_INFO))
    assert len(seen) == 2 and min(seen) >= wire.MIN_RESPONSE_SIZE


def test_err_ctl_1_an_unknown_error_name_fails_the_request():
    from pvgpu.guest.frontend.session import ControlRequestError

    class Refusing(LoopbackChannel):
        def request(self, msg, frames=(), timeout=None):
            return {"op": "reply", "ok": False, "error": "a_name_from_the_future", "message": "m"}, []
    s = _session(Refusing())
    with pytest.raises(ControlRequestError, match="a_name_from_the_future"):
        s.control(wire.OP_PING)


def test_err_resp_2_an_unknown_error_code_is_an_error_with_its_body():
    from pvgpu.guest.frontend.driver import DeviceResponseError
    s, drv = _driver()
    queue = s.channel.device_queue
    add_used = queue.add_used
    body = struct.pack(wire.RESP_ERROR_FORMAT, 11, 22, 4) + b"oops"

    def unknown_error(head, length):  # rewrite the OK the loopback wrote
        chain = s.channel.last_chain
        chain.write(s.channel.mirror, 0, struct.pack(wire.CTRL_HDR_FORMAT, 0x12EE, 0, 0, 0, 0) + body)
        add_used(head, wire.CTRL_HDR_SIZE + len(body))
    pop = queue.pop

    def remembering_pop():
        chain = s.channel.last_chain = pop()
        return chain
    queue.pop, queue.add_used = remembering_pop, unknown_error
    with pytest.raises(DeviceResponseError) as e:
        drv.call(nop())
    assert e.value.resp == 0x12EE and e.value.message == "oops" and (e.value.info0, e.value.info1) == (11, 22)


class _HelloChannel(LoopbackChannel):
    """Answers hello with one device, as a host would."""

    def request(self, msg, frames=(), timeout=None):
        reply, extra = super().request(msg, frames, timeout)
        if msg["op"] == wire.OP_HELLO:
            self.hello = msg
            reply.update(session="s1", heartbeat_ms=0, devices=[
                {"index": 0, "name": "d0", "vram_size": 1 << 30, "device_id": wire.VIRTIO_ID_PVGPU,
                 "peers": []}])
        return reply, extra


def test_mem_window_3_memory_handed_to_kernels_never_overlaps_the_rings():
    s = FrontendSession.__new__(FrontendSession)
    s.endpoint, s.memory, s.inline, s.timeout = "loopback", wire.MEMORY_INLINE, True, 5.0
    s.mem_size, s.name, s.requested_vgpu, s.features = MEM, "t", None, wire.DEVICE_FEATURES
    s.devices, s.closed, s.host_lost, s._wait_ewma, s._kicks = [], False, False, 0.0, {}
    s.channel = _HelloChannel()
    s._open()
    assert s.channel.hello["version"] == list(wire.PROTOCOL_VERSION)  # [CTL-HELLO-1]
    (drv,) = s.devices
    area = (drv.base, drv.base + VirtioGpuDriver.area_size())
    layout = drv.queue.layout
    assert area[0] <= layout.desc and layout.end <= area[1]  # rings and slots: the area
    # pinned and managed memory, the only guest memory kernels are pointed at, is the heap
    assert s.heap.base >= area[1] and s.heap.base + s.heap.size <= MEM
