"""spec §6.5.32 — CMD_LAUNCH_CODE and MEM_ALLOC_FLAG_EXEC: the checks of
pvgpu/conformance/checks/cmd_launch_code.py against our own host, one item per check and
memory model (conftest.py); and the wire constants of that part of the spec, which need no
host."""

import struct

from pvgpu.spec import wire

from pvgpu.conformance.checks.cmd_launch_code import BODY

GROUP = "cmd_launch_code"


def test_cmd_launch_code(conformance_case, run_conformance_case):
    run_conformance_case(conformance_case)


def test_wire_codes_and_layouts():
    assert wire.CMD_LAUNCH_CODE == 0x0441 and wire.CMD_NAMES[wire.CMD_LAUNCH_CODE] == "LAUNCH_CODE"
    assert BODY == 48 and wire.MEM_ALLOC_FLAG_EXEC == 1
    assert wire.RESP_ERR_ILLEGAL_CODE == 0x128B and wire.is_error_response(wire.RESP_ERR_ILLEGAL_CODE)
    assert wire.EVTQ_CODE_FAULT == 0x1402 and wire.EVTQ_CODE_FAULT in wire.EVTQ_NAMES
    assert struct.calcsize(wire.EVTQ_BODY_FORMAT) + wire.CTRL_HDR_SIZE == wire.EVTQ_ENTRY_SIZE
