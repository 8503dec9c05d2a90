"""spec §6.5.32 — CMD_LAUNCH_CODE, and MEM_ALLOC_FLAG_EXEC (clauses CMD-LAUNCH-CODE-*,
CMD-ALLOC-1, CMD-ALLOC-3, CMD-FAULT-*, DEV-FEAT-4, EVTQ-ENTRY-1, ERR-RESP-3): black-box
through the virtqueue in both memory models; requests are raw bytes, responses are read
back raw, code objects are built by hand (tests/codeobj.py)."""

import struct

import numpy as np

import codeobj
from spec import isa, wire

from rawdevice import cmd, d2h, h2d

ERR = struct.Struct(wire.RESP_ERROR_FORMAT)
BODY = wire.CMD_BODY_SIZES[wire.CMD_LAUNCH_CODE]


def launch_code(ctx, object_va, entry_va, grid=(1, 1, 1), block=(32, 1, 1), dyn_shared=0,
                params=b"", param_size=None, **kw):
    n = len(params) if param_size is None else param_size
    return cmd(wire.CMD_LAUNCH_CODE, (object_va, entry_va, *grid, *block, dyn_shared, n),
               ctx_id=ctx, extra=params, **kw)


def code(raw, command, data=b""):
    return raw.call(command, data)[0][0]


def error(raw, command):
    hdr, body, _ = raw.call(command)
    return hdr[0], ERR.unpack_from(body)[:2]


def exec_alloc(raw, ctx, size, rid):
    hdr, body, _ = raw.call(cmd(wire.CMD_MEM_ALLOC, (rid, wire.MEM_ALLOC_FLAG_EXEC, size),
                                ctx_id=ctx))
    assert hdr[0] == wire.RESP_OK_MEM_ALLOC, hdr
    return struct.unpack_from(wire.RESP_MEM_ALLOC_FORMAT, body)


def test_wire_codes_and_layouts():
    assert wire.CMD_LAUNCH_CODE == 0x0441 and wire.CMD_NAMES[wire.CMD_LAUNCH_CODE] == "LAUNCH_CODE"
    assert BODY == 48 and wire.MEM_ALLOC_FLAG_EXEC == 1
    assert wire.RESP_ERR_ILLEGAL_CODE == 0x128B and wire.is_error_response(wire.RESP_ERR_ILLEGAL_CODE)
    assert wire.EVTQ_CODE_FAULT == 0x1402 and wire.EVTQ_CODE_FAULT in wire.EVTQ_NAMES
    assert struct.calcsize(wire.EVTQ_BODY_FORMAT) + wire.CTRL_HDR_SIZE == wire.EVTQ_ENTRY_SIZE


def test_cmd_alloc_exec_flag(raw):
    """[CMD-ALLOC-1] [CMD-ALLOC-3]: EXEC is the only flag; an executable allocation is an
    allocation like any other for copies."""
    ctx = raw.context()
    va, size = exec_alloc(raw, ctx, 5000, 1)
    assert size == 8192 and wire.VA_USER_BASE <= va < wire.VA_USER_LIMIT
    data = bytes(range(256)) * 16
    assert h2d(raw, ctx, va, data)[0][0] == wire.RESP_OK_NODATA
    assert d2h(raw, ctx, va, len(data)) == data
    for flags in (2, 4, 0x80000000, wire.MEM_ALLOC_FLAG_EXEC | 2):
        assert code(raw, cmd(wire.CMD_MEM_ALLOC, (2, flags, 4096), ctx_id=ctx)) == \
            wire.RESP_ERR_INVALID_PARAMETER


def test_cmd_launch_code_checks_in_order(raw):
    """[CMD-LAUNCH-CODE-1]: param_size before the length, the length before the geometry,
    each failing check answered at once, with or without FLAG_FENCE."""
    ctx = raw.context()
    va, _ = exec_alloc(raw, ctx, 4096, 1)
    big = isa.MAX_PARAM_SIZE + 1
    # 1. too many parameter bytes (even though they are not there, and the grid is bad)
    assert error(raw, launch_code(ctx, va, va, grid=(0, 1, 1), param_size=big)) == \
        (wire.RESP_ERR_INVALID_PARAMETER, (0, 0))
    # 2. fewer parameter bytes than announced (the grid is bad too)
    assert code(raw, launch_code(ctx, va, va, grid=(0, 1, 1), params=b"\0" * 8,
                                 param_size=16)) == wire.RESP_ERR_SHORT_COMMAND
    hdr, _b, _n = raw.call(launch_code(ctx, va, va, param_size=4, fence_id=7))
    assert hdr == (wire.RESP_ERR_SHORT_COMMAND, wire.FLAG_FENCE, 7, ctx, 0)
    # 3. geometry and shared memory
    for kw in ({"grid": (0, 1, 1)}, {"grid": (1, wire.MAX_GRID_DIM, 1)}, {"block": (0, 1, 1)},
               {"block": (wire.MAX_BLOCK_THREADS + 1, 1, 1)}, {"block": (32, 32, 2)},
               {"dyn_shared": isa.MAX_DYNAMIC_SHARED + 1}):
        assert code(raw, launch_code(ctx, va, va, **kw)) == wire.RESP_ERR_INVALID_PARAMETER, kw
    # [CMD-CHECK-1] before all of them: the context
    assert code(raw, launch_code(ctx + 5000, va, va, param_size=big)) == \
        wire.RESP_ERR_INVALID_CONTEXT_ID


def test_cmd_launch_code_needs_compute(conformance_host):
    """[DEV-FEAT-4] [CMD-CHECK-1]: without PVGPU_F_COMPUTE, LAUNCH_CODE is unknown."""
    import guest
    from rawdevice import Raw
    features = wire.DEVICE_FEATURES & ~(1 << wire.PVGPU_F_COMPUTE)
    with guest.connect(conformance_host.endpoint, mem_size=8 << 20, features=features) as conn:
        raw = Raw(conn)
        ctx = raw.context()
        assert code(raw, launch_code(ctx, 1 << 32, 1 << 32)) == wire.RESP_ERR_UNKNOWN_COMMAND
        hdr, body, _ = raw.call(cmd(wire.CMD_MEM_ALLOC, (1, wire.MEM_ALLOC_FLAG_EXEC, 4096),
                                    ctx_id=ctx))
        assert hdr[0] == wire.RESP_OK_MEM_ALLOC  # the allocation itself needs no feature
