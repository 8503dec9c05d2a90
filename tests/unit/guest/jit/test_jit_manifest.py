"""The kernel manifest (tests/kernels/manifest.py) fits the corpus: every case names a PTX
file and entry that exist, its arguments match the entry's parameter layout, its expected
results have the shapes and types of the arrays they describe, and every PTX file of the
corpus has a case."""

import numpy as np
import pytest

from pvgpu.guest.jit import compile_ptx, read_code_object
from pvgpu.spec import isa
from jit_helpers import load_manifest

mf = load_manifest()

_OBJECTS = {}


def entry_of(case):
    if case.ptx not in _OBJECTS:
        _OBJECTS[case.ptx] = read_code_object(compile_ptx(case.path.read_text()))
    return _OBJECTS[case.ptx].entry(case.entry)


def flat_params(args):
    """(size, kind) per kernel parameter, kind "ptr", "int", "float" or "bytes"."""
    out = []
    for a in args:
        if isinstance(a, (mf.In, mf.Out, mf.InOut)):
            out.append((8, "ptr"))
        elif isinstance(a, mf.Scalar):
            v = np.asarray(a.value)
            out.append((v.itemsize, "float" if v.dtype.kind == "f" else "int"))
        elif isinstance(a, mf.ByValue):
            out.append((len(a.value), "bytes"))
        elif isinstance(a, mf.NumbaArray):
            out += [(8, "ptr"), (8, "ptr"), (8, "int"), (8, "int"), (8, "ptr"), (8, "int"),
                    (8, "int")]
        else:
            raise AssertionError(f"unknown argument {a!r}")
    return out


def test_every_ptx_file_has_a_case():
    covered = {c.ptx for c in mf.CASES}
    missing = [p.name for p in mf.HERE.glob("*.ptx") if p.name not in covered]
    assert not missing


@pytest.mark.parametrize("case", mf.CASES, ids=[c.name for c in mf.CASES])
def test_case_matches_its_entry(case):
    e = entry_of(case)
    args = case.make()
    params = flat_params(args)
    assert len(params) == len(e.params)
    for (size, kind), p in zip(params, e.params):
        assert size == p.size
        if kind == "bytes":
            assert p.type == isa.TYPE_B8
        elif kind == "float":
            assert p.type in isa.FLOAT_TYPES
        else:
            assert p.type in isa.INT_TYPES
    threads = int(np.prod(case.block))
    assert 1 <= threads <= (e.max_threads or isa.MAX_BLOCK_THREADS)
    assert e.shared_size + case.shared_mem <= isa.MAX_DYNAMIC_SHARED
    assert (case.expected is None) != (case.check is None)
    if case.expected is not None:
        want = case.expected(args)
        for i, w in want.items():
            a = args[i].arg if isinstance(args[i], mf.NumbaArray) else args[i]
            assert isinstance(a, (mf.Out, mf.InOut)), f"argument {i} is not read back"
            assert np.asarray(w).shape == a.value.shape and np.asarray(w).dtype == a.value.dtype
    for name, value in case.globals_before.items():
        sym = _OBJECTS[case.ptx].symbol(name)
        assert sym.size == np.asarray(value).nbytes
    # the arguments are the same every time
    again = case.make()
    for x, y in zip(args, again):
        vx = getattr(x, "arg", x).value
        vy = getattr(y, "arg", y).value
        if isinstance(vx, bytes):
            assert vx == vy
        else:
            assert np.array_equal(np.asarray(vx), np.asarray(vy), equal_nan=True)
