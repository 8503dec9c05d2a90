"""spec §6.5.33 — CMD_LAUNCH_BATCH (clauses CMD-LAUNCH-BATCH-*): black-box through the
virtqueue in both memory models; records are built by hand from the spec's tables."""

import struct

import numpy as np

from pvgpu.spec import wire

from pvgpu.conformance.rawdevice import cmd, d2h, h2d
from pvgpu.conformance.registry import check

ERR = struct.Struct(wire.RESP_ERROR_FORMAT)
N = 256


def _record(kernel_id, grid, slots: bytes, nargs: int, block=N) -> bytes:
    return struct.pack(wire.LAUNCH_RECORD_FORMAT, kernel_id, grid, 1, 1, block, 1, 1, nargs) + slots


def _scale(va, alpha) -> bytes:
    return _record(wire.KERNEL_SCALE, 1, struct.pack("<QQfxxxxQ", va, va, alpha, N), 4)


def _fill(va, value, grid=1) -> bytes:
    return _record(wire.KERNEL_FILL, grid, struct.pack("<QfxxxxQ", va, value, N), 3)


def _batch(ctx, records, count=None, **kw):
    return cmd(wire.CMD_LAUNCH_BATCH, (len(records) if count is None else count,), ctx_id=ctx,
               extra=b"".join(records), **kw)


@check("CMD-LAUNCH-BATCH-3", feature=wire.PVGPU_F_LAUNCH_BATCH)
def cmd_launch_batch_runs_its_records_in_order(raw):
    """[CMD-LAUNCH-BATCH-3]: the records run in order, as timeline work between a copy
    before and a copy after."""
    ctx = raw.context()
    va, _ = raw.alloc(ctx, 4 * N, 1)
    assert h2d(raw, ctx, va, np.arange(N, dtype=np.float32).tobytes())[0][0] == wire.RESP_OK_NODATA
    hdr, _b, _n = raw.call(_batch(ctx, [_scale(va, 2.0), _scale(va, 3.0)]))
    assert hdr[0] == wire.RESP_OK_NODATA
    got = np.frombuffer(d2h(raw, ctx, va, 4 * N), np.float32)
    assert np.array_equal(got, np.arange(N, dtype=np.float32) * 6)
    hdr, _b, _n = raw.call(_batch(ctx, [_fill(va, 1.0), _scale(va, 4.0)], fence_id=3))
    assert hdr == (wire.RESP_OK_NODATA, wire.FLAG_FENCE, 3, ctx, 0)
    assert np.array_equal(np.frombuffer(d2h(raw, ctx, va, 4 * N), np.float32),
                          np.full(N, 4.0, np.float32))


@check("CMD-LAUNCH-BATCH-1", "CMD-LAUNCH-BATCH-2", "CMD-LAUNCH-BATCH-4",
       feature=wire.PVGPU_F_LAUNCH_BATCH)
def cmd_launch_batch_checks_and_faults(raw):
    """[CMD-LAUNCH-BATCH-1] [CMD-LAUNCH-BATCH-2]: a bad count or record fails the whole
    batch with info0 its index, and nothing runs; [CMD-LAUNCH-BATCH-4]: a fault ends it."""
    ctx = raw.context()
    va, _ = raw.alloc(ctx, 4 * N, 1)
    good = _fill(va, 7.0)
    assert raw.call(_batch(ctx, [good], fence_id=1))[0][0] == wire.RESP_OK_NODATA
    for count in (0, wire.MAX_BATCH_LAUNCHES + 1):
        assert raw.call(_batch(ctx, [_fill(va, 1.0)], count=count))[0][0] == \
            wire.RESP_ERR_INVALID_PARAMETER
    bad_kernel = _record(0xFFFF, 1, b"", 0)
    bad_grid = _fill(va, 1.0, grid=0)
    for bad, resp in ((bad_kernel, wire.RESP_ERR_INVALID_KERNEL),
                      (bad_grid, wire.RESP_ERR_INVALID_PARAMETER)):
        hdr, body, _ = raw.call(_batch(ctx, [_fill(va, 1.0), bad, _fill(va, 2.0)]))
        assert hdr[0] == resp and ERR.unpack_from(body)[0] == 1
    hdr, body, _ = raw.call(_batch(ctx, [_fill(va, 1.0)], count=2))
    assert hdr[0] == wire.RESP_ERR_SHORT_COMMAND and ERR.unpack_from(body)[0] == 1
    assert np.array_equal(np.frombuffer(d2h(raw, ctx, va, 4 * N), np.float32),
                          np.full(N, 7.0, np.float32))
    unmapped = 0x3000_0000_0000
    hdr, body, _ = raw.call(_batch(ctx, [_scale(va, 2.0), _fill(unmapped, 1.0), _fill(va, 9.0)],
                                   fence_id=2))
    assert hdr[0] == wire.RESP_ERR_PAGE_FAULT and ERR.unpack_from(body)[0] == unmapped
    assert np.array_equal(np.frombuffer(d2h(raw, ctx, va, 4 * N), np.float32),
                          np.full(N, 14.0, np.float32))
