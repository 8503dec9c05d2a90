"""Exported buffers as capabilities (spec §6.5.29–§6.5.31, §12): RESOURCE_EXPORT publishes
a dma-buf (host/kmd/dmabuf.py) under a handle id and an unguessable 64-bit token, like a
dma-buf file descriptor passed over a socket. Any session that presents both may
RESOURCE_IMPORT it, on either device.

One registry serves the whole host. Each live export holds one reference to its dma-buf,
dropped when the export is revoked (RESOURCE_REVOKE, by its owner only), when the
exported resource is freed, when the owner's device is reset, when the owner exports
more than MAX_RESOURCE_EXPORTS (the oldest goes), and when the owner's session ends.
Importers hold their own references (their attachments), so none of this breaks them.
Unknown handles and wrong tokens are not told apart.
"""

from __future__ import annotations

import collections
import hmac
import itertools
import secrets

from spec import wire


class ResourceExports:
    """Host-global registry: handle id -> (owner, token, dma-buf)."""

    def __init__(self, max_per_owner: int = wire.MAX_RESOURCE_EXPORTS):
        self.max_per_owner = max_per_owner
        self._ids = itertools.count(1)
        self._by_handle = {}  # handle_id -> (owner, token, dmabuf)
        self._by_owner = {}  # owner -> OrderedDict(handle_id -> None), oldest first

    def __len__(self) -> int:
        return len(self._by_handle)

    def export(self, owner, dmabuf) -> tuple:
        """Publish `dmabuf` (the caller's reference passes to the registry);
        -> (handle_id, token)."""
        handle = next(self._ids)
        token = secrets.randbits(64) or 1
        self._by_handle[handle] = (owner, token, dmabuf)
        mine = self._by_owner.setdefault(owner, collections.OrderedDict())
        mine[handle] = None
        while len(mine) > self.max_per_owner:
            self._remove(next(iter(mine)))
        return handle, token

    def lookup(self, handle: int, token: int):
        """The exported dma-buf (no new reference), or None."""
        entry = self._by_handle.get(handle)
        if entry is None:
            return None
        ok = hmac.compare_digest(entry[1].to_bytes(8, "little"),
                                 (token & (2**64 - 1)).to_bytes(8, "little"))
        return entry[2] if ok else None

    def revoke(self, owner, handle: int) -> bool:
        """Withdraw export `handle` of `owner`; -> False if it has no such export."""
        entry = self._by_handle.get(handle)
        if entry is None or entry[0] is not owner:
            return False
        self._remove(handle)
        return True

    def withdraw_dmabuf(self, owner, dmabuf) -> None:
        """Withdraw every export of `dmabuf` by `owner` (its resource was freed)."""
        for h in [h for h in self._by_owner.get(owner, ()) if self._by_handle[h][2] is dmabuf]:
            self._remove(h)

    def withdraw_owner(self, owner, exporter=None) -> None:
        """Withdraw the exports of `owner` (only those of device `exporter`, if given)."""
        for h in list(self._by_owner.get(owner, ())):
            if exporter is None or self._by_handle[h][2].exporter is exporter:
                self._remove(h)

    def count(self, owner) -> int:
        return len(self._by_owner.get(owner, ()))

    def _remove(self, handle: int) -> None:
        owner, _token, dmabuf = self._by_handle.pop(handle)
        mine = self._by_owner[owner]
        del mine[handle]
        if not mine:
            del self._by_owner[owner]
        dmabuf.put()
