"""Capabilities: host-global objects published under a handle id and a token.

An export names an object (an event snapshot, a dma-buf, ...) by a handle id that is
unique for the host's lifetime and guards it with an unguessable 64-bit token from
`secrets`, like a file descriptor passed over a socket: whoever presents both may use
the object; an unknown handle and a wrong token are not told apart (compared in constant
time). Each owner (a session) keeps at most `max_per_owner` exports; a newer one
withdraws the owner's oldest. `released(obj)` runs whenever an export goes away, for
registries whose exports hold a reference.
"""

from __future__ import annotations

import collections
import hmac
import itertools
import secrets


class CapabilityRegistry:
    """handle id -> (owner, token, object)."""

    def __init__(self, max_per_owner: int):
        self.max_per_owner = max_per_owner
        self._ids = itertools.count(1)
        self._by_handle = {}  # handle_id -> (owner, token, obj)
        self._by_owner = {}  # owner -> OrderedDict(handle_id -> None), oldest first

    def __len__(self) -> int:
        return len(self._by_handle)

    def export(self, owner, obj) -> tuple:
        """-> (handle_id, token) for `obj`, owned by `owner`."""
        handle = next(self._ids)
        token = secrets.randbits(64) or 1
        self._by_handle[handle] = (owner, token, obj)
        mine = self._by_owner.setdefault(owner, collections.OrderedDict())
        mine[handle] = None
        while len(mine) > self.max_per_owner:
            self._remove(next(iter(mine)))
        return handle, token

    def exists(self, handle: int) -> bool:
        return handle in self._by_handle

    def live(self, handle: int, obj) -> bool:
        """Whether export `handle` still exists and still names `obj`."""
        entry = self._by_handle.get(handle)
        return entry is not None and entry[2] is obj

    def lookup(self, handle: int, token: int):
        """The exported object, or None for an unknown handle or a wrong token."""
        entry = self._by_handle.get(handle)
        if entry is None:
            return None
        ok = hmac.compare_digest(entry[1].to_bytes(8, "little"),
                                 (token & (2**64 - 1)).to_bytes(8, "little"))
        return entry[2] if ok else None

    def owned_by(self, owner, handle: int) -> bool:
        entry = self._by_handle.get(handle)
        return entry is not None and entry[0] is owner

    def withdraw(self, handles) -> None:
        for h in list(handles):
            if h in self._by_handle:
                self._remove(h)

    def withdraw_owner(self, owner, which=None) -> None:
        """Drop the exports of `owner` (only those whose object `which(obj)` accepts)."""
        for h in list(self._by_owner.get(owner, ())):
            if which is None or which(self._by_handle[h][2]):
                self._remove(h)

    def count(self, owner) -> int:
        return len(self._by_owner.get(owner, ()))

    def released(self, obj) -> None:
        """Hook: an export of `obj` went away."""

    def _remove(self, handle: int) -> None:
        owner, _token, obj = self._by_handle.pop(handle)
        mine = self._by_owner[owner]
        del mine[handle]
        if not mine:
            del self._by_owner[owner]
        self.released(obj)
