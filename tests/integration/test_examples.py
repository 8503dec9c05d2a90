"""Every script in examples/ runs against a real host and exits 0: against the test's host
given as ENDPOINT, and the examples that can start a host of their own, also without one.
raw_guest.py uses nothing of this project but spec/."""

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from pvgpu.transport import curve

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.glob("*.py"))

# examples that need an optional package, and why they are skipped without it
NEEDS = {"numba_kernel.py": ("numba", "numba-cuda is not installed (pip install numba-cuda)")}
# examples that need a host configured their way (vGPUs, little VRAM, CURVE keys): run
# without ENDPOINT they start one of their own; test_examples_against_a_host_of_the_user
# runs them against hosts configured as their docstrings say
OWN_HOST = {"vgpu_tenants.py", "oversubscription.py", "remote_guest.py"}


def _run(script: Path, *args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip()
    return r


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(shared_host, script):
    module, why = NEEDS.get(script.name, (None, ""))
    if module is not None and importlib.util.find_spec(module) is None:
        pytest.skip(why)
    if script.name in OWN_HOST:
        _run(script)
    else:
        _run(script, shared_host.endpoint)


def test_examples_against_a_host_of_the_user(host_factory, tmp_endpoint, tmp_path):
    vgpus = ["--sched", "band", "--vgpu", "A:compute=75,copy=50,mem=50",
             "--vgpu", "B:compute=25,copy=50,mem=50"]
    host = host_factory([tmp_endpoint], vram="64M", extra_args=vgpus)
    out = _run(EXAMPLES_DIR / "vgpu_tenants.py", host.endpoint).stdout
    assert out.splitlines()[1].startswith("A ") and out.splitlines()[2].startswith("B ")
    small = host_factory([tmp_endpoint.replace("host.sock", "small.sock")], vram="32M")
    out = _run(EXAMPLES_DIR / "oversubscription.py", small.endpoint).stdout
    assert "32 MiB of VRAM" in out and "every buffer" in out

    host_pub, host_secret = curve.write_keypair(str(tmp_path / "keys"), "host")
    guest_pub, guest_secret = curve.write_keypair(str(tmp_path / "keys"), "guest")
    (tmp_path / "guests").mkdir()
    (tmp_path / "guests" / "guest.key").write_bytes(Path(guest_pub).read_bytes())
    tcp = host_factory(["tcp://127.0.0.1:0"], vram="64M", extra_args=[
        "--curve-secret-key", host_secret, "--authorized-keys", str(tmp_path / "guests")])
    out = _run(EXAMPLES_DIR / "remote_guest.py", tcp.endpoint, "--server-key", host_pub,
               "--client-key", guest_secret).stdout
    assert f"key {curve.read_secret_key(guest_secret).fingerprint}" in out


def test_the_raw_guest_imports_only_the_spec():
    tree = ast.parse((EXAMPLES_DIR / "raw_guest.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    project = imported - set(sys.stdlib_module_names) - {"zmq", "msgpack", "numpy"}
    assert project == {"spec"}


def test_the_readme_lists_every_example():
    readme = (EXAMPLES_DIR.parent / "README.md").read_text()
    assert [p.name for p in EXAMPLES if f"- `{p.name}`" not in readme] == []
