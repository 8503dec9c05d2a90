"""Shared pieces of the pvgpu.cuda integration tests: a facade connected to the module's
shared host in each memory model, a driver context, the committed PTX they launch, and
`ok()`, which unwraps a (CUresult / cudaError_t, outputs...) tuple."""

from pathlib import Path

import pytest

import pvgpu.cuda
from pvgpu.cuda import driver as cuda

DATA = Path(__file__).resolve().parent / "data"
KERNELS = Path(__file__).resolve().parents[1] / "kernels"
LAUNCH_PTX = (DATA / "launch_api.ptx").read_text()  # saxpy, poly, affine, store_at, spin, ...
SAXPY_PTX = (KERNELS / "saxpy.ptx").read_text()


def ok(result):
    """The outputs of a successful call (None, one value or a tuple); fails the test with
    the error and its detail otherwise."""
    err = result[0]
    assert int(err) == 0, f"{err!r}: {pvgpu.cuda.error_detail()}"
    return None if len(result) == 1 else result[1] if len(result) == 2 else result[1:]


def fails(result, code):
    """Assert that `result` is error `code`, with None for every output."""
    assert result[0] == code, f"{result[0]!r} instead of {code!r}: {pvgpu.cuda.error_detail()}"
    assert all(v is None for v in result[1:])


@pytest.fixture(params=["shared", "inline"])
def model(request, shared_host):
    """pvgpu.cuda connected to the module's host in memory model `request.param`."""
    pvgpu.cuda.connect(shared_host.endpoint, memory=request.param, mem_size=96 << 20)
    try:
        yield request.param
    finally:
        pvgpu.cuda.shutdown()


@pytest.fixture
def shared_model(shared_host):
    pvgpu.cuda.connect(shared_host.endpoint, memory="shared", mem_size=96 << 20)
    try:
        yield "shared"
    finally:
        pvgpu.cuda.shutdown()


def _context():
    ok(cuda.cuInit(0))
    c = ok(cuda.cuCtxCreate(None, 0, ok(cuda.cuDeviceGet(0))))
    yield c
    cuda.cuCtxDestroy(c)


@pytest.fixture
def ctx(model):
    """cuInit, and a new context on device 0, current on this thread."""
    yield from _context()


@pytest.fixture
def shared_ctx(shared_model):
    """As ctx, in the shared memory model only (mapped and managed memory)."""
    yield from _context()
