"""CMD_LAUNCH_BATCH through the backend (spec §6.5.33): the records run in order as one job
on their timeline, a bad record fails the whole batch before anything runs, a fault ends
the batch and is remembered once, and the command exists only with PVGPU_F_LAUNCH_BATCH.
Sans-IO through Backend.handle."""

import struct

import numpy as np
import pytest

from pvgpu.spec import wire

from test_backend import HDR, Guest, _backend, cmd, d2h, h2d, ok

N = 256


@pytest.fixture
def backend():
    yield from _backend(num_gpus=1)


def record(kernel_id, grid, block, slots: bytes, nargs: int) -> bytes:
    return struct.pack(wire.LAUNCH_RECORD_FORMAT, kernel_id, grid, 1, 1, block, 1, 1,
                       nargs) + slots


def fill(va, value, n=N) -> bytes:
    return record(wire.KERNEL_FILL, -(-n // 256), 256, struct.pack("<QfxxxxQ", va, value, n), 3)


def scale(va, alpha, n=N) -> bytes:
    return record(wire.KERNEL_SCALE, -(-n // 256), 256,
                  struct.pack("<QQfxxxxQ", va, va, alpha, n), 4)


def batch(records, ctx_id=1, count=None, **kw):
    return cmd(wire.CMD_LAUNCH_BATCH, (len(records) if count is None else count,),
               ctx_id=ctx_id, extra=b"".join(records), **kw)


def setup(backend):
    g = Guest(backend)
    g.init()
    ok(g, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    body = ok(g, cmd(wire.CMD_MEM_ALLOC, (1, 0, 4 * N), ctx_id=1), resp=wire.RESP_OK_MEM_ALLOC)
    return g, struct.unpack_from(wire.RESP_MEM_ALLOC_FORMAT, body)[0]


def kmd_stats(backend, g):
    ctx = backend.sessions[g.peer].devices[0].compute.contexts[1]
    return ctx.kmd_ctx.stats


def test_the_records_run_in_order_as_one_job(backend):
    # [CMD-LAUNCH-BATCH-3]
    g, va = setup(backend)
    before = dict(kmd_stats(backend, g))
    # 1 -> 2, then 3 -> 6 -> 12 -> 6: in any other order the result differs
    records = [fill(va, 1.0), scale(va, 2.0), fill(va, 3.0), scale(va, 2.0), scale(va, 2.0),
               scale(va, 0.5)]
    ok(g, batch(records, flags=wire.FLAG_FENCE, fence_id=5))  # answered once all completed
    np.testing.assert_array_equal(d2h(g, 1, va, N), np.full(N, 6.0, np.float32))
    after = kmd_stats(backend, g)
    assert after["jobs_submitted"] - before.get("jobs_submitted", 0) == 1 + 1  # and the d2h
    assert after["launches"] - before.get("launches", 0) == len(records)


def test_a_batch_is_timeline_work_ordered_with_the_rest(backend):
    # [CMD-LAUNCH-BATCH-3] a copy after the batch sees its result; the batch sees the copy before
    g, va = setup(backend)
    h2d(g, 1, va, np.arange(N, dtype=np.float32))
    ok(g, batch([scale(va, 2.0), scale(va, 2.0)]))  # unfenced: accepted at once
    np.testing.assert_array_equal(d2h(g, 1, va, N), np.arange(N, dtype=np.float32) * 4)


def test_a_bad_record_fails_the_batch_and_nothing_runs(backend):
    # [CMD-LAUNCH-BATCH-2] [CMD-CHECK-2]
    g, va = setup(backend)
    ok(g, batch([fill(va, 7.0)], flags=wire.FLAG_FENCE, fence_id=1))
    bad = record(wire.KERNEL_FILL, 0, 256, struct.pack("<QfxxxxQ", va, 1.0, N), 3)  # grid 0
    hdr, body = g.call(batch([fill(va, 1.0), scale(va, 3.0), bad, fill(va, 2.0)]))
    assert hdr[0] == wire.RESP_ERR_INVALID_PARAMETER
    assert struct.unpack_from(wire.RESP_ERROR_FORMAT, body)[0] == 2  # info0: the record
    hdr, body = g.call(batch([fill(va, 1.0)] * 3, count=4))  # announces a record it lacks
    assert hdr[0] == wire.RESP_ERR_SHORT_COMMAND
    assert struct.unpack_from(wire.RESP_ERROR_FORMAT, body)[0] == 3
    for count in (0, wire.MAX_BATCH_LAUNCHES + 1):
        hdr, _ = g.call(batch([fill(va, 1.0)], count=count))
        assert hdr[0] == wire.RESP_ERR_INVALID_PARAMETER
    np.testing.assert_array_equal(d2h(g, 1, va, N), np.full(N, 7.0, np.float32))


def test_a_fault_ends_the_batch_and_is_remembered_once(backend):
    # [CMD-LAUNCH-BATCH-4] the records after the faulting one do not run
    g, va = setup(backend)
    ok(g, batch([fill(va, 1.0)], flags=wire.FLAG_FENCE, fence_id=1))
    unmapped = 0x3000_0000_0000
    hdr, _ = g.call(batch([scale(va, 2.0), fill(unmapped, 5.0), fill(va, 9.0)]))
    assert hdr[0] == wire.RESP_OK_NODATA  # accepted
    hdr, body = g.call(cmd(wire.CMD_NOP, ctx_id=1, flags=wire.FLAG_FENCE, fence_id=2))
    assert hdr[0] == wire.RESP_ERR_PAGE_FAULT
    assert struct.unpack_from(wire.RESP_ERROR_FORMAT, body)[0] == unmapped
    hdr, _ = g.call(cmd(wire.CMD_NOP, ctx_id=1, flags=wire.FLAG_FENCE, fence_id=3))
    assert hdr[0] == wire.RESP_OK_NODATA  # reported once
    np.testing.assert_array_equal(d2h(g, 1, va, N), np.full(N, 2.0, np.float32))


def test_without_the_feature_a_batch_is_an_unknown_command(backend):
    # [DEV-FEAT-4] [CMD-CHECK-1] step 2, before the body and ring_idx checks
    g = Guest(backend)
    g.init(features=wire.DEVICE_FEATURES & ~(1 << wire.PVGPU_F_LAUNCH_BATCH))
    ok(g, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    hdr, _ = g.call(batch([fill(0x1000, 1.0)]))
    assert hdr[0] == wire.RESP_ERR_UNKNOWN_COMMAND
    hdr, _ = g.call(HDR.pack(wire.CMD_LAUNCH_BATCH, 0, 0, 1, wire.MAX_RING_IDX + 1) + bytes(2))
    assert hdr[0] == wire.RESP_ERR_UNKNOWN_COMMAND
    g = Guest(backend, name=b"g2")
    g.init(features=wire.DEVICE_FEATURES & ~(1 << wire.PVGPU_F_COMPUTE))
    ok(g, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    hdr, _ = g.call(batch([fill(0x1000, 1.0)]))
    assert hdr[0] == wire.RESP_ERR_UNKNOWN_COMMAND
