"""pvgpu/cli.py: --plot of `bench` and `demo`, and `bench sched --seconds` defaulting by
--quick (the commands themselves run in tests/integration)."""

import sys

import pytest

from pvgpu import cli
from pvgpu.cli import build_parser


def test_plot_options_parse():
    a = build_parser().parse_args(["bench", "sched", "--quick", "--plot", "out"])
    assert a.plot == "out" and a.quick and a.seconds is None  # run_bench picks 20 s or quick
    assert build_parser().parse_args(["bench", "copies"]).plot is None
    a = build_parser().parse_args(["demo", "--guests", "3", "--plot", "d"])
    assert a.plot == "d" and a.guests == 3
    assert build_parser().parse_args(["bench", "sched", "--seconds", "4"]).seconds == 4.0


@pytest.mark.parametrize("argv,err", [
    (["bench", "jobs", "--plot", "d"], "--plot draws sched and copies only"),
    (["demo", "--plot", "d"], "--plot draws the vGPU demo"),
    (["demo", "p2p", "--plot", "d"], "--plot draws the vGPU demo"),
])
def test_plot_of_what_is_not_drawn_is_refused(argv, err, capsys):
    assert cli.main(argv) == 2
    assert err in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["bench", "sched", "--plot", "d"], ["bench", "copies", "--plot", "d"],
                                  ["demo", "--guests", "2", "--plot", "d"]])
def test_plot_without_matplotlib_is_one_line_before_any_run(argv, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert cli.main(argv) == 2  # at once: no host was started
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "install pvgpu[plot]" in err
