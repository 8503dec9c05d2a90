"""Exported buffers as capabilities (spec §6.5.29–§6.5.31, §12): RESOURCE_EXPORT publishes
a dma-buf (host/kmd/dmabuf.py) under a handle id and an unguessable 64-bit token
(host/backend/capabilities.py), like a dma-buf file descriptor passed over a socket. Any
session that presents both may RESOURCE_IMPORT it, on either device.

One registry serves the whole host. Each live export holds one reference to its dma-buf,
dropped when the export is revoked (RESOURCE_REVOKE, by its owner only), when the
exported resource is freed, when the owner's device is reset, when the owner exports
more than MAX_RESOURCE_EXPORTS (the oldest goes), and when the owner's session ends.
Importers hold their own references (their attachments), so none of this breaks them.
"""

from __future__ import annotations

from pvgpu.host.backend.capabilities import CapabilityRegistry
from pvgpu.spec import wire


class ResourceExports(CapabilityRegistry):
    """Host-global registry: handle id -> (owner, token, dma-buf); the caller's dma-buf
    reference passes to the registry with each export."""

    def __init__(self, max_per_owner: int = wire.MAX_RESOURCE_EXPORTS):
        super().__init__(max_per_owner)

    def released(self, dmabuf) -> None:
        dmabuf.put()

    def revoke(self, owner, handle: int) -> bool:
        """Withdraw export `handle` of `owner`; -> False if it has no such export."""
        if not self.owned_by(owner, handle):
            return False
        self.withdraw([handle])
        return True

    def withdraw_dmabuf(self, owner, dmabuf) -> None:
        """Withdraw every export of `dmabuf` by `owner` (its resource was freed)."""
        self.withdraw_owner(owner, lambda obj: obj is dmabuf)

    def withdraw_device(self, owner, exporter) -> None:
        """Withdraw the exports of `owner` of buffers of device `exporter` (its reset)."""
        self.withdraw_owner(owner, lambda obj: obj.exporter is exporter)
