"""The type checker passes: `python -m mypy` with pyproject.toml's [tool.mypy] (the guest
API and virtio driver, the transport and the spec, their function bodies included) reports
no error. mypy's cache goes to a temporary directory, so the run never depends on an
earlier one.

mypy cannot follow the checkout's layout (guest/ beside pvgpu/, joined to pvgpu.__path__ at
run time), so it runs in the installed layout: a temporary pvgpu/ of symlinks to pvgpu/'s own
files and to the checkout's guest/, host/, transport/, spec/ and bench/."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# [tool.mypy] of pyproject.toml, up to the next table (tomllib is Python 3.11+)
CONFIG = re.search(r"^\[tool\.mypy\]\n(.*?)^\[", (ROOT / "pyproject.toml").read_text(),
                   re.M | re.S).group(1)


SUBPACKAGES = ("guest", "host", "transport", "spec", "bench")


def installed_layout(tmp_path) -> Path:
    """A directory holding pvgpu/ as an install lays it out, made of symlinks."""
    top = tmp_path / "layout"
    (top / "pvgpu").mkdir(parents=True)
    for entry in (ROOT / "pvgpu").iterdir():
        if entry.name != "__pycache__":
            (top / "pvgpu" / entry.name).symlink_to(entry)
    for name in SUBPACKAGES:
        (top / "pvgpu" / name).symlink_to(ROOT / name)
    return top


def _mypy(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"),
                           "--config-file", str(ROOT / "pyproject.toml"),
                           "--no-error-summary", *args],
                          cwd=installed_layout(tmp_path), capture_output=True, text=True,
                          timeout=100)


def test_mypy_finds_no_error(tmp_path):
    r = _mypy(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_configuration_checks_the_guest_api_driver_transport_and_spec():
    files = re.search(r"^files = \[(.*)\]$", CONFIG, re.M).group(1)
    assert {'"pvgpu/guest/api"', '"pvgpu/guest/frontend"', '"pvgpu/transport"',
            '"pvgpu/spec"'} <= set(files.split(", "))
    assert re.search(r"^check_untyped_defs = true$", CONFIG, re.M)


def test_mypy_reports_an_error_in_a_function_body(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    n: int = 'one'\n")  # untyped def: checked with check_untyped_defs
    r = _mypy(tmp_path, str(bad))
    assert r.returncode == 1 and "bad.py:2: error" in r.stdout, r.stdout + r.stderr
