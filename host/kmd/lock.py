"""The device lock: a re-entrant lock under which no fence callback ever runs.

A fence callback may take a device lock: a scheduler's wake() takes its device's lock, a
backend completion takes the backend's. If callbacks ran on whichever thread signals
the fence, with whatever it holds, a thread holding device A's lock could signal a
fence (or register a callback on one that has just signalled, which runs it at once)
whose callback takes device B's lock, while another thread does the mirror image:
with cross-device dependencies (peer imports, imported events) A -> B and B -> A both
happen, and the two threads deadlock.

So every KMD device lock is a DeviceLock, and while a thread holds any DeviceLock, the
fence callbacks that would run on it (host/kmd/fence.py hands them to call_soon) are
queued on that thread instead. They run, in the order they were queued, as soon as the
thread holds none: when it releases its last DeviceLock, or while a Condition wait on
one has released them all. The queue is per thread, so other threads are not delayed,
and a callback never runs under a device lock, whichever path signalled its fence.
"""

from __future__ import annotations

import collections
import threading

_tls = threading.local()  # depth: DeviceLock levels held; queue: deferred calls; draining


def _depth() -> int:
    return getattr(_tls, "depth", 0)


def held() -> bool:
    """Whether the calling thread holds a DeviceLock."""
    return _depth() > 0


def call_soon(fn, *args) -> None:
    """fn(*args) now if the calling thread holds no DeviceLock, else once it holds none."""
    if _depth() == 0:
        fn(*args)
        return
    queue = getattr(_tls, "queue", None)
    if queue is None:
        queue = _tls.queue = collections.deque()
    queue.append((fn, args))


def _drain() -> None:
    """Run the calling thread's deferred calls (it holds no DeviceLock). A call that takes
    a lock and queues more leaves them to this loop, which keeps the order."""
    queue = getattr(_tls, "queue", None)
    if not queue or getattr(_tls, "draining", False):
        return
    _tls.draining = True
    try:
        while queue and _depth() == 0:
            fn, args = queue.popleft()
            fn(*args)
    finally:
        _tls.draining = False


class DeviceLock:
    """threading.RLock that counts, per thread, the DeviceLock levels held and runs the
    thread's deferred calls once it holds none. Usable with threading.Condition."""

    __slots__ = ("_lock",)

    def __init__(self):
        self._lock = threading.RLock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._lock.acquire(blocking, timeout):
            return False
        _tls.depth = _depth() + 1
        return True

    def release(self) -> None:
        self._lock.release()
        _tls.depth -= 1
        if _tls.depth == 0:
            _drain()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    # the protocol threading.Condition uses to release every level around a wait
    def _is_owned(self) -> bool:
        return self._lock._is_owned()

    def _release_save(self):
        state = self._lock._release_save()  # (levels, owner)
        _tls.depth -= state[0]
        if _tls.depth == 0:
            _drain()
        return state

    def _acquire_restore(self, state) -> None:
        self._lock._acquire_restore(state)
        _tls.depth = _depth() + state[0]

    def __repr__(self) -> str:
        return f"DeviceLock(owned={self._is_owned()})"
