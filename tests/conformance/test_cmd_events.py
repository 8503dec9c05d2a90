"""spec §6.5.11–§6.5.18 and §7.5–§7.7 — CTX_SYNC, GET_STATS, events and exported events: the
checks of pvgpu/conformance/checks/cmd_events.py against our own host, one item per check
and memory model (conftest.py); and the wire constants of that part of the spec, which need
no host."""

from pvgpu.spec import wire

from pvgpu.conformance.checks.cmd_events import EVENT

GROUP = "cmd_events"


def test_cmd_events(conformance_case, run_conformance_case):
    run_conformance_case(conformance_case)


def test_wire_codes_are_distinct_and_named():
    codes = [wire.CMD_GET_STATS, wire.CMD_CTX_SYNC, wire.CMD_EVENT_RECORD, wire.CMD_EVENT_WAIT,
             wire.CMD_EVENT_QUERY, wire.CMD_EVENT_DESTROY, wire.CMD_EVENT_EXPORT, wire.CMD_EVENT_IMPORT]
    assert len(set(codes)) == len(codes) and all(c in wire.CMD_NAMES for c in codes)
    assert all(0x0400 <= c < 0x0500 for c in codes)
    errs = [wire.RESP_ERR_CONTEXT_LOST, wire.RESP_ERR_JOB_TIMEOUT, wire.RESP_ERR_INVALID_EVENT]
    assert all(wire.is_error_response(c) and c in wire.RESP_NAMES for c in errs)
    assert wire.RESP_ERR_DEVICE_LOST == 0x1285 and min(errs) > wire.RESP_ERR_DEVICE_LOST
    assert EVENT.size == 32 and wire.CMD_BODY_SIZES[wire.CMD_EVENT_IMPORT] == 24
