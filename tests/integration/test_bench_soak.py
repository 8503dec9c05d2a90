"""bench/soak.py (`pvgpu bench soak`): rounds of guests through a real host, the host's
RSS read after each. Small counts; no figure is asserted but that it exists, the guests
checked their arrays, and the host exited cleanly."""

from pvgpu.bench import soak
from pvgpu import cli


def test_each_round_reports_the_hosts_rss_and_peak():
    lines = []
    res = soak.run_bench(rounds=2, guests=2, ops=20, vram="64M", workloads=True,
                         out=lines.append)
    assert [r["round"] for r in res["rounds"]] == [1, 2]
    assert all(r["rss_mib"] > 0 and r["peak_mib"] >= r["rss_mib"] for r in res["rounds"])
    assert res["host_exit_code"] == 0 and "second_half_growth_mib" in res
    assert len(lines) == 2 + 2 + 1  # start, header, a line per round, the growth


def test_soak_is_a_bench_choice():
    args = cli.build_parser().parse_args(["bench", "soak", "--rounds", "3", "--workloads"])
    assert (args.which, args.rounds, args.workloads) == ("soak", 3, True)
