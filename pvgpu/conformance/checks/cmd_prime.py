"""spec §6.5.29–§6.5.31 and §12 — RESOURCE_EXPORT / IMPORT / REVOKE (clauses CMD-EXPORT-*,
CMD-IMPORT-*, CMD-REVOKE-1, PRIME-*, CTL-HELLO-9), black-box through the virtqueue: one
session per memory model, raw requests, responses read back raw."""

import struct

import numpy as np

from pvgpu.spec import wire

from pvgpu.conformance.rawdevice import Raw, cmd, d2h, h2d
from pvgpu.conformance.registry import check

EXPORT = struct.Struct(wire.RESP_EXPORT_FORMAT)
IMPORT = struct.Struct(wire.RESP_IMPORT_FORMAT)
EVENT = struct.Struct(wire.RESP_EVENT_FORMAT)
P = wire.PAGE_SIZE


def export(raw, ctx, rid):
    hdr, body, used = raw.call(cmd(wire.CMD_RESOURCE_EXPORT, (rid,), ctx_id=ctx))
    assert hdr[0] == wire.RESP_OK_EXPORT and used == wire.CTRL_HDR_SIZE + EXPORT.size, hdr
    return EXPORT.unpack_from(body)


def import_(raw, ctx, handle, token, rid, flags=wire.IMPORT_FLAG_PEER2PEER):
    hdr, body, _ = raw.call(cmd(wire.CMD_RESOURCE_IMPORT, (handle, token, rid, flags), ctx_id=ctx))
    return hdr[0], (IMPORT.unpack_from(body) if hdr[0] == wire.RESP_OK_IMPORT else None)


@check("CTL-HELLO-9")
def hello_describes_every_peer(two):
    a, _b = two
    devices = a.conn.session.devices
    for drv in devices:  # CTL-HELLO-9
        peers = drv.info["peers"]
        assert sorted(p["dev"] for p in peers) == sorted(d.index for d in devices if d is not drv)
        for p in peers:
            assert isinstance(p["p2p"], bool) and p["link"] in ("bus_addr", "thru_host_bridge",
                                                                 "not_supported")
            assert p["p2p"] == (p["link"] != "not_supported") and (p["distance"] >= 0) == p["p2p"]


@check("CMD-IMPORT-1", "PRIME-IMPORT-1", "PRIME-IMPORT-2")
def import_in_another_session_on_the_other_device_shares_the_memory(two):
    a, b = two
    b1 = Raw(b.conn, dev=1)
    ca, cb = a.context(), b1.context()
    va, size = a.alloc(ca, 2 * P, 1)
    data = bytes(range(256)) * 32
    assert h2d(a, ca, va, data)[0][0] == wire.RESP_OK_NODATA
    handle, token, esize = export(a, ca, 1)
    assert esize == size
    code, (vb, isize, placement) = import_(b1, cb, handle, token, 5)
    assert code == wire.RESP_OK_IMPORT and isize == size
    p2p = next(p for p in a.drv.info["peers"] if p["dev"] == 1)["p2p"]
    # PRIME-IMPORT-2: PEER only when the fabric routes it; else system memory
    assert placement == (wire.IMPORT_PLACEMENT_PEER if p2p else wire.IMPORT_PLACEMENT_SYSTEM)
    assert d2h(b1, cb, vb, len(data)) == data
    assert h2d(b1, cb, vb, b"\x01" * 64)[0][0] == wire.RESP_OK_NODATA  # PRIME-IMPORT-1
    assert d2h(a, ca, va, 64) == b"\x01" * 64
    code, (_, _, placement) = import_(a, ca, handle, token, 7)
    assert placement == wire.IMPORT_PLACEMENT_LOCAL  # the exporting device
    code, (vb6, _, placement) = import_(b1, cb, handle, token, 6, flags=0)
    assert placement == wire.IMPORT_PLACEMENT_SYSTEM  # no PEER2PEER: system memory ...
    code, (_, _, placement) = import_(a, ca, handle, token, 8)
    assert placement == wire.IMPORT_PLACEMENT_SYSTEM  # ... for every user while it lasts
    assert h2d(a, ca, va, b"\x02" * 64)[0][0] == wire.RESP_OK_NODATA
    assert d2h(b1, cb, vb6, 64) == b"\x02" * 64 and d2h(b1, cb, vb, 64) == b"\x02" * 64


@check("CMD-IMPORT-2", "CMD-REVOKE-1", "PRIME-LIFE-1", "PRIME-LIFE-2")
def tokens_revoke_and_free(two):
    a, b = two
    ca, cb = a.context(), b.context()
    va, _ = a.alloc(ca, P, 1)
    assert h2d(a, ca, va, b"\x07" * P)[0][0] == wire.RESP_OK_NODATA
    handle, token, _ = export(a, ca, 1)
    for h, t in ((handle, token ^ 1), (handle + 10_000, token)):  # CMD-IMPORT-2
        assert import_(b, cb, h, t, 2)[0] == wire.RESP_ERR_PERMISSION
    assert b.call(cmd(wire.CMD_RESOURCE_REVOKE, (handle,)))[0][0] == wire.RESP_ERR_PERMISSION
    code, (vb, _, _) = import_(b, cb, handle, token, 2)
    assert code == wire.RESP_OK_IMPORT
    assert a.call(cmd(wire.CMD_RESOURCE_REVOKE, (handle,)))[0][0] == wire.RESP_OK_NODATA
    assert import_(b, cb, handle, token, 3)[0] == wire.RESP_ERR_PERMISSION  # CMD-REVOKE-1
    h2, t2, _ = export(a, ca, 1)
    assert a.call(cmd(wire.CMD_MEM_FREE, (1,), ctx_id=ca))[0][0] == wire.RESP_OK_NODATA
    assert import_(b, cb, h2, t2, 3)[0] == wire.RESP_ERR_PERMISSION  # PRIME-LIFE-2
    assert d2h(b, cb, vb, P) == b"\x07" * P  # PRIME-LIFE-1: the import keeps it
    assert b.call(cmd(wire.CMD_MEM_FREE, (2,), ctx_id=cb))[0][0] == wire.RESP_OK_NODATA


@check("CMD-EXPORT-1", "CMD-IMPORT-1", "CMD-IMPORT-3")
def bad_fields(raw):
    ctx = raw.context()
    raw.alloc(ctx, P, 1)
    handle, token, _ = export(raw, ctx, 1)
    assert raw.call(cmd(wire.CMD_RESOURCE_EXPORT, (2,), ctx_id=ctx))[0][0] == \
        wire.RESP_ERR_INVALID_RESOURCE_ID  # CMD-EXPORT-1
    assert import_(raw, ctx, handle, token, 0)[0] == wire.RESP_ERR_INVALID_RESOURCE_ID
    assert import_(raw, ctx, handle, token, 1)[0] == wire.RESP_ERR_INVALID_RESOURCE_ID
    assert import_(raw, ctx, handle, token, 2, flags=4)[0] == wire.RESP_ERR_INVALID_PARAMETER
    code, (va, size, _) = import_(raw, ctx, handle, token, 2)
    assert raw.call(cmd(wire.CMD_MEM_MAP, (va, 0, size, 2, 3), ctx_id=ctx))[0][0] == \
        wire.RESP_ERR_INVALID_PARAMETER  # CMD-IMPORT-3


@check("PRIME-SYNC-1", "FENCE-SIGNAL-2", "VQ-ORDER-1")
def implicit_sync_orders_a_reader_after_a_slow_writer(two):
    """[PRIME-SYNC-1] A reader on device 1 (session b) that the device accepted after a writer
    on device 0 (session a) reads what the writer wrote, although the writer was still running.
    "Earlier" is the order of acceptance, and requests of two sessions have no order of their
    own: a's launches are answered "accepted" ([FENCE-SIGNAL-2]) before b's read is sent."""
    a, b = two
    b1 = Raw(b.conn, dev=1)
    ca, cb = a.context(), b1.context()
    n = 64 * 1024
    va, _ = a.alloc(ca, 4 * n, 1)
    assert h2d(a, ca, va, np.zeros(n, np.float32).tobytes())[0][0] == wire.RESP_OK_NODATA
    handle, token, _ = export(a, ca, 1)
    _, (vb, _, _) = import_(b1, cb, handle, token, 2)
    # a longer burn when the machine was too slow for the read to overtake the fill
    for value, burn_us in ((9.0, 200_000), (10.0, 1_000_000), (11.0, 5_000_000)):
        burn = struct.pack("<Q", burn_us)
        hdr, _, _ = a.call(cmd(wire.CMD_LAUNCH, (wire.KERNEL_BURN, 1, 1, 1, 1, 1, 1, 1), ctx_id=ca,
                               extra=burn))
        assert hdr[0] == wire.RESP_OK_NODATA
        fill = struct.pack("<QfxxxxQ", va, value, n)
        hdr, _, _ = a.call(cmd(wire.CMD_LAUNCH, (wire.KERNEL_FILL, n // 256, 1, 1, 256, 1, 1, 3),
                               ctx_id=ca, extra=fill))
        assert hdr[0] == wire.RESP_OK_NODATA  # accepted
        assert a.call(cmd(wire.CMD_EVENT_RECORD, (1,), ctx_id=ca))[0][0] == wire.RESP_OK_NODATA
        reader = b1.submit(cmd(wire.CMD_COPY_D2H, (vb, 4 * n), ctx_id=cb), read_back=4 * n)
        # taken after the reader ([VQ-ORDER-1]): once it is answered, the reader was accepted
        assert b1.call(cmd(wire.CMD_NOP, (), ctx_id=cb))[0][0] == wire.RESP_OK_NODATA
        hdr, body, _ = a.call(cmd(wire.CMD_EVENT_QUERY, (1,)))  # the status now
        assert hdr[0] == wire.RESP_OK_EVENT
        fill_was_running = EVENT.unpack_from(body)[0] == wire.EVENT_STATUS_PENDING
        hdr, body, used = b1.wait(reader)
        assert hdr[0] == wire.RESP_OK_NODATA and used == wire.CTRL_HDR_SIZE + 4 * n
        assert np.all(np.frombuffer(body[:4 * n], np.float32) == value)
        if fill_was_running:
            break  # the reader was accepted before the fill completed, and waited for it
    else:
        raise AssertionError("the fill always completed before the reader was accepted")
