"""Every case of the kernel manifest, compiled by the JIT and run by the reference ISA
interpreter (jit_refsim.py), gives the results numpy expects: the compiler's instruction
selection and the manifest's expectations agree before any hardware runs them."""

import numpy as np
import pytest

from pvgpu.guest.jit import compile_ptx, read_code_object
from jit_helpers import load_manifest
from jit_refsim import Launch, Memory

mf = load_manifest()

_OBJECTS = {}


def marshal(args, entry, mem):
    """-> (parameter bytes, [(arg index, va, array)] to read back)."""
    flat, back = [], []
    for i, a in enumerate(args):
        inner = a.arg if isinstance(a, mf.NumbaArray) else a
        if isinstance(inner, (mf.In, mf.Out, mf.InOut)):
            arr = np.ascontiguousarray(inner.value)
            va = mem.alloc(arr.nbytes, arr)
            if not isinstance(inner, mf.In):
                back.append((i, va, arr))
            if isinstance(a, mf.NumbaArray):
                n = arr.size
                flat += [np.uint64(0), np.uint64(0), np.int64(n), np.int64(arr.itemsize),
                         np.uint64(va), np.int64(n), np.int64(arr.itemsize)]
            else:
                flat.append(np.uint64(va))
        elif isinstance(a, mf.Scalar):
            flat.append(a.value)
        elif isinstance(a, mf.ByValue):
            flat.append(a.value)
        else:
            raise AssertionError(a)
    buf = bytearray(entry.param_size)
    assert len(flat) == len(entry.params)
    for value, p in zip(flat, entry.params):
        b = value if isinstance(value, bytes) else np.asarray(value).tobytes()
        assert len(b) == p.size
        buf[p.offset:p.offset + p.size] = b
    return bytes(buf), back


@pytest.mark.parametrize("case", mf.CASES, ids=[c.name for c in mf.CASES])
def test_case_runs_on_the_reference_interpreter(case):
    if case.ptx not in _OBJECTS:
        _OBJECTS[case.ptx] = read_code_object(compile_ptx(case.path.read_text()))
    obj = _OBJECTS[case.ptx]
    entry = obj.entry(case.entry)
    mem = Memory()
    data_va = mem.alloc(obj.data_size, obj.data_init) if obj.data_size else 0
    const_va = mem.alloc(obj.const_size, obj.const_init) if obj.const_size else 0
    seg = {0: data_va, 1: const_va}
    for name, value in case.globals_before.items():
        sym = obj.symbol(name)
        va = (data_va if sym.space == 1 else const_va) + sym.offset
        off = va - 0x10_0000_0000
        raw = np.ascontiguousarray(value).view(np.uint8).ravel()
        mem.heap[off:off + len(raw)] = raw
    args = case.make()
    params, back = marshal(args, entry, mem)
    Launch(obj, entry, mem, data_va, const_va, params, case.grid, case.block,
           case.shared_mem).run()
    got = {}
    for i, va, arr in back:
        got[i] = np.frombuffer(mem.read(va, arr.nbytes), arr.dtype).reshape(arr.shape)
    if case.check is not None:
        case.check(args, got)
    else:
        for i, want in case.expected(args).items():
            np.testing.assert_allclose(got[i], want, rtol=case.rtol, atol=case.atol,
                                       err_msg=f"{case.name}: argument {i}")
    if case.globals_after is not None:
        for name, want in case.globals_after(args).items():
            sym = obj.symbol(name)
            va = (data_va if sym.space == 1 else const_va) + sym.offset
            have = np.frombuffer(mem.read(va, np.asarray(want).nbytes), np.asarray(want).dtype)
            np.testing.assert_allclose(have, np.asarray(want).ravel(), rtol=case.rtol,
                                       atol=case.atol, err_msg=f"{case.name}: global {name}")
    del seg
