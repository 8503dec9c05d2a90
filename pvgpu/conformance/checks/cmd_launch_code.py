"""spec §6.5.32 — CMD_LAUNCH_CODE, and MEM_ALLOC_FLAG_EXEC (clauses CMD-LAUNCH-CODE-*,
CMD-ALLOC-1, CMD-ALLOC-3, CMD-FAULT-*, DEV-FEAT-4, EVTQ-ENTRY-1, ERR-RESP-3): black-box
through the virtqueue in both memory models; requests are raw bytes, responses are read
back raw, code objects are built by hand (codeobj.py)."""

import struct

import numpy as np

from pvgpu.spec import isa, wire

from pvgpu.conformance import codeobj
from pvgpu.conformance.rawdevice import Raw, cmd, d2h, h2d
from pvgpu.conformance.registry import check

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


@check("CMD-ALLOC-1", "CMD-ALLOC-3")
def cmd_alloc_exec_flag(raw):
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


@check("CMD-LAUNCH-CODE-1", "CMD-CHECK-1", feature=wire.PVGPU_F_COMPUTE)
def cmd_launch_code_checks_in_order(raw):
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


@check("DEV-FEAT-4", "CMD-CHECK-1")
def cmd_launch_code_needs_compute(ctx):
    """[DEV-FEAT-4] [CMD-CHECK-1]: without PVGPU_F_COMPUTE, LAUNCH_CODE is unknown."""
    features = wire.DEVICE_FEATURES & ~(1 << wire.PVGPU_F_COMPUTE)
    with ctx.connect(mem_size=8 << 20, features=features) as conn:
        raw = Raw(conn)
        ctx = raw.context()
        assert code(raw, launch_code(ctx, 1 << 32, 1 << 32)) == wire.RESP_ERR_UNKNOWN_COMMAND
        hdr, body, _ = raw.call(cmd(wire.CMD_MEM_ALLOC, (1, wire.MEM_ALLOC_FLAG_EXEC, 4096),
                                    ctx_id=ctx))
        assert hdr[0] == wire.RESP_OK_MEM_ALLOC  # the allocation itself needs no feature


# ---------------------------------------------------------------------- execution
def load(raw, ctx, obj, rid=50):
    va, _ = exec_alloc(raw, ctx, len(obj), rid)
    assert h2d(raw, ctx, va, obj)[0][0] == wire.RESP_OK_NODATA
    return va


def store_index(raw, ctx, obj_va, obj, out_va, n, **kw):
    return launch_code(ctx, obj_va, codeobj.entry_va(obj_va, obj, 0), grid=(1, 1, 1),
                       block=(n, 1, 1), params=struct.pack("<QI", out_va, n), **kw)


def check_store_index(raw, ctx, n=64, rid=60):
    """A good launch in ctx works: out[i] == i."""
    obj = codeobj.kernels()
    obj_va = load(raw, ctx, obj, rid)
    out, _ = raw.alloc(ctx, 4 * n, rid + 1)
    assert code(raw, store_index(raw, ctx, obj_va, obj, out, n, fence_id=1)) == wire.RESP_OK_NODATA
    np.testing.assert_array_equal(np.frombuffer(d2h(raw, ctx, out, 4 * n), np.uint32), np.arange(n))


@check("CMD-LAUNCH-CODE-2", "CMD-LAUNCH-CODE-3", "CMD-LAUNCH-CODE-4",
       feature=wire.PVGPU_F_COMPUTE)
def cmd_launch_code_runs_accepted_or_fenced(raw):
    """[CMD-LAUNCH-CODE-2] [CMD-LAUNCH-CODE-3] [CMD-LAUNCH-CODE-4]: unfenced is "accepted" at
    once, fenced answers when done; the parameters are the device's copy (the chain's
    bytes may change once answered); the largest parameter buffer and shared memory pass."""
    ctx = raw.context()
    obj = codeobj.kernels()
    obj_va = load(raw, ctx, obj)
    out, _ = raw.alloc(ctx, 4 * 256, 1)
    hdr, _b, used = raw.call(store_index(raw, ctx, obj_va, obj, out, 256))
    assert hdr == (wire.RESP_OK_NODATA, 0, 0, ctx, 0) and used == wire.CTRL_HDR_SIZE
    hdr, _b, _n = raw.call(cmd(wire.CMD_NOP, ctx_id=ctx, fence_id=3))
    assert hdr == (wire.RESP_OK_NODATA, wire.FLAG_FENCE, 3, ctx, 0)
    np.testing.assert_array_equal(np.frombuffer(d2h(raw, ctx, out, 1024), np.uint32), np.arange(256))
    big = launch_code(ctx, obj_va, codeobj.entry_va(obj_va, obj, 2),
                      param_size=isa.MAX_PARAM_SIZE, dyn_shared=isa.MAX_DYNAMIC_SHARED)
    hdr, body, _n = raw.call(big, bytes(isa.MAX_PARAM_SIZE))  # in a descriptor of its own
    # accepted: the entry (trap) is checked when it runs
    assert hdr[0] == wire.RESP_OK_NODATA
    hdr, body, _n = raw.call(cmd(wire.CMD_CTX_SYNC, ctx_id=ctx))
    assert hdr[0] == wire.RESP_ERR_ILLEGAL_CODE  # param_size 4096 != the entry's 0 (COBJ-VALID-3)
    assert ERR.unpack_from(body)[:2] == (codeobj.entry_va(obj_va, obj, 2), isa.COBJ_ERR_LAUNCH)


@check("CMD-LAUNCH-CODE-5", "ERR-RESP-3", "CMD-FAULT-1", "CMD-FAULT-4", "CMD-ALLOC-3",
       feature=wire.PVGPU_F_COMPUTE)
def cmd_launch_code_faults(raw):
    """[CMD-LAUNCH-CODE-5] [ERR-RESP-3] [CMD-FAULT-1] [CMD-FAULT-4]: a trap and a
    malformed instruction are code faults (info0 the record, info1 the reason), an object
    without EXEC and a store out of bounds are page faults; the context carries on."""
    ctx = raw.context()
    obj = bytearray(codeobj.kernels())
    obj_va = load(raw, ctx, bytes(obj))
    trap = codeobj.entry_va(obj_va, obj, 2)
    assert error(raw, launch_code(ctx, obj_va, trap, fence_id=1)) == \
        (wire.RESP_ERR_ILLEGAL_CODE, (codeobj.instr_va(obj_va, obj, 2, 0), isa.COBJ_ERR_TRAP))
    # an unknown opcode in store_index's fourth instruction
    bad = codeobj.instr_va(0, obj, 0, 3)
    obj[bad:bad + 2] = b"\xff\xff"
    bad_va = load(raw, ctx, bytes(obj), rid=51)
    out, _ = raw.alloc(ctx, 4096, 1)
    assert error(raw, store_index(raw, ctx, bad_va, obj, out, 32, fence_id=2)) == \
        (wire.RESP_ERR_ILLEGAL_CODE, (bad_va + bad, isa.COBJ_ERR_INSTR))
    assert not any(d2h(raw, ctx, out, 128))  # nothing ran (COBJ-VALID-4)
    # a header that is not one
    obj[0:4] = b"JUNK"
    hdr_va = load(raw, ctx, bytes(obj), rid=52)
    assert error(raw, store_index(raw, ctx, hdr_va, obj, out, 32, fence_id=3)) == \
        (wire.RESP_ERR_ILLEGAL_CODE, (hdr_va, isa.COBJ_ERR_HEADER))
    # the object in memory that is not executable (CMD-ALLOC-3)
    good = codeobj.kernels()
    plain, _ = raw.alloc(ctx, len(good), 2)
    h2d(raw, ctx, plain, good)
    assert error(raw, launch_code(ctx, plain, codeobj.entry_va(plain, good, 2), fence_id=4)) == \
        (wire.RESP_ERR_PAGE_FAULT, (plain, wire.ACCESS_EXEC))
    # a store at an unmapped address
    unmapped = 0x7E00_0000_0000
    assert error(raw, store_index(raw, ctx, obj_va, good, unmapped, 32, fence_id=5)) == \
        (wire.RESP_ERR_PAGE_FAULT, (unmapped, wire.ACCESS_WRITE))
    check_store_index(raw, ctx)  # faulted, not lost


@check("CMD-ALLOC-3", "CMD-VA-2", feature=wire.PVGPU_F_COMPUTE)
def cmd_alloc_exec_only_at_its_own_va(raw):
    """[CMD-ALLOC-3] [CMD-VA-2]: a MEM_MAP alias of an executable allocation is not
    executable."""
    ctx = raw.context()
    obj = codeobj.kernels()
    va, size = exec_alloc(raw, ctx, len(obj), 9)
    h2d(raw, ctx, va, obj)
    hdr, body, _ = raw.call(cmd(wire.CMD_VA_RESERVE, (size, 0), ctx_id=ctx))
    alias, _ = struct.unpack_from(wire.RESP_VA_FORMAT, body)
    assert code(raw, cmd(wire.CMD_MEM_MAP, (alias, 0, size, 9, wire.MEM_MAP_ACCESS_READ),
                         ctx_id=ctx)) == wire.RESP_OK_NODATA
    assert error(raw, launch_code(ctx, alias, codeobj.entry_va(alias, obj, 2), fence_id=1)) == \
        (wire.RESP_ERR_PAGE_FAULT, (alias, wire.ACCESS_EXEC))
    assert error(raw, launch_code(ctx, va, codeobj.entry_va(va, obj, 2), fence_id=2))[0] == \
        wire.RESP_ERR_ILLEGAL_CODE  # the trap runs at the allocation's own VA


@check("CMD-LAUNCH-CODE-5", feature=wire.PVGPU_F_COMPUTE)
def a_malformed_code_object_faults_only_its_context(two):
    """[CMD-LAUNCH-CODE-5] [COBJ-VALID-4] [SM-EXEC-6]: hand-corrupted bytes in an executable
    allocation, launched through the raw command, fault only that context: the session's
    other contexts and another guest carry on."""
    a, b = two
    victim, neighbour, stranger = a.context(), a.context(), b.context()
    obj = bytearray(codeobj.kernels())
    entries_off = struct.unpack_from(isa.COBJ_HEADER_FORMAT, obj)[4]
    struct.pack_into("<I", obj, entries_off + 8, 1 << 30)  # store_index's code_start
    va = load(a, victim, bytes(obj))
    out, _ = a.alloc(victim, 4096, 1)
    hdr, body, _ = a.call(store_index(a, victim, va, obj, out, 32))
    assert hdr[0] == wire.RESP_OK_NODATA  # accepted: checked when it runs
    check_store_index(a, neighbour)
    check_store_index(b, stranger)
    hdr, body, _ = a.call(cmd(wire.CMD_CTX_SYNC, ctx_id=victim))
    assert hdr[0] == wire.RESP_ERR_ILLEGAL_CODE
    assert ERR.unpack_from(body)[:2] == (codeobj.entry_va(va, obj, 0), isa.COBJ_ERR_ENTRY)
    check_store_index(a, victim, rid=70)


@check("CMD-LAUNCH-CODE-3", feature=wire.PVGPU_F_COMPUTE)
def cmd_launch_code_copies_the_parameters_when_taken(raw):
    """[CMD-LAUNCH-CODE-3]: once the command is answered the driver may reuse the buffer
    that held the parameters, even though the launch has not run yet."""
    ctx = raw.context()
    obj = codeobj.kernels()
    obj_va = load(raw, ctx, obj)
    out, _ = raw.alloc(ctx, 4 * 64, 1)
    burn = cmd(wire.CMD_LAUNCH, (wire.KERNEL_BURN, 1, 1, 1, 1, 1, 1, 1), ctx_id=ctx,
               extra=struct.pack("<Q", 200_000))  # holds the timeline for 0.2 s
    assert code(raw, burn) == wire.RESP_OK_NODATA
    params = struct.pack("<QI", out, 64)
    gpa = raw.heap.alloc(len(params))
    raw.drv.mem.write(gpa, params)
    command = launch_code(ctx, obj_va, codeobj.entry_va(obj_va, obj, 0), block=(64, 1, 1),
                          param_size=len(params))
    hdr, _b, _n = raw.wait(raw.drv.submit(command, [(gpa, len(params))]))
    assert hdr[0] == wire.RESP_OK_NODATA
    raw.drv.mem.write(gpa, struct.pack("<QI", 0x7E00_0000_0000, 64))  # reused at once
    assert code(raw, cmd(wire.CMD_CTX_SYNC, ctx_id=ctx)) == wire.RESP_OK_NODATA
    np.testing.assert_array_equal(np.frombuffer(d2h(raw, ctx, out, 256), np.uint32), np.arange(64))
