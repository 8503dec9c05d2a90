"""Compute units: the parallel lanes of the emulated compute engine.

A real GPU spreads a grid's blocks over many compute units (SMs). The emulated compute
engine has a few CU worker threads (by default one per host CPU, at most 8) and splits
the index range of a large elementwise kernel over them; numpy releases the GIL for
bulk work, so the pieces run in parallel. Small ranges run on the engine's own thread.

The copy engines' DMA lanes are a ComputeUnits too, used through `share`: a large copy is
cut into pieces that the engine's thread and the idle lanes take in turn, so a lane that
gets no CPU (a loaded host) leaves its pieces to the others instead of holding up the
copy until it is scheduled.
Hardware-internal: nothing here knows about guests or the driver.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

MIN_SPLIT = 1 << 20  # elements below which splitting costs more than it gains
ALIGN = 4096  # elements: chunk boundaries stay cache-line and page friendly


class ComputeUnits:
    def __init__(self, count: int | None = None, name: str = "gpu"):
        self.count = max(1, count if count is not None else min(8, os.cpu_count() or 1))
        self._pool = None
        self._name = name
        self._lock = threading.Lock()
        self.split_launches = 0

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.count - 1, thread_name_prefix=f"{self._name}.cu")
            return self._pool

    def ranges(self, count: int) -> list:
        """The [lo, hi) pieces `count` elements are split into (one piece if small)."""
        if self.count == 1 or count < MIN_SPLIT:
            return [(0, count)]
        step = -(-count // self.count)
        step = -(-step // ALIGN) * ALIGN
        return [(lo, min(lo + step, count)) for lo in range(0, count, step)]

    def run(self, count: int, fn) -> None:
        """fn(lo, hi) over the pieces of [0, count); the calling thread takes the last."""
        pieces = self.ranges(count)
        if len(pieces) == 1:
            fn(0, count)
            return
        self.split_launches += 1
        futures = [self._executor().submit(fn, lo, hi) for lo, hi in pieces[:-1]]
        fn(*pieces[-1])
        for f in futures:
            f.result()

    def share(self, count: int, fn, piece: int) -> None:
        """fn(lo, hi) over [0, count) in pieces of at most `piece`, taken in turn by the
        calling thread and the other units; returns when every piece is done. The caller
        waits only for pieces another unit has begun: a unit that did not start before
        the pieces ran out is cancelled."""
        if self.count == 1 or count <= piece:
            fn(0, count)
            return
        self.split_launches += 1
        starts = iter(range(0, count, piece))
        lock = threading.Lock()

        def work():
            while True:
                with lock:
                    lo = next(starts, None)
                if lo is None:
                    return
                fn(lo, min(lo + piece, count))
        pool = self._executor()
        helpers = [pool.submit(work) for _ in range(min(self.count - 1, -(-count // piece) - 1))]
        work()
        for f in helpers:
            if not f.cancel():
                f.result()

    def shutdown(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


SERIAL = ComputeUnits(1)
