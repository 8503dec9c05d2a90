"""Engine traces (host/kmd/trace.py): the recorder as pure logic over a fake job stream
(the trace-event file, its tracks and metadata, slices, flows, instants and counters),
then the hooks of a real device: a traced device records its jobs, faults and VRAM, an
untraced one nothing."""

import json
import threading
from types import SimpleNamespace

import pytest

from pvgpu.host.hw import packets, regs
from pvgpu.host.kmd.kernarg import CodeLaunch
from pvgpu.host.kmd.trace import (QUEUE_TID, SUBMIT_TID, TraceRecorder, describe, engine_tid,
                                  format_size)
from pvgpu.spec import kernels

MiB = 1 << 20
SYS_VA = 1 << 40  # where the fake contexts map system memory


class FakeDevice:
    def __init__(self, index: int):
        self.index = index
        self.name = f"fake{index}"
        self.lock = threading.RLock()
        self.mm = SimpleNamespace(used=MiB)
        self.trace = None
        self.now = 1_000_000

    def clock_ns(self) -> int:
        return self.now


def _ctx(ctx_id=7, name="ctx", sid=3, session="alice", vgpu="A"):
    return SimpleNamespace(id=ctx_id, name=name, vgpu=SimpleNamespace(name=vgpu),
                           client=SimpleNamespace(sid=sid, name=session), vm=object(),
                           _sys_maps={SYS_VA: (None, 64 * MiB)}, _timeline_of={})


class Obj:
    """A hashable bag of attributes (entities are dict keys)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


class FakeStream:
    """Jobs on the engines of one fake device, with times the test chooses."""

    def __init__(self, dev, ctx):
        self.dev = dev
        self.ctx = ctx
        self.seqs = {}

    def job(self, engine, payload, arrival, start, end, timeline=0, error=None):
        seq = self.seqs[engine] = self.seqs.get(engine, 0) + 1
        ent = Obj(sched=SimpleNamespace(engine=engine), owner=self.ctx)
        self.ctx._timeline_of[ent] = timeline
        job = SimpleNamespace(entity=ent, seq=seq, arrival_ns=arrival, start_ns=start,
                              end_ns=end, payload=payload)
        return job, SimpleNamespace(seq=100 + seq, error=error)


def _ns(us: float) -> int:
    """A trace time (µs, written to the ns) in ns: exact, unlike a sum of floats."""
    return round(us * 1000)


def _slices(events, engine=None):
    return [e for e in events if e["ph"] == "X" and e["tid"] != SUBMIT_TID
            and (engine is None or e["tid"] == engine_tid(engine))]


@pytest.fixture
def traced():
    dev = FakeDevice(0)
    rec = TraceRecorder([dev], clock=lambda: 1_000_000)
    rec.attach()
    return dev, rec, FakeStream(dev, _ctx())


def _workload(dev, rec, stream):
    fill = packets.launch(kernels.KERNEL_FILL, (4, 1, 1), (256, 1, 1), [0x1000, 0, 1024])
    h2d = packets.copy(SYS_VA, 0x1000, 16 * MiB)
    d2h = packets.copy(0x1000, SYS_VA, 4096)
    d2d = packets.copy(0x1000, 0x2000, MiB) + packets.copy(0x3000, 0x4000, MiB)
    t = 1_000_000
    for engine, payload, arrival, start, end, timeline in [
            (regs.ENGINE_COPY0, h2d, t + 1000, t + 2000, t + 9000, 1),
            (regs.ENGINE_COMPUTE, fill, t + 1500, t + 9000, t + 12000, 1),
            (regs.ENGINE_COPY1, d2h, t + 1600, t + 12000, t + 12500, 1),
            (regs.ENGINE_COPY0, d2d, t + 1700, t + 12000, t + 14000, 0)]:
        rec.job(dev, *stream.job(engine, payload, arrival, start, end, timeline))


def test_jobs_become_slices_named_after_their_kernel_or_copy(traced):
    dev, rec, stream = traced
    _workload(dev, rec, stream)
    events = rec.events()
    names = {e["name"]: e for e in _slices(events)}
    assert set(names) == {"copy H2D 16 MiB", "fill", "copy D2H 4 KiB", "copy D2D 2 MiB"}
    h2d = names["copy H2D 16 MiB"]
    assert h2d["tid"] == engine_tid(regs.ENGINE_COPY0) and h2d["pid"] == 1
    # µs from the earliest time in the trace (the trace start here)
    assert (h2d["ts"], h2d["dur"]) == (2.0, 7.0)
    assert h2d["args"]["bytes"] == 16 * MiB and h2d["args"]["direction"] == "H2D"
    assert names["copy D2D 2 MiB"]["args"]["copies"] == 2
    fill = names["fill"]
    assert fill["tid"] == engine_tid(regs.ENGINE_COMPUTE)
    assert fill["args"]["kernel_id"] == kernels.KERNEL_FILL
    for key, value in {"session": 3, "session_name": "alice", "vgpu": "A", "context": 7,
                       "context_name": "ctx", "stream": 1, "fence": 101}.items():
        assert fill["args"][key] == value, key


def test_tracks_and_processes_are_named(traced):
    dev, rec, stream = traced
    _workload(dev, rec, stream)
    meta = [e for e in rec.events() if e["ph"] == "M"]
    assert {"pid": 1, "name": "gpu0 fake0"} in [
        {"pid": e["pid"], "name": e["args"]["name"]} for e in meta if e["name"] == "process_name"]
    threads = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert threads == {SUBMIT_TID: "submit", engine_tid(regs.ENGINE_COMPUTE): "compute",
                       engine_tid(regs.ENGINE_COPY0): "copy0",
                       engine_tid(regs.ENGINE_COPY1): "copy1", QUEUE_TID: "virtqueue"}
    order = {e["tid"]: e["args"]["sort_index"] for e in meta if e["name"] == "thread_sort_index"}
    assert min(order, key=order.get) == QUEUE_TID  # the virtqueue's track comes first


def test_kicks_and_completed_requests_are_instants_on_the_virtqueue_track(traced):
    dev, rec, stream = traced
    session = SimpleNamespace(sid="s4", name="bob")
    rec.kick(dev, 1_002_000, session)
    dev.now = 1_009_500
    rec.request_completed(dev, session, "CTX_SYNC", 17)
    queue = [e for e in rec.events() if e.get("tid") == QUEUE_TID and e["ph"] == "i"]
    assert [(e["name"], e["ts"], e["pid"]) for e in queue] == [("kick", 2.0, 1),
                                                               ("CTX_SYNC done", 9.5, 1)]
    assert queue[0]["args"] == {"session": "s4", "session_name": "bob"}
    assert queue[1]["args"] == {"session": "s4", "session_name": "bob", "head": 17}


def test_every_job_has_one_flow_from_its_submission(traced):
    dev, rec, stream = traced
    _workload(dev, rec, stream)
    events = rec.events()
    outs = {e["bind_id"]: e for e in events if e.get("flow_out")}
    ins = {e["bind_id"]: e for e in events if e.get("flow_in")}
    assert len(outs) == len(ins) == 4 and set(outs) == set(ins)
    for bind_id, submit in outs.items():
        job = ins[bind_id]
        assert submit["tid"] == SUBMIT_TID and submit["ph"] == "X"
        assert submit["ts"] <= job["ts"]
        assert submit["name"] == f"submit {job['name']}"
    arrivals = sorted(e["ts"] for e in outs.values())
    assert arrivals == [1.0, 1.5, 1.6, 1.7]


def test_fences_faults_and_resets_are_instants(traced):
    dev, rec, stream = traced
    ctx = stream.ctx
    job, fence = stream.job(regs.ENGINE_COMPUTE, packets.launch(kernels.KERNEL_BURN, (1, 1, 1), (1, 1, 1), [5]),
                            1_000_100, 1_000_200, 1_000_900, error="GPU page fault")
    rec.job(dev, job, fence)
    dev.now = 1_000_500
    rec.fault(dev, regs.ENGINE_COMPUTE, ValueError("bad"), ctx)
    dev.now = 1_000_600
    rec.engine_reset(dev, regs.ENGINE_COPY0, job, ctx, "timeout")
    instants = {e["name"]: e for e in rec.events() if e["ph"] == "i"}
    assert set(instants) == {"fence 101 signalled", "GPU fault", "engine reset"}
    assert instants["fence 101 signalled"]["ts"] == 0.9
    assert instants["fence 101 signalled"]["args"]["error"] == "GPU page fault"
    fault = instants["GPU fault"]
    assert (fault["ts"], fault["tid"], fault["args"]["error"]) == (0.5, engine_tid(0), "bad")
    reset = instants["engine reset"]
    assert reset["args"]["engine"] == "copy0" and reset["args"]["reason"] == "timeout"
    assert reset["s"] == "p"


def test_vram_is_a_counter_sampled_when_it_changes(traced):
    dev, rec, _stream = traced  # attach() took the first sample
    for used, now in [(MiB, 1_001_000), (3 * MiB, 1_002_000), (3 * MiB, 1_003_000),
                      (2 * MiB, 1_004_000)]:
        dev.mm.used, dev.now = used, now
        rec.vram(dev)
    counters = [(e["ts"], e["args"]["MiB"]) for e in rec.events() if e["ph"] == "C"]
    assert counters == [(0.0, 1.0), (2.0, 3.0), (4.0, 2.0)]


def test_the_file_is_trace_event_json(traced, tmp_path):
    dev, rec, stream = traced
    _workload(dev, rec, stream)
    path = tmp_path / "trace.json"
    assert rec.write(str(path)) == 4
    doc = json.loads(path.read_text())
    assert doc["displayTimeUnit"] == "ms"
    assert {e["ph"] for e in doc["traceEvents"]} == {"M", "X", "i", "C"}
    for e in doc["traceEvents"]:
        assert {"ph", "name", "pid", "tid"} <= set(e)
    assert list(tmp_path.iterdir()) == [path]  # the temporary file was renamed


def test_a_bounded_recorder_drops_the_oldest_and_says_so(tmp_path):
    dev = FakeDevice(0)
    rec = TraceRecorder([dev], max_records=3, clock=lambda: 0)
    stream = FakeStream(dev, _ctx())
    for i in range(5):  # five jobs, and the VRAM sample after the first
        rec.job(dev, *stream.job(regs.ENGINE_COMPUTE, packets.nop(1), i, i, i + 1))
    assert [e["args"]["job"] for e in _slices(rec.events())] == [3, 4, 5]
    rec.job(dev, *stream.job(regs.ENGINE_COMPUTE, packets.nop(1), 9, 9, 10))
    rec.write(str(tmp_path / "t.json"))
    assert json.loads((tmp_path / "t.json").read_text())["otherData"]["dropped_records"] == 3


def test_detach_stops_recording():
    dev = FakeDevice(0)
    rec = TraceRecorder([dev])
    rec.attach()
    assert dev.trace is rec
    rec.detach()
    assert dev.trace is None


@pytest.mark.parametrize("payload, engine, name", [
    (CodeLaunch(0x10, 0x1040, (1, 1, 1), (1, 1, 1), 0, b""), regs.ENGINE_COMPUTE,
     "code entry 0x1040"),
    (packets.copy(0x1000, 0x2000, 1536), regs.ENGINE_COPY0, "copy D2D 1.5 KiB"),
    (packets.copy(0x1000, 0x2000, 100), regs.ENGINE_COPY1, "copy D2H 100 B"),
    (packets.launch(kernels.KERNEL_FILL, (1, 1, 1), (1, 1, 1), [0, 0, 1]), regs.ENGINE_COMPUTE,
     "fill"),
    (b"".join([packets.launch(kernels.KERNEL_SCALE, (1, 1, 1), (1, 1, 1), [0, 0, 0, 1])] * 3
              + [packets.launch(kernels.KERNEL_FILL, (1, 1, 1), (1, 1, 1), [0, 0, 1]),
                 packets.launch(999, (1, 1, 1), (1, 1, 1), [])]),
     regs.ENGINE_COMPUTE, "scale x3, fill, kernel 999"),  # a batch's job: its runs of kernels
])
def test_describe(payload, engine, name):
    assert describe(payload, engine, ())[0] == name


def test_the_kernels_moves_on_copy_engine_0_are_restores():
    assert describe(packets.copy(0x1000, 0x2000, MiB), regs.ENGINE_COPY0, None)[0] \
        == "copy H2D 1 MiB"


def test_format_size():
    assert [format_size(n) for n in (0, 1023, 1024, 16 * MiB, 3 << 30)] == [
        "0 B", "1023 B", "1 KiB", "16 MiB", "3 GiB"]


# ---------------------------------------------------------------------- a real device
@pytest.fixture
def dev(make_dev):
    return make_dev()


def test_a_traced_device_records_its_jobs_with_their_hardware_times(dev):
    rec = TraceRecorder([dev])
    rec.attach()
    ctx = dev.create_context("traced")
    a, b = ctx.alloc(MiB), ctx.alloc(MiB)
    for _ in range(3):
        ctx.submit_launch(kernels.KERNEL_FILL, 4, 256, [a.va, 0x3F800000, 1024])
        ctx.submit_copy(a.va, b.va, MiB)
    ctx.submit_launch(kernels.KERNEL_BURN, 1, 1, [100]).wait()
    assert dev.wait_idle(30)
    rec.detach()
    events = rec.events()
    compute = _slices(events, regs.ENGINE_COMPUTE)
    copies = _slices(events, regs.ENGINE_COPY0)
    assert [e["name"] for e in compute] == ["fill"] * 3 + ["burn"]
    assert [e["name"] for e in copies] == ["copy D2D 1 MiB"] * 3
    for track in (compute, copies):
        for e in track:
            assert e["dur"] > 0 and e["args"]["context_name"] == "traced"
        for prev, nxt in zip(track, track[1:]):  # in order, never overlapping
            assert _ns(prev["ts"]) + _ns(prev["dur"]) <= _ns(nxt["ts"])
    assert any(e["ph"] == "C" for e in events)  # the two allocations


def test_a_fault_is_an_instant_beside_its_job(dev):
    rec = TraceRecorder([dev])
    rec.attach()
    ctx = dev.create_context()
    f = ctx.submit_launch(kernels.KERNEL_FILL, 1, 256, [0xDEAD0000, 0, 256])  # unmapped
    f.wait(30)
    assert f.error is not None
    rec.detach()
    events = rec.events()
    fault = [e for e in events if e["name"] == "GPU fault"]
    assert len(fault) == 1 and "page fault" in fault[0]["args"]["error"]
    assert [e["args"].get("error") for e in _slices(events)] == [str(f.error)]


def test_an_untraced_device_records_nothing(dev):
    rec = TraceRecorder([dev])
    ctx = dev.create_context()
    ctx.submit_launch(kernels.KERNEL_BURN, 1, 1, [0]).wait()
    assert dev.trace is None and rec.events()[-1]["ph"] == "M"


def test_allocations_and_frees_move_the_vram_counter(dev):
    rec = TraceRecorder([dev])
    rec.attach()
    ctx = dev.create_context()
    bo = ctx.alloc(4 * MiB)
    ctx.free(bo)
    dev.reclaim()
    rec.detach()
    mib = [e["args"]["MiB"] for e in rec.events() if e["ph"] == "C"]
    assert len(mib) >= 3 and max(mib) - mib[0] >= 4 and mib[-1] < max(mib)


def test_an_engine_reset_is_an_instant(make_dev):
    dev = make_dev(job_timeout_ns=200_000_000)
    rec = TraceRecorder([dev])
    rec.attach()
    ctx = dev.create_context("hung")
    hung = ctx.submit_launch(kernels.KERNEL_BURN, 1, 1, [kernels.BURN_FOREVER])
    assert hung.wait(30) and hung.error is not None
    rec.detach()
    resets = [e for e in rec.events() if e["name"] == "engine reset"]
    assert len(resets) == 1
    assert resets[0]["args"]["engine"] == "compute" and resets[0]["args"]["context_name"] == "hung"
