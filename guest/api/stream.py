"""Streams (spec §7.1): one timeline (ctx_id, ring_idx) of a context. Work of one stream
runs in submission order; work of different streams may overlap. A stream keeps the
asynchronous requests it has in flight and the first error of its asynchronous work, which
its next synchronizing call raises.
"""

from __future__ import annotations

from pvgpu.guest.api import errors, launch
from pvgpu.guest.api.commands import ring_command
from pvgpu.guest.api.event import Event
from pvgpu.guest.api.locking import ApiObject, unlocked
from pvgpu.spec import wire
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pvgpu.guest.api.context import Context
    from pvgpu.guest.api.device import Device


class Stream(ApiObject):
    """One timeline (ctx_id, ring_idx) of a context (spec §7.1). Work submitted to a stream
    runs in submission order; different streams of a context (and other contexts) may run
    concurrently. Errors of its asynchronous work are raised by its next synchronizing call.

    Create with `ctx.create_stream()` (ring_idx 1..MAX_RING_IDX); `ctx.default_stream` is
    ring_idx 0. `destroy()` (or leaving a `with` block) synchronizes and frees the ring_idx.
    """

    def __init__(self, ctx: "Context", ring_idx: int):
        self.context = ctx
        self.ring_idx = ring_idx
        self._conn_lock = ctx._conn_lock
        self._releases = ctx._releases
        self._driver = ctx._driver
        self._async_error: BaseException | None = None
        self._inflight: list = []  # asynchronous copy requests not yet completed
        self.destroyed = False
        # synchronize's fenced NOP, encoded once
        self._sync_command = ring_command(wire.CMD_NOP, ctx_id=ctx.ctx_id, ring_idx=ring_idx,
                                          fence_id=1)

    @property
    @unlocked("a field fixed at creation")
    def device(self) -> "Device":
        """The device of the stream's context."""
        return self.context.device

    @property
    @unlocked("a field fixed at creation")
    def is_default(self) -> bool:
        """Whether this is the context's default stream (ring 0)."""
        return self.ring_idx == 0

    def launch(self, kernel, grid, block, args) -> None:
        """Launch a built-in kernel on this stream (asynchronous)."""
        if self.destroyed:
            raise ValueError(f"{self!r} was destroyed")
        launch.builtin(self.context, self, kernel, grid, block, args)

    def record_event(self, event: "Event | None" = None) -> "Event":
        """Record `event` (a new one if None) on this stream; -> the event."""
        if event is None:
            event = Event(self.device, next(self.device._event_ids), self.context)
        event.record(self)
        return event

    def wait_event(self, event: "Event") -> None:
        """Make this stream's later work wait until `event` has completed. Returns at once:
        the host holds the stream's next job back (the guest never blocks). The event may
        belong to another stream, context or device, or be imported from another guest."""
        self.context._check_stream(self)
        if not isinstance(event, Event):
            raise TypeError(f"wait_event needs an Event, not {type(event).__name__}")
        if event.destroyed:
            raise errors.InvalidEventError(f"event {event.event_id} was destroyed",
                                           code=wire.RESP_ERR_INVALID_EVENT)
        if not event.recorded:
            return  # nothing captured: nothing to wait for (as cudaStreamWaitEvent)
        if event.device is not self.device:
            # event ids are per device: bring it over as an export, as another guest would
            local = self.device._import_event(event.export(), None)
            try:
                self._wait(local)
            finally:
                local.destroy()
        else:
            self._wait(event)
        # completions the event covers (D2H data landing) are ours to wait for too
        self._inflight += [r for r in event._requests if not r.done]

    def _wait(self, event: "Event") -> None:
        self._driver.call(ring_command(wire.CMD_EVENT_WAIT, (event.event_id,),
                                       ctx_id=self.context.ctx_id, ring_idx=self.ring_idx))

    def synchronize(self) -> None:
        """Wait for all work submitted to this stream (and the events it waits for); raises
        the first error of its earlier asynchronous work. The sync point is what the driver
        still holds back of the stream, sent fenced: its launches gathered in the open batch
        or its latest code launch (guest/frontend/launch_batch.py), if there are some; else a
        fenced NOP."""
        self.context._check_stream(self)
        err = None
        try:
            driver = self._driver
            req = driver.send_fenced(self.context.ctx_id, self.ring_idx)
            if req is None:
                driver.call(self._sync_command)
            else:
                driver.wait(req)
        except Exception as e:
            err = e
        self._settle()
        async_err = self._take_error()
        raise_first(err, async_err)

    def _track(self, req) -> None:
        if len(self._inflight) > 64:
            self._inflight = [r for r in self._inflight if not r.done]
        self._inflight.append(req)

    def _settle(self) -> None:
        """Wait until every asynchronous request of the stream has come back."""
        if not self._inflight:
            return
        pending = [r for r in self._inflight if not r.done]
        if pending:
            self._driver.session.wait_for(lambda: all(r.done for r in pending))
        self._inflight = []

    def _async_done(self, req) -> None:
        """An asynchronous request came back; keep its error for the next sync point."""
        try:
            req.response()
        except Exception as e:
            self._keep_error(e)

    def _keep_error(self, e) -> None:
        if self._async_error is None:
            self._async_error = e

    def _take_error(self):
        err, self._async_error = self._async_error, None
        return err

    def _raise_async_error(self) -> None:
        err = self._take_error()
        if err is not None:
            raise err

    def destroy(self) -> None:
        """Synchronize, then give the ring_idx back (the default stream lives as long as its
        context: destroying it only synchronizes)."""
        if self.destroyed:
            return
        ctx = self.context
        if ctx.destroyed:
            self.destroyed = True
            ctx._streams.pop(self.ring_idx, None)
            return
        try:
            self.synchronize()
        finally:
            if not self.is_default:
                self.destroyed = True
                ctx._streams.pop(self.ring_idx, None)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if self.destroyed or self._driver.needs_reset:
            return
        if exc_type is None:
            self.destroy()
        else:  # do not hide the exception in flight behind a synchronize error
            try:
                self.destroy()
            except errors.PvgpuError:
                pass

    def __repr__(self):
        return f"<pvgpu.Stream {self.ring_idx} of context {self.context.ctx_id}>"


def raise_first(*errs) -> None:
    for e in errs:
        if e is not None:
            raise e
