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
by every session and device): an export is named by a handle id and guarded by an
unguessable 64-bit token from `secrets`. Each session keeps at most
`MAX_EVENT_EXPORTS` exports; a newer one withdraws the session's oldest.
"""

from __future__ import annotations

import collections
import hmac
import itertools
import secrets

from spec import wire


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


class EventExports:
    """Host-global registry: handle id -> (owner, token, snapshot)."""

    def __init__(self, max_per_owner: int = wire.MAX_EVENT_EXPORTS):
        self.max_per_owner = max_per_owner
        self._ids = itertools.count(1)
        self._by_handle = {}  # handle_id -> (owner, token, snapshot)
        self._by_owner = {}  # owner -> OrderedDict(handle_id -> None), oldest first

    def __len__(self) -> int:
        return len(self._by_handle)

    def export(self, owner, snapshot: EventSnapshot) -> tuple:
        """-> (handle_id, token) for `snapshot`, owned by `owner` (a session)."""
        handle = next(self._ids)
        token = secrets.randbits(64) or 1
        self._by_handle[handle] = (owner, token, snapshot)
        mine = self._by_owner.setdefault(owner, collections.OrderedDict())
        mine[handle] = None
        while len(mine) > self.max_per_owner:
            old, _ = mine.popitem(last=False)
            self._by_handle.pop(old, None)
        return handle, token

    def exists(self, handle: int) -> bool:
        return handle in self._by_handle

    def live(self, handle: int, snapshot: EventSnapshot) -> bool:
        """Whether export `handle` still exists and still names `snapshot`."""
        entry = self._by_handle.get(handle)
        return entry is not None and entry[2] is snapshot

    def lookup(self, handle: int, token: int) -> EventSnapshot | None:
        """The exported snapshot, or None for an unknown handle or a wrong token (the two
        are not told apart)."""
        entry = self._by_handle.get(handle)
        if entry is None:
            return None
        ok = hmac.compare_digest(entry[1].to_bytes(8, "little"),
                                 (token & (2**64 - 1)).to_bytes(8, "little"))
        return entry[2] if ok else None

    def withdraw(self, handles) -> None:
        for h in handles:
            entry = self._by_handle.pop(h, None)
            if entry is not None:
                mine = self._by_owner.get(entry[0])
                if mine is not None:
                    mine.pop(h, None)
                    if not mine:
                        del self._by_owner[entry[0]]

    def withdraw_owner(self, owner) -> None:
        """Drop every export of `owner` (its session ended)."""
        for h in self._by_owner.pop(owner, ()):
            self._by_handle.pop(h, None)

    def count(self, owner) -> int:
        return len(self._by_owner.get(owner, ()))
