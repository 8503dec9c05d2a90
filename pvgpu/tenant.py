"""Tenant workloads: what one guest of a multi-guest run does (the demo and `bench sched`).

Each workload keeps the GPU busy for `seconds` and checks results as it goes:

  long    burn kernels of 20 ms, back to back (launch, synchronize, launch, ...);
          Gdev's "long kernels" tenant
  short   burn kernels of 1 ms, each launched as soon as the previous one is synchronized:
          the gap between them is the guest's own turnaround (≈0.4 ms in this emulator);
          Gdev's "short kernels" tenant
  copy    copy-heavy: 4 MiB host->device and back on one stream, verified, while a
          second stream keeps up to two 2 ms kernels queued on the compute engine
  mixed   random kernel lengths (0.5-10 ms) interleaved with a verified vector_add

Burn kernels occupy device time without host CPU (the emulated compute engine sleeps), so
several tenants on a 2-core machine compete for the *GPU*, not for the CPU. Every
workload finishes with a verification kernel, and `verified` is False on any mismatch.

`stop` (optional, a callable) ends a workload early: it is checked once per iteration, so
`pvgpu tenant` can stop cleanly on SIGTERM -- finish the iteration, verify, report.
"""

from __future__ import annotations

import collections
import random
import time

import numpy as np

WORKLOADS = ("long", "short", "copy", "mixed")
LONG_US = 20_000
SHORT_US = 1_000
SHORT_GAP_S = 0.0  # extra think time between short kernels (the turnaround is the gap)
COPY_BURN_US = 2_000
COPY_BURNS_QUEUED = 2


def _check_scale(ctx, n: int = 4096, alpha: float = 3.0) -> bool:
    x = np.arange(n, dtype=np.float32)
    dx, dy = ctx.to_device(x), ctx.empty(n, np.float32)
    ctx.launch("scale", grid=(n + 255) // 256, block=256, args=(dy, dx, alpha, n))
    ok = np.array_equal(dy.to_host(), x * np.float32(alpha))
    dx.free()
    dy.free()
    return ok


def run(ctx, workload: str, seconds: float, seed: int = 0, stop=None,
        kernel_us: int | None = None) -> dict:
    """Run one workload on a context for `seconds` (or until `stop()` is true);
    -> {workload, iterations, kernels, bytes_copied, seconds, verified, stopped}."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; one of {', '.join(WORKLOADS)}")
    rng = random.Random(seed)
    t0 = time.perf_counter()
    deadline = t0 + seconds
    stop = stop or (lambda: False)

    def running() -> bool:
        return time.perf_counter() < deadline and not stop()
    iterations = kernels = 0
    copied = 0
    verified = True
    if workload in ("long", "short"):
        us = kernel_us or (LONG_US if workload == "long" else SHORT_US)
        while running():
            ctx.launch("burn", grid=1, block=1, args=(us,))
            ctx.synchronize()
            kernels += 1
            iterations += 1
            if workload == "short":
                if SHORT_GAP_S:
                    time.sleep(SHORT_GAP_S)
    elif workload == "copy":
        n = 1 << 20  # 4 MiB of float32
        data = np.arange(n, dtype=np.float32)
        dev = ctx.empty(n, np.float32)
        out = np.empty(n, np.float32)
        compute = ctx.create_stream()
        # at most COPY_BURNS_QUEUED burns outstanding: a backlog would outlive the run
        free = [ctx.create_event() for _ in range(COPY_BURNS_QUEUED)]
        queued = collections.deque()
        try:
            while running():
                while queued and queued[0].query():
                    free.append(queued.popleft())
                if free:
                    compute.launch("burn", grid=1, block=1, args=(COPY_BURN_US,))
                    ev = free.pop()
                    ev.record(compute)
                    queued.append(ev)
                    kernels += 1
                data[0] = iterations
                dev.copy_from_host(data)
                dev.to_host(out)
                verified &= bool(np.array_equal(out, data))
                copied += 2 * data.nbytes
                iterations += 1
            compute.synchronize()
        finally:
            compute.destroy()
            for ev in (*free, *queued):
                ev.destroy()
        dev.free()
    else:  # mixed
        n = 1 << 18
        a = np.arange(n, dtype=np.float32)
        b = np.ones(n, dtype=np.float32)
        da, db, dc = ctx.to_device(a), ctx.to_device(b), ctx.empty(n, np.float32)
        while running():
            ctx.launch("burn", grid=1, block=1, args=(rng.randint(500, 10_000),))
            ctx.launch("vector_add", grid=(n + 255) // 256, block=256, args=(da, db, dc, n))
            kernels += 2
            if iterations % 4 == 0:
                verified &= bool(np.array_equal(dc.to_host(), a + b))
            else:
                ctx.synchronize()
            iterations += 1
        for arr in (da, db, dc):
            arr.free()
    ctx.synchronize()
    verified &= _check_scale(ctx)
    return {"workload": workload, "iterations": iterations, "kernels": kernels,
            "bytes_copied": copied, "seconds": time.perf_counter() - t0, "verified": verified,
            "stopped": bool(stop())}
