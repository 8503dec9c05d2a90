"""spec §6.5.29–§6.5.31 and §12 — RESOURCE_EXPORT / IMPORT / REVOKE: the checks of
pvgpu/conformance/checks/cmd_prime.py against our own host, one item per check and memory
model (conftest.py)."""

GROUP = "cmd_prime"


def test_cmd_prime(conformance_case, run_conformance_case):
    run_conformance_case(conformance_case)
