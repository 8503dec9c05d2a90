"""Counters (host/kmd/counters.py): a dict of counts whose missing keys read as 0."""

from pvgpu.host.kmd.counters import Counters


def test_a_missing_count_reads_as_zero_without_being_inserted():
    c = Counters()
    assert c["faults"] == 0 and "faults" not in c
    c["jobs"] += 1
    c["jobs"] += 2
    assert c == {"jobs": 3} and type(c["jobs"]) is int
    assert dict(c) == {"jobs": 3}  # snapshots copy it as a plain dict


def test_the_kmd_objects_count_with_it(make_dev):
    dev = make_dev()
    ctx = dev.create_context()
    assert all(type(o) is Counters for o in (dev.stats, ctx.stats, dev.schedulers[0].stats))
