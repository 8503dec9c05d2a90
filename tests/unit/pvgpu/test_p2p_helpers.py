"""The pure parts of `pvgpu demo p2p` and `pvgpu bench p2p` (the processes run in
tests/integration/test_demo_p2p.py)."""

import hashlib

import numpy as np
import pytest

from pvgpu.bench.p2p import parse_sizes
from pvgpu import demo
from pvgpu.cli import build_parser


def test_parse_sizes():
    assert parse_sizes(None) is None
    assert parse_sizes("16") == [16]
    assert parse_sizes("16, 64,256") == [16, 64, 256]
    for bad in ("", "0", "16,-1", "a", "16,,64"):
        with pytest.raises(ValueError):
            parse_sizes(bad)


def _result(got, device_sum=None):
    return {"checksum": float(got.sum(dtype=np.float64)),
            "sha256": hashlib.sha256(got.tobytes()).hexdigest(),
            "device_sum": float(got.sum(dtype=np.float64)) if device_sum is None else device_sum}


def test_p2p_check():
    n = 1 << 12
    want = demo.p2p_expected(n)
    assert demo.p2p_check(_result(want), n)[0]
    off = want.copy()
    off[7] += 1
    assert not demo.p2p_check(_result(off), n)[0]
    swapped = want.copy()
    swapped[[1, 2]] = swapped[[2, 1]]  # same sum, different data
    assert not demo.p2p_check(_result(swapped), n)[0]
    assert not demo.p2p_check(_result(want, device_sum=0.0), n)[0]


def test_demo_and_bench_parse_p2p():
    ap = build_parser()
    assert ap.parse_args(["demo", "p2p"]).which == "p2p"
    assert ap.parse_args(["demo"]).which is None
    a = ap.parse_args(["bench", "p2p", "--quick", "--sizes", "16"])
    assert (a.which, a.quick, a.sizes) == ("p2p", True, "16")
