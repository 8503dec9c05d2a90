"""A kernel written in Python with numba-cuda, compiled to PTX by numba and run on pvgpu.

    pip install numba-cuda             # numba.cuda.compile_ptx needs no GPU (it needs NVVM)
    pvgpu host &
    python examples/numba_kernel.py [ENDPOINT] [--memory inline]

numba passes a 1-D array to a kernel as seven parameters (meminfo, parent, nitems,
itemsize, data, shape, stride); `numba_array` below fills them from a DeviceArray.
"""

import argparse
import math
import sys

import numpy as np

import pvgpu


def numba_array(arr) -> tuple:
    """The seven kernel arguments numba's ABI takes for a C-contiguous 1-D array."""
    n, item = arr.shape[0], arr.dtype.itemsize
    return (0, 0, n, item, arr, n, item)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("endpoint", nargs="?", default=None)
    ap.add_argument("--memory", default="shared", choices=["shared", "inline"])
    args = ap.parse_args(argv)
    try:
        from numba import cuda
    except ImportError:
        print("this example needs numba-cuda: pip install numba-cuda", file=sys.stderr)
        return 2

    def damped_wave(x, out, decay):
        i = cuda.grid(1)
        if i < x.size:
            v = x[i]
            out[i] = math.sin(v) * math.exp(-decay * v * v)

    ptx, _ = cuda.compile_ptx(damped_wave, "float32[:], float32[:], float32", cc=(8, 0))
    n = 1 << 16
    x = np.linspace(-4, 4, n, dtype=np.float32)
    with pvgpu.connect(args.endpoint, memory=args.memory) as conn:
        with conn.devices[0].create_context() as ctx:
            mod = ctx.load_module(ptx)
            (name,) = mod.function_names  # numba mangles the Python name
            kernel = mod.get_function(name)
            dx, dout = ctx.to_device(x), ctx.empty(n, np.float32)
            kernel[(n + 255) // 256, 256](*numba_array(dx), *numba_array(dout), 0.25)
            out = dout.to_host()
    expected = np.sin(x) * np.exp(-0.25 * x * x)
    assert np.allclose(out, expected, rtol=1e-5, atol=1e-6)
    print(f"numba kernel damped_wave (entry {name[:32]}...) on pvgpu: {n} values match numpy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
