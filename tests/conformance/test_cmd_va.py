"""spec §6.5.25–§6.5.28 and §6.7 — explicit VA management: the checks of
pvgpu/conformance/checks/cmd_va.py against our own host, one item per check and memory model
(conftest.py); and the wire constants of that part of the spec, which need no host."""

from pvgpu.spec import wire

from pvgpu.conformance.checks.cmd_va import RW, VA, R

GROUP = "cmd_va"


def test_cmd_va(conformance_case, run_conformance_case):
    run_conformance_case(conformance_case)


def test_wire_codes_and_layouts():
    cmds = [wire.CMD_VA_RESERVE, wire.CMD_VA_RELEASE, wire.CMD_MEM_MAP, wire.CMD_MEM_UNMAP]
    assert cmds == [0x0470, 0x0471, 0x0472, 0x0473]
    assert all(c in wire.CMD_NAMES for c in cmds)
    assert [wire.CMD_BODY_SIZES[c] for c in cmds] == [16, 8, 32, 8]
    assert wire.RESP_OK_VA == 0x11A0 and VA.size == 16 and wire.RESP_OK_VA in wire.RESP_NAMES
    assert (R, RW) == (1, 3) and wire.RESP_ERR_INVALID_ADDRESS == 0x1284
