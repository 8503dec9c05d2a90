"""Pinned host memory and the copy options against a real host, in both memory models:
exact round trips through pinned arrays (sizes off the page size and larger than one
request), that pinned copies take the zero-copy path (no bounce chunk; the requests' data
descriptors are the pinned array's own guest range), asynchronous pinned copies on a
stream, freeing, the pageable options (pipeline=False, staging_chunk, staging_depth), the
one-descriptor path of small H2D copies, errors, and `pvgpu bench copies --quick`."""

import json
import subprocess
import sys

import numpy as np
import pytest

from pvgpu import guest
from pvgpu.guest.api.pinned import PinnedMemoryError, extent
from pvgpu.spec import wire

KiB, MiB = 1 << 10, 1 << 20
SIZES = [1, 1000, 4096 + 3, 3 * MiB + 1]


@pytest.fixture(params=["shared", "inline"])
def conn(request, shared_host):
    with guest.connect(shared_host.endpoint, memory=request.param, mem_size=64 << 20) as c:
        yield c


@pytest.fixture
def ctx(conn):
    with conn.devices[0].create_context() as c:
        yield c


def _data(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


class Spy:
    """Records the COPY_H2D/COPY_D2H requests a driver submits: (type, readable, writable)."""

    def __init__(self, drv):
        self.drv, self.calls, self._submit = drv, [], drv.submit

    def __enter__(self):
        def submit(command, readable=(), writable=(), kick=True):
            t = int.from_bytes(command[:4], "little")
            if t in (wire.CMD_COPY_H2D, wire.CMD_COPY_D2H):
                self.calls.append((t, list(readable), list(writable)))
            return self._submit(command, readable, writable, kick)
        self.drv.submit = submit
        return self

    def __exit__(self, *exc):
        del self.drv.submit


@pytest.mark.parametrize("n", SIZES)
def test_pinned_round_trip_is_exact(ctx, n):
    dev = ctx.device
    src = _data(n, n)
    with dev.pinned_array(src) as p, dev.pinned_zeros(n, np.uint8) as q:
        d = ctx.empty(n, np.uint8)
        d.copy_from_host(p)
        assert d.to_host(out=q) is q
        assert np.array_equal(q, src)
        np.testing.assert_array_equal(d.to_host(), src)  # the pageable path agrees
        d.free()


def test_pinned_copies_take_the_zero_copy_path(ctx):
    dev = ctx.device
    dev.pinned_request = 1 * MiB  # several requests, pinned_depth of them in flight
    n = 5 * MiB + 123
    p = dev.pinned_array(_data(n, 1))
    q = dev.pinned_zeros(n, np.uint8)
    d = ctx.empty(n, np.uint8)
    before = dict(dev.copy_stats)
    with Spy(dev.driver) as spy:
        d.copy_from_host(p)
        d.to_host(out=q)
    assert np.array_equal(p, q)
    assert dev.copy_stats["staging_chunks"] == before["staging_chunks"]  # no bounce chunk
    assert dev.copy_stats["pinned_requests"] - before["pinned_requests"] == 12
    assert dev.copy_stats["pinned_bytes"] - before["pinned_bytes"] == 2 * n
    h2d = [c for c in spy.calls if c[0] == wire.CMD_COPY_H2D]
    d2h = [c for c in spy.calls if c[0] == wire.CMD_COPY_D2H]
    assert len(h2d) == len(d2h) == 6
    pos = p.gpa
    for _t, readable, writable in h2d:  # one data descriptor each: the next piece of p
        assert writable == [] and len(readable) == 1
        gpa, size = readable[0]
        assert gpa == pos and size <= 1 * MiB
        pos += size
    assert pos == p.gpa + n
    pos = q.gpa
    for _t, readable, writable in d2h:
        gpa, size = writable[0]
        assert readable == [] and gpa == pos and q.gpa <= gpa and gpa + size <= q.gpa + n
        pos += size
    assert pos == q.gpa + n
    for a in (p, q, d):
        a.free()


def test_slices_and_plain_views_of_pinned_memory_are_pinned_too(ctx):
    dev = ctx.device
    n = 1 << 16
    big = dev.pinned_array(np.arange(2 * n, dtype=np.float32))
    d = ctx.empty(n, np.float32)
    before = dev.copy_stats["staging_chunks"]
    d.copy_from_host(big[n:])  # a slice
    out = np.asarray(dev.pinned_zeros(2 * n, np.float32))  # a plain ndarray view
    d.to_host(out=out[:n])
    assert dev.copy_stats["staging_chunks"] == before
    np.testing.assert_array_equal(out[:n], np.arange(n, 2 * n, dtype=np.float32))
    # to_device / kernels with pinned data
    a = ctx.to_device(big[:n])
    ctx.launch("vector_add", grid=n // 256, block=256, args=(a, d, d, n))
    np.testing.assert_array_equal(d.to_host(out=out[n:]), np.arange(n, dtype=np.float32) * 2 + n)
    assert dev.copy_stats["staging_chunks"] == before
    big.free()


def test_async_pinned_copies_on_a_stream(ctx):
    dev, conn = ctx.device, ctx.device.connection
    dev.pinned_request = 256 * KiB
    n = (1 * MiB + 40) // 4
    src = dev.pinned_array(np.arange(n, dtype=np.float32))
    dst = dev.pinned_zeros(n, np.float32)
    x, y = ctx.empty(n), ctx.empty(n)
    before = dev.copy_stats["staging_chunks"]
    with ctx.create_stream() as s:
        x.copy_from_host_async(src, s)
        s.launch("scale", -(-n // 256), 256, (y, x, 3.0, n))
        assert y.to_host_async(dst, s) is dst
        done = s.record_event()
        dst_free = conn.session.heap.free_bytes
        busy = extent(dst, conn)[0].busy
        dst.free()  # returns at once; the block goes back once its requests complete
        if busy:
            assert conn.session.heap.free_bytes == dst_free
        done.synchronize()
        s.synchronize()
    assert dev.copy_stats["staging_chunks"] == before
    assert conn.session.heap.free_bytes == dst_free + -(-(n * 4) // 4096) * 4096
    # freed, so read through a fresh pinned array the device fills
    with dev.pinned_zeros(n, np.float32) as again:
        y.to_host(out=again)
        np.testing.assert_array_equal(again, np.arange(n, dtype=np.float32) * 3)
    src.free()


def test_async_pinned_d2h_lands_by_the_event(ctx):
    dev = ctx.device
    n = 4096
    d = ctx.to_device(np.full(n, 7.0, np.float32))
    with dev.pinned_zeros(n, np.float32) as out, ctx.create_stream() as s:
        d.to_host_async(out, s)
        ev = s.record_event()
        ev.synchronize()
        np.testing.assert_array_equal(out, np.full(n, 7.0, np.float32))


def test_freeing_returns_heap_space(conn):
    heap = conn.session.heap
    free0 = heap.free_bytes
    arrays = [conn.pinned_empty((1000, 1000), np.float32) for _ in range(3)]
    assert heap.free_bytes <= free0 - 3 * 4_000_000
    for a in arrays:
        a.free()
    assert heap.free_bytes == free0
    with pytest.raises(MemoryError, match="mem_size"):
        conn.pinned_empty(conn.session.mem_size, np.uint8)


def test_pageable_options_give_identical_results(ctx):
    dev = ctx.device
    n = 3 * MiB + 777
    src = _data(n, 3)
    d = ctx.empty(n, np.uint8)
    results = []
    old = dev.staging_chunk
    try:
        for chunk, depth, pipeline in [(old, 4, True), (old, 4, False), (64 * KiB, 4, True),
                                       (64 * KiB, 2, False), (256 * KiB, 1, True), (4 * MiB, 3, True)]:
            dev.staging_chunk, dev.staging_depth = chunk, depth
            d.copy_from_host(src, pipeline=pipeline)
            out = np.zeros(n, np.uint8)
            d.to_host(out, pipeline=pipeline)
            results.append(out)
            d.copy_from_host(np.zeros(n, np.uint8))  # the next round starts from zeros
            # async forms with the same settings
            with ctx.create_stream() as s:
                d.copy_from_host_async(src, s)
                out2 = d.to_host_async(np.zeros(n, np.uint8), s)
            results.append(out2)
    finally:
        dev.staging_chunk, dev.staging_depth = old, 4
    for r in results:
        assert np.array_equal(r, src)


def test_small_h2d_copies_travel_in_the_command_descriptor(ctx):
    dev = ctx.device
    d = ctx.zeros(64, np.float32)
    before = dict(dev.copy_stats)
    with Spy(dev.driver) as spy:
        d.copy_from_host(np.arange(54, dtype=np.float32).tolist() + [0.0] * 10)  # 256 B: bounce
        ctx.copy_h2d(d.ptr + 4, np.arange(1, 55, dtype=np.float32))  # 216 B: one descriptor
        with ctx.create_stream() as s:
            ctx.copy_h2d_async(d.ptr, np.array([9.0], np.float32), stream=s)
    assert dev.copy_stats["small_copies"] - before["small_copies"] == 2
    assert dev.copy_stats["staging_chunks"] - before["staging_chunks"] == 1
    assert [len(r) for _t, r, _w in spy.calls] == [1, 0, 0]  # data descriptors
    want = np.zeros(64, np.float32)
    want[1:55] = np.arange(1, 55)
    want[0] = 9.0
    np.testing.assert_array_equal(d.to_host(), want)
    dev.small_h2d_max = 0  # off: through a bounce chunk again
    ctx.copy_h2d(d.ptr, np.array([5.0], np.float32))
    assert dev.copy_stats["small_copies"] - before["small_copies"] == 2
    assert d.to_host()[0] == 5.0


def test_copies_with_freed_pinned_memory_raise(ctx):
    dev = ctx.device
    d = ctx.empty(1024, np.uint8)
    p = dev.pinned_zeros(1024, np.uint8)
    view = np.asarray(p)
    p.free()
    for call in (lambda: d.to_host(out=p), lambda: d.copy_from_host(p), lambda: d.to_host(out=view),
                 lambda: d.to_host_async(p), lambda: d.copy_from_host_async(view),
                 lambda: ctx.copy_h2d(d.ptr, view[10:20]), lambda: ctx.to_device(p)):
        with pytest.raises(PinnedMemoryError, match="freed"):
            call()
    assert isinstance(PinnedMemoryError("x"), guest.PvgpuError)
    d.copy_from_host(np.ones(1024, np.uint8))  # the context is fine
    assert d.to_host().sum() == 1024


def test_device_errors_of_pinned_copies(ctx):
    dev = ctx.device
    with dev.pinned_zeros(8192, np.uint8) as p:
        bad = wire.VA_USER_LIMIT - 4096
        with pytest.raises(guest.PageFaultError):
            ctx.copy_d2h(bad, p)
        with pytest.raises(guest.PageFaultError):
            ctx.copy_h2d(bad, p)
        with ctx.create_stream() as s:
            ctx.copy_h2d_async(bad, p, stream=s)
            with pytest.raises(guest.PageFaultError):
                s.synchronize()
        # the pinned array and the context still work
        p[:] = 3
        d = ctx.to_device(p)
        assert int(d.to_host().sum()) == 3 * 8192


def test_pinned_memory_of_another_connection_is_ordinary_memory(ctx, shared_host):
    with guest.connect(shared_host.endpoint, mem_size=16 << 20) as other:
        p = other.pinned_array(_data(100_000, 4))
        d = ctx.empty(100_000, np.uint8)
        before = ctx.device.copy_stats["pinned_requests"]
        d.copy_from_host(p)
        assert ctx.device.copy_stats["pinned_requests"] == before
        assert np.array_equal(d.to_host(), p)
        p.free()


def test_bench_copies_quick(tmp_path):
    path = tmp_path / "copies.json"
    p = subprocess.run([sys.executable, "-m", "pvgpu", "bench", "copies", "--quick", "--json", str(path)],
                       capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads(path.read_text())
    assert {"shared", "inline", "chunk_sweep", "crossover", "tiny_h2d", "summary"} <= set(data)
    assert "pinned" in p.stdout and "crossover" in p.stdout
    for row in data["shared"]:  # the second limit: the best memcpy by any number of threads
        assert row["memcpy_mt_best_s"] <= row["memcpy_s"]
        assert row["h2d_pinned_vs_memcpy_mt"] <= row["h2d_pinned_vs_memcpy"]
