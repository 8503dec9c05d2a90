"""Both emulated GPUs at once: a gemm on each device, results compared with numpy.

    python examples/two_devices.py [ENDPOINT]
"""

import sys

import numpy as np

import pvgpu


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    rng = np.random.default_rng(1)
    m = 128
    with pvgpu.connect(argv[0] if argv else None) as conn:
        contexts = [dev.create_context(f"gemm-{dev.index}") for dev in conn.devices]
        jobs = []
        for ctx in contexts:  # launch on every device first: the GPUs work in parallel
            a = rng.standard_normal((m, m)).astype(np.float32)
            b = rng.standard_normal((m, m)).astype(np.float32)
            da, db, dc = ctx.to_device(a), ctx.to_device(b), ctx.empty((m, m))
            ctx.launch("gemm", grid=(m // 64, m), block=64, args=(da, db, dc, m, m, m))
            jobs.append((ctx, dc, a @ b))
        for ctx, dc, ref in jobs:
            out = dc.to_host()
            assert np.allclose(out, ref, rtol=1e-4, atol=1e-3)
            print(f"device {ctx.device.index}: gemm {m}x{m} matches numpy")
            ctx.destroy()


if __name__ == "__main__":
    main()
