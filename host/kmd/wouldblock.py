"""Calls that would wait for the GPU: WouldBlock, and the calling thread's blocking mode.

A few KMD calls cannot always complete at once: an allocation whose only eviction victims
have jobs on the hardware, a mapping whose range is still being unmapped behind the
context's work, a shared buffer that must migrate to system memory while a job uses it.
In an in-process caller's thread they wait (device lock released) and give up with an
error after the device's `timeout`.

The backend's I/O thread must never wait inside the KMD: it makes its calls inside
`nonblocking()`, and there such a call raises WouldBlock instead (O_NONBLOCK and -EAGAIN,
with a fence in place of poll()). A call that raises WouldBlock has changed nothing; its
`fence` signals once retrying may succeed, and `error` is what the call would have raised
had it waited out the device's timeout. The caller retries it after the fence signalled,
and gives up with `error` once that timeout has passed.
"""

from __future__ import annotations

import threading
import time

from pvgpu.host.kmd.fence import Fence

POLL = 0.05  # seconds between re-checks of a blocking wait (job completion also wakes it)
BLOCKING, NONBLOCKING, EXPIRED = 0, 1, 2  # a thread's mode (EXPIRED: non-blocking, gave up)


class _ThreadState(threading.local):
    mode = BLOCKING


_tls = _ThreadState()


class WouldBlock(Exception):
    """A call made in non-blocking mode would have to wait: retry it once `fence` signalled
    (the first of `fences` to signal); `error` is the KmdError of a wait that timed out."""

    def __init__(self, fences, error: Exception):
        super().__init__(str(error))
        self.fences = [f for f in fences if not f.signaled]
        self.error = error
        self.fence = _first_of(self.fences)


def _first_of(fences) -> Fence:
    if len(fences) == 1:
        return fences[0]
    first = Fence(-1, 0)
    for f in fences:
        f.add_done_callback(lambda _f: first.signal())
    return first


class nonblocking:
    """Context manager: KMD calls on this thread raise WouldBlock instead of waiting; with
    `expired` (the caller has retried for the device's timeout) they raise the error their
    wait would have ended in. (A class, not a generator: the backend enters it per command.)"""

    __slots__ = ("mode", "before")

    def __init__(self, expired: bool = False):
        self.mode = EXPIRED if expired else NONBLOCKING

    def __enter__(self) -> None:
        self.before = _tls.mode
        _tls.mode = self.mode

    def __exit__(self, *exc) -> None:
        _tls.mode = self.before


def wait(device, fences, deadline: float, error: Exception) -> None:
    """The one way the KMD waits for the GPU on a caller's behalf (device.lock held): in
    non-blocking mode raise WouldBlock(fences, error) (`error` if none of `fences` is
    pending: nothing on the GPU stands in the way then); else wait a little (lock released,
    woken early by job completions), raising `error` once `deadline` (monotonic) passed.
    The caller re-checks its condition afterwards."""
    mode = _tls.mode
    if mode != BLOCKING:
        fences = [f for f in fences if not f.signaled]
        if not fences or mode == EXPIRED:  # no GPU work to wait for, or waited long enough
            raise error
        raise WouldBlock(fences, error)
    left = deadline - time.monotonic()
    if left <= 0:
        raise error
    device._cond.wait(min(POLL, left))
