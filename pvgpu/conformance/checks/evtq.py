"""spec §5.7 — the event queue (clauses EVTQ-*, CMD-FAULT-4, DEV-QUEUE-1), black-box in both
memory models: the driver's posted event buffers are read back as the device wrote them."""

import struct

from pvgpu.spec import wire

from pvgpu.conformance.rawdevice import cmd, launch
from pvgpu.conformance.registry import check

MISSING = 0x3000_0000_0000


def fault(raw, ctx, ring_idx=0):
    assert raw.call(launch(wire.KERNEL_FILL, MISSING, 0, 64, ctx_id=ctx,
                           ring_idx=ring_idx))[0][0] == wire.RESP_OK_NODATA
    return raw.call(cmd(wire.CMD_NOP, ctx_id=ctx, fence_id=1, ring_idx=ring_idx))[0][0]


@check("DEV-QUEUE-1", "DEV-FEAT-1")
def config_counts_both_queues_and_the_feature_is_offered(raw):
    assert raw.drv.config[1] == wire.NUM_QUEUES == 2  # DEV-QUEUE-1
    assert wire.DEVICE_FEATURES & (1 << wire.PVGPU_F_EVENTQ)
    assert raw.drv.eventq is not None


@check("EVTQ-EVENT-1", "CMD-FAULT-4", feature=wire.PVGPU_F_EVENTQ)
def each_fault_is_one_entry_posted_before_its_error_response(raw):
    drv = raw.drv
    before = len(drv.events)
    ctx = raw.context()
    assert fault(raw, ctx, ring_idx=2) == wire.RESP_ERR_PAGE_FAULT
    new = list(drv.events)[before:]  # EVTQ-EVENT-1: reaped no later than the response
    assert len(new) == 1
    ev = new[0]
    assert (ev.type, ev.ctx_id, ev.ring_idx) == (wire.EVTQ_PAGE_FAULT, ctx, 2)
    assert (ev.address, ev.access, ev.engine, ev.missed) == (MISSING, wire.ACCESS_WRITE, 0, 0)
    # CMD-FAULT-4: the context keeps working; seq counts on
    assert fault(raw, ctx) == wire.RESP_ERR_PAGE_FAULT
    assert drv.events[-1].seq == ev.seq + 1 and drv.events[-1].ring_idx == 0


@check("EVTQ-ENTRY-1", feature=wire.PVGPU_F_EVENTQ)
def entries_have_the_documented_layout(raw):
    drv = raw.drv
    ctx = raw.context()
    assert fault(raw, ctx) == wire.RESP_ERR_PAGE_FAULT
    ev = drv.events[-1]
    # the driver re-posted the buffer; its bytes stay until the next event fills it
    raw_bytes = [drv.mem.read(g, wire.EVTQ_ENTRY_SIZE) for g in drv._event_bufs.values()]
    hdr = struct.Struct(wire.CTRL_HDR_FORMAT)
    mine = [b for b in raw_bytes if hdr.unpack_from(b)[0] == wire.EVTQ_PAGE_FAULT
            and struct.unpack_from("<Q", b, 24)[0] == ev.seq]
    assert len(mine) == 1
    b = mine[0]
    assert hdr.unpack_from(b) == (wire.EVTQ_PAGE_FAULT, 0, 0, ctx, 0)
    assert struct.unpack_from("<QQQIBB2xII", b, 24) == (
        ev.seq, ev.timestamp_ns, MISSING, ev.vmid, wire.ACCESS_WRITE, 0, 0, 0)


@check("EVTQ-EVENT-2", feature=wire.PVGPU_F_EVENTQ)
def events_of_one_session_never_reach_another(two):
    a, b = two
    seen_b = len(b.drv.events)
    assert fault(a, a.context()) == wire.RESP_ERR_PAGE_FAULT
    ctx = b.context()
    assert b.call(cmd(wire.CMD_NOP, ctx_id=ctx, fence_id=1))[0][0] == wire.RESP_OK_NODATA
    assert len(b.drv.events) == seen_b  # EVTQ-EVENT-2
