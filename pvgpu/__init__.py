"""pvgpu: a paravirtualized GPU for compute, one package.

    import pvgpu
    with pvgpu.connect() as conn:              # the host on the default endpoint
        ctx = conn.devices[0].create_context()
        ...

`pvgpu.connect`, `pvgpu.PvgpuError` and every other name of the guest API
(`pvgpu.guest.__all__`) are loaded on first use, so that `import pvgpu.spec.wire` or the
host process does not load the guest API and its numpy and ZeroMQ.

The subpackages: pvgpu.guest (the guest API over the virtio frontend), pvgpu.transport
(virtqueues over ZeroMQ), pvgpu.host (the backend process, its KMD and the emulated GPUs),
pvgpu.spec (the protocol's machine-readable companion), pvgpu.bench (the benchmarks), and
beside them the command line (pvgpu.cli), the CUDA-style API (pvgpu.cuda) and the
conformance suite (pvgpu.conformance).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys

TYPE_CHECKING = False  # typing's, without importing typing: type checkers go by the name
if TYPE_CHECKING:
    from typing import Any

    from pvgpu.guest import *  # noqa: F403  (what __getattr__ hands out)

_HERE = os.path.dirname(os.path.abspath(__file__))
_CHECKOUT = os.path.dirname(_HERE)

# A source checkout keeps guest/, host/, transport/, spec/ and bench/ beside pvgpu/, where an
# installed copy has them inside it (setup.py's package_dir). When this file is imported from
# a checkout -- tests run from its root put the checkout first on sys.path, ahead of any
# installed copy -- the checkout's top directory joins this package's search path, so that
# pvgpu.guest is ./guest there.
if (not os.path.isdir(os.path.join(_HERE, "guest"))
        and os.path.isfile(os.path.join(_CHECKOUT, "pyproject.toml"))
        and os.path.isfile(os.path.join(_CHECKOUT, "guest", "__init__.py"))):
    __path__.append(_CHECKOUT)


def _version() -> str:
    """The installed distribution's version; in a checkout without one, pyproject.toml's."""
    from importlib import metadata

    try:
        return metadata.version(__name__)
    except metadata.PackageNotFoundError:
        pass
    try:
        with open(os.path.join(_CHECKOUT, "pyproject.toml"), encoding="utf-8") as f:
            found = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M)
    except OSError:
        found = None
    return found.group(1) if found else "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()[name] = _version()
        return globals()[name]
    if (not name.startswith("_") and "." not in name
            and (f"{__name__}.guest" in sys.modules
                 or importlib.util.find_spec(f"{__name__}.{name}") is None)):
        # not a submodule (`from pvgpu import cli` is the CLI): a name of the guest API.
        # import_module, not sys.modules: while another thread imports pvgpu.guest, this
        # waits for it to finish; in the importing thread itself it is the partial module.
        guest = importlib.import_module(f"{__name__}.guest")
        if name in getattr(guest, "__all__", ()):  # () while this thread imports it
            # not cached: pvgpu.connect is pvgpu.guest.connect, also while a test patches that
            return getattr(guest, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    guest = importlib.import_module(f"{__name__}.guest")
    return sorted({*globals(), "__version__", *guest.__all__})
