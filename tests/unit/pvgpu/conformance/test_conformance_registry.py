"""pvgpu/conformance/registry.py: what @check accepts, which checks a pattern selects, and
that every clause a check names is a clause of spec/pvgpu.md."""

import fnmatch
import re
from pathlib import Path

import pytest

from pvgpu.conformance import all_checks, check, select
from pvgpu.conformance.registry import GROUPS, REGISTRY
from pvgpu.conformance.runner import cases

SPEC = (Path(__file__).resolve().parents[4] / "spec" / "pvgpu.md").read_text()
DEFINED = set(re.findall(r"^\[([A-Z]+(?:-[A-Z0-9]+)+)\]", SPEC, re.M)) | \
    set(re.findall(r"^\| \[(VQ-[A-Z-]+)\] \|", SPEC, re.M))  # the §4.7/§4.8 tables


def test_every_check_names_clauses_of_the_spec():
    checks = all_checks()
    assert len(checks) > 80 and {c.group for c in checks} == set(GROUPS)
    assert sorted({cid for c in checks for cid in c.clauses} - DEFINED) == []
    assert len({c.name for c in checks}) == len(checks)


NAMED = re.compile(r"^((?:ctl|mem|vq|dev|cmd|fence|krn|err|evtq|prime|sched)(?:_[a-z]+)*?_\d+)(?=_)")


def test_a_clause_in_a_check_name_is_one_of_its_clauses():
    """fence_timeline_2_order_across_engines checks FENCE-TIMELINE-2 (and says so)."""
    named = [(c.name, m.group(1).upper().replace("_", "-"), c.clauses)
             for c in all_checks() if (m := NAMED.match(c.name))]
    assert len(named) > 15
    assert [(name, cid) for name, cid, clauses in named if cid not in clauses] == []


def test_a_check_takes_only_what_a_context_hands_out():
    with pytest.raises(TypeError, match="unknown parameters"):
        check("CTL-PING-1")(lambda raw, endpoint: None)
    with pytest.raises(ValueError, match="clause IDs"):
        check("ping")
    with pytest.raises(ValueError, match="clause IDs"):
        check()
    with pytest.raises(ValueError, match="two checks named"):
        check("CTL-PING-1", name=all_checks()[0].name)(lambda ctx: None)
    assert all(c.name != "<lambda>" for c in REGISTRY)


def test_patterns_select_by_clause_or_name_in_any_case():
    hello = select(["CTL-HELLO-*"])
    def of_hello(c):
        return any(fnmatch.fnmatchcase(cid, "CTL-HELLO-*") for cid in c.clauses)
    assert hello and all(of_hello(c) for c in hello)
    assert {c.name for c in hello} == {c.name for c in all_checks() if of_hello(c)}
    assert select(["ctl-hello-10"]) == [c for c in hello if "CTL-HELLO-10" in c.clauses]
    both = select(["CTL-HELLO-10", "VQ-LOOP"])
    assert {c.name for c in both} == {"ctl_hello_10_the_first_error_in_the_spec_order_wins",
                                      "vq_loop_needs_reset_for_that_device_only"}
    assert [c.name for c in select(["cmd_va_reserve"])] == ["cmd_va_reserve"]
    assert select(["NO-SUCH-*"]) == []
    assert select(group="evtq") == [c for c in all_checks() if c.group == "evtq"]


def test_a_check_with_a_raw_session_runs_once_per_memory_model():
    per = {c.name: c.per_memory for c in all_checks()}
    assert per["cmd_va_reserve"] and per["vq_loop_needs_reset_for_that_device_only"]
    assert not per["ping_and_bye"] and not per["fence_export_between_sessions"]
    found = cases(select(["cmd_va_reserve", "ping_and_bye"]), ("shared", "inline"))
    assert [(c.name, m) for c, m in found] == [("ping_and_bye", None), ("cmd_va_reserve", "shared"),
                                               ("cmd_va_reserve", "inline")]
    assert [m for _, m in cases(select(["cmd_va_reserve"]), ("inline",))] == ["inline"]
