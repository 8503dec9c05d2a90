"""The driver's held request (guest/frontend/driver.py `hold`, `send_fenced`): the latest
code launch is kept back, unpublished, and goes out before anything else does -- another
request, a built-in launch joining a batch, the next held request -- and at a kick, so the
device sees the requests in the order the API made them ([CMD-LAUNCH-BATCH-5], §7.1); a
synchronize of its timeline sends it with FLAG_FENCE as its sync point ([FENCE-SIGNAL-1]);
a reset drops it, reported to its on_done. The real FrontendSession and driver over
test_kick_policy's in-process inline-model device, which records the header of each chain
in the order it pops them."""

import struct

import pytest

from pvgpu.guest.frontend.driver import DeviceNeedsReset, command, fenced
from pvgpu.spec import wire

from test_kick_policy import session  # noqa: F401  (the fixture)

HDR = struct.Struct(wire.CTRL_HDR_FORMAT)
FILL = struct.Struct(wire.LAUNCH_RECORD_FORMAT + "QfxxxxQ")  # a built-in launch record
PARAMS = bytes(range(16))


def code_launch(ctx_id=3, ring_idx=0, params=PARAMS) -> bytes:
    flags = wire.FLAG_INFO_RING_IDX if ring_idx else 0
    return command(wire.CMD_LAUNCH_CODE, (0x10000, 0x10040, 1, 1, 1, 256, 1, 1, 0, len(params)),
                   ctx_id=ctx_id, ring_idx=ring_idx, flags=flags, extra=params)


@pytest.fixture
def seen(session):  # noqa: F811
    """(type, flags, fence_id, readable bytes: the command and its data) of each chain, in
    the order the device pops them."""
    ch = session.channel
    queue = ch.device_queue
    pop = queue.pop
    got = []

    def recording_pop():
        chain = pop()
        if chain is not None:
            raw = chain.read(ch.mirror, 0, chain.readable_len)
            typ, flags, fence_id, _ctx, _ring = HDR.unpack_from(raw)
            got.append((typ, flags, fence_id, raw))
        return chain
    queue.pop = recording_pop
    return got


def types(seen) -> list:
    return [typ for typ, *_ in seen]


def test_a_held_launch_is_not_published_until_another_request_goes_out(session, seen):  # noqa: F811
    drv = session.devices[0]
    done = []
    drv.hold(code_launch(), (), 3, 0, done.append)
    assert drv.deferred == 1 and drv.in_flight == 0  # held: not in the avail ring
    assert drv.call(command(wire.CMD_NOP)) == (wire.RESP_OK_NODATA, b"")
    assert types(seen) == [wire.CMD_LAUNCH_CODE, wire.CMD_NOP]  # the launch first
    assert seen[0][1:3] == (0, 0)  # unfenced
    assert seen[0][3] == code_launch()  # its command as the API made it
    assert len(done) == 1 and done[0].response() == (wire.RESP_OK_NODATA, b"")
    assert drv.deferred == 0


def test_a_held_launch_goes_out_at_a_kick(session, seen):  # noqa: F811
    drv = session.devices[0]
    drv.hold(code_launch(), (), 3, 0, None)
    session.flush()  # what every wait does first
    assert types(seen) == [wire.CMD_LAUNCH_CODE] and drv.deferred == 0


def test_held_launches_and_batches_go_out_in_the_order_they_were_made(session, seen):  # noqa: F811
    drv = session.devices[0]
    assert drv.batcher is not None
    fill = (wire.KERNEL_FILL, 1, 1, 1, 256, 1, 1, 3, 0x1000, 1.0, 256)
    drv.hold(code_launch(params=b"A" * 16), (), 3, 0, None)
    drv.hold(code_launch(params=b"B" * 16), (), 3, 0, None)  # the first goes out
    drv.launch(3, 0, FILL, fill, None)  # the held one goes out before the batch opens
    drv.launch(3, 0, FILL, fill, None)
    assert drv.batcher.open is not None and drv._held is None
    drv.hold(code_launch(params=b"C" * 16), (), 3, 0, None)  # the batch goes first
    assert drv.batcher.open is None  # never both
    drv.kick()
    assert types(seen) == [wire.CMD_LAUNCH_CODE, wire.CMD_LAUNCH_CODE, wire.CMD_LAUNCH_BATCH,
                           wire.CMD_LAUNCH_CODE]
    assert [raw[-16:] for typ, _f, _i, raw in seen if typ == wire.CMD_LAUNCH_CODE] == \
        [b"A" * 16, b"B" * 16, b"C" * 16]


def test_a_synchronize_sends_its_timelines_held_launch_fenced(session, seen):  # noqa: F811
    # [FENCE-SIGNAL-1]: the sync point; another timeline's sync does not take it
    drv = session.devices[0]
    done = []
    gpa = 0x200000
    drv.mem.write(gpa, PARAMS * 4)  # large parameters, in a buffer of their own
    drv.hold(code_launch(ring_idx=2, params=b""), ((gpa, 64),), 3, 2, done.append)
    assert drv.send_fenced(3, 0) is None and drv.send_fenced(4, 2) is None
    assert drv.deferred == 1  # still held
    req = drv.send_fenced(3, 2)
    assert req is not None and drv.send_fenced(3, 2) is None
    assert drv.wait(req) == (wire.RESP_OK_NODATA, b"")
    assert done == [req]  # its on_done too
    (typ, flags, fence_id, raw), = seen
    assert typ == wire.CMD_LAUNCH_CODE
    assert flags == wire.FLAG_FENCE | wire.FLAG_INFO_RING_IDX and fence_id == 1
    # only the flags and fence_id differ; then the parameter buffer
    assert raw == fenced(code_launch(ring_idx=2, params=b"")) + PARAMS * 4


def test_fenced_sets_the_flag_and_a_nonzero_fence_id_and_keeps_the_rest():
    cmd = code_launch(ctx_id=9, ring_idx=5)
    typ, flags, fence_id, ctx_id, ring_idx = HDR.unpack_from(fenced(cmd))
    assert (typ, ctx_id, ring_idx) == (wire.CMD_LAUNCH_CODE, 9, 5)
    assert flags == wire.FLAG_INFO_RING_IDX | wire.FLAG_FENCE and fence_id == 1
    assert fenced(cmd)[HDR.size:] == cmd[HDR.size:]


def test_a_reset_drops_the_held_launch_and_reports_it_to_on_done(session, seen):  # noqa: F811
    drv = session.devices[0]
    done = []
    drv.hold(code_launch(), (), 3, 0, done.append)
    drv.initialize()  # the device reset
    assert len(done) == 1 and done[0].done
    with pytest.raises(DeviceNeedsReset, match="was reset"):
        done[0].response()
    assert drv.deferred == 0 and drv.send_fenced(3, 0) is None
    assert seen == [] and drv.in_flight == 0  # never sent


def test_a_held_launch_that_cannot_be_sent_fails_at_its_sync_point_not_in_the_sender(
        session, seen):  # noqa: F811
    drv = session.devices[0]
    done = []
    drv.hold(code_launch(), (), 3, 0, done.append)
    drv.needs_reset = True  # DEVICE_NEEDS_RESET before it went out
    drv.kick()  # no raise: its stream's next sync reports it
    assert len(done) == 1 and drv.deferred == 0
    with pytest.raises(DeviceNeedsReset, match="needs a reset"):
        done[0].response()
    with pytest.raises(DeviceNeedsReset):  # a new one fails at the call, as a submit does
        drv.hold(code_launch(), (), 3, 0, done.append)
    assert seen == [] and len(done) == 1
