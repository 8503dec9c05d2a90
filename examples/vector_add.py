"""Vector add on a pvgpu device: numpy in, numpy out.

    pvgpu host &                      # or: pvgpu host --listen tcp://127.0.0.1:5555 --insecure
    python examples/vector_add.py [ENDPOINT] [--memory inline]
"""

import argparse

import numpy as np

import pvgpu


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("endpoint", nargs="?", default=None)
    ap.add_argument("--memory", default="shared", choices=["shared", "inline"])
    args = ap.parse_args(argv)
    n = 1 << 20
    a = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    b = np.ones(n, np.float32)
    with pvgpu.connect(args.endpoint, memory=args.memory) as conn:
        dev = conn.devices[0]
        print(f"{dev}: features {', '.join(dev.features)}")
        with dev.create_context() as ctx:
            da, db, dc = ctx.to_device(a), ctx.to_device(b), ctx.empty(n)
            ctx.launch("vector_add", grid=n // 256, block=256, args=(da, db, dc, n))
            out = dc.to_host()
    assert np.array_equal(out, a + b)
    print(f"vector_add of {n} floats matches numpy")


if __name__ == "__main__":
    main()
