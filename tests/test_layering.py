"""The layers import only what they stand on, checked on the source with `ast`.

The stack, top to bottom: pvgpu (the CLI, the CUDA driver API) -> guest/api (the user-mode
driver) -> guest/frontend (the virtio driver) -> transport <- host/backend (the virtio
device) -> host/kmd (the kernel-mode driver) -> host/hw (the emulated GPU); spec/ is the
floor. What each layer may import is listed in ALLOWED; anything else of this repository
it imports, at module level or inside a function, fails the test. In particular:

- host/hw and host/kmd never import pvgpu.spec.wire (the guest protocol): the hardware's kernel
  ABI is pvgpu.spec.kernels, the ISA pvgpu.spec.isa, and the limits the wire sets for a guest's
  contexts reach the KMD as ContextLimits from host/backend (host/backend/limits.py);
- no lower layer imports a higher one (hw -> kmd, kmd -> backend, transport -> host or
  guest, frontend -> api, ...);
- only transport/channel.py, transport/curve.py (CURVE keys) and transport/admin.py (the
  host's admin endpoint) import zmq (and bench/,
  which measures bare zmq as a limit, and pvgpu/conformance/rawpeer.py, a conformance peer
  that sends frames our channel never would);
- the conformance suite (pvgpu/conformance) is a client: it imports the guest side, transport
  and spec, never host/, so it can test any implementation of the device;
- pvgpu/ loads bench/ on demand only: no pvgpu module imports it at module level, and only
  the CLI's `bench` sub-command imports it at all.

For guest/api the test checks import cycles: every strongly connected component of the
graph of its modules' imports (function-level imports count: deferring an import hides a
cycle, it does not remove it) must lie inside one of KNOWN_API_CYCLES. There are none: the
API's modules import one another in one direction only. Imports under `if TYPE_CHECKING:`
are no edges: they name the classes of annotations for the type checker and never run.
"""

import ast
import collections
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("spec", "transport", "host", "guest", "pvgpu", "bench")

# layer -> what its modules may import of this repository (prefixes of module names)
ALLOWED = {
    "spec": ("spec",),
    "pvgpu.host.hw": ("pvgpu.host.hw", "pvgpu.spec.isa", "pvgpu.spec.kernels"),
    "pvgpu.host.kmd": ("pvgpu.host.kmd", "pvgpu.host.hw", "pvgpu.spec.isa", "pvgpu.spec.kernels"),
    "transport": ("transport", "spec"),
    "pvgpu.host.backend": ("pvgpu.host.backend", "pvgpu.host.kmd", "transport", "spec"),
    "pvgpu.guest.frontend": ("pvgpu.guest.frontend", "transport", "spec"),
    "pvgpu.guest.jit": ("pvgpu.guest.jit", "spec"),
    "pvgpu.guest.api": ("pvgpu.guest.api", "pvgpu.guest.frontend", "pvgpu.guest.jit", "spec"),
    "guest": ("pvgpu.guest.api", "spec"),  # the package's own __init__: re-exports the API
    # the host process (host/main.py, host/config.py): puts the layers together
    "host": ("host", "transport", "spec"),
    # the conformance suite: a client of the wire protocol (and of `python -m pvgpu run`)
    "pvgpu.conformance": ("pvgpu.conformance", "pvgpu.procs", "guest", "transport", "spec"),
}
ZMQ_USERS = ("pvgpu.transport.channel", "pvgpu.transport.curve", "pvgpu.transport.admin", "bench",
             "pvgpu.conformance.rawpeer")
# The import cycles among guest/api modules today: one component, through core's
# function-level imports of module, prime and shm, and operands' and params' of core.
# The guest API's split into modules removes them.
KNOWN_API_CYCLES = ()  # the guest API split removed the last one
TYPE_ONLY = "type-only"  # the `lazy` of an import under `if TYPE_CHECKING:`


def _modules() -> dict:
    mods = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            mods[name] = path
    return mods


MODULES = _modules()


def _imports(name: str, path: Path) -> list:
    """-> [(imported module, lazy, line)]; `from pkg import mod` names pkg.mod. lazy is
    TYPE_ONLY for an import under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []

    def visit(node, lazy):
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                               ast.Lambda))
            if isinstance(child, ast.If) and ast.unparse(child.test) == "TYPE_CHECKING":
                inner = TYPE_ONLY
            if isinstance(child, ast.Import):
                found.extend((a.name, lazy, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - child.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    found.append((sub if sub in MODULES else base, lazy, child.lineno))
            visit(child, inner)
    visit(tree, False)
    return found


IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _layer(module: str):
    """The most specific ALLOWED layer holding `module` (None: not layered)."""
    layers = [layer for layer in ALLOWED if _within(module, layer)]
    return max(layers, key=len) if layers else None


def _ours(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


def test_the_source_tree_is_seen():
    for name in ("pvgpu.spec.wire", "pvgpu.spec.kernels", "pvgpu.host.hw.mmu", "pvgpu.host.kmd.device",
                 "pvgpu.host.backend.commands", "pvgpu.transport.channel", "pvgpu.guest.api.context",
                 "pvgpu.guest.frontend.driver", "pvgpu.cli"):
        assert name in MODULES, name
    assert ("pvgpu.spec.kernels", False) in {(m, lazy) for m, lazy, _ in IMPORTS["pvgpu.host.hw.mmu"]}
    assert ("pvgpu.bench.hotpaths", True) in {(m, lazy) for m, lazy, _ in IMPORTS["pvgpu.cli"]}


def test_each_layer_imports_only_what_it_stands_on():
    bad = []
    for name, imports in IMPORTS.items():
        layer = _layer(name)
        if layer is None:
            continue
        for module, _lazy, line in imports:
            if _ours(module) and not any(_within(module, ok) for ok in ALLOWED[layer]):
                bad.append(f"{MODULES[name].relative_to(ROOT)}:{line} imports {module}")
    assert bad == []


def test_the_hardware_and_the_kmd_never_import_the_wire_module():
    bad = [f"{name}:{line}" for name, imports in IMPORTS.items()
           if _within(name, "pvgpu.host.hw") or _within(name, "pvgpu.host.kmd")
           for module, _lazy, line in imports if _within(module, "pvgpu.spec.wire")]
    assert bad == []


def test_only_the_channel_imports_zmq():
    bad = [f"{name}:{line}" for name, imports in IMPORTS.items()
           for module, _lazy, line in imports
           if _within(module, "zmq") and not any(_within(name, u) for u in ZMQ_USERS)]
    assert bad == []


def test_pvgpu_loads_bench_on_demand_only():
    users = collections.defaultdict(list)
    for name, imports in IMPORTS.items():
        if _within(name, "pvgpu"):
            for module, lazy, line in imports:
                if _within(module, "bench"):
                    users[name].append((lazy, line))
    assert all(lazy for uses in users.values() for lazy, _line in uses), dict(users)
    assert set(users) <= {"pvgpu.cli"}


def _import_graph(names) -> dict:
    return {n: {m for m, lazy, _line in IMPORTS[n] if m in names and m != n and lazy != TYPE_ONLY}
            for n in names}


def _cycles(graph: dict) -> list:
    """Strongly connected components (of more than one module) of graph {module: {module}}."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))
    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def test_guest_api_has_no_import_cycle_but_those_known():
    api = {n for n in MODULES if _within(n, "pvgpu.guest.api")}
    new = [sorted(c) for c in _cycles(_import_graph(api))
           if not any(c <= known for known in KNOWN_API_CYCLES)]
    assert new == []


def test_the_cycle_finder_finds_every_cycle_and_nothing_else():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"a", "f"}, "f": {"e"}}
    assert sorted(map(sorted, _cycles(graph))) == [["a", "b", "c"], ["e", "f"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_type_only_imports_are_seen_but_are_no_edges_of_the_cycle_graph():
    typed = [(m, lazy) for m, lazy, _line in IMPORTS["pvgpu.guest.api.array"] if m == "pvgpu.guest.api.context"]
    assert typed == [("pvgpu.guest.api.context", TYPE_ONLY)]
    assert "pvgpu.guest.api.context" not in _import_graph({"pvgpu.guest.api.array", "pvgpu.guest.api.context"})[
        "pvgpu.guest.api.array"]
