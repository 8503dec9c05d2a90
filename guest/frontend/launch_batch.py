"""The driver's open CMD_LAUNCH_BATCH (spec §6.5.33): asynchronous built-in launches of one
timeline gathered into one request, as a Vulkan driver records a command buffer and
submits it once.

A launch the API does not wait for is written as a launch record straight into one of
the device's batch buffers in guest memory (BATCH_BUFFERS of BATCH_BUFFER_SIZE bytes, in
the device's area). The batch is sent as one LAUNCH_BATCH chain -- its header and count in
the request slot, its records as a second readable descriptor -- when

  - the driver submits any other request (VirtioGpuDriver.submit sends the batch first),
    or kicks (every wait kicks first), so the device sees the requests in the order the
    API made them, as separate LAUNCHes would have reached it ([CMD-LAUNCH-BATCH-5]);
  - a launch of another context or ring_idx comes;
  - it holds MAX_BATCH_LAUNCHES records, or the next record does not fit its buffer.

A synchronize that finds its timeline's launches still in the open batch sends that batch
with FLAG_FENCE (`flush(fence=True)`, VirtioGpuDriver.send_fenced) and waits for it in
place of its own sync command: a fenced LAUNCH_BATCH is answered when its last launch and
everything before it on the timeline have completed ([FENCE-SIGNAL-1]), and reports the
timeline's first error ([FENCE-ERROR-2]), as the fenced NOP would; one chain instead of two.
A context's synchronize does so in place of CTX_SYNC when the batch is of one of the
context's timelines and the driver knows every other one clean (guest/frontend/timelines.py,
VirtioGpuDriver.send_fenced_for_context): then CTX_SYNC would find nothing else to wait for
or report.

Code launches (LAUNCH_CODE, guest/api/module.py) are not batched, but the driver holds the
latest one back the same way (VirtioGpuDriver.hold): unpublished, sent before anything
else goes out -- another request, a launch joining a batch, the next held launch -- and at
a kick, never while a batch is open; a synchronize of its timeline sends it fenced as its
sync point. One that cannot be sent because the device needs a reset, or is dropped by a
reset, fails as an unsent batch does (`NeverSent`).

A buffer belongs to its batch until the device has returned the chain. A batch that cannot
be sent because the device needs a reset fails like the requests in flight did. The batch's
request completes once for all its launches: `on_done` (the stream's) is called once per
batch with that request, and an error of any launch in it is the batch's (§6.5.33).
Without PVGPU_F_LAUNCH_BATCH the driver sends each launch as its own LAUNCH instead.
"""

from __future__ import annotations

import struct

from pvgpu.spec import wire

BATCH_BUFFERS = 4  # batches in flight per device
BATCH_BUFFER_SIZE = 16 << 10  # 256 records of a 3-argument kernel (56 bytes) fit
_HDR_BODY = struct.Struct(wire.CTRL_HDR_FORMAT + wire.CMD_BODY_FORMATS[wire.CMD_LAUNCH_BATCH][1:])


class OpenBatch:
    """The records gathered so far for one timeline, in one batch buffer."""

    __slots__ = ("ctx_id", "ring_idx", "buffer", "gpa", "used", "count", "on_done")

    def __init__(self, ctx_id: int, ring_idx: int, buffer: int, gpa: int, on_done):
        self.ctx_id, self.ring_idx, self.buffer, self.gpa = ctx_id, ring_idx, buffer, gpa
        self.used = 0  # bytes of records written
        self.count = 0
        self.on_done = on_done


class LaunchBatcher:
    """The batch buffers of one device driver and its open batch (at most one)."""

    def __init__(self, driver, base: int):
        self.driver = driver
        self.base = base  # guest-physical address of the first batch buffer
        self.free = list(range(BATCH_BUFFERS - 1, -1, -1))
        self.open: OpenBatch | None = None
        self.sent = 0  # LAUNCH_BATCH requests sent (statistics, tests)

    @staticmethod
    def area_size() -> int:
        return BATCH_BUFFERS * BATCH_BUFFER_SIZE

    def add(self, ctx_id: int, ring_idx: int, record: struct.Struct, values, on_done) -> None:
        """Write one launch record (`record` packs the LAUNCH body and its argument slots
        from `values`) into the open batch of (ctx_id, ring_idx), opening one first."""
        b = self.open
        if b is not None and (b.ctx_id != ctx_id or b.ring_idx != ring_idx
                              or b.used + record.size > BATCH_BUFFER_SIZE):
            self.flush()
            b = None
        if b is None:
            b = self._open(ctx_id, ring_idx, on_done)
        record.pack_into(self.driver.mem.mv, b.gpa + b.used, *values)
        b.used += record.size
        b.count += 1
        if b.count == wire.MAX_BATCH_LAUNCHES:
            self.flush()

    def _open(self, ctx_id: int, ring_idx: int, on_done) -> OpenBatch:
        if not self.free:  # every buffer is in flight: wait for the device to return one
            self.driver.session.wait_for(lambda: bool(self.free))
        buffer = self.free.pop()
        self.open = OpenBatch(ctx_id, ring_idx, buffer, self.base + buffer * BATCH_BUFFER_SIZE,
                              on_done)
        return self.open

    def flush(self, fence: bool = False):
        """Send the open batch as one LAUNCH_BATCH chain (deferred kick), with FLAG_FENCE if
        `fence`; -> its Request, or None when no batch was open."""
        b, self.open = self.open, None
        if b is None:
            return None
        driver = self.driver
        if driver.mem.tracks_dirty:  # the inline model: the kick carries the records
            driver.mem.mark_dirty(b.gpa, b.used)
        flags = wire.FLAG_INFO_RING_IDX if b.ring_idx else 0
        if fence:
            flags |= wire.FLAG_FENCE
        cmd = _HDR_BODY.pack(wire.CMD_LAUNCH_BATCH, flags, int(fence), b.ctx_id, b.ring_idx,
                             b.count)
        try:
            req = driver.submit(cmd, readable=[(b.gpa, b.used)], kick=False)
        except Exception as e:
            self.free.append(b.buffer)
            if not driver.needs_reset:
                raise
            # the device needs a reset: its launches fail as the requests in flight did,
            # at their stream's next sync, not in whichever call happened to send them
            if b.on_done is not None:
                b.on_done(NeverSent(e))
            return None
        on_done, free, buffer = b.on_done, self.free, b.buffer

        def done(r):
            free.append(buffer)
            if on_done is not None:
                on_done(r)
        req.on_done = done
        self.sent += 1
        return req

    def drop(self, exc: BaseException) -> None:
        """The device was reset before the open batch was sent: its launches fail with
        `exc`, reported to its on_done as a failed request would be."""
        b, self.open = self.open, None
        self.free = list(range(BATCH_BUFFERS - 1, -1, -1))  # nothing is in flight any more
        if b is not None and b.on_done is not None:
            b.on_done(NeverSent(exc))


class NeverSent:
    """What on_done gets for a batch or a held launch that was never sent: a failed
    request, its error that of the device (it needs a reset, or was reset)."""

    __slots__ = ("failed", "done")

    def __init__(self, exc: BaseException):
        self.failed = exc
        self.done = True

    def response(self):
        raise self.failed
