"""Event counters of the KMD's objects (device, context, scheduler).

Counters is a dict whose missing keys read as 0, so `counters["x"] += 1` counts an event
seen for the first time. collections.Counter does the same, but each of its increments
costs about twice a plain dict's (measured here: ~250 ns against ~100), and a job bumps
about ten of them; Counters keeps dict's own item access.
"""

from __future__ import annotations


class Counters(dict):
    """A dict of counts: a missing key reads as 0 (and is not inserted by the read)."""

    __slots__ = ()

    def __missing__(self, key) -> int:
        return 0
