"""pvgpu/trace_view.py: a trace file (as the host's recorder writes it) is read back into
tracks, slices, submissions, instants, the virtqueue's kicks and completions and counters,
and drawn into a PNG."""

import threading
from types import SimpleNamespace

import pytest

from pvgpu.host.hw import packets, regs
from pvgpu.host.kmd.trace import TraceRecorder
from pvgpu import trace_view
from pvgpu.spec import kernels

MiB = 1 << 20


class _Entity:  # hashable: the context's timelines are keyed by entity
    def __init__(self, engine, ctx):
        self.sched = SimpleNamespace(engine=engine)
        self.owner = ctx


@pytest.fixture
def trace_file(tmp_path):
    devs = [SimpleNamespace(index=i, name="emu", lock=threading.RLock(), trace=None,
                            mm=SimpleNamespace(used=MiB * (i + 1)), clock_ns=lambda: 0)
            for i in range(2)]
    rec = TraceRecorder(devs, clock=lambda: 0)
    rec.attach()
    ctx = SimpleNamespace(id=1, name="c", vgpu=SimpleNamespace(name="default"), client=None,
                          vm=None, _sys_maps={}, _timeline_of={})
    jobs = [(0, regs.ENGINE_COMPUTE, packets.launch(kernels.KERNEL_FILL, (1, 1, 1),
                                                    (256, 1, 1), [0, 0, 256]), 0, 1000, 3000),
            (0, regs.ENGINE_COPY1, packets.copy(0, 0, 2 * MiB), 500, 3000, 5000),
            (1, regs.ENGINE_COMPUTE, packets.launch(kernels.KERNEL_BURN, (1, 1, 1),
                                                    (1, 1, 1), [5]), 100, 200, 4000)]
    for seq, (dev, engine, payload, arrival, start, end) in enumerate(jobs, 1):
        ent = _Entity(engine, ctx)
        job = SimpleNamespace(entity=ent, seq=seq, arrival_ns=arrival, start_ns=start,
                              end_ns=end, payload=payload)
        rec.job(devs[dev], job, SimpleNamespace(seq=seq, error=None))
    rec.fault(devs[1], regs.ENGINE_COMPUTE, "illegal packet")
    session = SimpleNamespace(sid="s1", name="g")
    rec.kick(devs[0], 100, session)
    rec.request_completed(devs[0], session, "LAUNCH", 3)  # at the device's clock: 0
    path = tmp_path / "t.json"
    rec.write(str(path))
    return str(path)


def test_load_reads_the_tracks_in_order(trace_file):
    t = trace_view.load(trace_file)
    labels = [label for _pid, _tid, label in t["tracks"]]
    assert labels[:5] == ["gpu0 emu\nvirtqueue", "gpu0 emu\nsubmit", "gpu0 emu\ncompute",
                          "gpu0 emu\ncopy0", "gpu0 emu\ncopy1"]
    assert len(labels) == 10
    assert t["slices"][(1, 2)] == [(0.001, 0.002, "fill", t["slices"][(1, 2)][0][3])]
    assert t["slices"][(1, 4)][0][2] == "copy D2H 2 MiB"
    assert len(t["submits"]) == 3
    assert [name for *_x, name in t["instants"]] == ["GPU fault"]
    assert t["counters"] == {1: [(0.0, 1.0)], 2: [(0.0, 2.0)]}
    assert sorted(t["queue"][(1, t["tracks"][0][1])]) == [(0.0, "LAUNCH done"), (0.0001, "kick")]


def test_render_writes_a_png(trace_file, tmp_path):
    out = trace_view.render(trace_file, str(tmp_path / "t.png"))
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_the_command_line_names_the_picture(trace_file, capsys):
    assert trace_view.main([trace_file, "--start", "0", "--end", "5"]) == 0
    assert capsys.readouterr().out.strip() == trace_file[:-len(".json")] + ".png"
