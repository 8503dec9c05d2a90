"""Which timelines of one device the driver knows to be clean (spec §7): every piece of
timeline work submitted on it is covered by a sync point of that timeline that has come
back with an OK answer, so the device holds neither pending work nor a remembered error
there. Pure bookkeeping: the driver tells the ledger what it submits (`submitted`) and what
each answer was (`answered`); `Context.synchronize` asks it (`others_clean`) whether the
fenced work of one timeline may stand in for a CTX_SYNC of the whole context.

Every request the ledger is told about gets the next sequence number (requests of other
types cannot change the answer and are not counted); the device takes chains in that order.
Per timeline (ctx_id, ring_idx) the ledger keeps the number of the last work submitted on it
and the highest number of a sync point of it that was answered OK; per context, that of the
last CTX_SYNC answered OK. A sync point covers the work submitted before it, and itself.

  - timeline work: COPY_H2D, COPY_D2H, COPY_D2D, LAUNCH, LAUNCH_BATCH, LAUNCH_CODE and
    EVENT_WAIT (a fenced NOP and CTX_SYNC wait for the events a timeline waits for,
    [FENCE-EVENT-4]); an unfenced NOP is nothing, a fenced one only a sync point;
  - sync points of a timeline: NOP, COPY_D2D and the launches with FLAG_FENCE, COPY_H2D and
    COPY_D2H always ([FENCE-ERROR-2]); CTX_SYNC of every timeline of its context;
  - an error answer counts as nothing (a sync point rejected by its checks leaves the
    remembered error in place; one that reports an error is treated as dirty too: that
    costs a CTX_SYNC, never a wrong result); so does a request that never comes back;
  - CTX_DESTROY answered OK forgets its context's timelines (those without later work);
    `forget` (a device reset) forgets everything, keeping the numbering, so that no answer
    to a request from before it can cover work submitted after it.

Without PVGPU_F_CONTEXT_INIT every request of a context is on its timeline 0, whatever its
ring_idx ([FENCE-TIMELINE-1]; FLAG_INFO_RING_IDX is only echoed, [CMD-HDR-1]).
"""

from __future__ import annotations

from pvgpu.spec import wire

WORK = frozenset({wire.CMD_COPY_H2D, wire.CMD_COPY_D2H, wire.CMD_COPY_D2D, wire.CMD_LAUNCH,
                  wire.CMD_LAUNCH_BATCH, wire.CMD_LAUNCH_CODE, wire.CMD_EVENT_WAIT})
SYNC_ALWAYS = frozenset({wire.CMD_COPY_H2D, wire.CMD_COPY_D2H})
SYNC_FENCED = frozenset({wire.CMD_NOP, wire.CMD_COPY_D2D, wire.CMD_LAUNCH,
                         wire.CMD_LAUNCH_BATCH, wire.CMD_LAUNCH_CODE})
# the request types the ledger is to be told about with or without FLAG_FENCE; of the
# others, only fenced ones matter (a fenced NOP), and only those it is told about
TYPES = WORK | {wire.CMD_CTX_SYNC, wire.CMD_CTX_DESTROY}

# what an answer is to settle (the first field of `submitted`'s token)
_TIMELINE, _CONTEXT, _DESTROY = 0, 1, 2


# RESP_OK_* are 0x11xx, the errors from 0x1200 on (spec/wire/cmd.py)
_OK_FIRST, _ERR_FIRST = wire.RESP_OK_NODATA, wire.RESP_ERR_UNSPEC


class TimelineLedger:
    """The clean and dirty timelines of one device's contexts (module docstring)."""

    def __init__(self, rings: bool = True):
        """`rings`: whether ring_idx names a timeline (PVGPU_F_CONTEXT_INIT negotiated)."""
        self.rings = rings
        self.seq = 0  # the number of the last request submitted
        # ctx_id -> ring_idx -> [last work, highest sync point answered OK], of the
        # timelines work was seen on
        self._timelines: dict[int, dict[int, list]] = {}
        self._ctx_synced: dict[int, int] = {}  # ctx_id -> last CTX_SYNC answered OK

    def submitted(self, type_: int, flags: int, ctx_id: int, ring_idx: int):
        """A request went out (every one of TYPES, and every one with FLAG_FENCE in
        `flags`, in the order their chains did) -> the token its answer is to be given to
        `answered` with, or None if its answer does not matter."""
        self.seq = seq = self.seq + 1
        if type_ in WORK:
            if not self.rings:
                ring_idx = 0
            try:  # (the hot path: no calls)
                rings = self._timelines[ctx_id]
            except KeyError:
                rings = self._timelines[ctx_id] = {}
            try:
                tl = rings[ring_idx]
            except KeyError:
                tl = rings[ring_idx] = [0, 0]
            tl[0] = seq
            if type_ in SYNC_ALWAYS or flags & wire.FLAG_FENCE and type_ in SYNC_FENCED:
                return _TIMELINE, tl, seq
            return None
        if type_ == wire.CMD_CTX_SYNC:
            return _CONTEXT, ctx_id, seq
        if type_ == wire.CMD_CTX_DESTROY:
            return _DESTROY, ctx_id, seq
        if type_ == wire.CMD_NOP and flags & wire.FLAG_FENCE:
            # a sync point with no work seen before it on its timeline covers nothing
            seen = self._timelines.get(ctx_id, {}).get(ring_idx if self.rings else 0)
            return None if seen is None else (_TIMELINE, seen, seq)
        return None

    def answered(self, token: tuple, resp_type: int) -> None:
        """The request `submitted` gave `token` for was answered `resp_type`."""
        if not _OK_FIRST <= resp_type < _ERR_FIRST:
            return
        what, which, seq = token
        if what == _TIMELINE:  # `which`: the timeline (a list dropped by forgetting is inert)
            if seq > which[1]:
                which[1] = seq
        elif what == _CONTEXT:
            if seq > self._ctx_synced.get(which, 0):
                self._ctx_synced[which] = seq
        else:
            rings = self._timelines.get(which)
            if rings is not None:
                for ring_idx in [r for r, tl in rings.items() if tl[0] < seq]:
                    del rings[ring_idx]
                if not rings:
                    del self._timelines[which]
            if self._ctx_synced.get(which, seq) < seq:
                del self._ctx_synced[which]

    def clean(self, ctx_id: int, ring_idx: int) -> bool:
        """Whether every work seen on timeline (ctx_id, ring_idx) is covered by a sync point
        answered OK (a timeline no work was seen on is)."""
        tl = self._timelines.get(ctx_id, {}).get(ring_idx if self.rings else 0)
        return tl is None or tl[0] <= tl[1] or tl[0] <= self._ctx_synced.get(ctx_id, 0)

    def others_clean(self, ctx_id: int, ring_idx: int) -> bool:
        """Whether every timeline of context ctx_id but (ctx_id, ring_idx) is `clean`."""
        try:  # (few calls: Context.synchronize asks every time)
            rings = self._timelines[ctx_id]
        except KeyError:
            return True
        if not self.rings:
            return True  # the context has one timeline
        ctx_synced = None
        for r in rings:
            tl = rings[r]
            work = tl[0]
            if work > tl[1] and r != ring_idx:
                if ctx_synced is None:
                    ctx_synced = self._ctx_synced.get(ctx_id, 0)
                if work > ctx_synced:
                    return False
        return True

    def forget(self) -> None:
        """The device was reset (or needs a reset): no timeline is known any more."""
        self._timelines = {}
        self._ctx_synced = {}
