"""Random sequences of device operations against a numpy model of the device's memory.

Each seed drives a guest through allocations, host<->device copies of random sizes
(small, chunk-crossing), device-to-device copies, elementwise kernels and frees, with and
without synchronizing in between, in both memory models and on both devices; after every
read-back the device's bytes must equal the model's.
"""

import numpy as np
import pytest

from pvgpu import guest

OPS = ("alloc", "h2d", "d2h", "d2d", "fill", "scale", "add", "sync", "free")


def _run(conn, seed, steps=400):
    rng = np.random.default_rng(seed)
    ctxs = [dev.create_context(f"random-{seed}") for dev in conn.devices]
    live = []  # (ctx, DeviceArray, model array)

    def pick():
        return live[int(rng.integers(len(live)))]

    for _ in range(steps):
        op = OPS[int(rng.integers(len(OPS)))] if live else "alloc"
        if op == "alloc" and len(live) < 12:
            n = int(rng.choice([1, 7, 1024, 100_003, 3 << 20]))
            ctx = ctxs[int(rng.integers(len(ctxs)))]
            data = rng.standard_normal(n).astype(np.float32)
            live.append((ctx, ctx.to_device(data), data.copy()))
        elif op == "h2d":
            ctx, d, model = pick()
            model[:] = rng.standard_normal(model.size).astype(np.float32)
            d.copy_from_host(model)
        elif op == "d2h":
            ctx, d, model = pick()
            np.testing.assert_array_equal(d.to_host(), model)
        elif op == "d2d":
            ctx, d, model = pick()
            same = [x for x in live if x[0] is ctx and x[1] is not d and x[2].size <= model.size]
            if same:
                _, src, src_model = same[int(rng.integers(len(same)))]
                ctx.copy_d2d(d.ptr, src.ptr, src_model.nbytes)
                model[:src_model.size] = src_model
        elif op == "fill":
            ctx, d, model = pick()
            value, count = float(rng.integers(-5, 5)), int(rng.integers(1, model.size + 1))
            ctx.launch("fill", grid=-(-count // 256), block=256, args=(d, value, count))
            model[:count] = value
        elif op == "scale":
            ctx, d, model = pick()
            ctx.launch("scale", grid=-(-model.size // 256), block=256, args=(d, d, 0.5, model.size))
            model *= np.float32(0.5)
        elif op == "add":
            ctx, d, model = pick()
            same = [x for x in live if x[0] is ctx and x[2].size == model.size]
            _, other, other_model = same[int(rng.integers(len(same)))]
            ctx.launch("vector_add", grid=-(-model.size // 256), block=256,
                       args=(d, other, d, model.size))
            model += other_model
        elif op == "sync":
            pick()[0].synchronize()
        elif op == "free" and len(live) > 1:
            ctx, d, model = live.pop(int(rng.integers(len(live))))
            np.testing.assert_array_equal(d.to_host(), model)
            d.free()
    for ctx, d, model in live:
        np.testing.assert_array_equal(d.to_host(), model)
    for ctx in ctxs:
        ctx.destroy()


@pytest.mark.parametrize("memory", ["shared", "inline"])
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_random_operations_match_a_numpy_model(shared_host, memory, seed):
    with guest.connect(shared_host.endpoint, memory=memory, mem_size=48 << 20) as conn:
        _run(conn, seed)
