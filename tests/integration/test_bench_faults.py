"""bench/faults.py (`pvgpu bench faults --quick`): every case runs against real host and
guest processes and reports its repetitions, median, maximum and target. No timing is
asserted: only that every figure exists (a repetition whose fault was not acted on within
the bench's own limit raises instead)."""

import json

from pvgpu.bench import faults
from pvgpu import cli


def test_bench_faults_quick_reports_every_case(tmp_path, capsys):
    path = tmp_path / "faults.json"
    assert cli.main(["bench", "faults", "--quick", "--json", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("pvgpu bench faults:")  # the header first, then each case
    assert lines[1:1 + len(faults.TARGETS)] == [f"  {case} ..." for case in faults.TARGETS]
    results = json.loads(path.read_text())
    assert set(results) == set(faults.TARGETS)
    for case, r in results.items():
        assert r["reps"] == faults.QUICK_REPS == len(r["times_s"])
        assert all(t > 0 for t in r["times_s"])
        assert r["median_s"] <= r["max_s"] == max(r["times_s"])
        assert r["target_s"] == faults.TARGETS[case]
        assert isinstance(r["met"], bool)
