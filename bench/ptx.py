"""`pvgpu bench ptx`: kernels of one's own (PTX) on the emulated SMs, against numpy and the
built-in kernels, in the same run.

  lanes      lane-instructions per second of the SMs on a divergence-free kernel over
             1 Mi threads, and on a divergent one (bench/sm.py: the hardware alone)
  vector_add c = a + b over 16 Mi floats: the PTX kernel, the built-in `vector_add`, and
             numpy.add on the same data
  saxpy      y = alpha * x + y over 16 Mi floats, likewise
  sgemm      a tiled SGEMM (16 x 16 tiles in shared memory, two barriers per tile) in
             GFLOP/s, against numpy.matmul
  reduce     a warp-shuffle reduction of 16 Mi floats (one atomicAdd per warp) against
             numpy.sum
  small      the fixed cost of a launch: `vector_add` of 256 floats (one block), PTX against
             the built-in kernel, launched asynchronously on one stream (launches/s) and
             launched + synchronized (the time of one)

The kernels are bench/kernels/ptx_bench.cu, compiled by nvcc into the PTX committed beside
it, which `ctx.load_module` compiles into a code object: no CUDA toolkit is needed. Every
end-to-end figure runs through a host process and the guest API in the shared memory
model: a launch followed by `ctx.synchronize()`, so it includes one round trip. Each
result is checked against numpy. Medians of interleaved rounds (bench/common.py); ratios
are `numpy time / kernel time` (1.0 = as fast as numpy).
"""

from __future__ import annotations

import os
import shutil
import statistics
from pathlib import Path

import numpy as np

from pvgpu.bench.common import rounds, write_json

KERNELS = Path(__file__).with_name("kernels") / "ptx_bench.ptx"
MiB = 1 << 20
TARGET_LANES = 200e6  # lane-instructions/s, divergence-free, 1 Mi threads
TARGET_VECTOR_ADD = 0.1  # PTX vector_add against numpy


def _median(times: list) -> float:
    return statistics.median(times)


def _check(name: str, ok: bool) -> None:
    if not ok:
        raise AssertionError(f"{name}: the kernel's result differs from numpy's")


def end_to_end(conn, quick: bool = False, out=print, *, n: int | None = None,
               gemm_n: int | None = None, small_launches: int | None = None) -> dict:
    """The figures through the guest API on `conn` (n floats per vector kernel, a gemm_n^3
    SGEMM, small_launches asynchronous launches of the small kernel per round; defaults by
    `quick`)."""
    n = n or ((1 << 22) if quick else (1 << 24))
    small_launches = small_launches or (200 if quick else 1000)
    gemm_n = gemm_n or (128 if quick else 256)
    reps = {"max_reps": 3 if quick else 7, "min_reps": 3, "budget": 2.0 if quick else 10.0,
            "warmup": True}
    results = {}
    rng = np.random.default_rng(0)
    with conn.devices[0].create_context() as ctx:
        mod = ctx.load_module(KERNELS)
        threads, blocks = 256, -(-n // 256)

        # vector_add: PTX, built-in, numpy
        a = rng.standard_normal(n).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        da, db, dc = ctx.to_device(a), ctx.to_device(b), ctx.empty(n, np.float32)
        ptx_add = mod.get_function("vector_add")
        c = np.empty_like(a)

        def run_ptx():
            ptx_add.launch(blocks, threads, (da, db, dc, n))
            ctx.synchronize()

        def run_builtin():
            ctx.launch("vector_add", blocks, threads, (da, db, dc, n))
            ctx.synchronize()

        times = rounds({"ptx": run_ptx, "builtin": run_builtin,
                        "numpy": lambda: np.add(a, b, out=c)}, **reps)
        run_ptx()
        _check("vector_add", np.array_equal(dc.to_host(), a + b))
        t = {k: _median(v) for k, v in times.items()}
        results["vector_add"] = {"n": n, "ptx_s": t["ptx"], "builtin_s": t["builtin"],
                                 "numpy_s": t["numpy"], "ptx_vs_numpy": t["numpy"] / t["ptx"],
                                 "ptx_vs_builtin": t["builtin"] / t["ptx"]}
        out(f"vector_add {n} floats: PTX {t['ptx'] * 1e3:7.1f} ms, built-in "
            f"{t['builtin'] * 1e3:6.1f} ms, numpy {t['numpy'] * 1e3:5.1f} ms: "
            f"PTX {t['numpy'] / t['ptx']:.3f}x numpy, {t['builtin'] / t['ptx']:.3f}x built-in")

        # saxpy: y = alpha x + y, in place (each kernel starts from the same y)
        x, y0, alpha = a, b, np.float32(2.5)
        dy = ctx.to_device(y0)
        ptx_saxpy = mod.get_function("saxpy")
        y = y0.copy()

        def reset():
            dy.copy_from_host(y0)

        def saxpy_ptx():
            ptx_saxpy.launch(blocks, threads, (alpha, da, dy, n))
            ctx.synchronize()

        def saxpy_builtin():
            ctx.launch("saxpy", blocks, threads, (float(alpha), da, dy, n))
            ctx.synchronize()

        def saxpy_numpy():
            np.multiply(x, alpha, out=y)
            np.add(y, y0, out=y)

        times = rounds({"ptx": (reset, saxpy_ptx), "builtin": (reset, saxpy_builtin),
                        "numpy": saxpy_numpy}, **reps)
        reset()
        saxpy_ptx()
        _check("saxpy", np.allclose(dy.to_host(), alpha * x + y0, rtol=1e-6, atol=1e-6))
        t = {k: _median(v) for k, v in times.items()}
        results["saxpy"] = {"n": n, "ptx_s": t["ptx"], "builtin_s": t["builtin"],
                            "numpy_s": t["numpy"], "ptx_vs_numpy": t["numpy"] / t["ptx"],
                            "ptx_vs_builtin": t["builtin"] / t["ptx"]}
        out(f"saxpy      {n} floats: PTX {t['ptx'] * 1e3:7.1f} ms, built-in "
            f"{t['builtin'] * 1e3:6.1f} ms, numpy {t['numpy'] * 1e3:5.1f} ms: "
            f"PTX {t['numpy'] / t['ptx']:.3f}x numpy, {t['builtin'] / t['ptx']:.3f}x built-in")
        for arr in (da, db, dc, dy):
            arr.free()

        # tiled SGEMM: GFLOP/s against numpy.matmul
        m = k = gemm_n
        A = rng.standard_normal((m, k)).astype(np.float32)
        B = rng.standard_normal((k, m)).astype(np.float32)
        dA, dB, dC = ctx.to_device(A), ctx.to_device(B), ctx.empty((m, m), np.float32)
        sgemm = mod.get_function("sgemm_tiled")
        tiles = -(-m // 16)

        def gemm_ptx():
            sgemm.launch((tiles, tiles), (16, 16), (dA, dB, dC, m, m, k))
            ctx.synchronize()

        times = rounds({"ptx": gemm_ptx, "numpy": lambda: np.matmul(A, B)},
                       **dict(reps, max_reps=3, min_reps=1))
        gemm_ptx()
        exact = A.astype(np.float64) @ B.astype(np.float64)
        bound = k * np.finfo(np.float32).eps * (np.abs(A) @ np.abs(B))
        _check("sgemm", np.all(np.abs(dC.to_host() - exact) <= bound))
        t = {kk: _median(v) for kk, v in times.items()}
        flops = 2.0 * m * m * k
        results["sgemm"] = {"n": m, "ptx_s": t["ptx"], "numpy_s": t["numpy"],
                            "ptx_gflops": flops / t["ptx"] / 1e9,
                            "numpy_gflops": flops / t["numpy"] / 1e9,
                            "ptx_vs_numpy": t["numpy"] / t["ptx"]}
        out(f"sgemm      {m}^3: PTX {flops / t['ptx'] / 1e9:7.3f} GFLOP/s, numpy "
            f"{flops / t['numpy'] / 1e9:7.1f} GFLOP/s: {t['numpy'] / t['ptx']:.5f}x numpy")
        for arr in (dA, dB, dC):
            arr.free()

        # warp-shuffle reduction against numpy.sum
        data = rng.random(n, dtype=np.float32)
        dd, dsum = ctx.to_device(data), ctx.zeros(1, np.float32)
        reduce_fn = mod.get_function("reduce_shfl")
        red_blocks = 1024

        def reduce_ptx():
            reduce_fn.launch(red_blocks, threads, (dd, dsum, n))
            ctx.synchronize()

        times = rounds({"ptx": (lambda: dsum.copy_from_host(np.zeros(1, np.float32)), reduce_ptx),
                        "numpy": lambda: np.sum(data)}, **reps)
        dsum.copy_from_host(np.zeros(1, np.float32))
        reduce_ptx()
        exact = float(np.sum(data, dtype=np.float64))
        _check("reduce", abs(float(dsum.to_host()[0]) - exact) <= 1e-4 * exact)
        t = {kk: _median(v) for kk, v in times.items()}
        results["reduce"] = {"n": n, "ptx_s": t["ptx"], "numpy_s": t["numpy"],
                             "ptx_vs_numpy": t["numpy"] / t["ptx"]}
        out(f"reduce     {n} floats: PTX {t['ptx'] * 1e3:7.1f} ms, numpy "
            f"{t['numpy'] * 1e3:5.1f} ms: {t['numpy'] / t['ptx']:.3f}x numpy")
        results["small"] = _small_launches(ctx, mod, small_launches, reps, out)
        mod.unload()
    return results


SMALL = 256  # floats of the small kernel: one block


def _small_launches(ctx, mod, launches: int, reps: dict, out) -> dict:
    """A launch's fixed cost: vector_add of SMALL floats, PTX and built-in, `launches`
    asynchronous ones on one stream then one synchronize, and one launch + synchronize."""
    a = np.arange(SMALL, dtype=np.float32)
    b = np.full(SMALL, 0.5, np.float32)
    da, db, dc = ctx.to_device(a), ctx.to_device(b), ctx.empty(SMALL, np.float32)
    ptx_add = mod.get_function("vector_add")
    stream = ctx.create_stream()
    args = (da, db, dc, SMALL)
    kernels = {"ptx": lambda s=None: ptx_add.launch(1, SMALL, args, stream=s),
               "builtin": lambda s=None: ctx.launch("vector_add", 1, SMALL, args, stream=s)}

    def many(launch):
        def run():
            for _ in range(launches):
                launch(stream)
            stream.synchronize()
        return run

    def one(launch):
        def run():
            launch()
            ctx.synchronize()
        return run

    times = rounds({**{f"{k}_async": many(fn) for k, fn in kernels.items()},
                    **{f"{k}_sync": one(fn) for k, fn in kernels.items()}}, **reps)
    for name, fn in kernels.items():
        dc.copy_from_host(np.zeros(SMALL, np.float32))
        many(fn)()
        _check(f"small {name} vector_add", np.array_equal(dc.to_host(), a + b))
    stream.destroy()
    for arr in (da, db, dc):
        arr.free()
    t = {k: _median(v) for k, v in times.items()}
    res = {"n": SMALL, "launches": launches,
           "ptx_per_s": launches / t["ptx_async"], "builtin_per_s": launches / t["builtin_async"],
           "ptx_sync_s": t["ptx_sync"], "builtin_sync_s": t["builtin_sync"]}
    res["ptx_vs_builtin_async"] = res["ptx_per_s"] / res["builtin_per_s"]
    res["ptx_vs_builtin_sync"] = t["builtin_sync"] / t["ptx_sync"]
    out(f"small      vector_add of {SMALL} floats: async PTX {res['ptx_per_s']:7.0f}/s, built-in "
        f"{res['builtin_per_s']:7.0f}/s ({res['ptx_vs_builtin_async']:.3f}x); launch + "
        f"synchronize PTX {t['ptx_sync'] * 1e6:5.0f} us, built-in {t['builtin_sync'] * 1e6:5.0f} us "
        f"({res['ptx_vs_builtin_sync']:.3f}x)")
    return res


def run_bench(json_path: str | None = None, quick: bool = False, out=None) -> dict:
    out = out or (lambda *a: print(*a, flush=True))
    from pvgpu.bench import sm
    from pvgpu import guest
    from pvgpu.procs import HostProcess, private_endpoint

    out("The SMs alone (no host, no driver):")
    results = {"sm": sm.run_bench(quick=quick, out=lambda s: out("  " + s))}
    endpoint, tmp = private_endpoint("pvgpu-bench-ptx")
    out("Through a host process and the guest API (shared memory model, launch + synchronize):")
    try:
        with HostProcess([endpoint], vram="1G"):
            with guest.connect(endpoint, mem_size=640 * MiB) as conn:
                results.update(end_to_end(conn, quick, lambda s: out("  " + s)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lanes = results["sm"]["lanes"]["lane_instructions_per_s"]
    vec = results["vector_add"]["ptx_vs_numpy"]
    out(f"targets: lane-instructions/s {lanes / 1e6:.0f} M (target >= {TARGET_LANES / 1e6:.0f} M: "
        f"{lanes / TARGET_LANES:.2f}x the target); PTX vector_add {vec:.3f}x numpy (target >= "
        f"{TARGET_VECTOR_ADD}: {vec / TARGET_VECTOR_ADD:.2f}x the target)")
    results["machine"] = {"cpus": os.cpu_count()}
    write_json(json_path, results, out)
    return results
