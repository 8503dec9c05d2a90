"""One forward step of a small neural network on a pvgpu device, checked against numpy:
a two-layer perceptron classifying a batch, probs = softmax(relu(x @ W1) @ W2), with the
built-in kernels gemm, relu and softmax.

    pvgpu host &
    python examples/nn_step.py [ENDPOINT] [--memory inline]
"""

import argparse

import numpy as np

import pvgpu

BATCH, FEATURES, HIDDEN, CLASSES = 64, 256, 128, 10


def gemm(ctx, a, b, c, m, n, k):
    """c[m, n] = a[m, k] @ b[k, n] (row-major float32), one thread per output element."""
    ctx.launch("gemm", grid=((n + 63) // 64, m), block=64, args=(a, b, c, m, n, k))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("endpoint", nargs="?", default=None)
    ap.add_argument("--memory", default="shared", choices=["shared", "inline"])
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, FEATURES)).astype(np.float32)
    w1 = (rng.standard_normal((FEATURES, HIDDEN)) / np.sqrt(FEATURES)).astype(np.float32)
    w2 = (rng.standard_normal((HIDDEN, CLASSES)) / np.sqrt(HIDDEN)).astype(np.float32)

    with pvgpu.connect(args.endpoint, memory=args.memory) as conn:
        with conn.devices[0].create_context("mlp") as ctx:
            dx, dw1, dw2 = ctx.to_device(x), ctx.to_device(w1), ctx.to_device(w2)
            h = ctx.empty((BATCH, HIDDEN))
            logits = ctx.empty((BATCH, CLASSES))
            probs = ctx.empty((BATCH, CLASSES))
            # the launches queue on the default stream; nothing waits until get()
            gemm(ctx, dx, dw1, h, BATCH, HIDDEN, FEATURES)                      # h = x @ W1
            ctx.launch("relu", grid=(h.size + 255) // 256, block=256, args=(h, h, h.size))
            gemm(ctx, h, dw2, logits, BATCH, CLASSES, HIDDEN)                   # logits = h @ W2
            ctx.launch("softmax", grid=BATCH, block=32, args=(probs, logits, BATCH, CLASSES))
            out = probs.get()

    ref_logits = np.maximum(x @ w1, 0) @ w2
    e = np.exp(ref_logits - ref_logits.max(axis=1, keepdims=True))
    ref = e / e.sum(axis=1, keepdims=True)
    # float32 sums in another order than numpy's BLAS: equal to a few ulps, not bit for bit
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-6)
    assert np.allclose(out.sum(axis=1), 1.0, atol=1e-5)
    agree = np.mean(out.argmax(axis=1) == ref.argmax(axis=1))
    print(f"forward step of a {FEATURES}-{HIDDEN}-{CLASSES} perceptron on a batch of {BATCH}: "
          f"probabilities match numpy (rtol 1e-4), predicted classes agree on {agree:.0%}")


if __name__ == "__main__":
    main()
