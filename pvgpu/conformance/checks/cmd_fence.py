"""spec §6 and §7 — device commands, timelines, fences and held chains (clauses CMD-*,
FENCE-*), black-box through the virtqueue: requests are raw bytes, responses are read
back raw, so every header field the device writes is checked."""

import struct

import numpy as np

from pvgpu.spec import wire

from pvgpu.conformance.burns import with_longer_burns
from pvgpu.conformance.rawdevice import HDR, cmd, completes, launch
from pvgpu.conformance.registry import check


@check("CMD-RESP-1", "ERR-RESP-3")
def cmd_resp_1_header_echo(raw):
    ctx = raw.context()
    hdr, _, n = raw.call(cmd(wire.CMD_NOP, ctx_id=ctx, fence_id=0xABCDEF0123, ring_idx=7,
                             flags=wire.FLAG_INFO_RING_IDX))
    assert hdr == (wire.RESP_OK_NODATA, wire.FLAG_FENCE | wire.FLAG_INFO_RING_IDX, 0xABCDEF0123, ctx, 7)
    assert n == wire.CTRL_HDR_SIZE
    hdr, body, _ = raw.call(cmd(wire.CMD_MEM_FREE, (999,), ctx_id=ctx, fence_id=5, ring_idx=3))
    assert hdr == (wire.RESP_ERR_INVALID_RESOURCE_ID, wire.FLAG_FENCE, 5, ctx, 3)
    info0, info1, mlen = struct.unpack_from(wire.RESP_ERROR_FORMAT, body)
    assert (info0, info1) == (0, 0) and 0 < mlen <= wire.MAX_ERROR_MESSAGE  # ERR-RESP-3
    hdr, _, _ = raw.call(b"\x01" * 10)  # shorter than a header: nothing to echo
    assert hdr == (wire.RESP_ERR_SHORT_COMMAND, 0, 0, 0, 0)


@check("CMD-CHECK-1")
def cmd_check_1_order(raw):
    # ring_idx is checked before the context, the body length before both
    assert raw.call(cmd(wire.CMD_NOP, ctx_id=4242, ring_idx=64))[0][0] == wire.RESP_ERR_INVALID_PARAMETER
    short = cmd(wire.CMD_MEM_ALLOC, (1, 0, 4096), ctx_id=4242, ring_idx=64)[:30]
    assert raw.call(short)[0][0] == wire.RESP_ERR_SHORT_COMMAND
    assert raw.call(cmd(wire.CMD_COPY_D2D, (0, 0, 4), ctx_id=4242))[0][0] == wire.RESP_ERR_INVALID_CONTEXT_ID
    assert raw.call(HDR.pack(0x0499, 0, 0, 4242, 64))[0][0] == wire.RESP_ERR_UNKNOWN_COMMAND


@check("CMD-ALLOC-1", "CMD-ALLOC-2", "CMD-VA-1", "CMD-FREE-1", "CMD-FREE-2")
def cmd_alloc_free_ids_and_layout(raw):
    ctx = raw.context()
    va1, size1 = raw.alloc(ctx, 5000, 11)
    va2, _ = raw.alloc(ctx, 1, 12)
    assert size1 == 8192 and wire.VA_USER_BASE <= va1 < wire.VA_USER_LIMIT  # CMD-VA-1, ALLOC-2
    assert va2 >= va1 + size1 or va2 + 4096 <= va1
    assert raw.call(cmd(wire.CMD_MEM_ALLOC, (11, 0, 4096), ctx_id=ctx))[0][0] == wire.RESP_ERR_INVALID_RESOURCE_ID
    assert raw.call(cmd(wire.CMD_MEM_ALLOC, (13, 2, 4096), ctx_id=ctx))[0][0] == wire.RESP_ERR_INVALID_PARAMETER
    assert raw.call(cmd(wire.CMD_MEM_FREE, (11,), ctx_id=ctx))[0][0] == wire.RESP_OK_NODATA
    raw.alloc(ctx, 4096, 11)  # CMD-FREE-2: the id is free again
    other = raw.context()  # CMD-FREE-1: a resource belongs to its context
    assert raw.call(cmd(wire.CMD_MEM_FREE, (12,), ctx_id=other))[0][0] == wire.RESP_ERR_INVALID_RESOURCE_ID


@check("CMD-H2D-1", "CMD-D2H-2", "CMD-FAULT-3")
def cmd_h2d_d2h_d2d_and_used_len(raw):
    ctx = raw.context()
    a, _ = raw.alloc(ctx, 4096, 1)
    b, _ = raw.alloc(ctx, 4096, 2)
    data = np.arange(1024, dtype=np.float32).tobytes()
    assert raw.call(cmd(wire.CMD_COPY_H2D, (a, 4096), ctx_id=ctx), data)[0][0] == wire.RESP_OK_NODATA
    assert raw.call(cmd(wire.CMD_COPY_H2D, (a, 4096), ctx_id=ctx), data[:100])[0][0] == \
        wire.RESP_ERR_INVALID_PARAMETER  # CMD-H2D-1: fewer data bytes than size
    assert raw.call(cmd(wire.CMD_COPY_D2D, (a, b, 4096), ctx_id=ctx, fence_id=1))[0][0] == wire.RESP_OK_NODATA
    hdr, body, used = raw.call(cmd(wire.CMD_COPY_D2H, (b, 4096), ctx_id=ctx), read_back=4096)
    assert hdr[0] == wire.RESP_OK_NODATA and used == wire.CTRL_HDR_SIZE + 4096  # CMD-D2H-2
    assert body[:4096] == data
    for bad in ((a, 0), (a, wire.VA_USER_LIMIT + 1)):  # CMD-FAULT-3
        assert raw.call(cmd(wire.CMD_COPY_D2D, (*bad[:1], b, bad[1]), ctx_id=ctx))[0][0] == \
            wire.RESP_ERR_INVALID_PARAMETER


@check("CMD-FAULT-2")
def cmd_fault_2_a_faulting_copy_writes_nothing(raw):
    ctx = raw.context()
    a, size = raw.alloc(ctx, 4096, 1)
    zero = bytes(4096)
    # the copy's last page lies past the buffer (the allocator leaves a guard page)
    hdr, body, _ = raw.call(cmd(wire.CMD_COPY_H2D, (a, 8192), ctx_id=ctx), b"\xff" * 8192)
    assert hdr[0] == wire.RESP_ERR_PAGE_FAULT
    info0, info1, _ = struct.unpack_from(wire.RESP_ERROR_FORMAT, body)
    assert info0 == a + 4096 and info1 == wire.ACCESS_WRITE
    hdr, body, _ = raw.call(cmd(wire.CMD_COPY_D2H, (a, 4096), ctx_id=ctx), read_back=4096)
    assert hdr[0] == wire.RESP_OK_NODATA and body[:4096] == zero


@check("FENCE-TIMELINE-2", "FENCE-SIGNAL-2")
def fence_timeline_2_order_across_engines(raw):
    """A fill on the compute engine, a D2D on the copy engine, a D2H: in order."""
    ctx = raw.context()
    a, _ = raw.alloc(ctx, 4096, 1)
    b, _ = raw.alloc(ctx, 4096, 2)
    reqs = [raw.submit(launch(wire.KERNEL_BURN, 50_000, ctx_id=ctx)),
            raw.submit(launch(wire.KERNEL_FILL, a, 7.0, 64, ctx_id=ctx)),
            raw.submit(cmd(wire.CMD_COPY_D2D, (a, b, 256), ctx_id=ctx))]
    hdr, body, _ = raw.call(cmd(wire.CMD_COPY_D2H, (b, 256), ctx_id=ctx), read_back=256)
    assert hdr[0] == wire.RESP_OK_NODATA
    assert np.frombuffer(body[:256], np.float32).tolist() == [7.0] * 64
    assert all(raw.wait(r)[0][0] == wire.RESP_OK_NODATA for r in reqs)  # FENCE-SIGNAL-2


@check("FENCE-SIGNAL-1", "FENCE-SIGNAL-2", "FENCE-TIMELINE-1", "FENCE-HOLD-2", "CMD-CHECK-2")
def fence_signal_held_and_other_timelines_independent(raw):
    ctx = raw.context()

    def attempt(burn_us):
        order = []
        burn = completes(order, "burn", raw.submit(launch(wire.KERNEL_BURN, burn_us, ctx_id=ctx)))
        sync0 = completes(order, "sync0", raw.submit(cmd(wire.CMD_NOP, ctx_id=ctx, fence_id=1)))
        # FENCE-TIMELINE-1: ring 1 is another timeline; FENCE-HOLD-2: held chains block nothing
        other = completes(order, "ring1", raw.submit(cmd(wire.CMD_NOP, ctx_id=ctx, ring_idx=1,
                                                         fence_id=2)))
        assert raw.wait(other)[0][0] == wire.RESP_OK_NODATA
        info = completes(order, "info", raw.submit(cmd(wire.CMD_GET_DEVICE_INFO)))
        assert raw.wait(info)[0][0] == wire.RESP_OK_DEVICE_INFO
        # CMD-CHECK-2: a rejected fenced command is answered at once, not after the burn
        bad = completes(order, "rejected", raw.submit(cmd(wire.CMD_NOP, ctx_id=ctx, ring_idx=99,
                                                          fence_id=3)))
        assert raw.wait(bad)[0][0] == wire.RESP_ERR_INVALID_PARAMETER
        assert raw.wait(burn)[0][0] == wire.RESP_OK_NODATA
        assert raw.wait(sync0)[0] == (wire.RESP_OK_NODATA, wire.FLAG_FENCE, 1, ctx, 0)
        if order[-1] != "sync0":
            return False  # the burn was over before the later chains were taken
        # FENCE-SIGNAL-2: the launch was answered at once; FENCE-SIGNAL-1: the fenced NOP
        # was held behind the burn while the later chains were answered
        assert order == ["burn", "ring1", "info", "rejected", "sync0"]
        return True
    with_longer_burns(attempt)


@check("FENCE-ERROR-1", "FENCE-ERROR-2")
def fence_error_first_wins_and_survives_rejections(raw):
    ctx = raw.context()
    bad1, bad2 = 0x2000_0000_0000, 0x2100_0000_0000
    raw.call(launch(wire.KERNEL_FILL, bad1, 1.0, 64, ctx_id=ctx))
    raw.call(launch(wire.KERNEL_FILL, bad2, 1.0, 64, ctx_id=ctx))
    # a command rejected by its checks leaves the remembered error in place
    assert raw.call(cmd(wire.CMD_COPY_D2D, (0, 0, 0), ctx_id=ctx, fence_id=1))[0][0] == \
        wire.RESP_ERR_INVALID_PARAMETER
    hdr, body, _ = raw.call(cmd(wire.CMD_NOP, ctx_id=ctx, fence_id=2))
    assert hdr[0] == wire.RESP_ERR_PAGE_FAULT and hdr[2] == 2
    assert struct.unpack_from(wire.RESP_ERROR_FORMAT, body)[0] == bad1  # the first error
    assert raw.call(cmd(wire.CMD_NOP, ctx_id=ctx, fence_id=3))[0][0] == wire.RESP_OK_NODATA


@check("FENCE-ERROR-3")
def fence_error_3_errors_die_with_their_context(raw):
    ctx = raw.context()
    raw.call(launch(wire.KERNEL_FILL, 0x2000_0000_0000, 1.0, 64, ctx_id=ctx))
    assert raw.call(cmd(wire.CMD_CTX_DESTROY, ctx_id=ctx))[0][0] == wire.RESP_OK_NODATA
    assert raw.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=ctx))[0][0] == wire.RESP_OK_NODATA
    assert raw.call(cmd(wire.CMD_NOP, ctx_id=ctx, fence_id=1))[0][0] == wire.RESP_OK_NODATA


@check("CMD-VA-2")
def cmd_va_2_allocations_are_private_to_their_context(raw):
    a_ctx, b_ctx = raw.context(), raw.context()
    va, _ = raw.alloc(a_ctx, 4096, 1)
    hdr, body, _ = raw.call(cmd(wire.CMD_COPY_D2H, (va, 64), ctx_id=b_ctx), read_back=64)
    assert hdr[0] == wire.RESP_ERR_PAGE_FAULT  # same VA, other context: not mapped


@check("CMD-CTX-CREATE-1")
def cmd_ctx_create_1_flags_beyond_a_priority_are_invalid(raw):
    for flags in (3, 4, 0x100, 0xFFFFFFFF):
        ctx = next(raw.ctx_ids)
        hdr = raw.call(cmd(wire.CMD_CTX_CREATE, (flags, b""), ctx_id=ctx))[0]
        assert hdr[0] == wire.RESP_ERR_INVALID_PARAMETER, flags
        # nothing was created: the id is still free
        assert raw.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=ctx))[0][0] == wire.RESP_OK_NODATA


@check("CMD-CTX-CREATE-3")
def cmd_ctx_create_3_priorities_are_accepted(raw):
    for priority in (wire.CTX_PRIORITY_NORMAL, wire.CTX_PRIORITY_LOW, wire.CTX_PRIORITY_HIGH):
        ctx = next(raw.ctx_ids)
        assert raw.call(cmd(wire.CMD_CTX_CREATE, (priority, b"p"), ctx_id=ctx))[0][0] == \
            wire.RESP_OK_NODATA, priority
        assert raw.call(launch(wire.KERNEL_BURN, 1, ctx_id=ctx, fence_id=1))[0][0] == wire.RESP_OK_NODATA
