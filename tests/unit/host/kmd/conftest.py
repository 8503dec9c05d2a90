"""Fixtures of the KMD tests: real emulated GPUs with a KMD each, always stopped, and gates:
fences the test signals, so that work waiting for one stays queued until the test says
(no burn that a stalled test could outlast). Their contexts have the limits the backend
gives a guest's (host/backend/limits.py), unless a test passes its own."""

import pytest

from pvgpu.host.backend.limits import GUEST_CONTEXT_LIMITS
from pvgpu.host.hw.gpu import Platform
from pvgpu.host.kmd import KmdDevice
from pvgpu.host.kmd.fence import Fence


@pytest.fixture
def make_dev():
    made = []

    def make(vram_size=32 << 20, num_gpus=1, topology="switch", **kw):
        platform = Platform(num_gpus, vram_size, topology=topology)
        kw.setdefault("limits", GUEST_CONTEXT_LIMITS)
        devs = [KmdDevice(g, **kw) for g in platform.gpus]
        made.append((platform, devs))
        for d in devs:
            d.start()
        return devs if num_gpus > 1 else devs[0]
    try:
        yield make
    finally:
        for platform, devs in made:
            for d in devs:
                d.stop()
            platform.stop()


@pytest.fixture
def gate():
    """gate() -> a fence only the test signals (gate.signal()); jobs that wait for it stay
    queued until then. Every gate is signalled at teardown."""
    gates = []

    def make():
        g = Fence(-1, 1)
        gates.append(g)
        return g
    try:
        yield make
    finally:
        for g in gates:
            g.signal()
