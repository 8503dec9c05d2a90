"""Reservation objects: the fences of one buffer, by usage (Linux dma_resv).

Every buffer that can be shared has one DmaResv, and every dma-buf exported from it
refers to that same object, so the exporter's and the importers' jobs synchronise
implicitly through it. A job that touches the buffer adds its fence with a usage:

  DMA_RESV_USAGE_KERNEL    the driver's own moves and clears (eviction, migration)
  DMA_RESV_USAGE_WRITE     implicit-sync writers
  DMA_RESV_USAGE_READ      implicit-sync readers
  DMA_RESV_USAGE_BOOKKEEP  tracked for the buffer's lifetime only, never waited for implicitly

The usages are ordered; asking for the fences of one usage returns every fence at or
below it (dma_resv_iter). A new job waits for dma_resv_usage_rw(write): a reader for
KERNEL+WRITE, a writer also for READ, so that it does not overwrite what is still read.

A fence context is one timeline (a scheduler entity, else a device's engine): its
fences signal in sequence order,
so a later fence of a context stands for the earlier ones (dma_resv_add_fence). Adding a
fence replaces a fence of the same context whose usage is the same or weaker when the
new one is later, and drops the new one when such a stored fence is already later.
Signalled fences are pruned whenever fences are added or listed.

Fences signal on engine threads, so the fence list is guarded by a lock; nothing here
blocks, and no fence callback is installed.

RESV_LOCK stands in for the ww_mutex acquire context of a submission: a driver holds it
while it reads a buffer's implicit dependencies, queues the job and adds the job's
fence, and while it checks that a buffer is idle and adds the fence of a move, so no
job and no move can slip between another's check and its fence. It is taken after a
device's lock and never held while waiting.
"""

from __future__ import annotations

import threading

RESV_LOCK = threading.RLock()

DMA_RESV_USAGE_KERNEL = 0
DMA_RESV_USAGE_WRITE = 1
DMA_RESV_USAGE_READ = 2
DMA_RESV_USAGE_BOOKKEEP = 3

USAGE_NAMES = {DMA_RESV_USAGE_KERNEL: "kernel", DMA_RESV_USAGE_WRITE: "write",
               DMA_RESV_USAGE_READ: "read", DMA_RESV_USAGE_BOOKKEEP: "bookkeep"}


def dma_resv_usage_rw(write: bool) -> int:
    """The usage whose fences a new job must wait for: a writer waits for readers too."""
    return DMA_RESV_USAGE_READ if write else DMA_RESV_USAGE_WRITE


def fence_context(fence):
    """The timeline a fence belongs to (dma_fence.context): a scheduler fence's entity,
    else its (device, engine)."""
    context = getattr(fence, "context", None)
    return context if context is not None else (fence.device, fence.engine)


def _check_usage(usage) -> int:
    if usage not in USAGE_NAMES or isinstance(usage, bool):
        raise ValueError(f"bad dma_resv usage {usage!r}")
    return usage


class DmaResv:
    """The fences of one buffer, at most one per (context, usage)."""

    __slots__ = ("_lock", "_fences")

    def __init__(self):
        self._lock = threading.Lock()
        self._fences = []  # [(fence, usage)], unsignalled when last pruned

    def add_fence(self, fence, usage: int) -> None:
        """dma_resv_add_fence: track `fence` for `usage`."""
        _check_usage(usage)
        if fence.signaled:
            return
        ctx = fence_context(fence)
        with self._lock:
            kept = []
            for old, old_usage in self._fences:
                if old.signaled:
                    continue
                if fence_context(old) == ctx:
                    if old_usage >= usage and fence.seq >= old.seq:
                        continue  # the new fence stands for it
                    if old_usage <= usage and old.seq >= fence.seq:
                        return  # it already stands for the new fence
                kept.append((old, old_usage))
            kept.append((fence, usage))
            self._fences = kept

    def fences(self, usage: int = DMA_RESV_USAGE_BOOKKEEP) -> list:
        """The unsignalled fences of `usage` and every stronger usage (dma_resv_iter)."""
        _check_usage(usage)
        with self._lock:
            self._fences = [(f, u) for f, u in self._fences if not f.signaled]
            return [f for f, u in self._fences if u <= usage]

    def implicit_deps(self, write: bool) -> list:
        """The fences a new job that reads (or writes) the buffer must wait for."""
        return self.fences(dma_resv_usage_rw(write))

    def test_signaled(self, usage: int = DMA_RESV_USAGE_BOOKKEEP) -> bool:
        """dma_resv_test_signaled: whether every fence of `usage` (or stronger) signalled."""
        return not self.fences(usage)

    def __len__(self) -> int:
        """Fences held, including any that signalled since the last pruning."""
        with self._lock:
            return len(self._fences)

    def __repr__(self) -> str:
        with self._lock:
            held = ", ".join(f"{USAGE_NAMES[u]}:{f!r}" for f, u in self._fences)
        return f"DmaResv([{held}])"
