"""Every PTX file of the kernel corpus (tests/kernels) parses, compiles, and gives a code
object that the reader re-reads and that keeps the ISA rules (guest/jit/verify.py)."""

import re
from pathlib import Path

import pytest

from pvgpu.guest.jit import compile_ptx, read_code_object
from pvgpu.guest.jit.ptx import parse
from pvgpu.guest.jit.verify import verify

KERNELS = Path(__file__).resolve().parents[4] / "tests" / "kernels"
PTX_FILES = sorted(KERNELS.glob("*.ptx"))


def test_the_corpus_is_complete():
    sources = sorted(p.stem for p in KERNELS.glob("*.cu"))
    assert len([s for s in sources if not s.startswith("nvrtc_")]) >= 30
    for name in sources:
        produced = f"{name}.nvrtc.ptx" if name.startswith("nvrtc_") else f"{name}.ptx"
        assert (KERNELS / produced).exists(), f"{name}.cu has no committed {produced}"
    assert any(p.name.endswith(".nvrtc.ptx") for p in PTX_FILES)
    assert any(p.name.endswith(".numba.ptx") for p in PTX_FILES)


@pytest.mark.parametrize("path", PTX_FILES, ids=[p.name for p in PTX_FILES])
def test_corpus_ptx_compiles_to_a_valid_code_object(path):
    text = path.read_text()
    module = parse(text)
    blob = compile_ptx(module)
    obj = verify(read_code_object(blob))
    entries = re.findall(r"\.entry\s+([A-Za-z_$%][\w$]*)", text)
    assert [e.name for e in obj.entries] == entries
    for e in obj.entries:
        assert e.code_count >= 1
        assert e.n_r32 + e.n_r64 + e.n_pred > 0
    assert read_code_object(blob).entries == obj.entries
