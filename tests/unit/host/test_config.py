"""Scheduling configuration: --vgpu specs and the JSON file."""

import json

import pytest

from pvgpu.host.config import ConfigError, SchedConfig, load_config, parse_vgpu
from pvgpu.host.kmd.sched import VgpuShares


def test_parse_vgpu_with_and_without_shares():
    assert parse_vgpu("A:compute=50,copy=40,mem=30") == VgpuShares("A", 50, 40, 30)
    assert parse_vgpu("B") == VgpuShares("B", 100, 100, 100)
    assert parse_vgpu("C:compute=25%") == VgpuShares("C", compute=25)


@pytest.mark.parametrize("bad", ["", ":compute=5", "A:compute", "A:compute=x", "A:gpu=5",
                                 "A:compute=0", "A:mem=101", "bad name:compute=5"])
def test_parse_vgpu_refuses_bad_specs(bad):
    with pytest.raises(ConfigError):
        parse_vgpu(bad)


def test_load_config_file(tmp_path):
    p = tmp_path / "sched.json"
    p.write_text(json.dumps({"sched": "band", "job_timeout_ms": 500, "vgpus": [
        {"name": "A", "compute": 50, "copy": 50, "mem": 50}, {"name": "B", "compute": 50}]}))
    cfg = load_config(str(p))
    assert cfg.policy == "band" and cfg.job_timeout_ms == 500
    assert [v.name for v in cfg.vgpus] == ["A", "B"]
    kw = cfg.kmd_kwargs()
    assert kw["job_timeout_ns"] == 500_000_000 and kw["policy"] == "band"
    assert "band" in cfg.describe()


@pytest.mark.parametrize("content", [
    "not json", "[]", '{"sched": "lottery"}', '{"vgpus": [{"compute": 5}]}',
    '{"vgpus": {"A": 1}}', '{"color": 1}', '{"hw_limit": 0}',
    '{"vgpus": [{"name": "A"}, {"name": "A"}]}'])
def test_load_config_refuses_bad_files(tmp_path, content):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(ConfigError):
        load_config(str(p))


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(str(tmp_path / "nope.json"))


def test_defaults_validate():
    assert SchedConfig().validate().policy == "fifo"
