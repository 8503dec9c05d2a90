"""Kernels of one's own through the guest API: CUDA C compiled with NVRTC (when cuda-bindings'
NVRTC is installed: pip install 'pvgpu[cuda]'), else the PTX nvcc made of the same source;
loaded into a context, launched, checked against numpy.

    pvgpu host &
    python examples/cuda_kernels.py [ENDPOINT] [--memory inline]
"""

import ctypes
import sys
from pathlib import Path

import numpy as np

import pvgpu

HERE = Path(__file__).resolve().parent


class Affine(ctypes.Structure):  # the kernel's struct, passed by value
    _fields_ = [("scale", ctypes.c_float), ("shift", ctypes.c_float)]


def load(ctx):
    try:
        mod = ctx.load_module(HERE / "cuda_kernels.cu")  # CUDA C: NVRTC -> PTX -> code object
        print("compiled cuda_kernels.cu with NVRTC")
    except pvgpu.CudaCompileError as e:
        print(f"{e}\n-> using the PTX nvcc made (cuda_kernels.ptx)")
        mod = ctx.load_module(HERE / "cuda_kernels.ptx")
    return mod


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    memory = "inline" if "--memory" in argv and argv[argv.index("--memory") + 1] == "inline" \
        else "shared"
    endpoint = next((a for a in argv if "://" in a), None)
    with pvgpu.connect(endpoint, memory=memory) as conn:
        with conn.devices[0].create_context() as ctx:
            mod = load(ctx)
            poly = mod.get_function("poly_affine")
            block_sum = mod.get_function("block_sum")
            print(f"poly_affine: {poly.num_regs} registers; block_sum: "
                  f"{block_sum.shared_size_bytes} bytes of shared memory per block")

            c = np.array([1.0, -0.5, 0.25, 0.125], np.float32)
            mod.get_global("coeffs", np.float32).copy_from_host(c)  # cudaMemcpyToSymbol
            n = 100_000
            x = np.linspace(-2, 2, n, dtype=np.float32)
            dx, dy = ctx.to_device(x), ctx.empty(n, np.float32)
            poly[(n + 255) // 256, 256](dx, dy, Affine(2.0, -1.0), n)
            want = 2.0 * (c[0] + x * (c[1] + x * (c[2] + x * c[3]))) - 1.0
            np.testing.assert_allclose(dy.to_host(), want, rtol=1e-5, atol=1e-5)
            print(f"poly_affine on {n} points: checked against numpy")

            w = np.linspace(0, 1, n, dtype=np.float32)
            total = ctx.zeros(1, np.float32)
            block_sum.launch(64, 256, (ctx.to_device(w), total, n))
            got, want = float(total.to_host()[0]), float(w.sum(dtype=np.float64))
            assert abs(got - want) <= 1e-5 * want, (got, want)  # float32 sums, in any order
            print(f"block_sum: {got:.2f} (numpy: {want:.2f})")


if __name__ == "__main__":
    main()
