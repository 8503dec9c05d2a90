"""guest/api/module.py and params.py without a host: reading code objects, telling sources
apart, NVRTC's absence, and marshalling launch arguments by an entry's parameter table."""

import builtins
import ctypes
import struct

import numpy as np
import pytest
from hypothesis import given, strategies as st

from pvgpu.conformance import codeobj
from pvgpu.guest.api import errors, module, params
from pvgpu.spec import isa


def entry_with(*param_specs, param_size=None):
    """A code object whose entry "k" has parameters (offset, size, align, type)."""
    size = param_size if param_size is not None else max(
        (o + s for o, s, _a, _t in param_specs), default=0)
    obj = codeobj.build([codeobj.Entry("k", codeobj.trap_code(), params=param_specs,
                                       param_size=size)])
    return module.CodeObject(obj).entries["k"]


# ------------------------------------------------------------------ code objects
def test_code_object_reader_names_entries_params_and_symbols():
    obj = codeobj.build(
        [codeobj.Entry("a", codeobj.trap_code(), params=codeobj.OUT_N, param_size=12,
                       shared_size=256, local_size=16, max_threads=128, n_r32=5, n_r64=3),
         codeobj.Entry("b", codeobj.spin_code())],
        data_init=b"\1\2\3\4", data_size=64, const_init=b"\5" * 8, const_size=8,
        symbols=[("g", isa.SPACE_GLOBAL, 0, 64), ("c", isa.SPACE_CONST, 0, 8)])
    co = module.CodeObject(obj)
    a, b = co.entries["a"], co.entries["b"]
    assert (a.index, b.index) == (0, 1)
    assert (a.n_r32, a.n_r64, a.shared_size, a.local_size, a.max_threads) == (5, 3, 256, 16, 128)
    assert [(p.offset, p.size, p.type) for p in a.params] == [(0, 8, isa.TYPE_U64), (8, 4, isa.TYPE_U32)]
    g = co.symbols["g"]
    assert (g.name, g.space, g.offset, g.size) == ("g", isa.SPACE_GLOBAL, 0, 64)
    assert co.segment_init("data") == b"\1\2\3\4" + bytes(60)
    assert co.segment_init("const") == b"\5" * 8
    patched = co.with_segment_vas(0x1234_5000, 0x6789_0000)
    assert struct.unpack_from("<QQ", patched, isa.COBJ_DATA_VA_OFFSET) == (0x1234_5000, 0x6789_0000)
    assert len(patched) == len(obj) and patched[:isa.COBJ_DATA_VA_OFFSET] == obj[:isa.COBJ_DATA_VA_OFFSET]
    assert co.entry_offset(b) == struct.unpack_from(isa.COBJ_HEADER_FORMAT, obj)[4] + isa.COBJ_ENTRY_SIZE


@pytest.mark.parametrize("corrupt", [
    lambda o: o[:50],  # shorter than a header
    lambda o: b"JUNK" + o[4:],  # magic
    lambda o: o + b"\0" * 8,  # size disagrees
    lambda o: o[:20] + struct.pack("<I", 1000) + o[24:],  # entry_count beyond the object
])
def test_code_object_reader_refuses_malformed_objects(corrupt):
    with pytest.raises(errors.ModuleLoadError, match="not a valid code object"):
        module.CodeObject(corrupt(codeobj.kernels()))


# ------------------------------------------------------------------ sources
def test_sources_are_told_apart(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(module, "compile_ptx", lambda text, name="<ptx>": seen.append(("ptx", text)) or b"obj")
    monkeypatch.setattr(module, "compile_cuda", lambda text, name="kernel.cu": seen.append(("cu", text)) or "PTX")
    ptx = "//\n.version 8.0\n.target sm_80\n.address_size 64\n"
    cu = 'extern "C" __global__ void k(float *x) { x[0] = 1; }'
    obj = codeobj.kernels()
    assert module.code_object_of(obj) == obj  # a code object: as it is
    assert module.code_object_of(ptx) == b"obj" and seen[-1] == ("ptx", ptx)
    assert module.code_object_of(ptx.encode()) == b"obj" and seen[-1] == ("ptx", ptx)
    module.code_object_of(cu)
    assert seen[-2:] == [("cu", cu), ("ptx", "PTX")]
    (tmp_path / "k.ptx").write_text(ptx)
    (tmp_path / "k.cu").write_text(cu)
    module.code_object_of(tmp_path / "k.ptx")
    assert seen[-1] == ("ptx", ptx)
    module.code_object_of(str(tmp_path / "k.cu"))
    assert seen[-2:] == [("cu", cu), ("ptx", "PTX")]
    with pytest.raises(errors.ModuleLoadError, match="cannot read"):
        module.code_object_of(tmp_path / "missing.ptx")
    with pytest.raises(errors.ModuleLoadError, match="neither a code object nor"):
        module.code_object_of(b"\xff\xfe\x00")
    with pytest.raises(TypeError, match="load_module takes"):
        module.code_object_of(42)


def test_cuda_c_without_nvrtc_says_what_to_install(monkeypatch):
    real_import = builtins.__import__

    def no_cuda(name, *a, **kw):
        if name.startswith("cuda"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *a, **kw)
    monkeypatch.setattr(builtins, "__import__", no_cuda)
    with pytest.raises(errors.CudaCompileError, match=r"pvgpu\[cuda\]"):
        module.compile_cuda('extern "C" __global__ void k() {}')


def test_cuda_c_with_nvrtc_compiles_or_reports_its_absence():
    """With the `cuda` extra installed NVRTC compiles CUDA C to PTX, and a source with an
    error gives NVRTC's log; without it, the error says what to install."""
    try:
        from cuda.bindings import nvrtc  # noqa: F401
    except ImportError:
        with pytest.raises(errors.CudaCompileError, match=r"pvgpu\[cuda\]"):
            module.compile_cuda('extern "C" __global__ void k() {}')
        return
    ptx = module.compile_cuda('extern "C" __global__ void twice(float *x) { x[threadIdx.x] *= 2; }')
    assert ".entry twice" in ptx and ".target" in ptx
    with pytest.raises(errors.CudaCompileError, match=r"bad\.cu\(1\)") as e:
        module.compile_cuda("__global__ void k( {", "bad.cu")
    assert "error" in e.value.log


# ------------------------------------------------------------------ arguments
def test_scalars_are_converted_to_the_declared_types():
    e = entry_with((0, 1, 1, isa.TYPE_U8), (2, 2, 2, isa.TYPE_S16), (4, 4, 4, isa.TYPE_S32),
                   (8, 8, 8, isa.TYPE_U64), (16, 4, 4, isa.TYPE_F32), (24, 8, 8, isa.TYPE_F64),
                   (32, 2, 2, isa.TYPE_F16), (36, 4, 4, isa.TYPE_B32))
    raw = params.ParamLayout(e).marshal(None, (True, np.int16(-2), -5, 2**64 - 1,
                                               np.float64(1.5), 3, 0.5, -1))
    assert raw[0] == 1 and struct.unpack_from("<h", raw, 2)[0] == -2
    assert struct.unpack_from("<iQf4xd", raw, 4) == (-5, 2**64 - 1, 1.5, 3.0)
    assert np.frombuffer(raw, np.float16, 1, 32)[0] == 0.5
    assert struct.unpack_from("<I", raw, 36)[0] == 0xFFFFFFFF  # b32: the bits of -1
    assert len(raw) == 40


_SCALAR_TYPES = {isa.TYPE_U8: "<u1", isa.TYPE_S16: "<i2", isa.TYPE_U32: "<u4",
                 isa.TYPE_S32: "<i4", isa.TYPE_B64: "<u8", isa.TYPE_S64: "<i8",
                 isa.TYPE_F16: "<f2", isa.TYPE_F32: "<f4", isa.TYPE_F64: "<f8"}


@st.composite
def scalar_params(draw):
    """A parameter table of scalars (packed with each one's own alignment) and values
    that fit each parameter, as Python or numpy numbers."""
    types = draw(st.lists(st.sampled_from(sorted(_SCALAR_TYPES)), min_size=1, max_size=8))
    specs, values, off = [], [], 0
    for t in types:
        dt = np.dtype(_SCALAR_TYPES[t])
        off = -(-off // dt.itemsize) * dt.itemsize
        specs.append((off, dt.itemsize, dt.itemsize, t))
        off += dt.itemsize
        if dt.kind == "f":
            top = float(np.finfo(dt).max)
            v = draw(st.floats(-top, top) | st.sampled_from([float("inf"), float("-inf")]))
        else:
            bits = 8 * dt.itemsize
            v = draw(st.integers(-(1 << (bits - 1)), (1 << bits) - 1))
        values.append(draw(st.sampled_from([v, dt.type(v)])) if dt.kind == "f"
                      or np.can_cast(np.min_scalar_type(v), dt) else v)
    return specs, values


@given(scalar_params())
def test_marshalling_matches_numpys_conversion_of_every_value(table):
    """Each value is packed at its offset as numpy converts it to the declared type: a
    float rounded as numpy rounds it (half to even, f16 too), an integer as the bits of
    the type's width, signed or not."""
    specs, values = table
    raw = params.ParamLayout(entry_with(*specs)).marshal(None, values)
    want = bytearray(len(raw))
    for (off, size, _a, t), v in zip(specs, values):
        dt = np.dtype(_SCALAR_TYPES[t])
        if dt.kind == "f":
            want[off:off + size] = np.array(float(v), dt).tobytes()
        else:
            want[off:off + size] = (int(v) & ((1 << 8 * size) - 1)).to_bytes(size, "little")
    assert raw == bytes(want)


def test_wrong_count_type_size_and_range():
    e = entry_with((0, 4, 4, isa.TYPE_U32), (8, 8, 8, isa.TYPE_F64))
    fn = params.ParamLayout(e)
    with pytest.raises(TypeError, match="takes 2 arguments, got 1"):
        fn.marshal(None, (1,))
    with pytest.raises(TypeError, match="takes 2 arguments, got 3"):
        fn.marshal(None, (1, 2.0, 3))
    with pytest.raises(TypeError, match="needs an integer"):
        fn.marshal(None, (1.5, 2.0))
    with pytest.raises(TypeError, match="needs a real number"):
        fn.marshal(None, (1, "2"))
    with pytest.raises(OverflowError, match="out of the range"):
        fn.marshal(None, (-2**31 - 1, 2.0))
    # nvcc declares C's int as .u32: a negative int fits the width and is taken as is
    assert struct.unpack_from("<i", fn.marshal(None, (np.int32(-3), 2.0)))[0] == -3
    with pytest.raises(OverflowError, match="out of the range"):
        fn.marshal(None, (2**32, 2.0))
    with pytest.raises(TypeError, match="must be a sequence"):
        fn.marshal(None, 5)
    f32 = params.ParamLayout(entry_with((0, 4, 4, isa.TYPE_F32)))
    with pytest.raises(OverflowError):
        f32.marshal(None, (1e39,))
    assert struct.unpack("<f", f32.marshal(None, (float("inf"),)))[0] == float("inf")


class Pair(ctypes.Structure):
    _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_int32), ("c", ctypes.c_double)]


def test_structs_by_value():
    fn = params.ParamLayout(entry_with((0, 16, 8, isa.TYPE_B8), (16, 4, 4, isa.TYPE_U32)))
    raw = fn.marshal(None, (Pair(1.5, -3, 2.25), 7))
    assert struct.unpack_from("<fidI", raw) == (1.5, -3, 2.25, 7)
    assert fn.marshal(None, (bytes(range(16)), 7))[:16] == bytes(range(16))
    rec = np.zeros((), dtype=[("a", "<f4"), ("b", "<i4"), ("c", "<f8")])
    rec["b"] = 9
    assert struct.unpack_from("<i", fn.marshal(None, (rec, 7)), 4)[0] == 9
    with pytest.raises(TypeError, match="is 16 bytes, the value given is 8"):
        fn.marshal(None, (b"\0" * 8, 7))
    with pytest.raises(TypeError, match="struct passed by value"):
        fn.marshal(None, (3, 7))


def test_a_marshalled_parameter_buffer_is_sent_as_it_is():
    fn = params.ParamLayout(entry_with((0, 4, 4, isa.TYPE_F32), (8, 8, 8, isa.TYPE_U64)))
    snan = struct.pack("<I", 0x7FA0_0001)  # a signalling NaN keeps its bits
    raw = snan + bytes(4) + (2**64 - 1).to_bytes(8, "little")
    assert fn.marshal(None, params.ParamBuffer(raw)) == raw
    with pytest.raises(TypeError, match="parameter buffer of 8 bytes.*take 16"):
        fn.marshal(None, params.ParamBuffer(raw[:8]))


def test_device_arrays_only_for_64_bit_parameters():
    class NotAnArray:
        pass
    fn = params.ParamLayout(entry_with((0, 4, 4, isa.TYPE_U32)))
    from pvgpu.guest.api.array import DeviceArray
    arr = DeviceArray.__new__(DeviceArray)  # never touched: refused by its parameter's type
    with pytest.raises(TypeError, match="cannot take a DeviceArray"):
        fn.marshal(None, (arr,))
    with pytest.raises(TypeError, match="needs an integer"):
        fn.marshal(None, (NotAnArray(),))


def test_launch_dimensions():
    assert module._launch_dims(5, "grid") == (5, 1, 1)
    assert module._launch_dims((2, 3), "block") == (2, 3, 1)
    assert module._launch_dims(np.int64(7), "grid") == (7, 1, 1)
    for bad in ((1, 2, 3, 4), (), "32", 2.0, (True,)):
        with pytest.raises(TypeError):
            module._launch_dims(bad, "block")
    for bad in (0, (32, 0), (2048,), (32, 32, 2)):
        with pytest.raises(errors.InvalidParameterError):
            module._launch_dims(bad, "block")
