"""Golden listings: the disassembly of a few small corpus kernels, so that any change in
the code the compiler emits shows up as a reviewed diff. After a deliberate change, run
with PVGPU_UPDATE_GOLDEN=1 and review the new files under golden/."""

import os
from pathlib import Path

import pytest

from pvgpu.guest.jit import compile_ptx, disassemble

HERE = Path(__file__).resolve().parent
KERNELS = HERE.parents[3] / "tests" / "kernels"
GOLDEN = ["saxpy", "divergent_loop", "reduce_shfl", "struct_param", "bar_red", "device_calls"]


@pytest.mark.parametrize("name", GOLDEN)
def test_disassembly_matches_the_golden_listing(name):
    text = disassemble(compile_ptx((KERNELS / f"{name}.ptx").read_text()))
    golden = HERE / "golden" / f"{name}.txt"
    if os.environ.get("PVGPU_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.exists(), f"no golden listing {golden.name}"
    assert text == golden.read_text()
