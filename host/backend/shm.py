"""Shared device memory on the wire (spec §6.5.19–§6.5.24, §6.6): the segment ids of one
session on one device.

The segments themselves, their keys, reference counts, attachments and export
capabilities live in the KMD (host/kmd/shm.py, one ShmManager per device); the key
namespace there is the session, so keys are private to the session that uses them. What
the wire adds is a per-session, per-device table of small `shm_id`s (le32, chosen by the
device, never 0) that name the segments this session created (SHM_GET) or imported
(SHM_IMPORT): a session can only name segments it was entitled to, and an id tells
nothing about other sessions' segments. The same segment always has the same id in one
session. An id lives until its segment is removed and detached by all (`dead`), until
device reset or session reclaim.

The command handlers are ComputeDevice.cmd_shm_* in commands.py.
"""

from __future__ import annotations

from pvgpu.host.backend.errors import CommandError
from pvgpu.host.kmd import errors as kmd_errors
from pvgpu.spec import wire


class ShmTable:
    """shm_id <-> SharedSegment for one session on one device."""

    def __init__(self, limit: int = wire.MAX_SHM_IDS):
        self.limit = limit
        self.ids = {}  # shm_id -> SharedSegment
        self._by_seg = {}  # SharedSegment -> shm_id
        self._next = 1

    def __len__(self) -> int:
        return len(self.ids)

    def purge(self) -> None:
        """Forget ids whose segment is removed and detached by all (or freed)."""
        for shm_id, seg in list(self.ids.items()):
            if seg.dead or seg.released:
                del self.ids[shm_id]
                del self._by_seg[seg]

    def id_of(self, seg):
        return self._by_seg.get(seg)

    def room_for_one(self) -> None:
        self.purge()
        if len(self.ids) >= self.limit:
            raise CommandError(wire.RESP_ERR_LIMIT,  # DEV-LIMIT-2
                               f"at most {self.limit} shared segment ids per device and session")

    def bind(self, seg) -> int:
        """The id of `seg` in this session (a new one if it has none)."""
        shm_id = self._by_seg.get(seg)
        if shm_id is not None:
            return shm_id
        self.room_for_one()
        while self._next in self.ids or self._next == 0:
            self._next = (self._next + 1) & 0xFFFFFFFF
        shm_id = self._next
        self._next = (self._next + 1) & 0xFFFFFFFF
        self.ids[shm_id] = seg
        self._by_seg[seg] = shm_id
        return shm_id

    def lookup(self, shm_id: int):
        self.purge()
        seg = self.ids.get(shm_id)
        if seg is None:
            raise CommandError(wire.RESP_ERR_INVALID_SEGMENT,
                               f"no shared segment {shm_id} in this session on this device "
                               "(never created or imported here, or removed and detached by all)")
        return seg

    def clear(self) -> None:
        self.ids.clear()
        self._by_seg.clear()


def shm_error(e) -> CommandError | None:
    """The wire error of a KMD shared-memory refusal (None: not one of its own)."""
    code = getattr(e, "code", None)
    if code == kmd_errors.INVALID_SEGMENT:
        return CommandError(wire.RESP_ERR_INVALID_SEGMENT, str(e))
    if code == kmd_errors.PERMISSION:
        return CommandError(wire.RESP_ERR_PERMISSION, str(e))
    return None
