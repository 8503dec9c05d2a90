"""spec §2 — the control channel: message shape, errors, sessions (clauses CTL-*): the checks
of pvgpu/conformance/checks/ctl_control_channel.py against our own host, one item per check
and memory model (conftest.py)."""

GROUP = "ctl_control_channel"


def test_ctl_control_channel(conformance_case, run_conformance_case):
    run_conformance_case(conformance_case)
