"""The machine's memcpy limits for the copy benchmarks: one `np.copyto` (one thread), and
the best memcpy by any number of threads, 1 .. the CPUs (the same bytes cut into one
contiguous slice per thread).

A copy engine of the emulated GPU shares a large copy out to its DMA lanes (one worker
thread per CPU, host/hw/compute_units.py), so it may beat one memcpy on a machine with
idle cores. The best memcpy by any number of threads is what any copy of this machine can
reach (on a loaded machine that may be one thread: a parallel copy waits for its slowest
thread); `pvgpu bench copies` and `pvgpu bench p2p` report the ratio against both limits.

    mt = ParallelMemcpy(2)      # a persistent pool: no thread start-up in the timings
    mt(dst, src)                # slice i of n / 2 bytes on thread i, the caller takes the last
    mt.close()
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

MAX_THREADS = 8


def thread_counts() -> list:
    """The thread counts of the parallel memcpys the limit tries besides one memcpy:
    2 .. the CPUs (at most MAX_THREADS)."""
    return list(range(2, max(2, min(MAX_THREADS, os.cpu_count() or 1)) + 1))


def slices(nbytes: int, threads: int) -> list:
    """[lo, hi) byte ranges that cut nbytes into `threads` contiguous pieces, in order,
    each a multiple of 4 KiB except the last."""
    if nbytes == 0:
        return [(0, 0)]
    step = -(-nbytes // threads)
    step = -(-step // 4096) * 4096
    return [(lo, min(lo + step, nbytes)) for lo in range(0, nbytes, step)]


class ParallelMemcpy:
    """np.copyto(dst, src) by `threads` threads (a pool kept between calls)."""

    def __init__(self, threads: int):
        if threads < 1:
            raise ValueError("threads must be >= 1")
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads - 1, "memcpy") if threads > 1 else None

    def __call__(self, dst: np.ndarray, src: np.ndarray) -> None:
        d = dst.reshape(-1).view(np.uint8)
        s = src.reshape(-1).view(np.uint8)
        if d.shape != s.shape:
            raise ValueError(f"dst has {d.shape[0]} bytes, src {s.shape[0]}")
        pieces = slices(d.shape[0], self.threads)
        futures = [self._pool.submit(np.copyto, d[lo:hi], s[lo:hi]) for lo, hi in pieces[:-1]]
        lo, hi = pieces[-1]
        np.copyto(d[lo:hi], s[lo:hi])
        for f in futures:
            f.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def best_parallel(times: dict) -> tuple:
    """{threads: seconds} (1: one memcpy) -> (seconds, threads) of the fastest."""
    threads = min(times, key=times.get)
    return times[threads], threads
