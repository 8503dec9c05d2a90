"""DMA mappings of host memory (dma_map_single): a host buffer made reachable by the GPU
at a bus address, for system-memory PTEs (the guest-memory window, evicted buffers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pvgpu.host.kmd.errors import InvalidArgument

if TYPE_CHECKING:
    from pvgpu.host.kmd.device import KmdDevice


@dataclass(frozen=True, eq=False)
class DmaMapping:
    """A host buffer made reachable by the device (dma_map_single): `size` bytes at `bus_addr`."""

    bus_addr: int
    size: int
    buf: np.ndarray = field(repr=False)
    device: "KmdDevice" = field(repr=False, default=None)


class DmaMixin:
    """KmdDevice's dma_map / dma_unmap."""

    def dma_map(self, buf) -> DmaMapping:
        """Make a host buffer reachable by the GPU; -> DmaMapping(bus_addr, size)."""
        if not isinstance(buf, np.ndarray):
            raise InvalidArgument("dma_map needs a numpy array")
        if not buf.flags.c_contiguous:
            raise InvalidArgument("dma_map needs a C-contiguous buffer")
        raw = buf.reshape(-1).view(np.uint8)
        if raw.size == 0:
            raise InvalidArgument("dma_map of an empty buffer")
        bus = self.gpu.sysmem.dma_map(raw)
        return DmaMapping(bus, int(raw.size), raw, self)

    def dma_unmap(self, mapping: DmaMapping) -> None:
        try:
            self.gpu.sysmem.dma_unmap(mapping.bus_addr)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
