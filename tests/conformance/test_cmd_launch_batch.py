"""spec §6.5.33 — CMD_LAUNCH_BATCH: the checks of pvgpu/conformance/checks/cmd_launch_batch.py
against our own host, one item per check and memory model (conftest.py); and the wire
constants of that part of the spec, which need no host."""

from pvgpu.spec import wire

GROUP = "cmd_launch_batch"


def test_cmd_launch_batch(conformance_case, run_conformance_case):
    run_conformance_case(conformance_case)


def test_wire_codes_and_layouts():
    assert wire.CMD_LAUNCH_BATCH == 0x0442 and wire.CMD_NAMES[wire.CMD_LAUNCH_BATCH] == "LAUNCH_BATCH"
    assert wire.CMD_BODY_SIZES[wire.CMD_LAUNCH_BATCH] == 8
    assert wire.LAUNCH_RECORD_SIZE == wire.CMD_BODY_SIZES[wire.CMD_LAUNCH] == 32
    assert wire.MAX_BATCH_LAUNCHES == 256 and wire.PVGPU_F_LAUNCH_BATCH == 3
    assert wire.DEVICE_FEATURES == 0x13000000F
