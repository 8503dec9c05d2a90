"""pvgpu.transport: virtqueues carried over ZeroMQ, both ends.

Installed inside pvgpu (setup.py's package_dir); in a checkout pvgpu/__init__.py finds
it beside pvgpu/. Imported under its bare name it would be a second copy of every module.
"""

if not __name__.startswith("pvgpu."):  # the checkout's top directory on sys.path
    raise ImportError(f"`{__name__}` is pvgpu.{__name__}: import it as that")
