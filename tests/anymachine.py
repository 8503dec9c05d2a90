"""Helpers for checks that must hold on any machine and under load, without timing.

Python-level work. `python_calls` counts the function calls (Python and C) a call makes,
for checks that work is done in bulk rather than per element: a count, unlike a
duration, does not depend on the machine or its load. `python_calls_per_run` counts the
calls of Python functions only, averaged over repeated runs: the call budgets of a hot
path. Both count with the cyclic garbage collector paused (after a collection), so that
the finalizers of other tests' garbage never run inside what is counted. (Longer and longer burns, for
checks that need a kernel still running when they look, are pvgpu/conformance/burns.py:
the conformance checks use them too.)
"""

from __future__ import annotations

import contextlib
import gc
import sys


def python_calls(fn) -> int:
    """About how many function calls (Python functions, and C functions called from
    Python) fn() makes: per-element work shows as a count that grows with the elements."""
    calls = 0

    def profile(_frame, event, _arg):
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    with _collector_paused():
        sys.setprofile(profile)
        try:
            fn()
        finally:
            sys.setprofile(None)
    return calls - 1  # fn itself


def python_calls_per_run(fn, n: int) -> float:
    """The calls of Python functions (not C ones) that fn() makes, averaged over n runs."""
    count = 0

    def profile(_frame, event, _arg):
        nonlocal count
        if event == "call":
            count += 1
    with _collector_paused():
        sys.setprofile(profile)
        try:
            for _ in range(n):
                fn()
        finally:
            sys.setprofile(None)
    return count / n


@contextlib.contextmanager
def _collector_paused():
    """Collect, then keep the cyclic collector off until the block ends (as it was)."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
