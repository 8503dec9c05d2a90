"""Fixtures of the integration tests (the host fixtures are in tests/conftest.py)."""

import pytest

from pvgpu import guest


@pytest.fixture(params=["shared", "inline"])
def conn(request, shared_host):
    """A guest session on the module's shared host, in each memory model (32 MiB)."""
    with guest.connect(shared_host.endpoint, memory=request.param, mem_size=32 << 20) as c:
        yield c
