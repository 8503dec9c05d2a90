"""Black-box conformance: the checks of pvgpu/conformance (the suite `pvgpu conformance`
runs) against a real host, one pytest item per check and memory model.

A test module names its group of checks (GROUP, a module of pvgpu/conformance/checks) and
has a test taking `conformance_case`; it is parametrized over that group. Our own host
must pass every check: a SKIP is a failure here. Set PVGPU_CONFORMANCE_ENDPOINT=ipc://...
or tcp://... to run the suite against another implementation instead of a `pvgpu host`
started here (a SKIP is then a skip).
"""

import os

import pytest

pytest.register_assert_rewrite("pvgpu.conformance.checks")

from pvgpu.conformance import FAIL, SKIP, Target, run_case, select  # noqa: E402
from pvgpu.conformance.context import MEMORY_MODELS  # noqa: E402
from pvgpu.conformance.runner import cases, probe  # noqa: E402

EXTERNAL = os.environ.get("PVGPU_CONFORMANCE_ENDPOINT")
TIMEOUT = 100.0  # + the runner's CLEANUP_S: within pytest's 120 s per test


def pytest_generate_tests(metafunc):
    if "conformance_case" in metafunc.fixturenames:
        group = metafunc.module.GROUP
        found = cases(select(group=group), MEMORY_MODELS)
        assert found, f"no checks in group {group}"
        metafunc.parametrize("conformance_case", [
            pytest.param((c, m), id=f"{c.name}-{m}" if m else c.name) for c, m in found])


@pytest.fixture(scope="module")
def patient_endpoint():
    """A host that keeps a vanished guest's session for long (Target.patient_endpoint);
    None: the host under test. test_ctl_session_trust.py starts one."""
    return None


@pytest.fixture(scope="module")
def conformance_target(request, patient_endpoint):
    """The implementation under test: PVGPU_CONFORMANCE_ENDPOINT, or our own host."""
    if EXTERNAL:
        target = Target(EXTERNAL, timeout=TIMEOUT)
    else:
        host = request.getfixturevalue("shared_host")
        target = Target(host.endpoint, endpoints=tuple(host.endpoints), timeout=TIMEOUT,
                        patient_endpoint=patient_endpoint)
    assert probe(target) is None, "the host does not answer hello"
    return target


@pytest.fixture
def run_conformance_case(conformance_target):
    """-> run((check, memory)): the check passes, or the test fails with its report."""
    def run(case):
        check, memory = case
        result = run_case(conformance_target, check, memory)
        if result.status == FAIL:
            pytest.fail(f"{result.line()}\n{result.detail}", pytrace=False)
        if result.status == SKIP:
            if EXTERNAL:
                pytest.skip(result.reason)
            pytest.fail(f"our own host must pass every check, not skip it: {result.line()}",
                        pytrace=False)
    return run
