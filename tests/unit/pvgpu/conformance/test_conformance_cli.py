"""`pvgpu conformance`'s arguments, and what it lists without a host (the runs against
hosts are tests/integration/test_conformance_tool.py)."""

import pytest

from pvgpu.cli import build_parser, main
from pvgpu.conformance import select


def test_arguments_and_defaults():
    a = build_parser().parse_args(["conformance", "--endpoint", "tcp://h:1"])
    assert (a.endpoint, a.memory, a.clauses, a.json, a.timeout, a.list) == \
        ("tcp://h:1", None, None, None, 60.0, False)
    a = build_parser().parse_args(["conformance", "--endpoint", "ipc:///x", "--memory", "inline",
                                   "--memory", "shared", "--clauses", "VQ-*", "--json", "-",
                                   "--timeout", "2.5"])
    assert (a.memory, a.clauses, a.json, a.timeout) == (["inline", "shared"], "VQ-*", "-", 2.5)
    assert main(["conformance"]) == 2  # --endpoint is required to run checks
    with pytest.raises(SystemExit):
        build_parser().parse_args(["conformance", "--endpoint", "x", "--memory", "telepathy"])


def test_list_names_each_run_with_its_clauses(capsys):
    assert main(["conformance", "--endpoint", "ipc:///nowhere", "--list", "--memory", "inline",
                 "--clauses", "CTL-HELLO-10, cmd_va_reserve"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "CTL-HELLO-10  ctl_hello_10_the_first_error_in_the_spec_order_wins",
        "CMD-VA-RESERVE-1 CMD-VA-RESERVE-2 CMD-VA-3 CMD-VA-5 CMD-VA-1  cmd_va_reserve[inline]"]
    assert main(["conformance", "--list"]) == 0  # listing needs no host
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == sum(2 if c.per_memory else 1 for c in select())
    assert main(["conformance", "--endpoint", "ipc:///nowhere", "--clauses", "NOPE-*"]) == 2
    assert "no check" in capsys.readouterr().err
