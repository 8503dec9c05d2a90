"""Reference workloads run as a guest and checked against numpy (used by `pvgpu run`, the demo,
the tests and the benchmarks)."""

from __future__ import annotations

import time

import numpy as np

WORKLOADS = ("vector-add", "saxpy", "gemm")
BLOCK = 256


def _grid(n: int) -> int:
    return max(1, -(-n // BLOCK))


def vector_add(ctx, n: int, rng) -> dict:
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    da, db, dc = ctx.to_device(a), ctx.to_device(b), ctx.empty(n, np.float32)
    ctx.launch("vector_add", grid=_grid(n), block=BLOCK, args=(da, db, dc, n))
    out = dc.to_host()
    for x in (da, db, dc):
        x.free()
    return {"ok": bool(np.array_equal(out, a + b)), "max_err": float(np.max(np.abs(out - (a + b)))) if n else 0.0}


def saxpy(ctx, n: int, rng) -> dict:
    alpha = np.float32(2.5)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    dx, dy = ctx.to_device(x), ctx.to_device(y)
    ctx.launch("saxpy", grid=_grid(n), block=BLOCK, args=(float(alpha), dx, dy, n))
    out = dy.to_host()
    ref = alpha * x + y
    for d in (dx, dy):
        d.free()
    return {"ok": bool(np.allclose(out, ref, rtol=1e-6, atol=1e-6)),
            "max_err": float(np.max(np.abs(out - ref))) if n else 0.0}


def gemm(ctx, n: int, rng) -> dict:
    """n is the matrix dimension (n x n times n x n)."""
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    da, db, dc = ctx.to_device(a), ctx.to_device(b), ctx.empty((n, n), np.float32)
    ctx.launch("gemm", grid=(_grid(n), n), block=BLOCK, args=(da, db, dc, n, n, n))
    out = dc.to_host()
    ref = a @ b
    for d in (da, db, dc):
        d.free()
    return {"ok": bool(np.allclose(out, ref, rtol=1e-4, atol=1e-3)),
            "max_err": float(np.max(np.abs(out - ref))) if n else 0.0}


RUNNERS = {"vector-add": vector_add, "saxpy": saxpy, "gemm": gemm}
DEFAULT_SIZES = {"vector-add": 1 << 20, "saxpy": 1 << 20, "gemm": 256}


def run_workload(ctx, name: str, size: int | None = None, seed: int = 0) -> dict:
    size = DEFAULT_SIZES[name] if size is None else size
    t0 = time.perf_counter()
    result = RUNNERS[name](ctx, size, np.random.default_rng(seed))
    result.update(workload=name, size=size, seconds=time.perf_counter() - t0)
    return result
