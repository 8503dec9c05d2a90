"""The driver keeps its ledger of clean timelines (guest/frontend/timelines.py) from what it
submits and what comes back: `submit` tells it of every request in the order the chains go
out, `reap` of each sync point's answer (its response type, read from the slot), a reset
forgets; `send_fenced_for_context` sends the held request or the open launch batch fenced as
a whole context's sync point only when every other timeline of that context is clean. The
real FrontendSession and driver over test_kick_policy's in-process inline-model device."""

import struct

import pytest

import test_kick_policy
from pvgpu.guest.frontend.driver import DeviceNeedsReset, DeviceResponseError, command
from pvgpu.spec import wire

from test_driver_held_request import FILL, code_launch, seen, types  # noqa: F401
from test_kick_policy import session  # noqa: F401  (the fixture)

FILL_3_0 = (wire.KERNEL_FILL, 1, 1, 1, 256, 1, 1, 3, 0x1000, 1.0, 256)


def sync_nop(ctx_id=3, ring_idx=0) -> bytes:
    return command(wire.CMD_NOP, ctx_id=ctx_id, ring_idx=ring_idx, fence_id=1,
                   flags=wire.FLAG_INFO_RING_IDX if ring_idx else 0)


def test_work_submitted_is_dirty_until_its_sync_point_is_answered_ok(session):  # noqa: F811
    drv = session.devices[0]
    assert drv.timelines.rings  # the loopback offers PVGPU_F_CONTEXT_INIT
    drv.submit(code_launch(ring_idx=2), kick=False)
    assert not drv.timelines.clean(3, 2) and drv.timelines.clean(3, 0)
    req = drv.submit(sync_nop(ring_idx=2), kick=False)
    assert not drv.timelines.clean(3, 2)  # not answered yet
    assert drv.wait(req) == (wire.RESP_OK_NODATA, b"")
    assert drv.timelines.clean(3, 2)


def test_an_error_answer_leaves_the_timeline_dirty(session, monkeypatch):  # noqa: F811
    drv = session.devices[0]
    drv.call(code_launch())
    err = struct.pack(wire.CTRL_HDR_FORMAT, wire.RESP_ERR_PAGE_FAULT, 0, 0, 3, 0) + bytes(8)
    monkeypatch.setattr(test_kick_policy, "OK", err)  # the device answers with an error
    with pytest.raises(DeviceResponseError):
        drv.call(sync_nop())
    assert not drv.timelines.clean(3, 0)
    monkeypatch.undo()
    drv.call(command(wire.CMD_CTX_SYNC, ctx_id=3))  # answered OK: every timeline of 3
    assert drv.timelines.clean(3, 0)


def test_an_unfenced_nop_is_not_counted(session):  # noqa: F811
    drv = session.devices[0]
    drv.call(command(wire.CMD_NOP, ctx_id=3))
    assert drv.timelines.seq == 0


def test_without_context_init_every_request_is_on_timeline_0(session):  # noqa: F811
    drv = session.devices[0]
    drv.wanted_features &= ~(1 << wire.PVGPU_F_CONTEXT_INIT)
    drv.initialize()
    assert not drv.timelines.rings
    drv.call(code_launch(ring_idx=2))
    assert not drv.timelines.clean(3, 0)
    drv.call(sync_nop(ring_idx=5))
    assert drv.timelines.clean(3, 0)


def test_a_reset_forgets_and_answers_from_before_it_never_count(session):  # noqa: F811
    drv = session.devices[0]
    drv.submit(code_launch(), kick=False)
    drv.submit(sync_nop(), kick=False)  # in flight when the device is reset
    seq = drv.timelines.seq
    drv.initialize()
    assert drv.timelines.clean(3, 0) and drv.timelines.seq == seq
    drv.call(code_launch())
    assert not drv.timelines.clean(3, 0)
    drv.fail_all(DeviceNeedsReset("test"))  # needs a reset: nothing known any more either
    assert drv.timelines.clean(3, 0)
    with pytest.raises(DeviceNeedsReset):
        drv.send_fenced_for_context(3) or drv.call(command(wire.CMD_CTX_SYNC, ctx_id=3))


def test_a_held_launch_is_a_contexts_sync_point_only_with_its_other_timelines_clean(
        session, seen):  # noqa: F811
    drv = session.devices[0]
    drv.call(code_launch(ring_idx=1))  # another timeline of context 3, not synchronized
    drv.hold(code_launch(), (), 3, 0, None)
    assert drv.send_fenced_for_context(4) is None  # another context's: no
    assert drv.send_fenced_for_context(3) is None  # timeline 1 is dirty: CTX_SYNC it is
    assert drv.deferred == 1  # still held
    drv.call(sync_nop(ring_idx=1))  # the held launch goes out first, unfenced
    assert drv.timelines.clean(3, 1) and drv.deferred == 0
    drv.hold(code_launch(), (), 3, 0, None)
    req = drv.send_fenced_for_context(3)
    assert req is not None and drv.wait(req) == (wire.RESP_OK_NODATA, b"")
    assert seen[-1][:3] == (wire.CMD_LAUNCH_CODE, wire.FLAG_FENCE, 1)
    assert drv.timelines.clean(3, 0)


def test_an_open_batch_is_a_contexts_sync_point_only_with_its_other_timelines_clean(
        session, seen):  # noqa: F811
    drv = session.devices[0]
    assert drv.batcher is not None
    drv.launch(3, 0, FILL, FILL_3_0, None)
    drv.call(command(wire.CMD_EVENT_WAIT, (1,), ctx_id=3, ring_idx=2))  # a wait, then nothing
    drv.launch(3, 0, FILL, FILL_3_0, None)
    assert drv.send_fenced_for_context(3) is None and drv.batcher.open is not None
    assert drv.send_fenced_for_context(5) is None
    drv.call(command(wire.CMD_CTX_SYNC, ctx_id=3))  # the batch first; then all of 3 clean
    drv.launch(3, 0, FILL, FILL_3_0, None)
    req = drv.send_fenced_for_context(3)
    assert req is not None and drv.wait(req) == (wire.RESP_OK_NODATA, b"")
    assert types(seen) == [wire.CMD_LAUNCH_BATCH, wire.CMD_EVENT_WAIT, wire.CMD_LAUNCH_BATCH,
                           wire.CMD_CTX_SYNC, wire.CMD_LAUNCH_BATCH]
    assert seen[-1][1] == wire.FLAG_FENCE
