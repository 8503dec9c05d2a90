"""Every kernel of the corpus (tests/kernels/, run as tests/kernels/manifest.py says) through
the guest API against a real host, in both memory models: compiled from its committed PTX,
loaded with Context.load_module, launched with Function.launch, its results checked
against numpy (module globals written with get_global before, read back after)."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from pvgpu import guest
from pvgpu.guest.jit import compile_ptx


def _load_manifest():
    """tests/kernels/manifest.py, imported by path (the tests are not a package)."""
    name = "pvgpu_kernel_manifest"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "kernels" / "manifest.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


mf = _load_manifest()

_OBJECTS = {}  # PTX file -> code object bytes (compiled once per test process)


def code_object(case) -> bytes:
    if case.ptx not in _OBJECTS:
        _OBJECTS[case.ptx] = compile_ptx(case.path.read_text())
    return _OBJECTS[case.ptx]


@pytest.fixture(scope="module", params=["shared", "inline"])
def corpus_ctx(request, shared_host):
    with guest.connect(shared_host.endpoint, memory=request.param, mem_size=64 << 20) as conn:
        ctx = conn.devices[0].create_context("corpus")
        yield ctx
        ctx.destroy()


def device_args(ctx, args):
    """-> (launch arguments, {index: DeviceArray} of the arrays read back)."""
    out, readback = [], {}
    for i, a in enumerate(args):
        arr = a.arg if isinstance(a, mf.NumbaArray) else a
        if isinstance(arr, (mf.In, mf.Out, mf.InOut)):
            host = np.ascontiguousarray(arr.value)
            dev = ctx.to_device(host) if host.size else ctx.empty(host.shape, host.dtype)
            if not isinstance(arr, mf.In):
                readback[i] = dev
            if isinstance(a, mf.NumbaArray):  # meminfo, parent, nitems, itemsize, data, shape, strides
                out += [0, 0, host.size, host.itemsize, dev, host.shape[0], host.strides[0]]
            else:
                out.append(dev)
        elif isinstance(a, mf.Scalar):
            out.append(a.value)
        elif isinstance(a, mf.ByValue):
            out.append(a.value)
        else:
            raise AssertionError(f"unknown argument {a!r}")
    return out, readback


@pytest.mark.parametrize("case", mf.CASES, ids=[c.name for c in mf.CASES])
def test_corpus_kernel(corpus_ctx, case):
    ctx = corpus_ctx
    mod = ctx.load_module(code_object(case))
    try:
        for name, value in case.globals_before.items():
            value = np.asarray(value)
            mod.get_global(name, value.dtype, value.shape).copy_from_host(value)
        args = case.make()
        launch_args, readback = device_args(ctx, args)
        mod.get_function(case.entry).launch(case.grid, case.block, launch_args,
                                            shared_mem=case.shared_mem)
        got = {i: arr.to_host() for i, arr in readback.items()}
        if case.check is not None:
            case.check(args, got)
        else:
            want = case.expected(args)
            assert set(want) <= set(got), (sorted(want), sorted(got))
            for i, w in want.items():
                np.testing.assert_allclose(got[i], w, rtol=case.rtol, atol=case.atol,
                                           err_msg=f"{case.name}: argument {i}")
        if case.globals_after is not None:
            for name, w in case.globals_after(args).items():
                w = np.asarray(w)
                g = mod.get_global(name, w.dtype, w.shape).to_host()
                np.testing.assert_allclose(g, w, rtol=case.rtol, atol=case.atol,
                                           err_msg=f"{case.name}: global {name}")
    finally:
        mod.unload()
