"""The README's Python example runs as written, against a host on the default endpoint."""

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
        code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
        scope = {}
        exec(compile(code, str(README), "exec"), scope)
        n = scope["n"]
        assert np.array_equal(scope["out"], np.arange(n, dtype=np.float32) + 1)
    finally:
        host.stop()
        shutil.rmtree(runtime, ignore_errors=True)
