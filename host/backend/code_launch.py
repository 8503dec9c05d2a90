"""CMD_LAUNCH_CODE: the checks when the device takes it (spec [CMD-LAUNCH-CODE-1]).

The body names a code object and one of its entries by VA, the grid, the block, the
dynamic shared memory and how many parameter bytes follow. The device checks only what
it can know without reading the object — the parameter size against isa.MAX_PARAM_SIZE,
that the bytes are there, the geometry and the shared memory against the device's
limits — in the order the clause gives. Everything about the object itself is checked by
the SMs when the launch starts ([CMD-LAUNCH-CODE-2]); the KMD never parses it.
"""

from __future__ import annotations

from typing import NamedTuple

from pvgpu.host.backend import protocol
from pvgpu.host.backend.errors import CommandError
from pvgpu.spec import isa, wire


class LaunchCode(NamedTuple):
    object_va: int
    entry_va: int
    grid: tuple
    block: tuple
    dyn_shared: int
    params: bytes


def check(cmd: protocol.LaunchCode) -> LaunchCode:
    """The decoded command -> a checked LaunchCode with its parameter bytes; raises
    CommandError for the first check that fails."""
    if cmd.param_size > isa.MAX_PARAM_SIZE:
        raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                           f"LAUNCH_CODE with {cmd.param_size} parameter bytes "
                           f"(at most {isa.MAX_PARAM_SIZE})")
    if cmd.carried < cmd.param_size:
        raise CommandError(wire.RESP_ERR_SHORT_COMMAND,
                           f"LAUNCH_CODE announces {cmd.param_size} parameter bytes but carries "
                           f"{cmd.carried}")
    protocol.check_geometry(cmd.grid, cmd.block)
    if cmd.dyn_shared > isa.MAX_DYNAMIC_SHARED:
        raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                           f"{cmd.dyn_shared} bytes of dynamic shared memory exceed the device's "
                           f"{isa.MAX_DYNAMIC_SHARED} per block")
    params = cmd.params() if cmd.param_size else b""
    return LaunchCode(cmd.object_va, cmd.entry_va, cmd.grid, cmd.block, cmd.dyn_shared, params)
