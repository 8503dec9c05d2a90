"""Fixtures of the KMD tests: real emulated GPUs with a KMD each, always stopped."""

import pytest

from host.hw.gpu import Platform
from host.kmd import KmdDevice


@pytest.fixture
def make_dev():
    made = []

    def make(vram_size=32 << 20, num_gpus=1, topology="switch", **kw):
        platform = Platform(num_gpus, vram_size, topology=topology)
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
