"""spec §6.5.11–§6.5.18 and §7.5–§7.7 — CTX_SYNC, GET_STATS, events and exported events
(clauses CMD-CTX-SYNC-*, CMD-STATS-*, CMD-EVENT-*, FENCE-EVENT-*, FENCE-EXPORT-*), black-box
through the virtqueue: requests are raw bytes and responses are read back raw."""

import secrets
import struct

import msgpack
import numpy as np

from pvgpu.spec import wire

from pvgpu.conformance.burns import with_longer_burns
from pvgpu.conformance.rawdevice import Raw, cmd, completes, launch
from pvgpu.conformance.registry import check

EVENT = struct.Struct(wire.RESP_EVENT_FORMAT)


def query(raw, event_id, **kw):
    hdr, body, used = raw.call(cmd(wire.CMD_EVENT_QUERY, (event_id,), **kw))
    assert hdr[0] == wire.RESP_OK_EVENT, hdr
    assert used == wire.CTRL_HDR_SIZE + EVENT.size
    return EVENT.unpack_from(body)


def export(raw, event_id):
    hdr, body, used = raw.call(cmd(wire.CMD_EVENT_EXPORT, (event_id,)))
    assert hdr[0] == wire.RESP_OK_EVENT_HANDLE and used == wire.CTRL_HDR_SIZE + 16
    return struct.unpack_from(wire.RESP_EVENT_HANDLE_FORMAT, body)


@check("CMD-EVENT-RECORD-2", "CMD-EVENT-QUERY-2", "FENCE-EVENT-2", "FENCE-EVENT-3")
def cmd_event_record_query_layout_and_timestamp(raw):
    """[CMD-EVENT-RECORD-2] [CMD-EVENT-QUERY-2] [FENCE-EVENT-2] [FENCE-EVENT-3]"""
    ctx = raw.context()
    assert raw.call(cmd(wire.CMD_EVENT_RECORD, (1,), ctx_id=ctx, ring_idx=3))[0][0] == wire.RESP_OK_NODATA
    status, err, ts_idle, info0, info1 = query(raw, 1)
    assert (status, err, info0, info1) == (wire.EVENT_STATUS_COMPLETE, 0, 0, 0) and ts_idle > 0

    def attempt(burn_us):
        raw.call(launch(wire.KERNEL_BURN, burn_us, ctx_id=ctx, ring_idx=3))
        hdr, _, _ = raw.call(cmd(wire.CMD_EVENT_RECORD, (2,), ctx_id=ctx, ring_idx=3, fence_id=9))
        assert hdr == (wire.RESP_OK_NODATA, wire.FLAG_FENCE, 9, ctx, 3)  # answered at once
        pending = query(raw, 2)
        order = []
        held = completes(order, "held", raw.submit(
            cmd(wire.CMD_EVENT_QUERY, (2,), ctx_id=ctx, ring_idx=5, fence_id=77)))
        other = completes(order, "other", raw.submit(cmd(wire.CMD_EVENT_QUERY, (1,))))
        assert EVENT.unpack_from(raw.wait(other)[1])[0] == wire.EVENT_STATUS_COMPLETE
        hdr, body, used = raw.wait(held)
        assert hdr == (wire.RESP_OK_EVENT, wire.FLAG_FENCE, 77, ctx, 5)
        status, err, ts_burn, _, _ = EVENT.unpack_from(body)
        assert status == wire.EVENT_STATUS_COMPLETE and err == 0
        assert ts_burn - ts_idle >= 0.9 * burn_us * 1000  # device time covers the burn
        if pending[0] != wire.EVENT_STATUS_PENDING:
            return False  # the burn was over before the query
        assert pending == (wire.EVENT_STATUS_PENDING, 0, 0, 0, 0)
        return order == ["other", "held"]  # the held query blocks nothing behind it
    with_longer_burns(attempt)


@check("CMD-EVENT-RECORD-1", "CMD-EVENT-WAIT-1", "CMD-EVENT-QUERY-1", "CMD-EVENT-DESTROY-1",
       "CMD-EVENT-EXPORT-1", "CMD-EVENT-IMPORT-1", "ERR-RESP-3", "CMD-CHECK-1",
       "CMD-EVENT-DESTROY-2")
def cmd_event_bad_ids(raw):
    """[CMD-EVENT-RECORD-1] [CMD-EVENT-WAIT-1] [CMD-EVENT-QUERY-1] [CMD-EVENT-DESTROY-1]
    [CMD-EVENT-EXPORT-1] [CMD-EVENT-IMPORT-1] [ERR-RESP-3]"""
    ctx = raw.context()
    raw.call(cmd(wire.CMD_EVENT_RECORD, (1,), ctx_id=ctx))
    for type_ in (wire.CMD_EVENT_WAIT, wire.CMD_EVENT_QUERY, wire.CMD_EVENT_DESTROY,
                  wire.CMD_EVENT_EXPORT):
        for bad in (0, 0xFFFF_FFFF):
            hdr, body, _ = raw.call(cmd(type_, (bad,), ctx_id=ctx))
            assert hdr[0] == wire.RESP_ERR_INVALID_EVENT, (wire.CMD_NAMES[type_], bad)
            assert struct.unpack_from(wire.RESP_ERROR_FORMAT, body)[:2] == (0, 0)
    assert raw.call(cmd(wire.CMD_EVENT_RECORD, (0,), ctx_id=ctx))[0][0] == wire.RESP_ERR_INVALID_EVENT
    assert raw.call(cmd(wire.CMD_EVENT_IMPORT, (0, 1, 1)))[0][0] == wire.RESP_ERR_INVALID_EVENT
    assert raw.call(cmd(wire.CMD_EVENT_IMPORT, (5, 2**64 - 1, 1)))[0][0] == wire.RESP_ERR_INVALID_EVENT
    # [CMD-CHECK-1] record and wait need a context; the others do not
    assert raw.call(cmd(wire.CMD_EVENT_RECORD, (2,), ctx_id=4242))[0][0] == wire.RESP_ERR_INVALID_CONTEXT_ID
    assert raw.call(cmd(wire.CMD_EVENT_WAIT, (1,), ctx_id=4242))[0][0] == wire.RESP_ERR_INVALID_CONTEXT_ID
    assert query(raw, 1)[0] == wire.EVENT_STATUS_COMPLETE  # nothing of that disturbed event 1
    # [CMD-EVENT-DESTROY-2] the id is free at once
    assert raw.call(cmd(wire.CMD_EVENT_DESTROY, (1,)))[0][0] == wire.RESP_OK_NODATA
    assert raw.call(cmd(wire.CMD_EVENT_QUERY, (1,)))[0][0] == wire.RESP_ERR_INVALID_EVENT
    assert raw.call(cmd(wire.CMD_EVENT_RECORD, (1,), ctx_id=ctx))[0][0] == wire.RESP_OK_NODATA


@check("FENCE-EVENT-1")
def fence_event_1_namespace_per_device_and_outlives_contexts(raw):
    """[FENCE-EVENT-1] event ids are per device, independent of contexts."""
    a, b = raw.context(), raw.context()
    raw.call(cmd(wire.CMD_EVENT_RECORD, (7,), ctx_id=a))
    assert raw.call(cmd(wire.CMD_EVENT_WAIT, (7,), ctx_id=b, ring_idx=2))[0][0] == wire.RESP_OK_NODATA
    assert raw.call(cmd(wire.CMD_CTX_DESTROY, ctx_id=a))[0][0] == wire.RESP_OK_NODATA
    assert query(raw, 7)[0] == wire.EVENT_STATUS_COMPLETE
    other = Raw(raw.conn, dev=1)  # the other device of the session: its own namespace
    assert other.call(cmd(wire.CMD_EVENT_QUERY, (7,)))[0][0] == wire.RESP_ERR_INVALID_EVENT


@check("CMD-EVENT-WAIT-2", "FENCE-EVENT-4")
def cmd_event_wait_orders_timelines_on_the_device(raw):
    """[CMD-EVENT-WAIT-2] [FENCE-EVENT-4]: timeline 2 reads what timeline 1 wrote behind a
    long burn, and EVENT_WAIT itself is answered at once."""
    ctx = raw.context()
    a, _ = raw.alloc(ctx, 4096, 1)
    b, _ = raw.alloc(ctx, 4096, 2)
    values = iter((5.0, 6.0, 7.0))

    def attempt(burn_us):
        value = next(values)
        raw.call(launch(wire.KERNEL_BURN, burn_us, ctx_id=ctx, ring_idx=1))
        raw.call(launch(wire.KERNEL_FILL, a, value, 64, ctx_id=ctx, ring_idx=1))
        raw.call(cmd(wire.CMD_EVENT_RECORD, (1,), ctx_id=ctx, ring_idx=1))
        assert raw.call(cmd(wire.CMD_EVENT_WAIT, (1,), ctx_id=ctx, ring_idx=2))[0][0] == \
            wire.RESP_OK_NODATA
        waited_at_once = query(raw, 1)[0] == wire.EVENT_STATUS_PENDING  # answered mid-burn
        raw.call(cmd(wire.CMD_COPY_D2D, (a, b, 256), ctx_id=ctx, ring_idx=2))
        hdr, body, _ = raw.call(cmd(wire.CMD_COPY_D2H, (b, 256), ctx_id=ctx, ring_idx=2),
                                read_back=256)
        assert hdr[0] == wire.RESP_OK_NODATA
        assert np.frombuffer(body[:256], np.float32).tolist() == [value] * 64
        return waited_at_once
    with_longer_burns(attempt)


@check("CMD-CTX-SYNC-1", "CMD-CTX-SYNC-2", "FENCE-ERROR-4")
def cmd_ctx_sync_covers_every_timeline_and_reports_the_lowest_ring(raw):
    """[CMD-CTX-SYNC-1] [CMD-CTX-SYNC-2] [FENCE-ERROR-4]"""
    ctx, other = raw.context(), raw.context()
    raw.call(launch(wire.KERNEL_FILL, 0x2300_0000_0000, 1.0, 64, ctx_id=ctx, ring_idx=9))
    raw.call(launch(wire.KERNEL_FILL, 0x2200_0000_0000, 1.0, 64, ctx_id=ctx, ring_idx=4))
    raw.call(launch(wire.KERNEL_BURN, 100_000, ctx_id=ctx, ring_idx=6))
    raw.call(launch(wire.KERNEL_FILL, 0x2400_0000_0000, 1.0, 64, ctx_id=other))
    hdr, body, _ = raw.call(cmd(wire.CMD_CTX_SYNC, ctx_id=ctx, ring_idx=2))
    assert hdr == (wire.RESP_ERR_PAGE_FAULT, 0, 0, ctx, 2)
    assert struct.unpack_from(wire.RESP_ERROR_FORMAT, body)[0] == 0x2200_0000_0000  # ring 4's
    # every timeline of ctx was reported; the other context's error is still remembered
    for ring in (4, 9):
        assert raw.call(cmd(wire.CMD_NOP, ctx_id=ctx, ring_idx=ring, fence_id=1))[0][0] == wire.RESP_OK_NODATA
    assert raw.call(cmd(wire.CMD_CTX_SYNC, ctx_id=ctx))[0][0] == wire.RESP_OK_NODATA
    assert raw.call(cmd(wire.CMD_CTX_SYNC, ctx_id=other, fence_id=3))[0][:3] == \
        (wire.RESP_ERR_PAGE_FAULT, wire.FLAG_FENCE, 3)
    assert raw.call(cmd(wire.CMD_CTX_SYNC, ctx_id=4242))[0][0] == wire.RESP_ERR_INVALID_CONTEXT_ID


@check("CMD-CTX-SYNC-1", "FENCE-HOLD-1", "FENCE-HOLD-2")
def cmd_ctx_sync_is_held_until_the_work_completes(raw):
    """[CMD-CTX-SYNC-1] [FENCE-HOLD-1] [FENCE-HOLD-2]"""
    ctx = raw.context()

    def attempt(burn_us):
        raw.call(launch(wire.KERNEL_BURN, burn_us, ctx_id=ctx, ring_idx=5))
        raw.call(cmd(wire.CMD_EVENT_RECORD, (1,), ctx_id=ctx, ring_idx=5))
        order = []
        held = completes(order, "sync", raw.submit(cmd(wire.CMD_CTX_SYNC, ctx_id=ctx)))
        probe = completes(order, "query", raw.submit(cmd(wire.CMD_EVENT_QUERY, (1,))))
        hdr, body, _ = raw.wait(probe)
        assert hdr[0] == wire.RESP_OK_EVENT
        running = EVENT.unpack_from(body)[0] == wire.EVENT_STATUS_PENDING
        assert raw.wait(held)[0][0] == wire.RESP_OK_NODATA
        assert query(raw, 1)[0] == wire.EVENT_STATUS_COMPLETE  # the sync waited for it
        # the query, taken after the sync while the burn ran, was answered first
        return running and order == ["query", "sync"]
    with_longer_burns(attempt)


@check("CMD-STATS-1", "CMD-STATS-2", "CMD-STATS-3")
def cmd_stats_layout_and_room(raw):
    """[CMD-STATS-1] [CMD-STATS-2] [CMD-STATS-3]"""
    hdr, body, used = raw.call(cmd(wire.CMD_GET_STATS), read_back=wire.STATS_BUFFER_SIZE)
    assert hdr[0] == wire.RESP_OK_STATS
    (length,) = struct.unpack_from(wire.RESP_STATS_FORMAT, body)
    assert used == wire.CTRL_HDR_SIZE + wire.RESP_STATS_SIZE + length
    stats = msgpack.unpackb(body[wire.RESP_STATS_SIZE:wire.RESP_STATS_SIZE + length], raw=False)
    assert isinstance(stats, dict) and stats["device"] == 0
    assert Raw(raw.conn, dev=1).call(cmd(wire.CMD_GET_STATS), read_back=wire.STATS_BUFFER_SIZE)[0][0] \
        == wire.RESP_OK_STATS
    if used > wire.MIN_RESPONSE_SIZE:  # does not fit the minimum response: told how much
        hdr, body, _ = raw.call(cmd(wire.CMD_GET_STATS))
        assert hdr[0] == wire.RESP_ERR_INVALID_PARAMETER
        need = struct.unpack_from(wire.RESP_ERROR_FORMAT, body)[0]
        assert need >= used - 64  # (the map may change a little between two requests)
        hdr, _, _ = raw.call(cmd(wire.CMD_GET_STATS), read_back=need + 4096)
        assert hdr[0] == wire.RESP_OK_STATS


@check("CMD-STATS-4")
def cmd_stats_4_another_session_is_not_described(ctx):
    """[CMD-STATS-4] a session's GET_STATS, on either device, holds none of the names another
    session gave itself and its context (their bytes appear nowhere in the map)."""
    secret = f"cs4-{secrets.token_hex(6)}"
    other = Raw(ctx.connect(name=f"{secret}-guest"))
    hdr, _, _ = other.call(cmd(wire.CMD_CTX_CREATE, (0, f"{secret}-ctx".encode()),
                               ctx_id=next(other.ctx_ids)))
    assert hdr[0] == wire.RESP_OK_NODATA
    me = Raw(ctx.connect(name="cs4-observer"))
    me.context()
    for dev in (0, 1):
        hdr, body, _ = Raw(me.conn, dev=dev).call(cmd(wire.CMD_GET_STATS),
                                                  read_back=wire.STATS_BUFFER_SIZE)
        assert hdr[0] == wire.RESP_OK_STATS
        (length,) = struct.unpack_from(wire.RESP_STATS_FORMAT, body)
        assert secret.encode() not in body[wire.RESP_STATS_SIZE:wire.RESP_STATS_SIZE + length]


@check("CMD-EVENT-EXPORT-2", "CMD-EVENT-IMPORT-1", "CMD-EVENT-IMPORT-2", "FENCE-EXPORT-1",
       "FENCE-EXPORT-2", "FENCE-EXPORT-3")
def fence_export_between_sessions(two):
    """[CMD-EVENT-EXPORT-2] [CMD-EVENT-IMPORT-1] [CMD-EVENT-IMPORT-2] [FENCE-EXPORT-1]
    [FENCE-EXPORT-2] [FENCE-EXPORT-3]"""
    a, b = two
    actx, bctx = a.context(), b.context()
    a.call(cmd(wire.CMD_EVENT_RECORD, (1,), ctx_id=actx))
    h, token = export(a, 1)
    assert export(a, 1) == (h, token)  # the same recording: the same handle
    for bad in ((h, token ^ 1), (h, 0), (h + 1_000_000, token)):
        assert b.call(cmd(wire.CMD_EVENT_IMPORT, (3, *bad)))[0][0] == wire.RESP_ERR_INVALID_EVENT
    assert b.call(cmd(wire.CMD_EVENT_QUERY, (3,)))[0][0] == wire.RESP_ERR_INVALID_EVENT  # not created
    handles = []

    def attempt(burn_us):  # session b imports session a's event while a's burn runs
        a.call(launch(wire.KERNEL_BURN, burn_us, ctx_id=actx))
        a.call(cmd(wire.CMD_EVENT_RECORD, (1,), ctx_id=actx))
        handles.append(export(a, 1))
        assert b.call(cmd(wire.CMD_EVENT_IMPORT, (3, *handles[-1])))[0][0] == wire.RESP_OK_NODATA
        return query(b, 3)[0] == wire.EVENT_STATUS_PENDING
    with_longer_burns(attempt)
    h, token = handles[-1]
    # session b waits for session a's burn, then records its own event
    b.call(cmd(wire.CMD_EVENT_WAIT, (3,), ctx_id=bctx, ring_idx=1))
    b.call(launch(wire.KERNEL_BURN, 1_000, ctx_id=bctx, ring_idx=1))
    b.call(cmd(wire.CMD_EVENT_RECORD, (4,), ctx_id=bctx, ring_idx=1))
    _, _, ts_b, _, _ = query(b, 4, fence_id=1)
    _, _, ts_a, _, _ = query(a, 1, fence_id=1)
    assert ts_b >= ts_a  # one device clock per host
    assert query(b, 3)[2] == ts_a  # the import captures exactly the exported work
    # recording again does not change the export; a new export is a new handle
    a.call(cmd(wire.CMD_EVENT_RECORD, (1,), ctx_id=actx))
    assert export(a, 1) != (h, token)
    assert b.call(cmd(wire.CMD_EVENT_IMPORT, (5, h, token)))[0][0] == wire.RESP_OK_NODATA
    assert query(b, 5)[2] == ts_a
    # destroying the event withdraws its exports; the importer keeps its recording
    assert a.call(cmd(wire.CMD_EVENT_DESTROY, (1,)))[0][0] == wire.RESP_OK_NODATA
    assert b.call(cmd(wire.CMD_EVENT_IMPORT, (6, h, token)))[0][0] == wire.RESP_ERR_INVALID_EVENT
    assert query(b, 3)[:3] == (wire.EVENT_STATUS_COMPLETE, 0, ts_a)


@check("FENCE-EXPORT-3", "CTL-RECLAIM-2")
def fence_export_3_reclaim_withdraws_exports(ctx):
    """[FENCE-EXPORT-3] [CTL-RECLAIM-2]: the exporting session says bye."""
    with ctx.connect(mem_size=16 << 20) as conn:
        b = Raw(conn)
        with ctx.connect(mem_size=16 << 20) as other:
            a = Raw(other)
            a.call(cmd(wire.CMD_EVENT_RECORD, (1,), ctx_id=a.context()))
            h, token = export(a, 1)
            assert b.call(cmd(wire.CMD_EVENT_IMPORT, (1, h, token)))[0][0] == wire.RESP_OK_NODATA
        assert b.call(cmd(wire.CMD_EVENT_IMPORT, (2, h, token)))[0][0] == wire.RESP_ERR_INVALID_EVENT
        assert query(b, 1)[0] == wire.EVENT_STATUS_COMPLETE


@check("FENCE-EVENT-3", "CMD-EVENT-QUERY-3")
def fence_event_3_error_of_the_captured_work(raw):
    """[FENCE-EVENT-3] [CMD-EVENT-QUERY-3]: the event reports its work's error and leaves
    it to the timeline's next synchronizing command."""
    ctx = raw.context()
    bad = 0x2500_0000_0000
    raw.call(launch(wire.KERNEL_FILL, bad, 1.0, 64, ctx_id=ctx, ring_idx=1))
    raw.call(cmd(wire.CMD_EVENT_RECORD, (1,), ctx_id=ctx, ring_idx=1))
    status, err, ts, info0, info1 = query(raw, 1, fence_id=1)
    assert (status, err, info0, info1) == (wire.EVENT_STATUS_ERROR, wire.RESP_ERR_PAGE_FAULT, bad,
                                           wire.ACCESS_WRITE) and ts > 0
    hdr, _, _ = raw.call(cmd(wire.CMD_NOP, ctx_id=ctx, ring_idx=1, fence_id=2))
    assert hdr[0] == wire.RESP_ERR_PAGE_FAULT
    # waiting for it does not carry the error over to another timeline
    raw.call(cmd(wire.CMD_EVENT_WAIT, (1,), ctx_id=ctx, ring_idx=2))
    raw.call(launch(wire.KERNEL_BURN, 10, ctx_id=ctx, ring_idx=2))
    assert raw.call(cmd(wire.CMD_NOP, ctx_id=ctx, ring_idx=2, fence_id=3))[0][0] == wire.RESP_OK_NODATA
