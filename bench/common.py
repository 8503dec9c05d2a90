"""Helpers shared by the benchmarks: interleaved timing rounds and the JSON report."""

from __future__ import annotations

import json
import math
import time


def rounds(variants: dict, *, max_reps: int, min_reps: int | None = None,
           budget: float = math.inf, warmup: bool = False) -> dict:
    """-> name -> [seconds]. Each variant (name -> fn, or (setup, fn): setup is not timed)
    runs once per round, so a drifting machine affects them alike; `warmup`: one untimed
    round first. Stops after max_reps rounds, or after min_reps once `budget` seconds have
    passed."""
    items = [(k, v if isinstance(v, tuple) else (None, v)) for k, v in variants.items()]
    if warmup:
        for _k, (setup, fn) in items:
            if setup:
                setup()
            fn()
    times = {k: [] for k, _ in items}
    start = time.perf_counter()
    for r in range(max_reps):
        for k, (setup, fn) in items:
            if setup:
                setup()
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
        if r + 1 >= (min_reps or max_reps) and time.perf_counter() - start > budget:
            break
    return times


def write_json(path: str | None, results, out=print) -> None:
    """Write `results` to `path` (nothing without a path) and say so."""
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=2)
        out(f"wrote {path}")
