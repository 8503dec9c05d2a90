"""spec §6 and §7 — device commands, timelines, fences and held chains: the checks of
pvgpu/conformance/checks/cmd_fence.py against our own host, one item per check and memory
model (conftest.py)."""

GROUP = "cmd_fence"


def test_cmd_fence(conformance_case, run_conformance_case):
    run_conformance_case(conformance_case)
