"""The `pvgpu` package itself: one namespace for every layer, the guest API's names handed out
on first use, the version, and the source-checkout search path."""

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pvgpu
from pvgpu import cli

ROOT = Path(__file__).resolve().parents[3]
PYPROJECT_VERSION = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(),
                              re.M).group(1)


def _fresh(code: str, *flags: str) -> str:
    """Run `code` in a fresh interpreter started in the checkout's top directory."""
    r = subprocess.run([sys.executable, *flags, "-c", code], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_connect_and_the_whole_guest_api_are_names_of_pvgpu():
    from pvgpu import guest
    assert pvgpu.connect is guest.connect
    assert pvgpu.PvgpuError is guest.PvgpuError
    for name in guest.__all__:
        assert getattr(pvgpu, name) is getattr(guest, name), name
    assert {"connect", "PvgpuError", "__version__", "guest"} <= set(dir(pvgpu))


def test_a_patched_guest_name_is_patched_in_pvgpu_too(monkeypatch):
    """pvgpu.connect is looked up in pvgpu.guest at each use, never a copy taken once: a test
    that patches pvgpu.guest.connect reaches code that calls pvgpu.connect, and leaves no
    patched copy behind."""
    from pvgpu import guest
    real = guest.connect
    with monkeypatch.context() as patch:
        patch.setattr(guest, "connect", lambda *a, **kw: "patched")
        assert pvgpu.connect() == "patched"
    assert pvgpu.connect is real


def test_an_unknown_name_is_an_attribute_error():
    for name in ("no_such_name", "no.such.module", "_private"):
        assert not hasattr(pvgpu, name), name


RACE = """
import importlib.abc, sys, threading
import pvgpu
gate, entered = threading.Event(), threading.Event()


class Gate(importlib.abc.MetaPathFinder):  # holds thread A inside pvgpu.guest's import
    def find_spec(self, name, path, target=None):
        if name == "pvgpu.guest.api" and threading.current_thread().name == "A":
            entered.set()
            gate.wait(30)


sys.meta_path.insert(0, Gate())
a = threading.Thread(target=importlib.import_module, args=("pvgpu.guest",), name="A")
a.start()
assert entered.wait(30)
got = []
b = threading.Thread(target=lambda: got.append(getattr(pvgpu, "connect", None)))
b.start()
b.join(0.2)
gate.set()
a.join(30)
b.join(30)
print(got[0] is sys.modules["pvgpu.guest"].connect)
"""


def test_a_guest_name_asked_for_while_another_thread_imports_the_api_waits_for_it():
    """Two threads of a program calling pvgpu.connect() at once: the second finds pvgpu.guest
    in sys.modules before its __all__ exists, and must wait for the import, not fail."""
    assert _fresh(RACE).split() == ["True"]


def test_a_layer_imported_under_its_bare_name_is_refused():
    """From the checkout's top directory `import guest` would find ./guest: a second copy of
    every module (and of every exception class) beside pvgpu.guest. It is refused, so code
    that still says `import guest` fails in the tests, not only once installed."""
    out = _fresh("import importlib\n"
                 "for name in ('guest', 'host', 'transport', 'spec', 'bench'):\n"
                 "    try:\n"
                 "        importlib.import_module(name)\n"
                 "    except ImportError as e:\n"
                 "        print(e)\n")
    assert out.splitlines() == [f"`{n}` is pvgpu.{n}: import it as that"
                                for n in ("guest", "host", "transport", "spec", "bench")]


def test_the_layers_load_without_the_guest_api():
    """`import pvgpu.spec.wire` (a raw-protocol guest, the host) loads neither the guest API
    nor ZeroMQ; `from pvgpu import cli` is the CLI, never a guest name."""
    out = _fresh("import sys, pvgpu.spec.wire; from pvgpu import procs; "
                 "print(sorted({m.split('.')[0] for m in sys.modules} & {'zmq', 'guest'}), "
                 "'pvgpu.guest' in sys.modules, pvgpu.__version__)")
    assert out.split() == ["[]", "False", PYPROJECT_VERSION]


def test_the_version_is_the_distributions_else_pyprojects(monkeypatch):
    assert pvgpu.__version__ == importlib.metadata.version("pvgpu") == PYPROJECT_VERSION

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert pvgpu._version() == PYPROJECT_VERSION  # a checkout that was never installed


def test_pvgpu_version_prints_it(capsys):
    try:
        cli.main(["--version"])
    except SystemExit as e:
        assert e.code == 0
    assert capsys.readouterr().out == f"pvgpu {PYPROJECT_VERSION}\n"


def test_a_source_checkout_finds_its_subpackages_beside_pvgpu():
    """In a checkout, guest/ ... sit beside pvgpu/: with nothing installed at all (-S: no
    site-packages, so no installed or editable copy), pvgpu.spec is the checkout's spec/."""
    out = _fresh("import sys; sys.path.insert(0, '.'); import pvgpu.spec.kernels as k; "
                 "print(k.__file__)", "-S")
    assert Path(out.strip()) == ROOT / "spec" / "kernels.py"


def test_the_package_is_typed():
    assert (Path(pvgpu.__file__).parent / "py.typed").is_file()
