"""Every script in examples/ runs against a real host and exits 0."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.py"))


# examples that need an optional package, and why they are skipped without it
NEEDS = {"numba_kernel.py": ("numba", "numba-cuda is not installed (pip install numba-cuda)")}


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(shared_host, script):
    module, why = NEEDS.get(script.name, (None, ""))
    if module is not None and importlib.util.find_spec(module) is None:
        pytest.skip(why)
    r = subprocess.run([sys.executable, str(script), shared_host.endpoint], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip()
