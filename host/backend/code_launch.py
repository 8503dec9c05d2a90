"""CMD_LAUNCH_CODE: the checks when the device takes it (spec [CMD-LAUNCH-CODE-1]).

The body names a code object and one of its entries by VA, the grid, the block, the
dynamic shared memory and how many parameter bytes follow. The device checks only what
it can know without reading the object — the parameter size against isa.MAX_PARAM_SIZE,
that the bytes are there, the geometry and the shared memory against the device's
limits — in the order the clause gives. Everything about the object itself is checked by
the SMs when the launch starts ([CMD-LAUNCH-CODE-2]); the KMD never parses it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from host.backend.errors import CommandError
from spec import isa, wire

BODY_SIZE = struct.calcsize(wire.CMD_BODY_FORMATS[wire.CMD_LAUNCH_CODE])


@dataclass(frozen=True)
class LaunchCode:
    object_va: int
    entry_va: int
    grid: tuple
    block: tuple
    dyn_shared: int
    params: bytes


def decode(body: tuple, chain, mem) -> LaunchCode:
    """The unpacked body (CMD_BODY_FORMATS) and the chain -> a checked LaunchCode; raises
    CommandError for the first check that fails."""
    object_va, entry_va, gx, gy, gz, bx, by, bz, dyn_shared, param_size = body
    if param_size > isa.MAX_PARAM_SIZE:
        raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                           f"LAUNCH_CODE with {param_size} parameter bytes "
                           f"(at most {isa.MAX_PARAM_SIZE})")
    off = wire.CTRL_HDR_SIZE + BODY_SIZE
    if chain.readable_len - off < param_size:
        raise CommandError(wire.RESP_ERR_SHORT_COMMAND,
                           f"LAUNCH_CODE announces {param_size} parameter bytes but carries "
                           f"{max(chain.readable_len - off, 0)}")
    if min(gx, gy, gz) == 0 or max(gx, gy, gz) >= wire.MAX_GRID_DIM:
        raise CommandError(wire.RESP_ERR_INVALID_PARAMETER, f"bad grid ({gx}, {gy}, {gz})")
    threads = bx * by * bz
    if threads == 0 or threads > wire.MAX_BLOCK_THREADS:
        raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                           f"block ({bx}, {by}, {bz}) must have 1..{wire.MAX_BLOCK_THREADS} "
                           "threads")
    if dyn_shared > isa.MAX_DYNAMIC_SHARED:
        raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                           f"{dyn_shared} bytes of dynamic shared memory exceed the device's "
                           f"{isa.MAX_DYNAMIC_SHARED} per block")
    params = bytes(chain.read(mem, off, param_size)) if param_size else b""
    return LaunchCode(object_va, entry_va, (gx, gy, gz), (bx, by, bz), dyn_shared, params)
