"""cuda-python style programs on pvgpu.cuda against a real host: examples/cuda_python_style.py
(driver and runtime API) runs unchanged in both memory models, with NVRTC or, without
cuda-bindings, from its committed PTX; the stand-ins for the cuda-python samples' helpers
(pvgpu.cuda.helpers) compile with NVRTC, or stop with a message saying what to install."""

import ctypes
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cuda_facade import model, ok  # noqa: F401
from pvgpu.cuda import driver as cuda
from pvgpu.cuda import helpers

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cuda_python_style.py"
# run a script as __main__ in a process that cannot import cuda-bindings (nor its NVRTC)
WITHOUT_BINDINGS = ("import runpy, sys; sys.modules['cuda'] = None; path = sys.argv.pop(1); "
                    "runpy.run_path(path, run_name='__main__')")
HAS_NVRTC = importlib.util.find_spec("cuda") is not None and \
    importlib.util.find_spec("cuda.bindings.nvrtc") is not None


def _run(args, endpoint, memory):
    env = dict(os.environ, PVGPU_MEMORY=memory)
    env.pop("PVGPU_ENDPOINT", None)
    return subprocess.run([sys.executable, *args, endpoint], capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.mark.parametrize("memory", ["shared", "inline"])
def test_the_cuda_python_style_example_runs_in_both_memory_models(shared_host, memory):
    r = _run([str(EXAMPLE)], shared_host.endpoint, memory)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "scale_add" in r.stdout and "histogram" in r.stdout and r.stdout.strip().endswith("done")
    if memory == "shared":
        assert "mapped host memory: the kernel wrote the host's buffer in place" in r.stdout
    else:
        assert "cannot map host memory" in r.stdout


def test_the_example_runs_from_its_committed_ptx_without_cuda_bindings(shared_host):
    r = _run(["-c", WITHOUT_BINDINGS, str(EXAMPLE)], shared_host.endpoint, "shared")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "NVRTC is not installed: using the PTX nvcc made" in r.stdout


SOURCE = """
extern "C" __global__ void twice(const float *src, float *dst)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    dst[i] = src[i] * 2.0f;
}
"""


@pytest.mark.skipif(not HAS_NVRTC, reason="NVRTC (pip install 'pvgpu[cuda]') is not installed: "
                    "KernelHelper compiles CUDA C with it")
def test_kernel_helper_compiles_cuda_c_with_nvrtc(model):
    dev_id = helpers.find_cuda_device()
    assert dev_id == 0
    helpers.check_compute_capability_too_low(dev_id, (6, 0))
    kernel = helpers.KernelHelper(SOURCE, dev_id).get_function(b"twice")
    n = 1024
    x = np.arange(n, dtype=np.float32)
    d_x, d_y = ok(cuda.cuMemAlloc(x.nbytes)), ok(cuda.cuMemAlloc(x.nbytes))
    helpers.check_cuda_errors(cuda.cuMemcpyHtoD(d_x, x, x.nbytes))
    helpers.checkCudaErrors(cuda.cuLaunchKernel(kernel, n // 256, 1, 1, 256, 1, 1, 0, 0,
                                                ((d_x, d_y), (ctypes.c_void_p, ctypes.c_void_p)), 0))
    out = np.empty_like(x)
    helpers.check_cuda_errors(cuda.cuMemcpyDtoH(out, d_y, out.nbytes))
    np.testing.assert_array_equal(out, 2 * x)
    with pytest.raises(RuntimeError, match=r"CUDA error code=1\(CUDA_ERROR_INVALID_VALUE\)"):
        helpers.check_cuda_errors(cuda.cuMemAlloc(0))
    with pytest.raises(SystemExit):  # a compile error: the log, and exit
        helpers.KernelHelper("this is not C", dev_id)


def test_kernel_helper_without_nvrtc_says_what_to_install(model, monkeypatch, capsys):
    for name in ("cuda", "cuda.bindings", "cuda.bindings.nvrtc"):  # as if it were absent
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setenv("CUDA_BINDINGS_SKIP_EXAMPLE", "3")
    with pytest.raises(SystemExit) as e:
        helpers.KernelHelper(SOURCE, helpers.find_cuda_device())
    assert e.value.code == 3
    assert "pip install 'pvgpu[cuda]'" in capsys.readouterr().err


def test_command_line_helpers(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["sample.py", "device=1", "-use_generic_memory"])
    assert helpers.check_cmd_line_flag("device=") and helpers.get_cmd_line_argument_int("device=") == 1
    assert helpers.checkCmdLineFlag("use_generic_memory") and not helpers.check_cmd_line_flag("help")
    assert helpers.get_cmd_line_argument_int("other=") == 0


def test_the_readme_cuda_python_example(shared_host, monkeypatch):
    readme = (EXAMPLE.parents[1] / "README.md").read_text()
    section = readme[readme.index("## Running cuda-python programs"):]
    block = section[section.index("```python\n") + 10:section.index("```\n", section.index("```python"))]
    monkeypatch.chdir(EXAMPLE.parents[1])  # it reads tests/kernels/saxpy.ptx
    monkeypatch.setenv("PVGPU_ENDPOINT", shared_host.endpoint)
    import pvgpu.cuda
    pvgpu.cuda.shutdown()  # the first call connects, from the environment
    try:
        scope = {}
        exec(compile(block, "README.md", "exec"), scope)
        assert (scope["y"] == 2 * scope["x"]).all()
    finally:
        pvgpu.cuda.shutdown()
