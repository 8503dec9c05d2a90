"""Device commands as the API sends them: the frontend's encoder, with the ring_idx of the
stream a command belongs to (spec CMD-HDR-1)."""

from __future__ import annotations

from pvgpu.guest.frontend.driver import command
from pvgpu.spec import wire


def ring_command(type_: int, body=(), *, ctx_id: int = 0, ring_idx: int = 0, fence_id: int = 0,
                 extra: bytes = b"") -> bytes:
    """A device command; a non-zero ring_idx also sets FLAG_INFO_RING_IDX (spec CMD-HDR-1)."""
    return command(type_, body, ctx_id=ctx_id, ring_idx=ring_idx, fence_id=fence_id,
                   flags=wire.FLAG_INFO_RING_IDX if ring_idx else 0, extra=extra)
