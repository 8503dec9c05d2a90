"""pvgpu/cli.py: argument parsing (the commands themselves run in tests/integration)."""

import argparse

import pytest

from pvgpu.cli import build_parser, parse_size


@pytest.mark.parametrize("text,value", [("4096", 4096), ("512M", 512 << 20), ("1G", 1 << 30),
                                        ("2GiB", 2 << 30), ("64k", 64 << 10), (" 8 M ", 8 << 20)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "lots", "1.5G", "-1M", "12X"])
def test_parse_size_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


def test_defaults_and_repeatable_listen():
    a = build_parser().parse_args(["host", "--listen", "tcp://127.0.0.1:1", "--listen", "ipc:///tmp/x"])
    assert a.listen == ["tcp://127.0.0.1:1", "ipc:///tmp/x"] and a.vram == 1 << 30 and a.gpus == 2
    assert not a.no_default and build_parser().parse_args(["host", "--no-default"]).no_default
    a = build_parser().parse_args(["run", "gemm", "saxpy", "--memory", "inline", "--size", "9"])
    assert a.workloads == ["gemm", "saxpy"] and a.memory == "inline" and a.size == 9
    assert a.mem_size == 192 << 20 and a.connect is None
