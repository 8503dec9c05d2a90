"""spec/coverage.md, the traceability table of MUST clauses and their tests, is current
(tests/coverage_table.py generates it), and its reasons are honest."""

import coverage_table


def test_the_committed_table_is_current():
    assert coverage_table.TABLE.read_text() == coverage_table.render(), (
        "spec/coverage.md is stale: run `python tests/coverage_table.py --write`")


def test_reasons_are_given_only_for_must_clauses_without_a_test():
    all_clauses = coverage_table.clauses()
    must = set(coverage_table.must_clauses(all_clauses))
    cov = coverage_table.citations(all_clauses)
    assert sorted(set(coverage_table.UNTESTED) - must) == []
    assert sorted(c for c in coverage_table.UNTESTED if c in cov) == []


def test_every_must_clause_has_a_test_or_says_why_not():
    all_clauses = coverage_table.clauses()
    cov = coverage_table.citations(all_clauses)
    assert sorted(c for c in coverage_table.must_clauses(all_clauses)
                  if c not in cov and c not in coverage_table.UNTESTED) == []


def test_a_citation_in_a_test_body_or_name_counts(tmp_path, monkeypatch):
    t = tmp_path / "tests"
    t.mkdir()
    (t / "test_x.py").write_text('"""module text citing CTL-HELLO-1 does not count."""\n\n\n'
                                 "def test_ctl_hello_6_twice():\n    pass\n\n\n"
                                 "def test_other():\n    x = 1  # [CMD-FAULT-3]\n\n\n"
                                 "def helper():\n    return 'CTL-HELLO-2'\n\n\n"
                                 '@check("CMD-FAULT-4")\ndef a_check(ctx):\n    pass\n')
    monkeypatch.setattr(coverage_table, "ROOT", tmp_path)
    monkeypatch.setattr(coverage_table, "SOURCES", [t])
    cov = coverage_table.citations(["CTL-HELLO-1", "CTL-HELLO-2", "CTL-HELLO-6", "CMD-FAULT-3",
                                    "CMD-FAULT-4"])
    assert cov == {"CTL-HELLO-6": ["tests/test_x.py::test_ctl_hello_6_twice"],
                   "CMD-FAULT-3": ["tests/test_x.py::test_other"],
                   "CMD-FAULT-4": ["tests/test_x.py::a_check"]}  # a conformance check's decorator
