"""CMD_LAUNCH_CODE through the real backend, KMD and GPU with a sans-IO guest: a launch
that runs, a code fault answered RESP_ERR_ILLEGAL_CODE and posted as EVTQ_CODE_FAULT with
its reason, events and GET_STATS that carry it, and the mapping of CodeFault records."""

import struct

import msgpack
import numpy as np
import pytest

from pvgpu.conformance import codeobj
from pvgpu.host.backend import commands
from pvgpu.host.kmd.bo import CodeFault, GpuFault
from pvgpu.spec import isa, wire

from test_backend import Guest, _backend, cmd, ok
from test_backend_eventq import EventGuest

ERR = struct.Struct(wire.RESP_ERROR_FORMAT)
OBJ = codeobj.kernels()


@pytest.fixture
def backend():
    yield from _backend()


def setup(g, ctx_id=1):
    """A context with the test kernels loaded into an executable allocation -> object VA."""
    ok(g, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=ctx_id))
    body = ok(g, cmd(wire.CMD_MEM_ALLOC, (100, wire.MEM_ALLOC_FLAG_EXEC, len(OBJ)), ctx_id=ctx_id),
              wire.RESP_OK_MEM_ALLOC)
    va, _size = struct.unpack_from(wire.RESP_MEM_ALLOC_FORMAT, body)
    ok(g, cmd(wire.CMD_COPY_H2D, (va, len(OBJ)), ctx_id=ctx_id), data=OBJ)
    return va


def launch(g, ctx_id, obj_va, index, params=b"", block=32, **kw):
    return g.call(cmd(wire.CMD_LAUNCH_CODE, (obj_va, codeobj.entry_va(obj_va, OBJ, index), 1, 1, 1,
                                             block, 1, 1, 0, len(params)),
                      ctx_id=ctx_id, extra=params, **kw))


def test_code_fault_records_map_to_the_wire():
    f = CodeFault(vmid=3, address=0x1_0000_0040, reason=isa.COBJ_ERR_INSTR, engine=0)
    e = commands.fault_to_error(f)
    assert (e.resp, e.info0, e.info1) == (wire.RESP_ERR_ILLEGAL_CODE, 0x1_0000_0040,
                                          isa.COBJ_ERR_INSTR)
    assert "instruction" in str(e)
    assert commands.error_to_event(f) == (wire.EVTQ_CODE_FAULT, 0x1_0000_0040, 0, 3,
                                          isa.COBJ_ERR_INSTR)
    g = GpuFault(vmid=3, address=0x2000, access=wire.ACCESS_EXEC, engine=0)
    assert commands.fault_to_error(g).resp == wire.RESP_ERR_PAGE_FAULT
    assert commands.error_to_event(g) == (wire.EVTQ_PAGE_FAULT, 0x2000, wire.ACCESS_EXEC, 3, 0)


def test_a_code_launch_runs_and_a_trap_is_illegal_code(backend):
    g = EventGuest(backend)
    g.init()
    obj_va = setup(g, 7)
    body = ok(g, cmd(wire.CMD_MEM_ALLOC, (1, 0, 4096), ctx_id=7), wire.RESP_OK_MEM_ALLOC)
    out, _ = struct.unpack_from(wire.RESP_MEM_ALLOC_FORMAT, body)
    hdr, _ = launch(g, 7, obj_va, 0, struct.pack("<QI", out, 64), block=64, flags=wire.FLAG_FENCE,
                    fence_id=5)
    assert hdr == (wire.RESP_OK_NODATA, wire.FLAG_FENCE, 5, 7, 0)
    hdr, data = g.call(cmd(wire.CMD_COPY_D2H, (out, 256), ctx_id=7), writable=4096)
    np.testing.assert_array_equal(np.frombuffer(data[:256], np.uint32), np.arange(64))
    # a trap: accepted, remembered, reported by the next synchronizing command
    hdr, _ = launch(g, 7, obj_va, 2, ring_idx=0)
    assert hdr[0] == wire.RESP_OK_NODATA
    hdr, body = g.call(cmd(wire.CMD_NOP, ctx_id=7, flags=wire.FLAG_FENCE, fence_id=1))
    assert hdr[0] == wire.RESP_ERR_ILLEGAL_CODE
    info0, info1, _n = ERR.unpack_from(body)
    trap_va = codeobj.instr_va(obj_va, OBJ, 2, 0)
    assert (info0, info1) == (trap_va, isa.COBJ_ERR_TRAP)  # ISA-OP-6: the trap instruction
    (n, ehdr, ebody, _raw), = g.events()
    assert ehdr == (wire.EVTQ_CODE_FAULT, 0, 0, 7, 0)
    seq, _ts, address, vmid, access, engine, missed, detail = ebody
    assert (address, access, engine, detail) == (trap_va, 0, 0, isa.COBJ_ERR_TRAP) and vmid > 0
    # GET_STATS names the code fault; the context keeps working
    _hdr, stats = g.call(cmd(wire.CMD_GET_STATS), writable=wire.STATS_BUFFER_SIZE)
    (length,) = struct.unpack_from(wire.RESP_STATS_FORMAT, stats)
    faults = msgpack.unpackb(stats[8:8 + length], strict_map_key=False)["faults"]
    assert faults[7]["count"] == 1 and faults[7]["last"]["code"] == "trap"
    hdr, _ = launch(g, 7, obj_va, 0, struct.pack("<QI", out, 64), block=64, flags=wire.FLAG_FENCE,
                    fence_id=6)
    assert hdr[0] == wire.RESP_OK_NODATA


def test_an_object_in_memory_without_exec_faults_with_access_exec(backend):
    g = Guest(backend)
    g.init()
    ok(g, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    body = ok(g, cmd(wire.CMD_MEM_ALLOC, (5, 0, len(OBJ)), ctx_id=1), wire.RESP_OK_MEM_ALLOC)
    va, _ = struct.unpack_from(wire.RESP_MEM_ALLOC_FORMAT, body)
    ok(g, cmd(wire.CMD_COPY_H2D, (va, len(OBJ)), ctx_id=1), data=OBJ)
    hdr, body = launch(g, 1, va, 2, flags=wire.FLAG_FENCE, fence_id=1)
    assert hdr[0] == wire.RESP_ERR_PAGE_FAULT
    assert ERR.unpack_from(body)[:2] == (va, wire.ACCESS_EXEC)
