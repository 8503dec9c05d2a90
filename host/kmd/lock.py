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


class _ThreadState(threading.local):
    depth = 0  # DeviceLock levels the thread holds
    queue = None  # its deferred calls: deque of (fn, args)
    draining = False


_tls = _ThreadState()


def held() -> bool:
    """Whether the calling thread holds a DeviceLock."""
    return _tls.depth > 0


def call_soon(fn, *args) -> None:
    """fn(*args) now if the calling thread holds no DeviceLock, else once it holds none."""
    if not _tls.depth:
        fn(*args)
        return
    queue = _tls.queue
    if queue is None:
        queue = _tls.queue = collections.deque()
    queue.append((fn, args))


def _drain() -> None:
    """Run the calling thread's deferred calls (it holds no DeviceLock). A call that takes
    a lock and queues more leaves them to this loop, which keeps the order."""
    if _tls.draining:
        return
    queue = _tls.queue
    _tls.draining = True
    try:
        while queue and not _tls.depth:
            fn, args = queue.popleft()
            fn(*args)
    finally:
        _tls.draining = False


class DeviceLock:
    """threading.RLock that counts, per thread, the DeviceLock levels held and runs the
    thread's deferred calls once it holds none. Usable with threading.Condition."""

    __slots__ = ("_lock", "_acquire", "_release", "owned")

    def __init__(self):
        self._lock = threading.RLock()
        self._acquire, self._release = self._lock.acquire, self._lock.release
        self.owned = self._lock._is_owned  # () -> whether the calling thread holds it

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._acquire(blocking, timeout):
            return False
        _tls.depth += 1
        return True

    def release(self) -> None:
        self._release()
        depth = _tls.depth = _tls.depth - 1
        if not depth and _tls.queue:
            _drain()

    def enter(self) -> bool:
        """Acquire; -> whether this is the thread's outermost DeviceLock level (it held
        none). `with lock as outermost:` is the same."""
        self._acquire()
        depth = _tls.depth
        _tls.depth = depth + 1
        return not depth

    __enter__ = enter

    def __exit__(self, *exc) -> None:
        self._release()
        depth = _tls.depth = _tls.depth - 1
        if not depth and _tls.queue:
            _drain()

    # the protocol threading.Condition uses to release every level around a wait
    def _is_owned(self) -> bool:
        return self._lock._is_owned()

    def _release_save(self):
        state = self._lock._release_save()  # (levels, owner)
        depth = _tls.depth = _tls.depth - state[0]
        if not depth and _tls.queue:
            _drain()
        return state

    def _acquire_restore(self, state) -> None:
        self._lock._acquire_restore(state)
        _tls.depth += state[0]

    def __repr__(self) -> str:
        return f"DeviceLock(owned={self._is_owned()})"


class DeviceCondition(threading.Condition):
    """threading.Condition on a DeviceLock that counts the threads waiting on it, so that
    a notification with none waiting (every job's retirement) is one attribute test:
    `if cond.waiting: cond.notify_all()`."""

    def __init__(self, lock: DeviceLock):
        super().__init__(lock)
        self.waiting = 0  # changed with the lock held

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting += 1
        try:
            return super().wait(timeout)
        finally:
            self.waiting -= 1
