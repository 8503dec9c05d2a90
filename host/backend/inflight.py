"""Jobs the backend has on a GPU that have not finished: the I/O loop's headroom in O(1).

Before it takes each chain the device must know whether the KMD takes more work
(`KmdDevice.has_headroom`: fewer than `max_queued_jobs` jobs queued on the device and
fewer than `max_client_queued_jobs` of the session), and otherwise leave the chains in
the avail ring ([VQ-ORDER-3]). Asking the KMD scans its schedulers and contexts under
the device lock. So the backend counts what it submitted itself and has not yet seen
finish, per session and per GPU: `track` takes a job's finished fence, and the fence's
callback ends the count (completion, error or cancellation alike). Every queued job of
a session was submitted by the backend and is unfinished, so while both counts are
below the KMD's limits there is headroom for certain, and only above them is the KMD
asked; its answer decides as it always did.

A job that ran to completion on the submitting thread (a short job on an idle ring) is
finished when `track` sees it and costs nothing here.
"""

from __future__ import annotations

import threading


class DeviceJobs:
    """Unfinished jobs of every session on one GPU; `limit`: the KMD's max_queued_jobs."""

    __slots__ = ("count", "limit", "lock")

    def __init__(self, limit: int):
        self.count = 0
        self.limit = limit
        self.lock = threading.Lock()  # fence callbacks run on engine and interrupt threads


class SessionJobs:
    """Unfinished jobs of one session on one GPU; `limit`: the KMD's
    max_client_queued_jobs."""

    __slots__ = ("count", "limit", "device")

    def __init__(self, limit: int, device: DeviceJobs):
        self.count = 0
        self.limit = limit
        self.device = device

    def room(self) -> bool:
        """Whether both counts are below their limits: then the KMD has headroom."""
        return self.count < self.limit and self.device.count < self.device.limit

    def track(self, fence) -> None:
        """Count the job of `fence` until it signals."""
        if fence.signaled:
            return
        with self.device.lock:
            self.count += 1
            self.device.count += 1
        fence.add_done_callback(self._finished)  # runs at once if it signalled meanwhile

    def _finished(self, _fence) -> None:
        with self.device.lock:
            self.count -= 1
            self.device.count -= 1
