"""The README's Python examples run as written, against a host on the default endpoint."""

import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

from pvgpu.procs import HostProcess

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_example(monkeypatch):
    runtime = tempfile.mkdtemp(prefix="pvgpu-xdg-")
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)  # the default endpoint lives here
    host = HostProcess([], vram="128M")
    try:
        assert host.endpoint == f"ipc://{runtime}/pvgpu.sock"
        first, streams = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[:2]
        scope = {}
        exec(compile(first, str(README), "exec"), scope)
        n = scope["n"]
        assert np.array_equal(scope["out"], np.arange(n, dtype=np.float32) + 1)
        scope = {}
        exec(compile(streams, str(README), "exec"), scope)
        assert np.array_equal(scope["twos"], np.full(scope["n"], 2.0, np.float32))
        assert scope["ms"] >= 45
    finally:
        host.stop()
        shutil.rmtree(runtime, ignore_errors=True)


def test_readme_pictures_are_committed_small_pngs():
    pictures = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", README.read_text())
    assert {"docs/sched.png", "docs/copies.png", "docs/demo.png"} <= set(pictures)
    for rel in pictures:
        data = (README.parent / rel).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 100_000, rel
