"""Stopping a launch between instructions and inside the long ones (SM-EXEC-5).

The executor checks the engine's stop token before every instruction. A few instructions
can take long by themselves -- atomics whose lanes all hit one address (a round per lane),
float operations computed exactly lane by lane -- so their loops call check() every
CHECK_EVERY iterations, which raises Stopped when the engine has stopped the launch.
running(ctl) binds the token of the launch running on this thread.
"""

from __future__ import annotations

import threading

CHECK_EVERY = 256  # iterations of a per-lane or per-round loop between checks

_current = threading.local()


class Stopped(Exception):
    """The engine stopped the launch (reset, shutdown, job timeout)."""


class running:
    """with running(ctl): the launch of token ctl runs on this thread."""

    __slots__ = ("ctl", "previous")

    def __init__(self, ctl):
        self.ctl = ctl

    def __enter__(self):
        self.previous = getattr(_current, "ctl", None)
        _current.ctl = self.ctl

    def __exit__(self, *exc):
        _current.ctl = self.previous


def check() -> None:
    ctl = getattr(_current, "ctl", None)
    if ctl is not None and ctl.stopped():
        raise Stopped()
