"""Helpers for checks that must hold on any machine and under load, without timing.

Python-level work. `python_calls` counts the function calls (Python and C) a call makes,
for checks that work is done in bulk rather than per element: a count, unlike a
duration, does not depend on the machine or its load. `python_calls_per_run` counts the
calls of Python functions only, averaged over repeated runs: the call budgets of a hot
path. (Longer and longer burns, for
checks that need a kernel still running when they look, are pvgpu/conformance/burns.py:
the conformance checks use them too.)
"""

from __future__ import annotations

import sys


def python_calls(fn) -> int:
    """About how many function calls (Python functions, and C functions called from
    Python) fn() makes: per-element work shows as a count that grows with the elements."""
    calls = 0

    def profile(_frame, event, _arg):
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

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
    sys.setprofile(profile)
    try:
        for _ in range(n):
            fn()
    finally:
        sys.setprofile(None)
    return count / n
