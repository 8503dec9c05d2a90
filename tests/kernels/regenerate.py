"""Rebuild the committed PTX of the kernel corpus from its sources (never run by tests).

    python tests/kernels/regenerate.py            # every producer that is installed
    python tests/kernels/regenerate.py --only nvcc vector_add gemm_tiled

Producers:
- nvcc (on PATH): every `<name>.cu` except `nvrtc_*.cu` -> `<name>.ptx` (`--ptx -arch=sm_80
  -O3`), plus the variants in NVCC_VARIANTS -> `<name>.<variant>.ptx`.
- NVRTC (`pip install cuda-bindings nvidia-cuda-nvrtc`): every `nvrtc_*.cu` and the names
  in NVRTC_ALSO -> `<name>.nvrtc.ptx`, with the options in NVRTC_OPTIONS.
- numba-cuda (`pip install numba-cuda`): every kernel of numba_kernels.py ->
  `numba_<name>.numba.ptx`.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

SM80 = ["-arch=sm_80", "-O3"]
NVCC_VARIANTS = {
    # name: {variant: nvcc options}; sm_75 is the oldest target nvcc 13 accepts, and
    # `-Xcicc -O0` gives unoptimized PTX without -G debug information.
    "vector_add": {"sm75": ["-arch=sm_75", "-O3"], "sm90": ["-arch=sm_90", "-O3"],
                   "O0": ["-arch=sm_80", "-Xcicc", "-O0"]},
    "gemm_tiled": {"sm75": ["-arch=sm_75", "-O3"], "sm90": ["-arch=sm_90", "-O3"],
                   "O0": ["-arch=sm_80", "-Xcicc", "-O0"]},
    "reduce_shfl": {"sm75": ["-arch=sm_75", "-O3"], "sm90": ["-arch=sm_90", "-O3"]},
    "histogram": {"sm75": ["-arch=sm_75", "-O3"], "sm90": ["-arch=sm_90", "-O3"]},
    "atomics_global": {"sm90": ["-arch=sm_90", "-O3"], "O0": ["-arch=sm_80", "-Xcicc", "-O0"]},
    "bit_tricks": {"sm75": ["-arch=sm_75", "-O3"], "sm90": ["-arch=sm_90", "-O3"],
                   "O0": ["-arch=sm_80", "-Xcicc", "-O0"]},
    "f16_convert": {"sm90": ["-arch=sm_90", "-O3"], "O0": ["-arch=sm_80", "-Xcicc", "-O0"]},
    "device_calls": {"sm90": ["-arch=sm_90", "-O3"], "O0": ["-arch=sm_80", "-Xcicc", "-O0"]},
    "struct_param": {"O0": ["-arch=sm_80", "-Xcicc", "-O0"]},
    "early_exit": {"O0": ["-arch=sm_80", "-Xcicc", "-O0"]},
    "local_array": {"O0": ["-arch=sm_80", "-Xcicc", "-O0"]},
    "bar_red": {"O0": ["-arch=sm_80", "-Xcicc", "-O0"]},
    "clamp_select": {"O0": ["-arch=sm_80", "-Xcicc", "-O0"]},
    "float_math": {"sm75": ["-arch=sm_75", "-O3"], "O0": ["-arch=sm_80", "-Xcicc", "-O0"]},
    "f64_math": {"sm90": ["-arch=sm_90", "-O3"]},
    "divergent_loop": {"O0": ["-arch=sm_80", "-Xcicc", "-O0"]},
}
NVRTC_ALSO = ["vector_add", "gemm_tiled", "reduce_shfl"]
NVRTC_OPTIONS = {"nvrtc_fast_math": ["--gpu-architecture=compute_80", "--use_fast_math"]}
NVRTC_DEFAULT = ["--gpu-architecture=compute_80"]
NUMBA_CC = (8, 0)


def nvcc(names: list[str]) -> None:
    exe = shutil.which("nvcc")
    if exe is None:
        print("nvcc: not installed, skipped")
        return
    for src in sorted(HERE.glob("*.cu")):
        name = src.stem
        if name.startswith("nvrtc_") or (names and name not in names):
            continue
        builds = {"": SM80, **NVCC_VARIANTS.get(name, {})}
        for variant, opts in builds.items():
            out = HERE / (f"{name}.{variant}.ptx" if variant else f"{name}.ptx")
            subprocess.run([exe, "--ptx", *opts, str(src), "-o", str(out)], check=True)
            print("nvcc:", out.name)


def nvrtc(names: list[str]) -> None:
    try:
        from cuda.bindings import nvrtc as rtc
    except ImportError:
        print("NVRTC: cuda-bindings / nvidia-cuda-nvrtc not installed, skipped")
        return
    sources = sorted(HERE.glob("nvrtc_*.cu")) + [HERE / f"{n}.cu" for n in NVRTC_ALSO]
    for src in sources:
        name = src.stem
        if names and name not in names:
            continue
        opts = [o.encode() for o in NVRTC_OPTIONS.get(name, NVRTC_DEFAULT)]
        err, prog = rtc.nvrtcCreateProgram(src.read_bytes(), src.name.encode(), 0, [], [])
        _ok(err, rtc, "nvrtcCreateProgram")
        (err,) = rtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != rtc.nvrtcResult.NVRTC_SUCCESS:
            _, size = rtc.nvrtcGetProgramLogSize(prog)
            log = b" " * size
            rtc.nvrtcGetProgramLog(prog, log)
            raise SystemExit(f"NVRTC failed on {src.name}:\n{log.decode()}")
        err, size = rtc.nvrtcGetPTXSize(prog)
        _ok(err, rtc, "nvrtcGetPTXSize")
        buf = b" " * size
        (err,) = rtc.nvrtcGetPTX(prog, buf)
        _ok(err, rtc, "nvrtcGetPTX")
        out = HERE / f"{name}.nvrtc.ptx"
        out.write_bytes(buf.rstrip(b"\0 "))
        print("NVRTC:", out.name)


def _ok(err, rtc, what: str) -> None:
    if err != rtc.nvrtcResult.NVRTC_SUCCESS:
        raise SystemExit(f"{what}: {err}")


def numba(names: list[str]) -> None:
    try:
        from numba import cuda
    except ImportError:
        print("numba-cuda: not installed, skipped")
        return
    sys.path.insert(0, str(HERE))
    kernels = importlib.import_module("numba_kernels").KERNELS
    for name, (fn, sig) in kernels.items():
        if names and name not in names:
            continue
        ptx, _ = cuda.compile_ptx(fn, sig, cc=NUMBA_CC)
        out = HERE / f"numba_{name}.numba.ptx"
        out.write_text(ptx)
        print("numba-cuda:", out.name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("nvcc", "nvrtc", "numba"), action="append")
    ap.add_argument("names", nargs="*", help="kernel names (default: all)")
    args = ap.parse_args()
    for producer in args.only or ("nvcc", "nvrtc", "numba"):
        {"nvcc": nvcc, "nvrtc": nvrtc, "numba": numba}[producer](args.names)


if __name__ == "__main__":
    main()
