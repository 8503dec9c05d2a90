"""spec §4 — the device validates every chain it pops (clauses VQ-*): the checks of
pvgpu/conformance/checks/vq_validation.py against our own host, one item per check and
memory model (conftest.py)."""

GROUP = "vq_validation"


def test_vq_validation(conformance_case, run_conformance_case):
    run_conformance_case(conformance_case)
