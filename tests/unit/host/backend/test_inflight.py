"""host/backend/inflight.py: the backend's own count of its unfinished jobs, which spares
the I/O loop a question to the KMD before every chain and stays exact across
completions, errors and teardown.

Jobs are kept queued deterministically by an EVENT_WAIT on an imported event whose only
fence belongs to the test: every launch of that timeline waits behind it until the test
signals it."""

import struct
import time

import pytest

from pvgpu.host.backend.events import EventSnapshot
from pvgpu.host.backend.inflight import DeviceJobs, SessionJobs
from pvgpu.host.kmd.fence import Fence
from pvgpu.spec import wire
from pvgpu.transport import codec

from anymachine import python_calls
from test_backend import Guest, _backend, cmd

CLIENT_LIMIT = 3


@pytest.fixture
def backend():
    yield from _backend(num_gpus=1, max_client_queued_jobs=CLIENT_LIMIT)


def test_counts_follow_fences_per_session_and_per_device():
    device = DeviceJobs(limit=3)
    a, b = SessionJobs(2, device), SessionJobs(2, device)
    fences = [Fence(0, i) for i in range(3)]
    a.track(fences[0])
    a.track(fences[1])
    b.track(fences[2])
    a.track(Fence.signaled_fence())  # finished on the submitting thread: not counted
    assert (a.count, b.count, device.count) == (2, 1, 3)
    assert not a.room() and not b.room()  # a at its limit; the device at its limit
    fences[0].signal()
    assert (a.count, device.count) == (1, 2) and a.room() and b.room()
    fences[2].signal(error=RuntimeError("fault"))  # an error ends the job as well
    assert (b.count, device.count) == (0, 1)
    fences[1].signal()
    assert (a.count, b.count, device.count) == (0, 0, 0)


def _setup(backend):
    g = Guest(backend)
    g.init(qsize=64)
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    hdr, body = g.call(cmd(wire.CMD_MEM_ALLOC, (1, 0, 4096), ctx_id=1))
    va, _ = struct.unpack_from(wire.RESP_MEM_ALLOC_FORMAT, body)
    return g, va


def _fill(va, value=0, ctx_id=1):
    return cmd(wire.CMD_LAUNCH, (wire.KERNEL_FILL, 1, 1, 1, 4, 1, 1, 3), ctx_id=ctx_id,
               extra=struct.pack("<QQQ", va, value, 4))


def _gate(backend, g):
    """Make the timeline of context 1 wait for a fence of the test's: -> the fence."""
    gate = Fence(-1, 1)
    snapshot = EventSnapshot([gate], clock=backend.kmds[0].clock_ns)
    handle, token = backend.event_exports.export("the test", snapshot)
    assert g.call(cmd(wire.CMD_EVENT_IMPORT, (5, handle, token)))[0][0] == wire.RESP_OK_NODATA
    assert g.call(cmd(wire.CMD_EVENT_WAIT, (5,), ctx_id=1))[0][0] == wire.RESP_OK_NODATA
    return gate


def _jobs(backend, g):
    return backend.sessions[g.peer].devices[0].compute.jobs


def _until(predicate, g, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "never happened"
        g._deliver(g.backend.run_completions())
        time.sleep(0.001)


def test_the_kmd_is_not_asked_for_headroom_below_the_backends_counts(backend, monkeypatch):
    g, va = _setup(backend)
    kmd = backend.kmds[0]
    asked = []
    real = kmd.has_headroom
    monkeypatch.setattr(kmd, "has_headroom", lambda client=None: asked.append(1) or real(client))
    for i in range(20):  # each runs to completion at once: nothing stays unfinished
        assert g.call(_fill(va, i))[0][0] == wire.RESP_OK_NODATA
        assert g.call(cmd(wire.CMD_NOP))[0][0] == wire.RESP_OK_NODATA
    assert asked == []
    assert _jobs(backend, g).count == 0


def test_past_the_session_limit_the_kmd_decides_and_the_queue_stalls(backend, monkeypatch):
    g, va = _setup(backend)
    kmd = backend.kmds[0]
    asked = []
    real = kmd.has_headroom
    monkeypatch.setattr(kmd, "has_headroom", lambda client=None: asked.append(1) or real(client))
    gate = _gate(backend, g)
    bad = 0x3000_0000_0000
    heads = [g.submit(_fill(bad if i == 1 else va, i), at=(1 << 20) + 1024 * i)[0]
             for i in range(CLIENT_LIMIT + 2)]
    jobs = _jobs(backend, g)
    dev = backend.sessions[g.peer].devices[0]
    # CLIENT_LIMIT launches wait behind the gate; the KMD, asked, has no room for more
    assert jobs.count == CLIENT_LIMIT and backend.device_jobs[0].count == CLIENT_LIMIT
    assert asked and dev.stats["stalls"] == 1
    assert len(g.queue.pop_used()) == CLIENT_LIMIT  # the last two stay in the avail ring
    gate.signal()
    done = set()
    _until(lambda: done.update(h for h, _n in g.queue.pop_used()) or done == set(heads[-2:]), g)
    _until(lambda: jobs.count == 0, g)  # the faulting launch (i == 1) ended its count too
    assert backend.device_jobs[0].count == 0


def test_teardown_ends_the_counts_of_cancelled_jobs(backend):
    g, va = _setup(backend)
    gate = _gate(backend, g)
    for i in range(CLIENT_LIMIT):
        g.submit(_fill(va, i), at=(1 << 20) + 1024 * i)
    jobs = _jobs(backend, g)
    assert jobs.count == CLIENT_LIMIT
    g.seq += 1
    g._deliver(backend.handle(g.peer, codec.encode(
        {"op": wire.OP_SET_STATUS, "seq": g.seq, "dev": 0, "status": 0}), 0.0))
    # the queued jobs were cancelled with the device: their fences signalled with an error
    assert jobs.count == 0 and backend.device_jobs[0].count == 0
    gate.signal()


def test_a_chains_headroom_check_does_not_grow_with_the_devices_contexts(backend):
    """The check before each chain is O(1): what one NOP chain costs does not depend on
    how many contexts the device has (the KMD's own check scans them all)."""
    g, _va = _setup(backend)

    def nop_kick_calls():
        at = 1 << 20
        g.mem.write(at, cmd(wire.CMD_NOP))
        head = g.queue.add_chain([(at, wire.CTRL_HDR_SIZE)], [(at + 4096, wire.MIN_RESPONSE_SIZE)])
        dirty = g.mem.take_dirty()
        frames = codec.encode({"op": wire.OP_KICK, "dev": 0, "queue": 0,
                               "patches": [[a, k] for k, (a, _n) in enumerate(dirty)]},
                              [g.mem.read(a, n) for a, n in dirty])
        out = []
        calls = python_calls(lambda: out.extend(backend.handle(g.peer, frames, 0.0)))
        g._deliver(out)
        assert [h for h, _n in g.queue.pop_used()] == [head]
        return calls

    nop_kick_calls()
    few = nop_kick_calls()
    for ctx_id in range(2, 30):
        g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=ctx_id))
    assert nop_kick_calls() == few
