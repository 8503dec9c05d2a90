"""The driver's open LAUNCH_BATCH (guest/frontend/launch_batch.py) as pure logic, against a
driver that records what it would submit: when a batch goes out, what its chain carries
(spec §6.5.33), how its buffers come back, and what its launches get when the device needs
a reset."""

import struct

import pytest

from pvgpu.guest.frontend import launch_batch
from pvgpu.guest.frontend.launch_batch import BATCH_BUFFER_SIZE, BATCH_BUFFERS, LaunchBatcher
from pvgpu.spec import wire
from pvgpu.transport.memory import InlineGuestMemory

HDR = struct.Struct(wire.CTRL_HDR_FORMAT)
FILL = struct.Struct(wire.LAUNCH_RECORD_FORMAT + "QfxxxxQ")  # a 3-argument record
BASE = 0x10000


class Req:
    def __init__(self):
        self.on_done = None
        self.done = False


class Driver:
    """Records each submit: (command, readable extents); completes requests on demand."""

    def __init__(self):
        self.mem = InlineGuestMemory(BASE + BATCH_BUFFERS * BATCH_BUFFER_SIZE)
        self.sent = []
        self.requests = []
        self.needs_reset = False
        self.fail = None
        self.session = self

    def submit(self, command, readable=(), kick=True):
        if self.fail is not None:
            raise self.fail
        assert not kick
        self.sent.append((command, list(readable)))
        self.requests.append(Req())
        return self.requests[-1]

    def complete(self, i=0):
        req = self.requests.pop(i)
        req.done = True
        req.on_done(req)

    def wait_for(self, cond):  # the device returns the oldest chain
        while not cond():
            self.complete()


def values(i):
    return (wire.KERNEL_FILL, 1, 1, 1, 256, 1, 1, 3, 0x1000 + i, float(i), 256)


def records(drv, n):
    """The records of the n-th submitted batch, as they lie in guest memory."""
    command, [(gpa, length)] = drv.sent[n]
    typ, flags, _f, ctx_id, ring_idx, count = struct.unpack(
        HDR.format + wire.CMD_BODY_FORMATS[wire.CMD_LAUNCH_BATCH][1:], command)
    assert typ == wire.CMD_LAUNCH_BATCH and length == count * FILL.size
    raw = drv.mem.read(gpa, length)
    return ctx_id, ring_idx, flags, [FILL.unpack_from(raw, i * FILL.size) for i in range(count)]


def test_a_run_of_one_timeline_is_one_batch_until_something_else_comes():
    # [CMD-LAUNCH-BATCH-1] [CMD-LAUNCH-BATCH-5]
    drv = Driver()
    b = LaunchBatcher(drv, BASE)
    done = []
    for i in range(5):
        b.add(7, 2, FILL, values(i), done.append)
    assert drv.sent == [] and b.open.count == 5  # nothing goes out by itself
    b.add(7, 3, FILL, values(5), done.append)  # another ring_idx: the first batch goes
    b.add(8, 3, FILL, values(6), done.append)  # another context: so does the second
    assert b.flush() is not None and b.flush() is None
    got = [records(drv, n) for n in range(3)]
    assert [(c, r, f) for c, r, f, _ in got] == [(7, 2, wire.FLAG_INFO_RING_IDX),
                                                 (7, 3, wire.FLAG_INFO_RING_IDX),
                                                 (8, 3, wire.FLAG_INFO_RING_IDX)]
    assert [rec for *_, recs in got for rec in recs] == \
        [pytest.approx(values(i)) for i in range(7)]
    drv.complete()
    assert len(done) == 1  # once per batch, with the batch's request


def test_a_full_batch_goes_out_and_buffers_are_reused_once_returned():
    drv = Driver()
    b = LaunchBatcher(drv, BASE)
    n = (BATCH_BUFFERS + 1) * wire.MAX_BATCH_LAUNCHES
    for i in range(n):  # one more batch than buffers: the driver waits for the device
        b.add(1, 0, FILL, values(i), None)
    assert len(drv.sent) == BATCH_BUFFERS + 1 and b.open is None
    assert drv.sent[0][0][:4] == struct.pack("<I", wire.CMD_LAUNCH_BATCH)
    assert records(drv, 0)[2] == 0  # ring_idx 0: no FLAG_INFO_RING_IDX
    gpas = [readable[0][0] for _c, readable in drv.sent]
    assert len(set(gpas[:BATCH_BUFFERS])) == BATCH_BUFFERS  # four buffers in flight
    assert gpas[BATCH_BUFFERS] == gpas[0]  # the first one returned is the one reused
    assert records(drv, BATCH_BUFFERS)[3][-1] == pytest.approx(values(n - 1))
    while drv.requests:
        drv.complete()
    assert sorted(b.free) == list(range(BATCH_BUFFERS))


def test_a_batch_ends_where_the_next_record_would_not_fit_its_buffer():
    drv = Driver()
    b = LaunchBatcher(drv, BASE)
    big = struct.Struct(wire.LAUNCH_RECORD_FORMAT + "16Q")  # 160 bytes
    per_buffer = BATCH_BUFFER_SIZE // big.size
    assert per_buffer < wire.MAX_BATCH_LAUNCHES
    for i in range(per_buffer + 1):
        b.add(1, 0, big, (wire.KERNEL_FILL, 1, 1, 1, 1, 1, 1, 16, *range(i, i + 16)), None)
    assert len(drv.sent) == 1 and drv.sent[0][1][0][1] == per_buffer * big.size
    assert b.open.count == 1


def test_without_a_device_the_unsent_launches_fail_as_requests_in_flight_do():
    drv = Driver()
    b = LaunchBatcher(drv, BASE)
    got = []
    b.add(1, 0, FILL, values(0), got.append)
    drv.needs_reset, drv.fail = True, RuntimeError("device 0 needs a reset")
    assert b.flush() is None  # no raise: the stream's next sync reports it
    with pytest.raises(RuntimeError, match="needs a reset"):
        got[0].response()
    assert sorted(b.free) == list(range(BATCH_BUFFERS))
    drv.needs_reset = False
    b.add(1, 0, FILL, values(1), got.append)
    with pytest.raises(RuntimeError):  # any other failure is the caller's
        b.flush()
    assert sorted(b.free) == list(range(BATCH_BUFFERS))


def test_a_reset_drops_the_open_batch_and_frees_every_buffer():
    drv = Driver()
    b = LaunchBatcher(drv, BASE)
    got = []
    for i in range(wire.MAX_BATCH_LAUNCHES + 1):
        b.add(1, 0, FILL, values(i), got.append)
    b.drop(RuntimeError("reset"))
    assert b.open is None and sorted(b.free) == list(range(BATCH_BUFFERS))
    assert len(got) == 1 and got[0].done
    with pytest.raises(RuntimeError, match="reset"):
        got[0].response()
    assert launch_batch.BATCH_BUFFER_SIZE >= wire.MAX_BATCH_LAUNCHES * FILL.size


def test_a_batch_sent_as_a_sync_point_carries_a_fence():
    # [FENCE-SIGNAL-1] the synchronize's sync point (VirtioGpuDriver.send_fenced)
    drv = Driver()
    b = LaunchBatcher(drv, BASE)
    b.add(7, 2, FILL, values(0), None)
    assert b.flush(fence=True) is not None
    typ, flags, fence_id, ctx_id, ring_idx = HDR.unpack_from(drv.sent[0][0])
    assert (typ, ctx_id, ring_idx) == (wire.CMD_LAUNCH_BATCH, 7, 2)
    assert flags == wire.FLAG_FENCE | wire.FLAG_INFO_RING_IDX and fence_id == 1
    b.add(7, 0, FILL, values(1), None)
    b.flush()
    assert HDR.unpack_from(drv.sent[1][0])[1:3] == (0, 0)  # unfenced: flags 0, fence_id 0
