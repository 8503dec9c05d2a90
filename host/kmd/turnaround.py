"""A vGPU's turnaround on one ring: BAND's time buffer sized from measured gaps.

A guest that submits each job once the previous one has completed (launch, synchronize,
launch, ...) leaves the ring idle between its jobs: the completion travels to the guest,
the guest submits again, the host decodes and pushes the job. BAND holds a free ring
against a vGPU over its share so that such a guest is not overtaken in that gap (Gdev's
time buffer). A fixed buffer is either too short (the gap of a loaded host is longer, and
the long jobs take the ring: the short tenant starves) or idles the ring needlessly; so
the buffer is the gap itself, as measured: the time from the vGPU's last job completing,
with nothing else of it queued or running, to its next job being pushed.

The bound is the longest of the last SAMPLES gaps with a margin (MARGIN times it). The two
ways to be wrong cost very differently: a gap that outlasts the bound gives the ring to
another vGPU's job, and behind a long job (Gdev's 20 ms) the short tenant loses that
whole job's time; a hold that proves too long idles the ring for at most the bound, once,
when the vGPU goes quiet, and never longer than the held job would have run (the
scheduler does not wait for a vGPU due after that job's end). A high quantile (the 90th)
let about one gap in ten through: with 1 ms kernels BAND measured Jain 0.91 and 13 pp
there, against 0.945 and 9.8 pp with this bound (the long tenant at its 50 % share instead
of 54 %). Gaps of a period or longer are the vGPU going quiet, not a turnaround, and are
not samples. Pure logic: times are ns arguments.
"""

from __future__ import annotations

import collections

SAMPLES = 16  # gaps remembered
MARGIN = 1.5  # the bound: this times the longest of them
MIN_SAMPLES = 4  # fewer measured gaps: no bound (the configured time buffer applies)


class Turnaround:
    """The gaps between one vGPU's jobs on one ring."""

    __slots__ = ("limit_ns", "idle_since", "gaps", "_bound")

    def __init__(self, limit_ns: int):
        self.limit_ns = limit_ns  # a gap this long is the vGPU going quiet
        self.idle_since = None  # when its last job completed and nothing of it was left
        self.gaps = collections.deque(maxlen=SAMPLES)
        self._bound = None

    def idle(self, end_ns: int) -> None:
        """Its last job completed at end_ns and it has nothing queued or running."""
        self.idle_since = end_ns

    def pushed(self, now: int) -> None:
        """It pushed a job at `now`: the gap, if it was idle, is a sample."""
        if self.idle_since is None:
            return
        gap = now - self.idle_since
        self.idle_since = None
        if 0 <= gap < self.limit_ns:
            self.gaps.append(gap)
            self._bound = None

    def bound(self) -> int | None:
        """-> the gap (ns) its next job arrives within, or None before MIN_SAMPLES gaps."""
        if self._bound is None and len(self.gaps) >= MIN_SAMPLES:
            self._bound = int(MARGIN * max(self.gaps))
        return self._bound

    def due(self) -> int | None:
        """-> when its next job is due if it is idle in a gap now (idle_since + bound), or
        None when it is not idle or has no bound yet."""
        if self.idle_since is None:
            return None
        bound = self.bound()
        return None if bound is None else self.idle_since + bound
