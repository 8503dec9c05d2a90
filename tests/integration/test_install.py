"""A plain (non-editable) install into a fresh virtual environment puts one package into
site-packages, `pvgpu` (and its dist-info), and works from anywhere: the layers are
pvgpu.guest, pvgpu.host, ..., with the spec's text, the bench kernels and py.typed inside.

No network: the wheel is built with this environment's setuptools (--no-build-isolation) and
installed without its dependencies, which the fresh environment borrows from this one
through a .pth file written after site-packages was listed.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import msgpack
import numpy
import zmq

ROOT = Path(__file__).resolve().parents[2]
JUNK = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis",
                              ".pytest_cache", ".mypy_cache", ".venv")


def _run(args, timeout, **kw):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, **kw)
    assert r.returncode == 0, f"{args}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_a_plain_install_holds_one_top_level_package(tmp_path):
    src = tmp_path / "src"  # a copy: building leaves build/ and *.egg-info behind
    shutil.copytree(ROOT, src, ignore=JUNK)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
          "--no-index", "--quiet", "--wheel-dir", str(tmp_path / "wheels"), str(src)], 100)
    wheel, = (tmp_path / "wheels").glob("pvgpu-*.whl")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], 60)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
          "--no-index", "--quiet", str(wheel)], 100)

    site = Path(_run([str(python), "-I", "-c", "import sysconfig; "
                      "print(sysconfig.get_path('purelib'))"], 30).strip())
    assert sorted(os.listdir(site)) == ["pvgpu", wheel.name.split("-py")[0] + ".dist-info"]

    deps = {str(Path(m.__file__).parents[1]) for m in (numpy, zmq, msgpack)}
    (site / "deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    out = _run([str(python), "-I", "-c", """
import importlib.resources, importlib.util, pvgpu, pvgpu.guest.api, pvgpu.host.main, pvgpu.spec.wire
files = importlib.resources.files
print(pvgpu.__file__, pvgpu.guest.api.__file__, pvgpu.host.main.__file__)
print(pvgpu.__version__, pvgpu.connect is pvgpu.guest.connect)
print((files("pvgpu.spec") / "pvgpu.md").is_file(), (files("pvgpu") / "py.typed").is_file(),
      (files("pvgpu.bench") / "kernels" / "ptx_bench.ptx").is_file())
print([n for n in ("guest", "host", "transport", "spec", "bench")
       if importlib.util.find_spec(n) is not None])  # generic top-level names: none
"""], 60, cwd=tmp_path)
    files, facts, data, generic = out.splitlines()
    assert all(Path(f).is_relative_to(site) for f in files.split()), files
    assert facts.split() == [wheel.name.split("-")[1], "True"]
    assert data.split() == ["True", "True", "True"]
    assert generic == "[]"
    version = _run([str(venv / "bin" / "pvgpu"), "--version"], 60, cwd=tmp_path)
    assert version == f"pvgpu {wheel.name.split('-')[1]}\n"
