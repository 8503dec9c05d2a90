"""spec §6.5.19–§6.5.24 and §6.6 — shared device memory: SHM_GET, SHM_ATTACH, SHM_DETACH,
SHM_CONTROL, SHM_EXPORT, SHM_IMPORT (clauses CMD-SHM-*, CTL-RECLAIM-5), black-box through
the virtqueue in both memory models: requests are raw bytes, responses are read back raw."""

import struct

import numpy as np

from pvgpu.spec import wire

from pvgpu.conformance.rawdevice import Raw, cmd, d2h, h2d
from pvgpu.conformance.registry import check

SHM = struct.Struct(wire.RESP_SHM_FORMAT)
ATTACH = struct.Struct(wire.RESP_SHM_ATTACH_FORMAT)
HANDLE = struct.Struct(wire.RESP_SHM_HANDLE_FORMAT)
STAT = struct.Struct(wire.RESP_SHM_STAT_FORMAT)
P = wire.PAGE_SIZE


def code(raw, command, data=b""):
    return raw.call(command, data)[0][0]


def shm_get(raw, key, size, **kw):
    hdr, body, used = raw.call(cmd(wire.CMD_SHM_GET, (key, size, 0), **kw))
    assert hdr[0] == wire.RESP_OK_SHM and used == wire.CTRL_HDR_SIZE + SHM.size, hdr
    return SHM.unpack_from(body)


def attach(raw, ctx, shm_id, flags=0):
    hdr, body, used = raw.call(cmd(wire.CMD_SHM_ATTACH, (shm_id, flags), ctx_id=ctx))
    assert hdr[0] == wire.RESP_OK_SHM_ATTACH and used == wire.CTRL_HDR_SIZE + ATTACH.size, hdr
    return ATTACH.unpack_from(body)


def stat(raw, shm_id, ctx=0):
    hdr, body, used = raw.call(cmd(wire.CMD_SHM_CONTROL, (shm_id, wire.SHM_CTL_STAT), ctx_id=ctx))
    assert hdr[0] == wire.RESP_OK_SHM_STAT and used == wire.CTRL_HDR_SIZE + STAT.size, hdr
    return STAT.unpack_from(body)


def export(raw, shm_id):
    hdr, body, used = raw.call(cmd(wire.CMD_SHM_EXPORT, (shm_id,)))
    assert hdr[0] == wire.RESP_OK_SHM_HANDLE and used == wire.CTRL_HDR_SIZE + HANDLE.size, hdr
    return HANDLE.unpack_from(body)


def import_(raw, handle, token):
    hdr, body, used = raw.call(cmd(wire.CMD_SHM_IMPORT, (handle, token)))
    assert hdr[0] == wire.RESP_OK_SHM and used == wire.CTRL_HDR_SIZE + SHM.size, hdr
    return SHM.unpack_from(body)


@check("CMD-SHM-GET-1", "CMD-SHM-GET-2", "CMD-SHM-1", "CMD-SHM-8")
def cmd_shm_get_layout_keys_and_sizes(raw):
    """[CMD-SHM-GET-1] [CMD-SHM-GET-2] [CMD-SHM-1] [CMD-SHM-8]"""
    shm_id, flags, size = shm_get(raw, 0xABCDEF, 5000)
    assert shm_id != 0 and flags == wire.SHM_FLAG_CREATED and size == 2 * P
    hdr, body, _ = raw.call(cmd(wire.CMD_SHM_GET, (0xABCDEF, 2 * P, 0), ctx_id=77, fence_id=5))
    assert hdr == (wire.RESP_OK_SHM, wire.FLAG_FENCE, 5, 77, 0)  # at once, fence echoed
    assert SHM.unpack_from(body) == (shm_id, 0, 2 * P)  # the same segment, same id
    assert shm_get(raw, 0xABCDEF, 0) == (shm_id, 0, 2 * P)  # size 0 looks up
    assert shm_get(raw, 0xABCDEF, 8000) == (shm_id, 0, 2 * P)  # equal once rounded
    p1, p2 = shm_get(raw, wire.SHM_KEY_PRIVATE, P), shm_get(raw, wire.SHM_KEY_PRIVATE, P)
    assert p1[1] == p2[1] == wire.SHM_FLAG_CREATED and len({p1[0], p2[0], shm_id}) == 3
    assert code(raw, cmd(wire.CMD_SHM_GET, (0xABCDEF, 3 * P, 0))) == wire.RESP_ERR_INVALID_PARAMETER
    assert code(raw, cmd(wire.CMD_SHM_GET, (1, P, 1))) == wire.RESP_ERR_INVALID_PARAMETER
    assert code(raw, cmd(wire.CMD_SHM_GET, (0x5151, 0, 0))) == wire.RESP_ERR_INVALID_SEGMENT
    assert code(raw, cmd(wire.CMD_SHM_GET, (2, 1 << 50, 0))) == wire.RESP_ERR_OUT_OF_MEMORY
    for s in (shm_id, p1[0], p2[0]):
        assert code(raw, cmd(wire.CMD_SHM_CONTROL, (s, wire.SHM_CTL_RMID))) == wire.RESP_OK_NODATA


@check("CMD-SHM-ATTACH-1", "CMD-SHM-ATTACH-2", "CMD-SHM-3", "CMD-VA-2", "CMD-CHECK-1")
def cmd_shm_attach_maps_the_same_memory_in_two_contexts(raw):
    """[CMD-SHM-ATTACH-1] [CMD-SHM-ATTACH-2] [CMD-SHM-3] [CMD-VA-2]"""
    c1, c2 = raw.context(), raw.context()
    own, _ = raw.alloc(c1, P, 1)
    shm_id, _, size = shm_get(raw, 11, 3 * P)
    va1, s1 = attach(raw, c1, shm_id)
    va2, _ = attach(raw, c2, shm_id)
    assert s1 == size == 3 * P
    assert wire.VA_USER_BASE <= va1 < wire.VA_USER_LIMIT and va1 % P == 0
    assert va1 + size <= own or own + P <= va1  # no overlap with the context's allocation
    data = np.arange(3 * P // 4, dtype=np.float32).tobytes()
    assert h2d(raw, c1, va1, data)[0][0] == wire.RESP_OK_NODATA
    assert d2h(raw, c2, va2, 3 * P) == data  # written through c1, read through c2
    assert stat(raw, shm_id, ctx=c2) == (3 * P, va2, 2, wire.SHM_STAT_CREATOR)
    assert stat(raw, shm_id) == (3 * P, 0, 2, wire.SHM_STAT_CREATOR)
    # errors
    assert code(raw, cmd(wire.CMD_SHM_ATTACH, (shm_id, 0), ctx_id=c1)) == wire.RESP_ERR_INVALID_PARAMETER
    assert code(raw, cmd(wire.CMD_SHM_ATTACH, (shm_id, 4), ctx_id=raw.context())) == \
        wire.RESP_ERR_INVALID_PARAMETER
    for bad in (0, shm_id + 999):
        assert code(raw, cmd(wire.CMD_SHM_ATTACH, (bad, 0), ctx_id=c1)) == wire.RESP_ERR_INVALID_SEGMENT
    assert code(raw, cmd(wire.CMD_SHM_ATTACH, (shm_id, 0), ctx_id=4242)) == \
        wire.RESP_ERR_INVALID_CONTEXT_ID  # CMD-CHECK-1: SHM_ATTACH needs a context
    assert code(raw, cmd(wire.CMD_SHM_CONTROL, (shm_id, wire.SHM_CTL_RMID))) == wire.RESP_OK_NODATA


@check("CMD-SHM-ATTACH-2", "CMD-FAULT-1")
def cmd_shm_attach_read_only_faults_on_write(raw):
    """[CMD-SHM-ATTACH-2] [CMD-FAULT-1]"""
    ctx = raw.context()
    shm_id, _, _ = shm_get(raw, wire.SHM_KEY_PRIVATE, P)
    va, _ = attach(raw, ctx, shm_id, wire.SHM_ATTACH_RDONLY)
    hdr, body, _ = raw.call(cmd(wire.CMD_COPY_H2D, (va, 16), ctx_id=ctx), b"\1" * 16)
    assert hdr[0] == wire.RESP_ERR_PAGE_FAULT
    info0, info1, _ = struct.unpack_from(wire.RESP_ERROR_FORMAT, body)
    assert (info0, info1) == (va, wire.ACCESS_WRITE)
    assert d2h(raw, ctx, va, 16) == bytes(16)  # reads work (and nothing was written)
    raw.call(cmd(wire.CMD_SHM_CONTROL, (shm_id, wire.SHM_CTL_RMID)))


@check("CMD-SHM-DETACH-1", "CMD-SHM-DETACH-2")
def cmd_shm_detach(raw):
    """[CMD-SHM-DETACH-1] [CMD-SHM-DETACH-2]"""
    ctx = raw.context()
    shm_id, _, _ = shm_get(raw, 12, P)
    attach(raw, ctx, shm_id)
    hdr, _, used = raw.call(cmd(wire.CMD_SHM_DETACH, (shm_id,), ctx_id=ctx, fence_id=3))
    assert hdr == (wire.RESP_OK_NODATA, wire.FLAG_FENCE, 3, ctx, 0) and used == wire.CTRL_HDR_SIZE
    assert stat(raw, shm_id, ctx) == (P, 0, 0, wire.SHM_STAT_CREATOR)
    assert code(raw, cmd(wire.CMD_SHM_DETACH, (shm_id,), ctx_id=ctx)) == wire.RESP_ERR_INVALID_SEGMENT
    assert code(raw, cmd(wire.CMD_SHM_DETACH, (shm_id + 999,), ctx_id=ctx)) == \
        wire.RESP_ERR_INVALID_SEGMENT
    attach(raw, ctx, shm_id)  # may be attached again
    raw.call(cmd(wire.CMD_SHM_CONTROL, (shm_id, wire.SHM_CTL_RMID)))


@check("CMD-SHM-CONTROL-1", "CMD-SHM-CONTROL-2", "CMD-SHM-5", "CMD-SHM-2", "CMD-SHM-6")
def cmd_shm_control_remove_while_attached(raw):
    """[CMD-SHM-CONTROL-1] [CMD-SHM-CONTROL-2] [CMD-SHM-5] [CMD-SHM-2]"""
    c1, c2 = raw.context(), raw.context()
    shm_id, _, _ = shm_get(raw, 13, P)
    va, _ = attach(raw, c1, shm_id)
    assert h2d(raw, c1, va, b"\7" * 64)[0][0] == wire.RESP_OK_NODATA
    assert code(raw, cmd(wire.CMD_SHM_CONTROL, (shm_id, 9))) == wire.RESP_ERR_INVALID_PARAMETER
    assert code(raw, cmd(wire.CMD_SHM_CONTROL, (0, wire.SHM_CTL_STAT))) == wire.RESP_ERR_INVALID_SEGMENT
    for _ in range(2):  # removing a removed segment has no further effect
        assert code(raw, cmd(wire.CMD_SHM_CONTROL, (shm_id, wire.SHM_CTL_RMID))) == wire.RESP_OK_NODATA
    assert stat(raw, shm_id, c1) == (P, va, 1, wire.SHM_STAT_REMOVED | wire.SHM_STAT_CREATOR)
    assert code(raw, cmd(wire.CMD_SHM_ATTACH, (shm_id, 0), ctx_id=c2)) == wire.RESP_ERR_INVALID_SEGMENT
    assert code(raw, cmd(wire.CMD_SHM_EXPORT, (shm_id,))) == wire.RESP_ERR_INVALID_SEGMENT
    assert code(raw, cmd(wire.CMD_SHM_GET, (13, 0, 0))) == wire.RESP_ERR_INVALID_SEGMENT  # key freed
    assert d2h(raw, c1, va, 64) == b"\7" * 64  # the attachment works unchanged
    new_id, flags, _ = shm_get(raw, 13, P)
    assert flags == wire.SHM_FLAG_CREATED and new_id != shm_id
    assert code(raw, cmd(wire.CMD_SHM_DETACH, (shm_id,), ctx_id=c1)) == wire.RESP_OK_NODATA
    # removed and detached by all: the id is no longer valid
    assert code(raw, cmd(wire.CMD_SHM_CONTROL, (shm_id, wire.SHM_CTL_STAT))) == \
        wire.RESP_ERR_INVALID_SEGMENT
    # CMD-SHM-6: its memory does not show up in a new segment
    va2, _ = attach(raw, c2, new_id)
    assert b"\7" * 64 not in d2h(raw, c2, va2, P)
    raw.call(cmd(wire.CMD_SHM_CONTROL, (new_id, wire.SHM_CTL_RMID)))


@check("CMD-SHM-EXPORT-1", "CMD-SHM-EXPORT-2", "CMD-SHM-IMPORT-1", "CMD-SHM-IMPORT-2",
       "CMD-SHM-2", "CMD-SHM-4", "DEV-ISOLATE-1")
def cmd_shm_export_import_between_sessions(two):
    """[CMD-SHM-EXPORT-1] [CMD-SHM-EXPORT-2] [CMD-SHM-IMPORT-1] [CMD-SHM-IMPORT-2]
    [CMD-SHM-2] [CMD-SHM-4] [DEV-ISOLATE-1]"""
    a, b = two
    ca, cb = a.context(), b.context()
    shm_a, _, _ = shm_get(a, 21, 2 * P)
    va_a, _ = attach(a, ca, shm_a)
    assert h2d(a, ca, va_a, b"\x42" * P)[0][0] == wire.RESP_OK_NODATA
    # keys are private: B's key 21 names no segment, or another one
    assert code(b, cmd(wire.CMD_SHM_GET, (21, 0, 0))) == wire.RESP_ERR_INVALID_SEGMENT
    shm_b, flags, _ = shm_get(b, 21, 2 * P)
    assert flags == wire.SHM_FLAG_CREATED
    # ids are per session: the same number in B names B's own segment, not A's
    vb, _ = attach(b, cb, shm_b)
    assert d2h(b, cb, vb, 16) != b"\x42" * 16
    handle, token = export(a, shm_a)
    assert export(a, shm_a) == (handle, token)  # the same handle while the export lives
    # unknown handle and wrong token are the same refusal
    assert code(b, cmd(wire.CMD_SHM_IMPORT, (handle, token ^ 1))) == wire.RESP_ERR_PERMISSION
    assert code(b, cmd(wire.CMD_SHM_IMPORT, (handle + 12345, token))) == wire.RESP_ERR_PERMISSION
    imp, flags, size = import_(b, handle, token)
    assert flags == 0 and size == 2 * P and import_(b, handle, token)[0] == imp
    va_b, _ = attach(b, cb, imp)
    assert d2h(b, cb, va_b, P) == b"\x42" * P  # the creator's data
    assert h2d(b, cb, va_b + P, b"\x24" * 64)[0][0] == wire.RESP_OK_NODATA
    assert d2h(a, ca, va_a + P, 64) == b"\x24" * 64  # and the importer's, back
    assert stat(b, imp, cb) == (2 * P, va_b, 2, 0)
    # only the creator removes or exports
    assert code(b, cmd(wire.CMD_SHM_CONTROL, (imp, wire.SHM_CTL_RMID))) == wire.RESP_ERR_PERMISSION
    assert code(b, cmd(wire.CMD_SHM_EXPORT, (imp,))) == wire.RESP_ERR_PERMISSION
    # a handle is valid on its device only
    other = Raw(b.conn, dev=1)
    assert code(other, cmd(wire.CMD_SHM_IMPORT, (handle, token))) == wire.RESP_ERR_PERMISSION
    # removal withdraws the export
    assert code(a, cmd(wire.CMD_SHM_CONTROL, (shm_a, wire.SHM_CTL_RMID))) == wire.RESP_OK_NODATA
    assert code(b, cmd(wire.CMD_SHM_IMPORT, (handle, token))) == wire.RESP_ERR_PERMISSION
    for raw_, ctx, sid in ((a, ca, shm_a), (b, cb, imp), (b, cb, shm_b)):
        assert code(raw_, cmd(wire.CMD_SHM_DETACH, (sid,), ctx_id=ctx)) == wire.RESP_OK_NODATA
    b.call(cmd(wire.CMD_SHM_CONTROL, (shm_b, wire.SHM_CTL_RMID)))


@check("CTL-RECLAIM-5", "CMD-SHM-5")
def ctl_reclaim_5_a_reclaimed_creator_leaves_importers_attached(ctx):
    """[CTL-RECLAIM-5] [CMD-SHM-5]"""
    with ctx.connect(memory="inline", mem_size=16 << 20) as gb:
        b = Raw(gb)
        cb = b.context()
        with ctx.connect(mem_size=16 << 20) as ga:
            a = Raw(ga)
            ca = a.context()
            shm_a, _, _ = shm_get(a, 31, P)
            va_a, _ = attach(a, ca, shm_a)
            assert h2d(a, ca, va_a, b"\x99" * 128)[0][0] == wire.RESP_OK_NODATA
            handle, token = export(a, shm_a)
            imp, _, _ = import_(b, handle, token)
            va_b, _ = attach(b, cb, imp)
        # the creator said bye: removed, its export withdrawn, B's attachment unchanged
        assert stat(b, imp, cb) == (P, va_b, 1, wire.SHM_STAT_REMOVED)
        assert d2h(b, cb, va_b, 128) == b"\x99" * 128
        assert code(b, cmd(wire.CMD_SHM_IMPORT, (handle, token))) == wire.RESP_ERR_PERMISSION
        assert code(b, cmd(wire.CMD_SHM_DETACH, (imp,), ctx_id=cb)) == wire.RESP_OK_NODATA
        assert code(b, cmd(wire.CMD_SHM_CONTROL, (imp, wire.SHM_CTL_STAT))) == \
            wire.RESP_ERR_INVALID_SEGMENT


@check("CTL-RECLAIM-5", "DEV-RESET-1")
def ctl_reclaim_5_device_reset_removes_the_sessions_segments(ctx):
    """[CTL-RECLAIM-5] [DEV-RESET-1]"""
    with ctx.connect(mem_size=16 << 20) as ga, \
            ctx.connect(memory="inline", mem_size=16 << 20) as gb:
        a, b = Raw(ga), Raw(gb)
        ca, cb = a.context(), b.context()
        shm_a, _, _ = shm_get(a, 41, P)
        attach(a, ca, shm_a)
        imp, _, _ = import_(b, *export(a, shm_a))
        attach(b, cb, imp)
        ga.devices[0].reset()
        assert stat(b, imp, cb)[2:] == (1, wire.SHM_STAT_REMOVED)  # A's attachment went too
        a.ctx_ids = iter(range(500, 600))
        a.context()
        assert code(a, cmd(wire.CMD_SHM_CONTROL, (shm_a, wire.SHM_CTL_STAT))) == \
            wire.RESP_ERR_INVALID_SEGMENT  # ids forgotten
        assert code(a, cmd(wire.CMD_SHM_GET, (41, 0, 0))) == wire.RESP_ERR_INVALID_SEGMENT
        assert code(b, cmd(wire.CMD_SHM_DETACH, (imp,), ctx_id=cb)) == wire.RESP_OK_NODATA
