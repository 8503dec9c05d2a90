"""Events and their exports (spec §7.6 events, §7.7 exports, §6.5.13–§6.5.18 EVENT_*).

An event is a *snapshot* of timeline work (cudaEventRecord): the KMD fences of the work a
timeline had been given when the event was recorded, plus the fences that timeline was
still to wait for (EVENT_WAIT not yet consumed by a job). It completes when every one of
them has signalled; its completion time is the latest of their completion times, and
never earlier than the moment it was recorded (an event recorded on an idle timeline
completes at once, at record time).

Fences are reference-counted Python objects that signal exactly once, so a snapshot can
be shared freely: by the event id that recorded it, by exports, and by the events of
other sessions that imported it. Nothing here owns GPU state; dropping a snapshot never
affects the work it describes.

`EventExports` is the host-global registry of exported snapshots (one per host, shared
by every session and device; host/backend/capabilities.py): an export is named by a
handle id and guarded by an unguessable 64-bit token. Each session keeps at most
`MAX_EVENT_EXPORTS` exports; a newer one withdraws the session's oldest.
"""

from __future__ import annotations

from pvgpu.host.backend.capabilities import CapabilityRegistry
from pvgpu.spec import wire


class EventSnapshot:
    """The fences an event captured, and when it was recorded (device clock, ns).

    `own`: the recording timeline's work (its last job and the jobs whose errors it has
    not reported yet); `waits`: fences the timeline was still to wait for. Both count for
    completion; only `own` counts for the event's error (errors never cross timelines)."""

    __slots__ = ("fences", "own", "record_ns", "clock", "_seen")

    def __init__(self, own, waits=(), *, clock):
        # already-completed work without an error adds nothing: it finished before
        # the record time, which is the earliest completion time anyway
        def keep(fences):
            return [f for f in fences if f is not None and (not f.signaled or f.error is not None)]
        self.own = tuple(dict.fromkeys(keep(own)))
        self.fences = tuple(dict.fromkeys(self.own + tuple(keep(waits))))
        self.clock = clock
        self.record_ns = clock()
        self._seen = {}  # fence index -> clock when its completion was observed
        for i, f in enumerate(self.fences):
            if not f.signaled and getattr(f, "timestamp", None) is None:
                f.add_done_callback(lambda _f, i=i: self._seen.setdefault(i, self.clock()))

    @property
    def done(self) -> bool:
        return all(f.signaled for f in self.fences)

    def pending(self) -> list:
        return [f for f in self.fences if not f.signaled]

    def error(self):
        """The error of the timeline's own captured work that failed first (None if none did)."""
        for f in self.own:
            if f.signaled and f.error is not None:
                return f.error
        return None

    def timestamp_ns(self) -> int | None:
        """When the captured work completed (None while some of it is pending)."""
        if not self.done:
            return None
        t = self.record_ns
        for i, f in enumerate(self.fences):
            ts = getattr(f, "timestamp", None)
            if ts is None:
                # the KMD did not stamp it: the time we saw it signal (an upper bound)
                ts = self._seen.setdefault(i, self.clock())
            t = max(t, int(ts))
        return t


class EventExports(CapabilityRegistry):
    """Host-global registry: handle id -> (owner, token, snapshot)."""

    def __init__(self, max_per_owner: int = wire.MAX_EVENT_EXPORTS):
        super().__init__(max_per_owner)
