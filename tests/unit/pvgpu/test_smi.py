"""pvgpu/smi.py without a host: summarise() of two admin `stats` replies and render()."""

from __future__ import annotations

import io
import json

import pytest

from pvgpu import smi

MiB = 1 << 20


def _device(idx, now, busy, free=60 * MiB, vgpu_util=0.0):
    return {"device": idx, "name": f"pvgpu-emu{idx}", "vram_size": 64 * MiB, "now_ns": now,
            "engines": {e: {"busy_ns": b, "vgpus": {"default": {"utilisation": vgpu_util}}}
                        for e, b in zip(smi.ENGINES, busy)},
            "mem": {"vram_size": 64 * MiB, "vram_free": free, "evicted_bytes": 2 * MiB}}


def _session(sid, name, peer, busy, dev=0, vram=4 * MiB):
    return {"id": sid, "name": name, "peer": peer, "key": None, "vgpu": "g1", "memory": "shared",
            "devices": [{"device": dev, "contexts": [{"id": 1, "name": "c"}], "vram_bytes": vram,
                         "evicted_bytes": MiB, "busy_ns": busy},
                        {"device": 1 - dev, "contexts": [], "vram_bytes": 0,
                         "evicted_bytes": 0, "busy_ns": {}}]}


IPC = {"transport": "ipc", "pid": 4242, "uid": 1000, "gid": 1000}
TCP = {"transport": "tcp", "address": "10.0.0.2:51234"}


def _pair():
    prev = {"host": {"pid": 1, "endpoints": ["ipc:///x"], "uptime_s": 3},
            "devices": [_device(0, 1_000_000_000, (0, 0, 0)), _device(1, 1_000_000_000, (0, 0, 0))],
            "sessions": [_session("s1", "alice", IPC, {"compute": 0}),
                         _session("s2", "bob", TCP, {"compute": 0, "copy0": 0})]}
    cur = {"host": {"pid": 1, "endpoints": ["ipc:///x"], "uptime_s": 4},
           "devices": [_device(0, 2_000_000_000, (750_000_000, 100_000_000, 0), free=40 * MiB),
                       _device(1, 2_000_000_000, (0, 0, 0))],
           "sessions": [_session("s1", "alice", IPC, {"compute": 500_000_000}),
                        _session("s2", "bob", TCP, {"compute": 250_000_000, "copy0": 100_000_000}),
                        {"id": "s3", "name": "idle", "peer": None, "vgpu": "default",
                         "devices": []}]}
    return prev, cur


def test_summarise_measures_utilisation_between_two_samples():
    prev, cur = _pair()
    s = smi.summarise(cur, prev)
    assert s["interval_s"] == 1.0
    d0, d1 = s["devices"]
    assert d0["utilisation"] == {"compute": 0.75, "copy0": 0.1, "copy1": 0.0}
    assert (d0["vram_used"], d0["vram_total"], d0["sessions"]) == (24 * MiB, 64 * MiB, 2)
    assert d1["sessions"] == 0
    rows = {r["id"]: r for r in s["sessions"]}
    assert rows["s1"]["pid"] == "4242" and rows["s2"]["pid"] == "10.0.0.2:51234"
    assert rows["s1"]["share"] == {"compute": 0.5, "copy0": 0.0, "copy1": 0.0}
    assert rows["s2"]["share"]["copy0"] == 0.1
    assert (rows["s1"]["device"], rows["s1"]["contexts"], rows["s1"]["vram_bytes"]) == (0, 1, 4 * MiB)
    assert rows["s3"]["device"] is None and rows["s3"]["pid"] == "-"  # no contexts anywhere
    assert [r["id"] for r in s["sessions"]] == ["s1", "s2", "s3"]


def test_summarise_without_a_previous_sample():
    _prev, cur = _pair()
    cur["devices"][0] = _device(0, 5, (1, 1, 1), vgpu_util=0.4)
    s = smi.summarise(cur)
    assert s["interval_s"] is None
    assert s["devices"][0]["utilisation"]["compute"] == 0.4  # the scheduler's window
    assert all(v is None for r in s["sessions"] for v in r["share"].values())


def test_a_session_new_since_the_last_sample_has_no_share_yet():
    prev, cur = _pair()
    prev["sessions"] = prev["sessions"][:1]
    rows = {r["id"]: r for r in smi.summarise(cur, prev)["sessions"]}
    assert rows["s2"]["share"]["compute"] is None and rows["s1"]["share"]["compute"] == 0.5


def test_render_shows_devices_and_sessions():
    prev, cur = _pair()
    text = smi.render(smi.summarise(cur, prev))
    lines = text.splitlines()
    assert lines[0].startswith("pvgpu smi") and "over 1 s" in lines[1]
    gpu0 = next(line for line in lines if line.strip().startswith("0  pvgpu-emu0"))
    assert "24.0 MiB / 64.0 MiB" in gpu0 and "75 %" in gpu0 and "10 %" in gpu0
    alice = next(line for line in lines if "alice" in line)
    assert "4242" in alice and "s1" in alice and "50 %" in alice and "4.0 MiB" in alice
    bob = next(line for line in lines if "bob" in line)
    assert "10.0.0.2:51234" in bob
    idle = next(line for line in lines if "idle" in line)
    assert idle.strip().startswith("-")
    assert max(len(line) for line in lines) <= 110


def test_render_without_sessions():
    text = smi.render(smi.summarise({"host": {}, "devices": [], "sessions": []}))
    assert "no sessions" in text


def test_run_reports_no_host_in_one_line(tmp_path, capsys):
    assert smi.run(f"ipc://{tmp_path}/none.sock") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"pvgpu smi: no host at ipc://{tmp_path}/none.sock; start one with `pvgpu host`"]
    assert smi.run(None, f"ipc://{tmp_path}/adm/admin.sock") == 1
    assert "no admin socket" in capsys.readouterr().err


def test_run_loop_and_json_with_a_fake_admin(monkeypatch):
    prev, cur = _pair()
    samples = iter([prev, cur, cur])

    class Fake:
        def request(self, op):
            assert op == "stats"
            try:
                return next(samples)
            except StopIteration:
                raise KeyboardInterrupt from None  # Ctrl-C after the third frame

        def close(self):
            pass
    monkeypatch.setattr(smi, "connect", lambda *a, **k: Fake())
    monkeypatch.setattr(smi.time, "sleep", lambda s: None)
    out = io.StringIO()
    assert smi.run(loop=0.5, out=out) == 0
    frames = out.getvalue().split(smi.CLEAR)[1:]
    assert len(frames) == 3 and "alice" in frames[1] and "50 %" in frames[1]
    assert "50 %" not in frames[0]  # the first frame has no interval yet
    samples = iter([prev, cur])
    out = io.StringIO()
    assert smi.run(as_json=True, out=out) == 0
    doc = json.loads(out.getvalue())
    assert doc["devices"][0]["utilisation"]["compute"] == 0.75


@pytest.mark.parametrize("argv", [["smi", "--loop", "0"], ["smi", "-l", "-1"]])
def test_the_cli_refuses_a_loop_that_is_not_positive(argv, capsys):
    from pvgpu.cli import main
    assert main(argv) == 2
    assert "--loop needs a positive" in capsys.readouterr().err
