"""spec §6.5.25–§6.5.28 and §6.7 — explicit VA management: VA_RESERVE, VA_RELEASE,
MEM_MAP, MEM_UNMAP (clauses CMD-VA-*, CMD-FREE-3, CMD-FAULT-4), black-box through the
virtqueue in both memory models: requests are raw bytes, responses are read back raw."""

import struct

import msgpack
import numpy as np

from pvgpu.spec import wire

from pvgpu.conformance.rawdevice import cmd, d2h, h2d, launch
from pvgpu.conformance.registry import check

VA = struct.Struct(wire.RESP_VA_FORMAT)
ERR = struct.Struct(wire.RESP_ERROR_FORMAT)
P = wire.PAGE_SIZE
R, RW = wire.MEM_MAP_ACCESS_READ, wire.MEM_MAP_ACCESS_READ | wire.MEM_MAP_ACCESS_WRITE


def code(raw, command, data=b""):
    return raw.call(command, data)[0][0]


def reserve(raw, ctx, size, align=0, **kw):
    hdr, body, used = raw.call(cmd(wire.CMD_VA_RESERVE, (size, align), ctx_id=ctx, **kw))
    assert hdr[0] == wire.RESP_OK_VA and used == wire.CTRL_HDR_SIZE + VA.size, hdr
    return VA.unpack_from(body)


def mem_map(raw, ctx, va, rid, offset=0, size=P, flags=RW):
    return code(raw, cmd(wire.CMD_MEM_MAP, (va, offset, size, rid, flags), ctx_id=ctx))


def fault(resp):
    hdr, body, _ = resp
    assert hdr[0] == wire.RESP_ERR_PAGE_FAULT, hdr
    return ERR.unpack_from(body)[:2]


@check("CMD-VA-RESERVE-1", "CMD-VA-RESERVE-2", "CMD-VA-3", "CMD-VA-5", "CMD-VA-1")
def cmd_va_reserve(raw):
    """[CMD-VA-RESERVE-1] [CMD-VA-RESERVE-2] [CMD-VA-3] [CMD-VA-5] [CMD-VA-1]"""
    ctx = raw.context()
    hdr, body, _ = raw.call(cmd(wire.CMD_VA_RESERVE, (3 * P + 1, 1 << 21), ctx_id=ctx, fence_id=9))
    assert hdr == (wire.RESP_OK_VA, wire.FLAG_FENCE, 9, ctx, 0)  # at once, fence echoed
    va, size = VA.unpack_from(body)
    assert size == 4 * P and va % (1 << 21) == 0
    assert wire.VA_USER_BASE <= va and va + size <= wire.VA_USER_LIMIT
    own, _ = raw.alloc(ctx, P, 1)
    assert not va <= own < va + size  # allocations never land in a reservation
    assert fault(h2d(raw, ctx, va, b"\1" * 16)) == (va, wire.ACCESS_WRITE)  # nothing mapped
    for bad in ((0, 0), (P, 3 * P), (P, P // 2), (P, wire.MAX_VA_ALIGN * 2),
                (wire.VA_USER_LIMIT, 0)):
        assert code(raw, cmd(wire.CMD_VA_RESERVE, bad, ctx_id=ctx)) == \
            wire.RESP_ERR_INVALID_PARAMETER, bad
    assert code(raw, cmd(wire.CMD_VA_RESERVE, (P, 0), ctx_id=4242)) == \
        wire.RESP_ERR_INVALID_CONTEXT_ID
    assert code(raw, cmd(wire.CMD_VA_RESERVE, (wire.VA_USER_LIMIT - wire.VA_USER_BASE, 0), ctx_id=ctx)) == \
        wire.RESP_ERR_OUT_OF_MEMORY
    va2, _ = reserve(raw, ctx, P)
    assert va2 >= va + size or va2 + P <= va  # reservations do not overlap


@check("CMD-VA-RELEASE-1", "CMD-VA-RELEASE-2")
def cmd_va_release(raw):
    """[CMD-VA-RELEASE-1] [CMD-VA-RELEASE-2]"""
    ctx = raw.context()
    va, _ = reserve(raw, ctx, 2 * P)
    rid = 7
    raw.alloc(ctx, P, rid)
    assert mem_map(raw, ctx, va, rid) == wire.RESP_OK_NODATA
    assert code(raw, cmd(wire.CMD_VA_RELEASE, (va,), ctx_id=ctx)) == wire.RESP_ERR_INVALID_PARAMETER
    assert code(raw, cmd(wire.CMD_MEM_UNMAP, (va,), ctx_id=ctx)) == wire.RESP_OK_NODATA
    assert code(raw, cmd(wire.CMD_VA_RELEASE, (va + P,), ctx_id=ctx)) == wire.RESP_ERR_INVALID_ADDRESS
    hdr, _, used = raw.call(cmd(wire.CMD_VA_RELEASE, (va,), ctx_id=ctx, fence_id=4))
    assert hdr == (wire.RESP_OK_NODATA, wire.FLAG_FENCE, 4, ctx, 0) and used == wire.CTRL_HDR_SIZE
    assert code(raw, cmd(wire.CMD_VA_RELEASE, (va,), ctx_id=ctx)) == wire.RESP_ERR_INVALID_ADDRESS
    assert mem_map(raw, ctx, va, rid) == wire.RESP_ERR_INVALID_ADDRESS  # no longer reserved


@check("CMD-VA-MAP-2", "CMD-VA-4", "CMD-VA-2")
def cmd_mem_map_same_memory_at_two_vas(raw):
    """[CMD-VA-MAP-2] [CMD-VA-4] [CMD-VA-2]"""
    ctx = raw.context()
    own, _ = raw.alloc(ctx, 4 * P, 11)
    va, _ = reserve(raw, ctx, 8 * P)
    assert mem_map(raw, ctx, va + P, 11, offset=2 * P, size=2 * P) == wire.RESP_OK_NODATA
    data = np.arange(2 * P // 4, dtype=np.float32).tobytes()
    assert h2d(raw, ctx, own + 2 * P, data)[0][0] == wire.RESP_OK_NODATA
    assert d2h(raw, ctx, va + P, 2 * P) == data  # written at one VA, read at the other
    # a kernel writing through the mapping is seen at the allocation's VA
    assert raw.call(launch(wire.KERNEL_FILL, va + P, 2.0, 64, ctx_id=ctx, fence_id=1))[0][0] == \
        wire.RESP_OK_NODATA
    assert d2h(raw, ctx, own + 2 * P, 256) == np.full(64, 2.0, np.float32).tobytes()
    assert fault(raw.call(cmd(wire.CMD_COPY_D2H, (va, 16), ctx_id=ctx), read_back=16)) == \
        (va, wire.ACCESS_READ)  # the rest of the reservation stays unmapped


@check("CMD-VA-MAP-1", "CMD-CHECK-1")
def cmd_mem_map_checks(raw):
    """[CMD-VA-MAP-1] [CMD-CHECK-1]"""
    ctx, other = raw.context(), raw.context()
    raw.alloc(ctx, 2 * P, 21)
    raw.alloc(other, P, 22)
    va, _ = reserve(raw, ctx, 4 * P)
    assert mem_map(raw, ctx, va, 999) == wire.RESP_ERR_INVALID_RESOURCE_ID
    assert mem_map(raw, ctx, va, 22) == wire.RESP_ERR_INVALID_RESOURCE_ID  # another context's
    for flags in (0, wire.MEM_MAP_ACCESS_WRITE, 4, 7):
        assert mem_map(raw, ctx, va, 21, flags=flags) == wire.RESP_ERR_INVALID_PARAMETER
    for off, size, at in ((0, 0, va), (100, P, va), (0, P + 1, va), (0, P, va + 8), (P, 2 * P, va)):
        assert mem_map(raw, ctx, at, 21, offset=off, size=size) == \
            wire.RESP_ERR_INVALID_PARAMETER, (off, size, at)
    assert mem_map(raw, ctx, va + 3 * P, 21, size=2 * P) == wire.RESP_ERR_INVALID_ADDRESS
    assert mem_map(raw, ctx, wire.VA_USER_BASE, 21) == wire.RESP_ERR_INVALID_ADDRESS
    assert mem_map(raw, ctx, va + P, 21, size=2 * P) == wire.RESP_OK_NODATA
    assert mem_map(raw, ctx, va + 2 * P, 21) == wire.RESP_ERR_INVALID_ADDRESS  # overlap
    assert mem_map(raw, ctx, va, 21, flags=R) == wire.RESP_OK_NODATA  # adjacent is fine
    assert code(raw, cmd(wire.CMD_MEM_MAP, (va, 0, P, 21, RW), ctx_id=4242)) == \
        wire.RESP_ERR_INVALID_CONTEXT_ID


@check("CMD-VA-4", "CMD-FAULT-1", "CMD-FAULT-2", "KRN-FAULT-1", "CMD-FAULT-4")
def cmd_mem_map_read_only_faults_on_write(raw):
    """[CMD-VA-4] [CMD-FAULT-1] [CMD-FAULT-2] [KRN-FAULT-1] [CMD-FAULT-4]"""
    ctx, other = raw.context(), raw.context()
    own, _ = raw.alloc(ctx, P, 31)
    dst, _ = raw.alloc(ctx, P, 32)
    va, _ = reserve(raw, ctx, P)
    assert mem_map(raw, ctx, va, 31, flags=R) == wire.RESP_OK_NODATA
    data = b"\5" * 64
    assert h2d(raw, ctx, own, data)[0][0] == wire.RESP_OK_NODATA
    assert d2h(raw, ctx, va, 64) == data  # reads work
    assert fault(h2d(raw, ctx, va + 32, b"\1" * 16)) == (va + 32, wire.ACCESS_WRITE)
    assert fault(raw.call(cmd(wire.CMD_COPY_D2D, (dst, va, 64), ctx_id=ctx, fence_id=2))) == \
        (va, wire.ACCESS_WRITE)
    assert fault(raw.call(launch(wire.KERNEL_FILL, va, 1.0, 16, ctx_id=ctx, fence_id=3))) == \
        (va, wire.ACCESS_WRITE)
    assert d2h(raw, ctx, own, 64) == data  # nothing was written
    # the context is faulted, not lost; the other context carries on
    assert raw.call(launch(wire.KERNEL_FILL, dst, 1.0, 16, ctx_id=ctx, fence_id=4))[0][0] == \
        wire.RESP_OK_NODATA
    ob, _ = raw.alloc(other, P, 33)
    assert h2d(raw, other, ob, data)[0][0] == wire.RESP_OK_NODATA and d2h(raw, other, ob, 64) == data
    hdr, body, _ = raw.call(cmd(wire.CMD_GET_STATS), read_back=wire.STATS_BUFFER_SIZE)
    (length,) = struct.unpack_from(wire.RESP_STATS_FORMAT, body)
    faults = msgpack.unpackb(body[8:8 + length], raw=False, strict_map_key=False).get("faults")
    if faults is not None:  # informative (pvgpu's host reports it)
        assert faults[ctx]["count"] == 3 and other not in faults


@check("CMD-VA-UNMAP-1", "CMD-VA-UNMAP-2")
def cmd_mem_unmap(raw):
    """[CMD-VA-UNMAP-1] [CMD-VA-UNMAP-2]"""
    ctx = raw.context()
    raw.alloc(ctx, P, 41)
    va, _ = reserve(raw, ctx, 2 * P)
    assert mem_map(raw, ctx, va, 41) == wire.RESP_OK_NODATA
    assert d2h(raw, ctx, va, 16) == bytes(16)  # used once: its translation may be cached
    for bad in (va + P, va + 8, 0):
        assert code(raw, cmd(wire.CMD_MEM_UNMAP, (bad,), ctx_id=ctx)) == wire.RESP_ERR_INVALID_ADDRESS
    hdr, _, used = raw.call(cmd(wire.CMD_MEM_UNMAP, (va,), ctx_id=ctx, fence_id=6))
    assert hdr == (wire.RESP_OK_NODATA, wire.FLAG_FENCE, 6, ctx, 0) and used == wire.CTRL_HDR_SIZE
    # every command taken before it completed (synchronous copies): the range faults now
    assert fault(raw.call(cmd(wire.CMD_COPY_D2H, (va, 16), ctx_id=ctx), read_back=16)) == \
        (va, wire.ACCESS_READ)
    assert code(raw, cmd(wire.CMD_MEM_UNMAP, (va,), ctx_id=ctx)) == wire.RESP_ERR_INVALID_ADDRESS
    assert mem_map(raw, ctx, va, 41, flags=R) == wire.RESP_OK_NODATA  # may be mapped again
    assert d2h(raw, ctx, va, 16) == bytes(16)


@check("CMD-FREE-3", "CMD-FREE-2")
def cmd_mem_free_while_mapped(raw):
    """[CMD-FREE-3] [CMD-FREE-2]"""
    ctx = raw.context()
    raw.alloc(ctx, P, 51)
    va, _ = reserve(raw, ctx, P)
    assert mem_map(raw, ctx, va, 51) == wire.RESP_OK_NODATA
    assert code(raw, cmd(wire.CMD_MEM_FREE, (51,), ctx_id=ctx)) == wire.RESP_ERR_INVALID_PARAMETER
    assert d2h(raw, ctx, va, 16) == bytes(16)  # no effect: still mapped and usable
    assert code(raw, cmd(wire.CMD_MEM_UNMAP, (va,), ctx_id=ctx)) == wire.RESP_OK_NODATA
    assert code(raw, cmd(wire.CMD_MEM_FREE, (51,), ctx_id=ctx)) == wire.RESP_OK_NODATA
    # CTX_DESTROY with live reservations and mappings
    raw.alloc(ctx, P, 52)
    va2, _ = reserve(raw, ctx, P)
    assert mem_map(raw, ctx, va2, 52) == wire.RESP_OK_NODATA
    assert code(raw, cmd(wire.CMD_CTX_DESTROY, ctx_id=ctx)) == wire.RESP_OK_NODATA
