"""Kernels of one's own through the guest API against a real host, in both memory models:
Context.load_module from PTX text, bytes and files, launches checked against numpy,
__constant__ data through get_global, structs by value, argument and configuration
errors, faults (page faults, code faults, malformed objects) that stay in their context,
and TDR stopping a kernel that never ends."""

import ctypes
import struct
from pathlib import Path

import numpy as np
import pytest

from pvgpu.conformance import codeobj
from pvgpu import guest
from pvgpu.spec import isa, wire

DATA = Path(__file__).resolve().parent / "data"
PTX = (DATA / "launch_api.ptx").read_text()


class Affine(ctypes.Structure):
    _fields_ = [("scale", ctypes.c_float), ("shift", ctypes.c_int), ("bias", ctypes.c_double)]


@pytest.fixture
def ctx(conn):
    with conn.devices[0].create_context("modules") as c:
        yield c


def test_saxpy_from_ptx_text_bytes_and_file(ctx):
    rng = np.random.default_rng(1)
    n = 10_000
    x = rng.standard_normal(n).astype(np.float32)
    y0 = rng.standard_normal(n).astype(np.float32)
    for src in (PTX, PTX.encode(), DATA / "launch_api.ptx", str(DATA / "launch_api.ptx")):
        mod = ctx.load_module(src)
        saxpy = mod.get_function("saxpy")
        dx, dy = ctx.to_device(x), ctx.to_device(y0)
        saxpy.launch(8, 256, (np.float32(2.5), dx, dy, n))  # grid-stride: fewer threads than n
        np.testing.assert_allclose(dy.to_host(), 2.5 * x + y0, rtol=1e-6, atol=1e-6)
        saxpy[(4,), (128, 1, 1)](-1.0, dx, dy, n)  # the numba-style form, 1- and 3-tuples
        np.testing.assert_allclose(dy.to_host(), 1.5 * x + y0, rtol=1e-5, atol=1e-5)
        mod.unload()


def test_function_attributes_and_names(ctx):
    mod = ctx.load_module(PTX)
    assert mod.function_names == sorted(["saxpy", "poly", "affine", "store_at", "spin",
                                         "small_block", "dot_big"])
    assert mod.global_names == ["coeffs", "counter"]
    f = mod.get_function("saxpy")
    assert f is mod.get_function("saxpy") and f.name == "saxpy"
    assert f.num_regs > 0 and f.shared_size_bytes == 0 and f.local_size_bytes == 0
    assert f.max_threads_per_block == isa.MAX_BLOCK_THREADS
    assert mod.get_function("small_block").max_threads_per_block == 64
    with pytest.raises(guest.NotFoundError, match="no kernel 'nope'.*saxpy"):
        mod.get_function("nope")
    with pytest.raises(guest.NotFoundError):
        mod.get_global("nope")


def test_constant_data_through_get_global(ctx):
    mod = ctx.load_module(PTX)
    coeffs = mod.get_global("coeffs", np.float32)
    counter = mod.get_global("counter", np.int32)
    assert coeffs.shape == (4,) and counter.shape == (1,)
    np.testing.assert_array_equal(counter.to_host(), [0])  # zero-initialised
    c = np.array([1.0, -2.0, 0.5, 0.25], np.float32)
    coeffs.copy_from_host(c)
    n = 1000
    x = np.linspace(-2, 2, n, dtype=np.float32)
    dx, dy = ctx.to_device(x), ctx.empty(n, np.float32)
    mod.get_function("poly")[4, 256](dx, dy, n)
    want = c[0] + x * (c[1] + x * (c[2] + x * c[3]))
    np.testing.assert_allclose(dy.to_host(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(counter.to_host(), [n])  # atomics over the whole grid
    with pytest.raises(ValueError):
        mod.get_global("coeffs", np.float64, shape=3)


def test_struct_by_value(ctx):
    mod = ctx.load_module(PTX)
    affine = mod.get_function("affine")
    n = 300
    x = np.arange(n, dtype=np.float32)
    dx, dy = ctx.to_device(x), ctx.empty(n, np.float64)
    affine.launch(2, 256, (Affine(0.5, 3, 0.25), dx, dy, n))
    np.testing.assert_allclose(dy.to_host(), x * 0.5 + 3 + 0.25)
    raw = bytes(Affine(2.0, -1, 1.0))  # bytes of the right size do as well
    affine.launch(2, 256, (raw, dx, dy, n))
    np.testing.assert_allclose(dy.to_host(), x * 2.0 - 1 + 1.0)


def test_parameters_larger_than_a_command_slot(ctx):
    """A 256-byte struct by value: the parameters travel in a buffer of their own."""
    mod = ctx.load_module(PTX)
    w = np.linspace(-1, 1, 64, dtype=np.float32)
    x = np.arange(64, dtype=np.float32)
    out, dx = ctx.empty(32, np.float32), ctx.to_device(x)
    free_before = ctx.device.connection.session.heap.free_bytes
    for _ in range(3):
        mod.get_function("dot_big").launch(1, 32, (w.tobytes(), dx, out))
    ctx.synchronize()
    np.testing.assert_allclose(out.to_host(), np.full(32, np.dot(w, x)), rtol=1e-5)
    assert ctx.device.connection.session.heap.free_bytes == free_before  # given back


def test_argument_errors_are_raised_before_the_host_sees_them(ctx):
    mod = ctx.load_module(PTX)
    saxpy = mod.get_function("saxpy")
    dx = ctx.zeros(16, np.float32)
    sent = ctx.device.stats()
    for args, exc in [((1.0, dx, dx), TypeError), ((1.0, dx, dx, 16, 5), TypeError),
                      (("a", dx, dx, 16), TypeError), ((1.0, dx, dx, 1.5), TypeError),
                      ((1.0, dx, 2.5, 16), TypeError), ((1.0, dx, dx, 2**40), OverflowError),
                      ((1e40, dx, dx, 16), OverflowError)]:
        with pytest.raises(exc):
            saxpy.launch(1, 32, args)
    affine = mod.get_function("affine")
    with pytest.raises(TypeError, match="16 bytes"):
        affine.launch(1, 32, (b"\0" * 8, dx, dx, 1))
    with pytest.raises(TypeError, match="struct passed by value"):
        affine.launch(1, 32, (1.0, dx, dx, 1))
    other = ctx.device.create_context()
    with pytest.raises(ValueError, match="belongs to context"):
        saxpy.launch(1, 32, (1.0, other.zeros(4, np.float32), dx, 4))
    other.destroy()
    freed = ctx.zeros(4, np.float32)
    freed.free()
    with pytest.raises(guest.InvalidResourceError):
        saxpy.launch(1, 32, (1.0, freed, dx, 4))
    after = ctx.device.stats()
    launches = lambda s: s["engines"]["compute"]["stats"].get("jobs_run", 0)  # noqa: E731
    assert launches(after) == launches(sent)  # nothing reached the device
    ctx.synchronize()


def test_launch_configuration_limits(ctx):
    mod = ctx.load_module(PTX)
    small = mod.get_function("small_block")
    out = ctx.zeros(64, np.int32)
    small.launch(1, 64, (out,))
    np.testing.assert_array_equal(out.to_host(), np.arange(64))
    with pytest.raises(guest.InvalidParameterError, match="at most 64"):
        small.launch(1, 65, (out,))
    saxpy = mod.get_function("saxpy")
    with pytest.raises(guest.InvalidParameterError, match="shared memory"):
        saxpy.launch(1, 32, (1.0, out, out, 0), shared_mem=isa.MAX_DYNAMIC_SHARED + 1)
    with pytest.raises(guest.InvalidParameterError):
        saxpy.launch(1, (32, 32, 2), (1.0, out, out, 0))
    with pytest.raises(guest.InvalidParameterError):
        saxpy.launch(0, 32, (1.0, out, out, 0))
    saxpy.launch(1, 32, (1.0, out, out, 0), shared_mem=isa.MAX_DYNAMIC_SHARED)
    ctx.synchronize()


def test_a_launch_beyond_the_entry_through_the_raw_command_is_an_illegal_code_fault(ctx):
    """The device, not only the API, refuses a block the entry does not allow
    ([COBJ-VALID-3]): a raw LAUNCH_CODE with 65 threads of small_block."""
    mod = ctx.load_module(PTX)
    fn = mod.get_function("small_block")
    out = ctx.zeros(128, np.int32)
    entry_va = mod.va + mod._cobj.entry_offset(fn._entry)
    hdr = wire.pack_ctrl_hdr(wire.CMD_LAUNCH_CODE, ctx_id=ctx.ctx_id)
    body = struct.pack(wire.CMD_BODY_FORMATS[wire.CMD_LAUNCH_CODE], mod.va, entry_va,
                       1, 1, 1, 65, 1, 1, 0, 8) + struct.pack("<Q", out.ptr)
    ctx.device.call_raw(hdr + body)  # accepted: the device checks the entry when it runs
    with pytest.raises(guest.IllegalCodeError) as e:
        ctx.synchronize()
    assert e.value.reason == "launch" and e.value.address == entry_va
    np.testing.assert_array_equal(out.to_host(), 0)  # nothing ran


def test_an_out_of_bounds_store_is_a_page_fault_the_host_survives(conn, ctx):
    mod = ctx.load_module(PTX)
    bad = 0x7E00_0000_0000  # in the user range, never mapped
    mod.get_function("store_at").launch(1, 1, (bad, 7))
    with pytest.raises(guest.PageFaultError) as e:
        ctx.synchronize()
    assert e.value.address == bad and e.value.access == "write"
    assert ctx.faulted
    out = ctx.zeros(64, np.int32)  # the context, and the host, carry on
    mod.get_function("small_block").launch(1, 64, (out,))
    np.testing.assert_array_equal(out.to_host(), np.arange(64))


def test_a_trap_is_an_illegal_code_error_with_its_event(ctx):
    obj = codeobj.kernels()
    mod = ctx.load_module(obj)  # a code object is loaded as it is
    mod.get_function("trap").launch(1, 32, ())
    with pytest.raises(guest.IllegalCodeError) as e:
        ctx.synchronize()
    assert e.value.reason == "trap" and e.value.code == wire.RESP_ERR_ILLEGAL_CODE
    assert mod.va < e.value.address < mod.va + len(obj)  # the trap instruction
    assert e.value.event is not None and e.value.event.type == wire.EVTQ_CODE_FAULT
    assert e.value.event.detail == isa.COBJ_ERR_TRAP and e.value.event.address == e.value.address
    assert any(ev.type == wire.EVTQ_CODE_FAULT for ev in ctx.faults)
    out = ctx.zeros(32, np.uint32)
    mod.get_function("store_index").launch(1, 32, (out, 32))
    np.testing.assert_array_equal(out.to_host(), np.arange(32))


def test_unload_frees_and_dropping_a_module_frees(ctx):
    dev = ctx.device
    mod = ctx.load_module(PTX)
    g = mod.get_global("coeffs", np.float32)
    f = mod.get_function("saxpy")
    mod.unload()
    mod.unload()  # twice: nothing
    with pytest.raises(guest.InvalidResourceError, match="unloaded"):
        f.launch(1, 32, (1.0, 0, 0, 0))
    with pytest.raises(guest.InvalidResourceError, match="unloaded"):
        g.to_host()
    with pytest.raises(guest.InvalidResourceError):
        mod.get_function("saxpy")
    before = dev.connection._releases.freed
    for _ in range(3):
        ctx.load_module(PTX).get_function("saxpy")  # dropped at once
    ctx.synchronize()  # an API call: the queued frees are sent
    assert dev.connection._releases.freed >= before + 3 * 3  # object, .global, .const


def test_a_looping_kernel_is_stopped_by_tdr(host_factory, tmp_endpoint):
    host = host_factory([tmp_endpoint], vram="64M", extra_args=["--job-timeout-ms", "500"])
    with guest.connect(host.endpoint, mem_size=16 << 20) as conn:
        dev = conn.devices[0]
        ctx = dev.create_context()
        other = dev.create_context()
        mod = ctx.load_module(PTX)
        flag = ctx.zeros(1, np.int32)
        mod.get_function("spin").launch(64, 256, (flag,))
        with pytest.raises(guest.JobTimeoutError):
            ctx.synchronize()
        with pytest.raises(guest.ContextLostError):
            ctx.zeros(4)
        out = other.zeros(64, np.int32)  # other contexts carry on
        other.load_module(PTX).get_function("small_block").launch(1, 64, (out,))
        np.testing.assert_array_equal(out.to_host(), np.arange(64))
        ctx.destroy()


def test_ptx_that_does_not_compile_names_the_line(ctx):
    bad = PTX.replace("mad.lo.s32", "mad.lol.s32", 1)
    line = next(i for i, text in enumerate(bad.splitlines(), 1) if "mad.lol" in text)
    with pytest.raises(guest.PtxCompileError) as e:
        ctx.load_module(bad)
    assert e.value.line == line and f"line {line}" in str(e.value)


def test_cuda_c_source(ctx):
    """CUDA C compiles through NVRTC when the `cuda` extra is installed; without it the
    error says what to install (both machines run this test)."""
    src = (DATA / "launch_api.cu").read_text()
    try:
        from cuda.bindings import nvrtc  # noqa: F401
    except ImportError:
        with pytest.raises(guest.CudaCompileError, match=r"pvgpu\[cuda\]"):
            ctx.load_module(src)
        return
    mod = ctx.load_module(src)
    out = ctx.zeros(64, np.int32)
    mod.get_function("small_block").launch(1, 64, (out,))
    np.testing.assert_array_equal(out.to_host(), np.arange(64))
    mod2 = ctx.load_module(DATA / "launch_api.cu")
    assert "saxpy" in mod2.function_names


def test_the_readme_kernel_example(shared_host, monkeypatch):
    """README "Writing kernels": its example runs as written (against this host)."""
    import re
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## Writing kernels"):]
    example = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    connect = guest.connect
    monkeypatch.setattr(guest, "connect", lambda *a, **kw: connect(shared_host.endpoint,
                                                                 mem_size=16 << 20))
    scope = {}
    exec(compile(example, "README.md", "exec"), scope)
    np.testing.assert_array_equal(scope["halves"], np.arange(scope["n"], dtype=np.float32) * 0.5)
