"""GPU page faults reported on the event queue (spec §5.7), through real host and guest
processes in both memory models: the guest's exception names the address and the access,
the context is marked faulted, and other contexts carry on."""

import numpy as np
import pytest

from pvgpu import guest
from pvgpu.guest.frontend.driver import DeviceEvent
from pvgpu.spec import wire


def test_a_kernel_writing_past_its_buffer_faults_with_an_event(conn):
    dev = conn.devices[0]
    with dev.create_context() as ctx, dev.create_context() as other:
        x = ctx.to_device(np.zeros(1024, np.float32))  # one 4 KiB page
        y = other.to_device(np.ones(1024, np.float32))
        assert not ctx.faulted
        ctx.launch("fill", grid=16, block=256, args=(x, 5.0, 4096))  # 4x the buffer
        with pytest.raises(guest.PageFaultError) as ei:
            ctx.synchronize()
        err = ei.value
        assert err.address == x.ptr + 4096 and err.access == "write"
        ev = err.event
        assert isinstance(ev, DeviceEvent) and ev.type == wire.EVTQ_PAGE_FAULT
        assert (ev.ctx_id, ev.address, ev.access, ev.engine) == (ctx.ctx_id, x.ptr + 4096,
                                                                 wire.ACCESS_WRITE, 0)
        text = str(err)
        assert hex(x.ptr + 4096) in text and "write" in text and "compute engine" in text
        assert ctx.faulted and ctx.faults == [ev] and not other.faulted
        assert ev in dev.events
        # only the faulting context's job failed; both contexts keep working
        other.launch("scale", grid=4, block=256, args=(y, y, 2.0, 1024))
        np.testing.assert_array_equal(y.to_host(), np.full(1024, 2, np.float32))
        ctx.launch("fill", grid=4, block=256, args=(x, 3.0, 1024))
        np.testing.assert_array_equal(x.to_host(), np.full(1024, 3, np.float32))
        ctx.synchronize()  # the fault was reported once, with its event


def test_a_copy_to_a_read_only_mapping_faults_with_an_event(conn):
    dev = conn.devices[1]
    with dev.create_context() as ctx:
        a = ctx.to_device(np.arange(2048, dtype=np.float32))
        src = ctx.to_device(np.ones(2048, np.float32))
        r = ctx.reserve_va(1 << 16)
        ro = ctx.map(a, r.va, access="r")
        ctx.copy_d2d(ro.ptr, src.ptr, 4096)
        with pytest.raises(guest.PageFaultError) as ei:
            ctx.synchronize()
        ev = ei.value.event
        assert ev is not None and ev.address == ro.ptr and ev.access == wire.ACCESS_WRITE
        assert ev.engine == 1 and "copy0" in str(ei.value)  # device-to-device copies: copy0
        assert ctx.faults == [ev]
        np.testing.assert_array_equal(a.to_host(), np.arange(2048, dtype=np.float32))


def test_faults_seen_only_on_the_event_queue_are_raised_at_synchronize(conn):
    dev = conn.devices[0]
    with dev.create_context() as ctx:
        ctx.synchronize()
        # an event whose job's error no response carried (e.g. from a host that reports
        # faults only as events): the next synchronize of its context raises it
        ev = DeviceEvent(wire.EVTQ_PAGE_FAULT, ctx.ctx_id, 0, 99, 1, 0x7000_0000_1000, 3,
                         wire.ACCESS_READ, 2, 0)
        dev._on_device_event(ev)
        with pytest.raises(guest.PageFaultError) as ei:
            ctx.synchronize()
        assert ei.value.event is ev and ei.value.address == 0x7000_0000_1000
        assert ei.value.access == "read" and "copy1" in str(ei.value)
        ctx.synchronize()  # raised once


def test_without_the_event_queue_faults_are_still_errors(shared_host):
    features = wire.DEVICE_FEATURES & ~(1 << wire.PVGPU_F_EVENTQ)
    with guest.connect(shared_host.endpoint, mem_size=16 << 20, features=features) as c:
        dev = c.devices[0]
        assert dev.driver.eventq is None
        with dev.create_context() as ctx:
            ctx.launch("fill", grid=1, block=64, args=(0x5000_0000_0000, 1.0, 64))
            with pytest.raises(guest.PageFaultError) as ei:
                ctx.synchronize()
            assert ei.value.event is None and ei.value.address == 0x5000_0000_0000
            assert not ctx.faulted and dev.events == []
