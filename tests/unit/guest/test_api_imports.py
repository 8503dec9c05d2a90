"""The modules of guest/api import each other without a cycle, at any depth (module level
or inside a function): each concept's module depends only on those below it, so any of
them imports on its own and none reaches back into the one that imports it. Imports under
`if TYPE_CHECKING:` do not count: they name annotations' classes for the type checker
(tests/test_types.py) and never run."""

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import pvgpu.guest.api
from pvgpu import guest

API = Path(guest.api.__file__).parent
MODULES = sorted(p.stem for p in API.glob("*.py") if p.stem != "__init__")


def _runtime_nodes(node):
    """ast.walk, without the bodies of `if TYPE_CHECKING:`."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not (isinstance(child, ast.If) and ast.unparse(child.test) == "TYPE_CHECKING"):
            yield from _runtime_nodes(child)


def api_imports(name: str) -> set:
    """-> the pvgpu.guest.api modules that guest/api/<name>.py imports, anywhere in it (but for
    the type checker)."""
    out = set()
    for node in _runtime_nodes(ast.parse((API / f"{name}.py").read_text())):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            mods = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for mod in mods:
            parts = mod.split(".")
            if parts[:2] == ["guest", "api"] and len(parts) > 2 and parts[2] in MODULES:
                out.add(parts[2])
    out.discard(name)
    return out


def find_cycle(graph: dict) -> list:
    """-> one cycle of `graph` ([a, b, ..., a]), or [] if it has none."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        state[node] = "done"
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [node])
            if found:
                return found
    return []


def test_the_api_modules_import_each_other_without_a_cycle():
    cycle = find_cycle({name: api_imports(name) for name in MODULES})
    assert not cycle, f"import cycle in guest/api: {' -> '.join(cycle)}"


def test_sharing_and_modules_sit_below_the_context():
    for name in ("prime", "shm", "module", "operands", "params", "copy", "pinned"):
        assert not api_imports(name) & {"core", "connection", "device", "context"}, name


def test_the_cycle_finder_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("name", MODULES)
def test_each_module_imports_first(name):
    """Importing any one of them first (a fresh interpreter) works."""
    code = f"import importlib; importlib.import_module('pvgpu.guest.api.{name}')"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert importlib.import_module(f"pvgpu.guest.api.{name}")


def test_type_checking_imports_do_not_count():
    source = (API / "array.py").read_text()
    assert "    from pvgpu.guest.api.context import Context" in source  # under TYPE_CHECKING
    assert "context" not in api_imports("array")
