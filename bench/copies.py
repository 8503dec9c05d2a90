"""`pvgpu bench copies`: host<->device copies by kind of host memory, against memcpy.

  sizes      1 KiB ... 256 MiB (powers of 4), host->device and device->host, shared memory
             model: pinned memory (one DMA per request, no bounce), pageable memory through
             the pipelined bounce chunks, and pageable one chunk at a time (pipeline=False);
             each against numpy `copyto` of the same size measured in the same run
  inline     the same three for the inline memory model (sizes from 64 KiB)
  chunks     pageable 64 MiB with bounce chunks of 256 KiB ... 16 MiB (Gdev found 4 MiB best),
             pipelined, and the pinned request size at 256 MiB
  crossover  one synchronous request (one bounce chunk holding the whole copy) against the
             chunk pipeline (four chunks of a quarter each), 16 KiB ... 16 MiB: below the
             crossover one request is cheaper; and tiny H2D copies (8 ... 216 bytes) whose
             data rides in the command's descriptor against the bounce chunk, beside the
             bare no-op round trip

Medians of interleaved repetitions (every variant of a size runs once per round, so a
drifting machine affects all alike). Ratios against memcpy are `memcpy time / copy time`
(1.0 = as fast as one memcpy of the same bytes). A copy engine shares large copies out to
its DMA lanes (one thread per CPU), so the sizes table also measures memcpys of the same
bytes by 2 .. CPUs threads (bench/memcpy.py) and reports the pinned and device copies
against the best memcpy by any number of threads too (`*_vs_memcpy_mt`).
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import statistics
import time

import numpy as np

from pvgpu.bench.common import rounds, write_json
from pvgpu.bench.memcpy import ParallelMemcpy, best_parallel, thread_counts
from pvgpu import guest
from pvgpu.guest.api.commands import ring_command
from pvgpu.procs import HostProcess, private_endpoint
from pvgpu.spec import wire

KiB, MiB = 1 << 10, 1 << 20
SIZES = [KiB << (2 * k) for k in range(10)]  # 1 KiB ... 256 MiB
QUICK_SIZES = [KiB, 64 * KiB, 4 * MiB, 16 * MiB]
INLINE_MIN = 64 * KiB
SWEEP_SIZE, SWEEP_CHUNKS = 64 * MiB, [256 * KiB << k for k in range(7)]  # 256 KiB ... 16 MiB
QUICK_SWEEP_SIZE, QUICK_SWEEP_CHUNKS = 16 * MiB, [1 * MiB, 4 * MiB, 16 * MiB]
PINNED_REQUESTS = [8 * MiB, 16 * MiB, 32 * MiB, 64 * MiB, 256 * MiB]
CROSS_SIZES = [16 * KiB << k for k in range(13)]  # 16 KiB ... 64 MiB
QUICK_CROSS_SIZES = [64 * KiB, 1 * MiB, 4 * MiB]
TINY = [8, 64, 216]
MEM_SIZE = 640 * MiB  # 256 MiB pinned + staging (up to 4 x 16 MiB) + rings
TARGET_PINNED = 0.85  # pinned >= 0.85x memcpy (one thread) for >= 16 MiB (issue 12)
TARGET_PIPELINE = 1.3  # pipelined >= 1.3x faster than unpipelined for >= 16 MiB


def _rounds(variants: dict, *, min_reps: int, max_reps: int, budget: float) -> dict:
    """Median seconds of each variant (name -> fn, or (setup, fn)), interleaved after one
    warm-up round (bench/common.py)."""
    times = rounds(variants, max_reps=max_reps, min_reps=min_reps, budget=budget, warmup=True)
    return {k: statistics.median(v) for k, v in times.items()}


def _reps(size: int, quick: bool) -> dict:
    if quick:
        return {"min_reps": 3, "max_reps": 30, "budget": 0.15}
    if size >= 64 * MiB:
        return {"min_reps": 5, "max_reps": 9, "budget": 1.0}
    return {"min_reps": 7, "max_reps": 300, "budget": 0.6}


def _fmt_size(n: int) -> str:
    for unit, s in (("MiB", MiB), ("KiB", KiB)):
        if n >= s and n % s == 0:
            return f"{n // s} {unit}"
    return f"{n} B"


def _gbs(n: int, t: float) -> str:
    return f"{n / t / 1e9:6.2f}"


def _sizes_table(ctx, dev, sizes, bufs, quick, label, mts) -> list:
    """pinned / pageable / unpipelined, H2D and D2H, per size, against memcpy (and the
    pinned and device copies against the best memcpy by 1 .. CPUs threads, `mts`: threads
    -> ParallelMemcpy)."""
    src, dst, psrc, pdst, d, d2 = bufs
    rows = []
    print(f"\n{label}: GB/s (x memcpy of the same size); pipe = pageable pipelined / unpipelined "
          f"(chunk {_fmt_size(dev.staging_chunk)}, {dev.staging_depth} in flight); D2D = the "
          "device's own copy of the same size, VRAM to VRAM (a fenced COPY_D2D); mt = the best "
          "memcpy by 1 .. CPUs threads (its threads), and the pinned copies against it")
    print(f"{'size':>8} {'memcpy':>7} {'D2D':>15} | {'H2D pinned':>15} {'pageable':>15} {'unpiped':>15} "
          f"{'pipe':>5} | {'D2H pinned':>15} {'pageable':>15} {'unpiped':>15} {'pipe':>5}")
    d2d_cmd = ring_command(wire.CMD_COPY_D2D, (d.ptr, d2.ptr, 0), ctx_id=ctx.ctx_id, fence_id=1)
    for n in sizes:
        s, o, ps, po = src[:n], dst[:n], psrc[:n], pdst[:n]
        dv = d.ptr
        d2d = d2d_cmd[:-8] + n.to_bytes(8, "little")
        t = _rounds({
            "memcpy": lambda: np.copyto(o, s),
            **{f"memcpy_mt{k}": functools.partial(mt, o, s) for k, mt in mts.items()},
            "d2d": lambda: dev.driver.call(d2d),
            "h2d_pinned": lambda: ctx.copy_h2d(dv, ps),
            "h2d_pageable": lambda: ctx.copy_h2d(dv, s),
            "h2d_unpipelined": lambda: ctx.copy_h2d(dv, s, pipeline=False),
            "d2h_pinned": lambda: ctx.copy_d2h(dv, po),
            "d2h_pageable": lambda: ctx.copy_d2h(dv, o),
            "d2h_unpipelined": lambda: ctx.copy_d2h(dv, o, pipeline=False),
        }, **_reps(n, quick))
        assert np.array_equal(po, ps) and np.array_equal(o, s)
        row = {"size": n, **{f"{k}_s": v for k, v in t.items()}}
        mc = t["memcpy"]
        for k in ("h2d_pinned", "h2d_pageable", "h2d_unpipelined", "d2h_pinned", "d2h_pageable",
                  "d2h_unpipelined"):
            row[f"{k}_vs_memcpy"] = mc / t[k]
        row["h2d_pipeline_speedup"] = t["h2d_unpipelined"] / t["h2d_pageable"]
        row["d2h_pipeline_speedup"] = t["d2h_unpipelined"] / t["d2h_pageable"]
        rows.append(row)

        row["d2d_vs_memcpy"] = mc / t["d2d"]
        mt, threads = best_parallel({1: mc, **{k: t[f"memcpy_mt{k}"] for k in mts}})
        row["memcpy_mt_best_s"], row["memcpy_mt_threads"] = mt, threads
        for k in ("h2d_pinned", "d2h_pinned", "d2d"):
            row[f"{k}_vs_memcpy_mt"] = mt / t[k]

        def cell(k):
            return f"{_gbs(n, t[k])} ({mc / t[k]:4.2f}x)"
        print(f"{_fmt_size(n):>8} {_gbs(n, mc):>7} {cell('d2d')} | {cell('h2d_pinned')} {cell('h2d_pageable')} "
              f"{cell('h2d_unpipelined')} {row['h2d_pipeline_speedup']:4.2f}x | {cell('d2h_pinned')} "
              f"{cell('d2h_pageable')} {cell('d2h_unpipelined')} {row['d2h_pipeline_speedup']:4.2f}x"
              f" | mt {_gbs(n, mt)} ({threads}): pinned {row['h2d_pinned_vs_memcpy_mt']:4.2f}x / "
              f"{row['d2h_pinned_vs_memcpy_mt']:4.2f}x, D2D {row['d2d_vs_memcpy_mt']:4.2f}x")
    return rows


def _chunk_sweep(ctx, dev, bufs, size, chunks, quick) -> list:
    src, dst, _psrc, _pdst, d, _d2 = bufs
    s, o = src[:size], dst[:size]
    old = dev.staging_chunk
    print(f"\nchunk sweep: pageable {_fmt_size(size)}, pipelined ({dev.staging_depth} in flight), "
          "GB/s (x memcpy)")
    rows = []
    try:
        mc = _rounds({"m": lambda: np.copyto(o, s)}, **_reps(size, quick))["m"]
        for chunk in chunks:
            dev.staging_chunk = chunk
            t = _rounds({"h2d": lambda: ctx.copy_h2d(d.ptr, s),
                         "d2h": lambda: ctx.copy_d2h(d.ptr, o),
                         "h2d_unpipelined": lambda: ctx.copy_h2d(d.ptr, s, pipeline=False),
                         "d2h_unpipelined": lambda: ctx.copy_d2h(d.ptr, o, pipeline=False)},
                        **_reps(size, quick))
            rows.append({"chunk": chunk, "size": size, "memcpy_s": mc, **{f"{k}_s": v for k, v in t.items()}})
            print(f"  chunk {_fmt_size(chunk):>8}: H2D {_gbs(size, t['h2d'])} ({mc / t['h2d']:4.2f}x, "
                  f"{t['h2d_unpipelined'] / t['h2d']:4.2f}x unpipelined)   D2H {_gbs(size, t['d2h'])} "
                  f"({mc / t['d2h']:4.2f}x, {t['d2h_unpipelined'] / t['d2h']:4.2f}x unpipelined)")
    finally:
        dev.staging_chunk = old
    return rows


def _pinned_requests(ctx, dev, bufs, size, quick) -> list:
    src, dst, psrc, pdst, d, _d2 = bufs
    ps, po = psrc[:size], pdst[:size]
    old = dev.pinned_request
    mc = _rounds({"m": lambda: np.copyto(dst[:size], src[:size])}, **_reps(size, quick))["m"]
    rows = []
    print(f"\npinned request size: {_fmt_size(size)}, {dev.pinned_depth} in flight, GB/s (x memcpy)")
    try:
        for req in [r for r in PINNED_REQUESTS if r <= size]:
            dev.pinned_request = req
            t = _rounds({"h2d": lambda: ctx.copy_h2d(d.ptr, ps), "d2h": lambda: ctx.copy_d2h(d.ptr, po)},
                        **_reps(size, quick))
            rows.append({"request": req, "size": size, "memcpy_s": mc, "h2d_s": t["h2d"], "d2h_s": t["d2h"]})
            print(f"  request {_fmt_size(req):>8}: H2D {_gbs(size, t['h2d'])} ({mc / t['h2d']:4.2f}x)   "
                  f"D2H {_gbs(size, t['d2h'])} ({mc / t['d2h']:4.2f}x)")
    finally:
        dev.pinned_request = old
    return rows


def _crossover(ctx, dev, bufs, sizes, quick) -> dict:
    """One request holding the whole copy vs. four pipelined chunks of a quarter each (and
    the default chunking, where it differs from one request)."""
    src, dst, _psrc, _pdst, d, _d2 = bufs
    old = dev.staging_chunk
    rows = []
    print("\nsmall copies: one synchronous request (one bounce chunk holding it all) vs the chunk "
          f"pipeline (4 chunks of size/4, {dev.staging_depth} in flight) and the default chunks "
          f"({_fmt_size(old)}), µs")
    try:
        for n in sizes:
            s, o = src[:n], dst[:n]
            one, quarter = max(4096, -(-n // 4096) * 4096), max(4096, n // 4)

            def use(chunk):
                return lambda: setattr(dev, "staging_chunk", chunk)
            variants = {"h2d_one": (use(one), lambda: ctx.copy_h2d(d.ptr, s)),
                        "h2d_chunked": (use(quarter), lambda: ctx.copy_h2d(d.ptr, s)),
                        "d2h_one": (use(one), lambda: ctx.copy_d2h(d.ptr, o)),
                        "d2h_chunked": (use(quarter), lambda: ctx.copy_d2h(d.ptr, o))}
            if n > old:
                variants["h2d_default"] = (use(old), lambda: ctx.copy_h2d(d.ptr, s))
                variants["d2h_default"] = (use(old), lambda: ctx.copy_d2h(d.ptr, o))
            t = _rounds(variants, **_reps(n, quick))
            rows.append({"size": n, **{f"{k}_s": v for k, v in t.items()}})

            def dflt(k):
                return f"  default {t[k] * 1e6:8.0f}" if k in t else " " * 18
            print(f"  {_fmt_size(n):>8}: H2D one {t['h2d_one'] * 1e6:8.0f}  quarters {t['h2d_chunked'] * 1e6:8.0f}"
                  f"{dflt('h2d_default')}   D2H one {t['d2h_one'] * 1e6:8.0f}  quarters "
                  f"{t['d2h_chunked'] * 1e6:8.0f}{dflt('d2h_default')}")
    finally:
        dev.staging_chunk = old
    result = {"rows": rows}
    for k in ("h2d", "d2h"):
        faster = [r["size"] for r in rows if r[f"{k}_chunked_s"] < r[f"{k}_one_s"]]
        # the crossover: the smallest size from which on the pipeline stays faster
        cross = None
        for r in reversed(rows):
            if r[f"{k}_chunked_s"] < r[f"{k}_one_s"]:
                cross = r["size"]
            else:
                break
        result[f"{k}_crossover"] = cross
        result[f"{k}_chunked_faster_at"] = faster
    print("  crossover (the pipeline wins from): "
          + ", ".join(f"{k.upper()} {_fmt_size(result[f'{k}_crossover']) if result[f'{k}_crossover'] else 'never'}"
                      for k in ("h2d", "d2h")))
    return result


def _tiny(ctx, dev, bufs, quick) -> list:
    src, dst, _psrc, _pdst, d, _d2 = bufs
    old = dev.small_h2d_max
    rows = []
    print("\ntiny H2D: data in the command's descriptor vs a bounce chunk + data descriptor, µs")
    try:
        for n in TINY:
            s = src[:n]
            t = _rounds({"nop": dev.nop,
                         "one_descriptor": (lambda: setattr(dev, "small_h2d_max", n),
                                            lambda: ctx.copy_h2d(d.ptr, s)),
                         "bounce": (lambda: setattr(dev, "small_h2d_max", 0),
                                    lambda: ctx.copy_h2d(d.ptr, s)),
                         "d2h_bounce": lambda: ctx.copy_d2h(d.ptr, dst[:n])},
                        min_reps=20, max_reps=100 if quick else 1000, budget=0.3 if quick else 2.0)
            rows.append({"size": n, **{f"{k}_s": v for k, v in t.items()}})
            print(f"  {n:4d} B: one descriptor {t['one_descriptor'] * 1e6:6.0f}   bounce {t['bounce'] * 1e6:6.0f}"
                  f"   (no-op round trip {t['nop'] * 1e6:6.0f}; D2H {t['d2h_bounce'] * 1e6:6.0f})")
    finally:
        dev.small_h2d_max = old
    return rows


def _session(endpoint, memory, mem_size, max_size):
    conn = guest.connect(endpoint, memory=memory, mem_size=mem_size)
    dev = conn.devices[0]
    ctx = dev.create_context()
    rng = np.random.default_rng(1)
    src = rng.integers(0, 255, max_size, dtype=np.uint8)
    dst = np.zeros(max_size, np.uint8)
    psrc = dev.pinned_array(src)
    pdst = dev.pinned_zeros(max_size, np.uint8)
    d = ctx.empty(max_size, np.uint8)
    d2 = ctx.empty(max_size, np.uint8)
    return conn, dev, ctx, (src, dst, psrc, pdst, d, d2)


def run_bench(json_path: str | None = None, quick: bool = False, plot_dir: str | None = None) -> int:
    """The parts of the module docstring; `plot_dir`: also draw bandwidth against size
    there (pvgpu.plots). -> exit code."""
    started = time.perf_counter()
    sizes = QUICK_SIZES if quick else SIZES
    max_size = max(sizes)
    sweep_size, sweep_chunks = (QUICK_SWEEP_SIZE, QUICK_SWEEP_CHUNKS) if quick else (SWEEP_SIZE, SWEEP_CHUNKS)
    mem_size = (128 * MiB) if quick else MEM_SIZE
    endpoint, tmpdir = private_endpoint("pvgpu-bench")
    results = {"machine": {"python": platform.python_version(), "numpy": np.__version__,
                           "cpus": os.cpu_count()}, "quick": quick}
    host = HostProcess([endpoint], vram="1G")
    mts = {k: ParallelMemcpy(k) for k in thread_counts()}
    try:
        conn, dev, ctx, bufs = _session(endpoint, wire.MEMORY_SHARED, mem_size, max_size)
        with conn:
            results["config"] = {"staging_chunk": dev.staging_chunk, "staging_depth": dev.staging_depth,
                                 "pinned_request": dev.pinned_request, "pinned_depth": dev.pinned_depth,
                                 "small_h2d_max": dev.small_h2d_max, "mem_size": mem_size}
            results["shared"] = _sizes_table(ctx, dev, sizes, bufs, quick, "shared memory", mts)
            results["chunk_sweep"] = _chunk_sweep(ctx, dev, bufs, sweep_size, sweep_chunks, quick)
            if not quick:
                results["pinned_request_sweep"] = _pinned_requests(ctx, dev, bufs, max_size, quick)
            results["crossover"] = _crossover(ctx, dev, bufs, QUICK_CROSS_SIZES if quick else CROSS_SIZES, quick)
            results["tiny_h2d"] = _tiny(ctx, dev, bufs, quick)
        inline_sizes = [n for n in sizes if n >= INLINE_MIN]
        conn, dev, ctx, bufs = _session(endpoint, wire.MEMORY_INLINE, mem_size, max(inline_sizes))
        with conn:
            results["config"]["inline_pinned_request"] = dev.pinned_request
            results["inline"] = _sizes_table(ctx, dev, inline_sizes, bufs, quick, "inline memory", mts)
    finally:
        for mt in mts.values():
            mt.close()
        host.stop()
        shutil.rmtree(tmpdir, ignore_errors=True)
    big = [r for r in results["shared"] if r["size"] >= 16 * MiB]
    summary = {
        "pinned_vs_memcpy_min_ge_16MiB": min((min(r["h2d_pinned_vs_memcpy"], r["d2h_pinned_vs_memcpy"])
                                              for r in big), default=None),
        "pinned_vs_memcpy_mt_min_ge_16MiB": min((min(r["h2d_pinned_vs_memcpy_mt"],
                                                     r["d2h_pinned_vs_memcpy_mt"])
                                                 for r in big), default=None),
        "pipeline_speedup_min_ge_16MiB": min((min(r["h2d_pipeline_speedup"], r["d2h_pipeline_speedup"])
                                              for r in big), default=None),
        "h2d_crossover": results["crossover"]["h2d_crossover"],
        "d2h_crossover": results["crossover"]["d2h_crossover"],
    }
    results["summary"] = summary
    results["targets"] = {"pinned_vs_memcpy_ge_16MiB": f">= {TARGET_PINNED}",
                          "pipeline_speedup_ge_16MiB": f">= {TARGET_PIPELINE}"}
    results["seconds"] = time.perf_counter() - started

    def verdict(v, target):
        return "n/a" if v is None else f"{v:.2f} ({'met' if v >= target else 'NOT met'}, target >= {target})"
    mt_ratio = summary["pinned_vs_memcpy_mt_min_ge_16MiB"]
    print(f"\nsummary (sizes >= 16 MiB, shared memory, worst of H2D/D2H): pinned vs memcpy "
          f"{verdict(summary['pinned_vs_memcpy_min_ge_16MiB'], TARGET_PINNED)} (vs the best memcpy "
          f"by any number of threads {'n/a' if mt_ratio is None else f'{mt_ratio:.2f}'}); pipelined vs unpipelined "
          f"{verdict(summary['pipeline_speedup_min_ge_16MiB'], TARGET_PIPELINE)}; {results['seconds']:.0f} s")
    write_json(json_path, results)
    if plot_dir is not None:
        from pvgpu import plots
        print(f"wrote {plots.copies_figure(results, plot_dir)}", flush=True)
    return 0
