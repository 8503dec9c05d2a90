"""spec/pvgpu.md itself: clause IDs are unique, every ID that code or tests cite exists,
and every wire constant the spec names exists in pvgpu.spec.wire."""

import re
from pathlib import Path

from pvgpu.spec import wire

ROOT = Path(__file__).resolve().parents[2]
SPEC = (ROOT / "spec" / "pvgpu.md").read_text()
CLAUSE = re.compile(r"^\[([A-Z]+(?:-[A-Z0-9]+)+)\]", re.M)
# a clause ID, never the tail of a longer one (ISA-MEM-5 of spec/isa.md cites no pvgpu.md clause)
CITED = re.compile(r"(?<![\w-])((?:CTL|MEM|VQ|DEV|CMD|FENCE|KRN|ERR|EVTQ|PRIME|SCHED)-[A-Z0-9]+"
                   r"(?:-[A-Z0-9]+)*)(-\*)?")


def _defined() -> set:
    ids = set(CLAUSE.findall(SPEC))
    ids |= set(re.findall(r"^\| \[(VQ-[A-Z-]+)\] \|", SPEC, re.M))  # the §4.7/§4.8 tables
    return ids


def test_clause_ids_are_unique():
    ids = CLAUSE.findall(SPEC)
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})


def test_every_cited_clause_exists():
    defined = _defined()
    cited, families = set(), set()
    for folder in ("tests", "transport", "host", "guest", "pvgpu"):
        for path in (ROOT / folder).rglob("*.py"):
            for name, star in CITED.findall(path.read_text()):
                (families if star else cited).add(name)  # "FENCE-TIMELINE-*" names a family
    assert len(defined) > 150
    assert sorted(cited - defined) == []
    assert sorted(f for f in families if not any(d.startswith(f + "-") for d in defined)) == []


def test_every_section_is_present():
    for heading in ("## 2", "### 2.8", "### 2.9", "## 3", "### 3.2", "### 3.3", "## 4", "## 5",
                    "## 6", "## 7", "## 8", "## 9", "## 10"):
        assert re.search(rf"^{re.escape(heading)}\b", SPEC, re.M), heading


def test_named_wire_constants_exist():
    prefixes = ("CMD_", "RESP_", "VIRTQ_", "STATUS_", "CTL_ERR_", "OP_", "KERNEL_", "PVGPU_F_",
                "VIRTIO_F_")
    named = set(re.findall(r"`((?:%s)[A-Z0-9_]+)`" % "|".join(prefixes), SPEC))
    assert named and sorted(n for n in named if not hasattr(wire, n)) == []


def _groups() -> dict:
    """clause group (the ID without its number) -> the numbers defined in it."""
    groups: dict = {}
    for cid in _defined():
        head, _, num = cid.rpartition("-")
        if num.isdigit():
            groups.setdefault(head, []).append(int(num))
    return groups


def _unused() -> set:
    """The IDs §1.4 lists as naming no clause (retired or never assigned)."""
    found = re.search(r"without gaps, except these, which name no clause: (.*?)\. A host", SPEC, re.S)
    assert found, "§1.4 lists the IDs that name no clause"
    return set(re.findall(r"[A-Z]+(?:-[A-Z0-9]+)+", found.group(1)))


def test_clause_numbers_are_consecutive_within_each_group():
    # a gap is how a cut passage shows: CTL-HELLO-2..4 went missing once without notice
    unused = _unused()
    assert not unused & _defined()
    gaps = {}
    for head, nums in _groups().items():
        missing = {f"{head}-{n}" for n in range(1, max(nums) + 1) if n not in nums} - unused
        if missing:
            gaps[head] = sorted(missing)
    assert gaps == {}


def test_every_clause_starts_a_paragraph():
    """A clause opens its own paragraph: after a blank line, a heading or a table row.
    A clause ID followed by a capitalised sentence anywhere else is a clause that a cut
    joined onto the middle of another sentence or list item."""
    lines = SPEC.splitlines()
    bad = []
    for i, line in enumerate(lines):
        if CLAUSE.match(line) and i and lines[i - 1].strip() and not lines[i - 1].startswith(("#", "|")):
            bad.append((i + 1, line[:60]))
        for m in re.finditer(r"\[([A-Z]+(?:-[A-Z0-9]+)+)\] (?:The|A|An|If|When|Every|Each|On|In|Any)\b", line):
            if m.start() > 0 and not line.startswith("|"):
                bad.append((i + 1, line[m.start():m.start() + 60]))
    assert bad == []


def test_spec_documents_cite_only_defined_clauses():
    defined = _defined()
    cited = set()
    for path in (ROOT / "spec").glob("*.md"):
        if path.name == "isa.md":  # the ISA document's own ISA-* clauses
            continue
        cited |= {name for name, star in CITED.findall(path.read_text()) if not star}
    assert sorted(cited - defined - _unused()) == []


TEST_NAME = re.compile(r"def (test_(?:ctl|mem|vq|dev|cmd|fence|krn|err|evtq|prime|sched)(?:_[a-z]+)*?_\d+)(?=_|\()")


def test_test_names_cite_only_defined_clauses():
    """test_fence_timeline_2_order... names FENCE-TIMELINE-2: it must exist."""
    defined = _defined()
    missing = []
    for path in (ROOT / "tests").rglob("test_*.py"):
        for name in TEST_NAME.findall(path.read_text()):
            cid = name[len("test_"):].upper().replace("_", "-")
            if cid not in defined:
                missing.append((path.name, name))
    assert missing == []
