"""`pvgpu bench`: every hot path against this machine's own limit, measured in the same run.

  copies     64 MiB host->device and device->host, both memory models,
             against numpy `copyto` of the same 64 MiB (one memcpy); also memcpy beside a
             second memcpy process, which bounds a path of two copies (bounce + DMA)
  round trip a synchronous no-op command through the virtqueue, against a bare pyzmq
             DEALER/ROUTER round trip of a message of the same size to another process
  kernels    vector_add and gemm with data already on the device (launch + synchronize),
             against numpy on the same arrays

Medians of repeated runs; ratios are `limit time / stack time` for bandwidths and kernels
(1.0 = as fast as the limit) and `stack time / limit time` for the round trip.
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

import msgpack
import numpy as np
import zmq

from pvgpu.bench.common import write_json
from pvgpu import guest
from pvgpu.procs import HostProcess, private_endpoint
from pvgpu.spec import wire

MiB = 1 << 20


def _median_time(fn, reps: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_memcpy(nbytes: int, reps: int) -> float:
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    return _median_time(lambda: np.copyto(dst, src), reps)


def bench_memcpy_contended(nbytes: int, reps: int) -> float:
    """memcpy while another process runs memcpy: half the two-copy (bounce) path's cost."""
    other = subprocess.Popen([sys.executable, "-m", "pvgpu.bench.membw", str(nbytes), "30"],
                             stdout=subprocess.PIPE, text=True)
    try:
        if other.stdout.readline().strip() != "ready":
            raise RuntimeError("the competing memcpy process did not start")
        return bench_memcpy(nbytes, reps)
    finally:
        other.kill()
        other.wait()
        other.stdout.close()


def bench_raw_zmq(endpoint: str, msg_size: int, reps: int) -> float:
    proc = subprocess.Popen([sys.executable, "-m", "pvgpu.bench.echo", endpoint])
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    try:
        s.connect(endpoint)
        payload = b"x" * msg_size
        s.send(payload)
        if not s.poll(10000):
            raise RuntimeError("echo server did not answer")
        s.recv()

        def rt():
            s.send(payload)
            s.recv()
        return _median_time(rt, reps, warmup=50)
    finally:
        s.send(b"quit")
        s.close()
        ctx.term()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _kick_size() -> int:
    return len(msgpack.packb({"op": wire.OP_KICK, "dev": 0, "queue": 0}))


def run_bench(json_path: str | None = None, quick: bool = False) -> int:
    reps = 3 if quick else 7
    rt_reps = 300 if quick else 3000
    size = 64 * MiB
    endpoint, tmpdir = private_endpoint("pvgpu-bench")
    results = {"machine": {"python": platform.python_version(), "numpy": np.__version__,
                           "zmq": zmq.zmq_version(), "cpus": os.cpu_count()}}
    host = HostProcess([endpoint], vram="1G")
    try:
        memcpy = bench_memcpy(size, reps * 2)
        results["memcpy_64MiB_s"] = memcpy
        contended = bench_memcpy_contended(size, reps * 2)
        results["memcpy_64MiB_contended_s"] = contended
        raw = bench_raw_zmq(f"ipc://{tmpdir}/echo.sock", _kick_size(), rt_reps)
        results["raw_zmq_rtt_s"] = raw
        print(f"limits: numpy copyto 64 MiB {size / memcpy / 1e9:6.2f} GB/s "
              f"({size / contended / 1e9:.2f} GB/s beside a second copy: two overlapped copies "
              f"reach at most {memcpy / contended:.2f}x)   bare zmq round trip {raw * 1e6:6.1f} us")
        for memory in wire.MEMORY_MODELS:
            with guest.connect(endpoint, memory=memory, mem_size=192 * MiB) as conn:
                dev = conn.devices[0]
                with dev.create_context() as ctx:
                    host_buf = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8)
                    d = ctx.empty(size, np.uint8)
                    h2d = _median_time(lambda: d.copy_from_host(host_buf), reps)
                    out = np.empty_like(host_buf)
                    d2h = _median_time(lambda: d.to_host(out), reps)
                    assert np.array_equal(out, host_buf)
                    results[f"h2d_{memory}_s"] = h2d
                    results[f"d2h_{memory}_s"] = d2h
                    print(f"{memory:>6} memory: H2D {size / h2d / 1e9:6.2f} GB/s ({memcpy / h2d:4.2f}x memcpy)   "
                          f"D2H {size / d2h / 1e9:6.2f} GB/s ({memcpy / d2h:4.2f}x memcpy)")
                    if memory == wire.MEMORY_SHARED:
                        nop = _median_time(dev.nop, rt_reps, warmup=50)
                        results["nop_rtt_s"] = nop
                        print(f"no-op command round trip {nop * 1e6:6.1f} us ({nop / raw:4.2f}x bare zmq)")
                        _bench_kernels(ctx, results, reps)
    finally:
        host.stop()
        shutil.rmtree(tmpdir, ignore_errors=True)
    ratios = {
        "h2d_shared_vs_memcpy": results["memcpy_64MiB_s"] / results["h2d_shared_s"],
        "d2h_shared_vs_memcpy": results["memcpy_64MiB_s"] / results["d2h_shared_s"],
        "h2d_inline_vs_memcpy": results["memcpy_64MiB_s"] / results["h2d_inline_s"],
        "d2h_inline_vs_memcpy": results["memcpy_64MiB_s"] / results["d2h_inline_s"],
        "two_copy_ceiling_vs_memcpy": results["memcpy_64MiB_s"] / results["memcpy_64MiB_contended_s"],
        "nop_rtt_vs_raw_zmq": results["nop_rtt_s"] / results["raw_zmq_rtt_s"],
        "vector_add_vs_numpy": results["numpy_vector_add_s"] / results["vector_add_s"],
        "gemm_vs_numpy": results["numpy_gemm_s"] / results["gemm_s"],
    }
    results["ratios"] = ratios
    results["targets"] = {"copies_shared_vs_memcpy": ">= 0.5", "nop_rtt_vs_raw_zmq": "<= 2.0",
                          "kernels_vs_numpy": ">= 0.8"}
    print("\nratios (target): " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    write_json(json_path, results)
    return 0


def _bench_kernels(ctx, results: dict, reps: int) -> None:
    rng = np.random.default_rng(2)
    n = 16 * MiB // 4 * 4  # 16 Mi floats = 64 MiB per vector
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    da, db, dc = ctx.to_device(a), ctx.to_device(b), ctx.empty(n)
    grid = -(-n // 256)

    def vadd():
        ctx.launch("vector_add", grid=grid, block=256, args=(da, db, dc, n))
        ctx.synchronize()
    c = np.empty_like(a)
    results["vector_add_s"] = _median_time(vadd, reps)
    results["numpy_vector_add_s"] = _median_time(lambda: np.add(a, b, out=c), reps)
    assert np.array_equal(dc.to_host(), a + b)
    for x in (da, db, dc):
        x.free()
    m = 1024
    A, B = rng.standard_normal((m, m)).astype(np.float32), rng.standard_normal((m, m)).astype(np.float32)
    dA, dB, dC = ctx.to_device(A), ctx.to_device(B), ctx.empty((m, m))

    def gemm():
        ctx.launch("gemm", grid=(4, m), block=256, args=(dA, dB, dC, m, m, m))
        ctx.synchronize()
    C = np.empty((m, m), np.float32)
    results["gemm_s"] = _median_time(gemm, reps)
    results["numpy_gemm_s"] = _median_time(lambda: np.matmul(A, B, out=C), reps)
    assert np.allclose(dC.to_host(), A @ B, rtol=1e-4, atol=1e-3)
    print(f"vector_add 16 Mi floats {results['vector_add_s'] * 1e3:7.2f} ms vs numpy "
          f"{results['numpy_vector_add_s'] * 1e3:7.2f} ms ({results['numpy_vector_add_s'] / results['vector_add_s']:4.2f}x)")
    print(f"gemm 1024^3 {results['gemm_s'] * 1e3:7.2f} ms vs numpy {results['numpy_gemm_s'] * 1e3:7.2f} ms "
          f"({results['numpy_gemm_s'] / results['gemm_s']:4.2f}x)")
