"""spec §5.7 — the event queue (clauses EVTQ-*, CMD-FAULT-4, DEV-QUEUE-1): the checks of
pvgpu/conformance/checks/evtq.py against our own host, one item per check and memory model
(conftest.py)."""

GROUP = "evtq"


def test_evtq(conformance_case, run_conformance_case):
    run_conformance_case(conformance_case)
