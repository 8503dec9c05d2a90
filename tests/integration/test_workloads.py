"""End to end: a real host process, this test process as a guest, every result against numpy.

Both memory models, over ipc and tcp, on both devices.
"""

import numpy as np
import pytest

from pvgpu import guest
from pvgpu.spec import wire
from pvgpu.workloads import run_workload

MODELS = ["shared", "inline"]


def _endpoint(host, transport):
    return next(ep for ep in host.endpoints if ep.startswith(transport))


@pytest.fixture(params=[("ipc", "shared"), ("ipc", "inline"), ("tcp", "shared"), ("tcp", "inline")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def conn(request, shared_host):
    transport, memory = request.param
    with guest.connect(_endpoint(shared_host, transport), memory=memory, mem_size=64 << 20) as c:
        yield c


@pytest.mark.parametrize("workload,size", [("vector-add", 100_003), ("saxpy", 65_536), ("gemm", 96)])
def test_workload_matches_numpy(conn, workload, size):
    with conn.devices[1].create_context() as ctx:
        r = run_workload(ctx, workload, size)
    assert r["ok"], r


def test_every_builtin_kernel(conn):
    rng = np.random.default_rng(7)
    n = 5000
    x = rng.standard_normal(n).astype(np.float32)
    with conn.devices[0].create_context() as ctx:
        dx, dy = ctx.to_device(x), ctx.empty(n)
        ctx.launch("fill", grid=20, block=256, args=(dy, 3.5, n))
        assert np.all(dy.to_host() == np.float32(3.5))
        ctx.launch("scale", grid=20, block=256, args=(dy, dx, -2.0, n))
        np.testing.assert_array_equal(dy.to_host(), np.float32(-2.0) * x)
        ctx.launch("relu", grid=20, block=256, args=(dy, dx, n))
        np.testing.assert_array_equal(dy.to_host(), np.maximum(x, 0))
        s = ctx.empty(1)
        ctx.launch("reduce_sum", grid=1, block=256, args=(dx, s, n))
        assert abs(float(s.to_host()[0]) - float(x.sum(dtype=np.float64))) < 1e-2
        m = rng.standard_normal((37, 19)).astype(np.float32)
        dm, dout = ctx.to_device(m), ctx.empty(m.shape)
        ctx.launch("softmax", grid=37, block=32, args=(dout, dm, 37, 19))
        e = np.exp(m - m.max(axis=1, keepdims=True))
        np.testing.assert_allclose(dout.to_host(), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
        ctx.launch("burn", grid=1, block=1, args=(100,))
        ctx.synchronize()


def test_elementwise_kernels_cover_only_the_launched_threads(conn):
    with conn.devices[0].create_context() as ctx:
        d = ctx.zeros(1000)
        ctx.launch("fill", grid=2, block=100, args=(d, 1.0, 1000))  # 200 threads
        out = d.to_host()
        assert out[:200].sum() == 200 and out[200:].sum() == 0


def test_large_copy_round_trip_is_byte_identical(conn):
    data = np.random.default_rng(1).integers(0, 256, size=(20 << 20) + 12345, dtype=np.uint8)
    with conn.devices[0].create_context() as ctx:
        d = ctx.to_device(data)
        np.testing.assert_array_equal(d.to_host(), data)


def test_device_to_device_copy(conn):
    a = np.arange(10_000, dtype=np.float32)
    with conn.devices[0].create_context() as ctx:
        da, db = ctx.to_device(a), ctx.empty(a.shape)
        ctx.copy_d2d(db.ptr, da.ptr, a.nbytes)
        np.testing.assert_array_equal(db.to_host(), a)


def test_device_info_and_features(conn):
    assert len(conn.devices) == 2
    for dev in conn.devices:
        assert dev.vram_size == 256 << 20
        assert {"VERSION_1", "INDIRECT_DESC", "EVENT_IDX"} <= set(dev.features)
        info = dev.info()
        assert 0 < info["vram_free"] <= info["vram_size"]


def test_results_identical_across_memory_models(shared_host):
    # [MEM-EQUIV-1] the same requests give the same bytes in both models
    ep = _endpoint(shared_host, "ipc")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 48)).astype(np.float32)
    b = rng.standard_normal((48, 80)).astype(np.float32)
    outs = []
    for memory in MODELS:
        with guest.connect(ep, memory=memory, mem_size=32 << 20) as c:
            with c.devices[0].create_context() as ctx:
                da, db, dc = ctx.to_device(a), ctx.to_device(b), ctx.empty((64, 80))
                ctx.launch("gemm", grid=(1, 64), block=128, args=(da, db, dc, 64, 80, 48))
                outs.append(dc.to_host())
    assert outs[0].tobytes() == outs[1].tobytes()


FEATURE_SETS = {
    "direct-chains-flags": (1 << wire.VIRTIO_F_VERSION_1) | (1 << wire.PVGPU_F_COMPUTE),
    "indirect-only": (1 << wire.VIRTIO_F_VERSION_1) | (1 << wire.PVGPU_F_COMPUTE)
    | (1 << wire.VIRTIO_F_INDIRECT_DESC),
    "event-idx-only": (1 << wire.VIRTIO_F_VERSION_1) | (1 << wire.PVGPU_F_COMPUTE)
    | (1 << wire.VIRTIO_F_EVENT_IDX),
}


@pytest.mark.parametrize("memory", MODELS)
@pytest.mark.parametrize("features", sorted(FEATURE_SETS))
def test_every_feature_combination_runs_the_workloads(shared_host, memory, features):
    """Direct chains and NO_INTERRUPT/NO_NOTIFY flags as well as indirect tables and
    EVENT_IDX: the same results whatever the driver negotiated."""
    with guest.connect(shared_host.endpoint, memory=memory, mem_size=32 << 20,
                       features=FEATURE_SETS[features]) as c:
        dev = c.devices[0]
        assert set(dev.features) == {n for bit, n in wire.FEATURE_NAMES.items()
                                     if FEATURE_SETS[features] & (1 << bit)}
        with dev.create_context() as ctx:
            for w, n in (("vector-add", 30_000), ("gemm", 64)):
                assert run_workload(ctx, w, n)["ok"]
            for _ in range(300):  # enough requests to wrap the 256-entry ring
                dev.nop()


@pytest.mark.parametrize("memory", MODELS)
def test_threads_may_share_a_connection(shared_host, memory):
    import threading

    with guest.connect(shared_host.endpoint, memory=memory, mem_size=48 << 20) as c:
        results, failures = {}, []

        def worker(i):
            try:
                with c.devices[i % 2].create_context() as ctx:
                    for rep in range(5):
                        w = ("vector-add", "gemm", "saxpy")[(i + rep) % 3]
                        r = run_workload(ctx, w, 48 if w == "gemm" else 5000, seed=i * 10 + rep)
                        results[(i, rep)] = r["ok"]
            except Exception as e:  # reported below; a thread must not die silently
                failures.append(repr(e))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not failures and len(results) == 20 and all(results.values())


@pytest.mark.parametrize("memory", MODELS)
def test_many_requests_leave_no_unread_notifications(shared_host, memory):
    """Regression: with notifications suppressed the device must not send calls the
    polling driver never reads; 1000 of them filled ZeroMQ's high-water mark and the host
    then dropped this guest's control replies."""
    from pvgpu.transport.channel import ChannelTimeout

    with guest.connect(shared_host.endpoint, memory=memory, mem_size=16 << 20) as c:
        dev = c.devices[0]
        for _ in range(3000):
            dev.nop()
        c.session.timeout = 5.0
        assert c.session.control("ping")["ok"]
        unread = 0
        try:
            while True:
                c.session.channel.recv_until(lambda m: m.get("op") == "call", timeout=0.2)
                unread += 1
        except ChannelTimeout:
            pass
        assert unread < 50  # a few races at the poll deadline, not one per request
