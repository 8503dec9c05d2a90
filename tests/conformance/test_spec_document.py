"""spec/pvgpu.md itself: clause IDs are unique, every ID that code or tests cite exists,
and every wire constant the spec names exists in spec.wire."""

import re
from pathlib import Path

from spec import wire

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
