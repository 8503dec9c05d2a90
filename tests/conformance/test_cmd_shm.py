"""spec §6.5.19–§6.5.24 and §6.6 — shared device memory: the checks of
pvgpu/conformance/checks/cmd_shm.py against our own host, one item per check and memory
model (conftest.py); and the wire constants of that part of the spec, which need no host."""

from pvgpu.spec import wire

from pvgpu.conformance.checks.cmd_shm import ATTACH, HANDLE, SHM, STAT

GROUP = "cmd_shm"


def test_cmd_shm(conformance_case, run_conformance_case):
    run_conformance_case(conformance_case)


def test_wire_codes_and_layouts():
    cmds = [wire.CMD_SHM_GET, wire.CMD_SHM_ATTACH, wire.CMD_SHM_DETACH, wire.CMD_SHM_CONTROL,
            wire.CMD_SHM_EXPORT, wire.CMD_SHM_IMPORT]
    assert all(0x0400 <= c < 0x0500 and c in wire.CMD_NAMES for c in cmds)
    assert len(set(wire.CMD_BODY_FORMATS)) == len(wire.CMD_BODY_FORMATS)
    assert [wire.CMD_BODY_SIZES[c] for c in cmds] == [24, 8, 8, 8, 8, 16]
    oks = [wire.RESP_OK_SHM, wire.RESP_OK_SHM_ATTACH, wire.RESP_OK_SHM_HANDLE, wire.RESP_OK_SHM_STAT]
    errs = [wire.RESP_ERR_INVALID_SEGMENT, wire.RESP_ERR_PERMISSION]
    assert all(0x1100 <= c < 0x1200 and c in wire.RESP_NAMES for c in oks)
    assert all(wire.is_error_response(c) and c in wire.RESP_NAMES for c in errs)
    assert min(errs) > wire.RESP_ERR_INVALID_EVENT
    assert (SHM.size, ATTACH.size, HANDLE.size, STAT.size) == (16, 16, 16, 24)
