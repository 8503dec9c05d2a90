"""Events (spec §7.5): a marker in a stream that completes when the work submitted to the
stream before it has. `record` captures the work so far, `query`/`synchronize` ask for and
wait for its completion, `elapsed_time` measures device time between two events; an
`export`ed event (an `EventHandle`) can be imported by another guest, or on the other
device, to order work across them (`Stream.wait_event`). Event ids belong to a device.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from pvgpu.guest.api import errors
from pvgpu.guest.api.commands import ring_command
from pvgpu.guest.api.handles import ExportedHandle
from pvgpu.guest.api.lifetime import DestroyedOnExit
from pvgpu.guest.api.locking import ApiObject
from pvgpu.spec import wire

if TYPE_CHECKING:
    from pvgpu.guest.api.context import Context
    from pvgpu.guest.api.device import Device
    from pvgpu.guest.api.stream import Stream

_EVENT = struct.Struct(wire.RESP_EVENT_FORMAT)
_HANDLE = struct.Struct(wire.RESP_EVENT_HANDLE_FORMAT)


class EventHandle(ExportedHandle):
    """An exported event: `str(handle)` ("evt:<id>:<token hex>") or the object itself
    (picklable) can be passed to another process, which imports it with
    `ctx.import_event(handle)`. Anyone holding it can wait on the event; keep it private."""

    PREFIX = "evt"
    WHAT = "an event handle"


class Event(DestroyedOnExit, ApiObject):
    """A marker in a stream (spec §7.5): `record(stream)` captures the work submitted to the
    stream so far; the event completes when that work has. Event ids belong to a device."""

    def __init__(self, device: "Device", event_id: int, ctx: "Context | None" = None, *,
                 recorded: bool = False):
        self.device = device
        self.context = ctx
        self.event_id = event_id
        self._conn_lock = device._conn_lock
        self._releases = device._releases
        self._driver = device.driver
        self.recorded = recorded  # the device knows the id (recorded or imported)
        self.destroyed = False
        self._timestamp: int | None = None  # completion time of the current recording, once known
        self._requests: list = []  # async requests of the recording stream that it covers

    def _check(self) -> None:
        if self.destroyed:
            raise errors.InvalidEventError(f"event {self.event_id} was destroyed",
                                           code=wire.RESP_ERR_INVALID_EVENT)

    def record(self, stream: "Stream | None" = None) -> None:
        """Capture the work submitted to `stream` (default: the default stream of the
        event's context) so far, including the events it was told to wait for."""
        self._check()
        if stream is None:
            if self.context is None:
                raise ValueError("this event has no context: pass the stream to record on")
            stream = self.context.default_stream
        if stream.device is not self.device:
            raise ValueError("an event can be recorded only on streams of its own device")
        stream.context._check_stream(stream)
        self._driver.call(ring_command(wire.CMD_EVENT_RECORD, (self.event_id,),
                                       ctx_id=stream.context.ctx_id, ring_idx=stream.ring_idx))
        self.recorded = True
        self._timestamp = None
        self._requests = [r for r in stream._inflight if not r.done]

    def _query(self, wait: bool) -> tuple:
        """-> (status, error, timestamp_ns, info0, info1) from EVENT_QUERY."""
        _t, body = self._driver.call(ring_command(wire.CMD_EVENT_QUERY, (self.event_id,),
                                                  fence_id=1 if wait else 0))
        status, code, ts, info0, info1 = _EVENT.unpack_from(body)
        if status != wire.EVENT_STATUS_PENDING:
            if self._requests:  # let D2H data land before reporting completion
                reqs, self._requests = self._requests, []
                self._driver.session.wait_for(lambda: all(r.done for r in reqs))
            self._timestamp = ts
        return status, code, ts, info0, info1

    def _raise_for(self, status, code, info0, info1) -> None:
        if status == wire.EVENT_STATUS_ERROR:
            if code == wire.RESP_ERR_PAGE_FAULT:
                what = (f"GPU page fault: {wire.ACCESS_NAMES.get(info1, 'access')} "
                        f"at VA {info0:#x}")
            else:
                what = wire.RESP_NAMES.get(code, hex(code))
            raise errors.error_for(code, f"event {self.event_id}: the work it captured failed: {what}",
                                   info0, info1)

    def query(self) -> bool:
        """True once the captured work has completed (raises its error if it failed)."""
        self._check()
        if not self.recorded:
            return True
        status, code, _ts, info0, info1 = self._query(wait=False)
        self._raise_for(status, code, info0, info1)
        return status != wire.EVENT_STATUS_PENDING

    def synchronize(self) -> None:
        """Wait until the captured work has completed (raises its error if it failed)."""
        self._check()
        if not self.recorded:
            return
        status, code, _ts, info0, info1 = self._query(wait=True)
        self._raise_for(status, code, info0, info1)

    @property
    def timestamp_ns(self) -> int | None:
        """Device time (ns) when the captured work completed; None while pending or if never
        recorded. An event recorded on an idle stream completes at its record time."""
        if self._timestamp is None and self.recorded and not self.destroyed:
            self._query(wait=False)
        return self._timestamp

    def elapsed_time(self, end: "Event") -> float:
        """Milliseconds of device time from this event to `end` (both must be complete)."""
        for ev in (self, end):
            ev._check()
            if not ev.recorded:
                raise errors.InvalidEventError(f"event {ev.event_id} was never recorded",
                                               code=wire.RESP_ERR_INVALID_EVENT)
            if ev.timestamp_ns is None:
                raise errors.NotReadyError(f"event {ev.event_id} has not completed yet")
        assert end._timestamp is not None and self._timestamp is not None  # checked above
        return (end._timestamp - self._timestamp) / 1e6

    def export(self) -> EventHandle:
        """Publish the event as it is now (a snapshot: recording it again later does not
        change the export; export again to share the new recording)."""
        self._check()
        if not self.recorded:
            raise errors.InvalidEventError(f"event {self.event_id} was never recorded",
                                           code=wire.RESP_ERR_INVALID_EVENT)
        _t, body = self._driver.call(ring_command(wire.CMD_EVENT_EXPORT, (self.event_id,)))
        return EventHandle(*_HANDLE.unpack_from(body))

    def destroy(self) -> None:
        """Free the event on the device (EVENT_DESTROY; cuEventDestroy). A second
        destroy() does nothing."""
        if self.destroyed:
            return
        self.destroyed = True
        if self.recorded and not self._driver.needs_reset:
            self._driver.call(ring_command(wire.CMD_EVENT_DESTROY, (self.event_id,)))

    def __repr__(self):
        return f"<pvgpu.Event {self.event_id} on device {self.device.index}>"
