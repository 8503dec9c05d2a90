"""Damaged PTX (corpus files with lines deleted, swapped or altered) gives a PtxError or a
code object that keeps the ISA rules, never another exception: a guest's bad module is a
clear error, not a crash of the compiler."""

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from pvgpu.guest.jit import compile_ptx
from pvgpu.guest.jit.errors import PtxError
from pvgpu.guest.jit.verify import verify

KERNELS = Path(__file__).resolve().parents[4] / "tests" / "kernels"
SOURCES = [p.read_text() for p in sorted(KERNELS.glob("*.ptx"))
           if p.stat().st_size < 12_000]
JUNK = ["%r1", "%rd1", "%p1", "%f1", "0", "-1", "0f3F800000", "foo", "[%rd1]", "{%r1, %r2}",
        "%tid.x", ".u64", "_", ",", ";", "{", "}", "[", "]", ".b32", "%r99999", "@%p1",
        "0d4000000000000000", "ld.param.v4.u8", "$L__BB0_2"]


@st.composite
def damaged(draw):
    lines = draw(st.sampled_from(SOURCES)).split("\n")
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        how = draw(st.integers(0, 4))
        toks = lines[i].split()
        if how == 0:
            del lines[i]
        elif how == 1:
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif toks and how == 2:
            del toks[draw(st.integers(0, len(toks) - 1))]
            lines[i] = " ".join(toks)
        elif toks:
            toks.insert(draw(st.integers(0, len(toks))), draw(st.sampled_from(JUNK)))
            lines[i] = " ".join(toks)
    return "\n".join(lines)


@settings(max_examples=150, deadline=None)
@given(damaged())
def test_damaged_ptx_is_an_error_or_a_valid_object(text):
    try:
        blob = compile_ptx(text)
    except PtxError as e:
        assert e.line >= 0 and str(e)
        return
    verify(blob)
