"""What the host keeps of a session once it has ended (spec §10.1): nothing. Sessions
come and go through Backend.handle with sans-IO guests, each holding contexts, buffers,
events and exports on both devices; afterwards every per-session registry of the
backend and the KMDs is empty and no session object is reachable."""

import gc
import time
import weakref

import pytest

from pvgpu.spec import wire

from test_backend import Guest, _backend, cmd


@pytest.fixture
def backend():
    yield from _backend()


def busy_session(backend, name: bytes, dev: int) -> Guest:
    """A session with two contexts, buffers, recorded and exported events and an exported
    buffer on device `dev`."""
    g = Guest(backend, name)
    g.init(dev=dev)
    for ctx in (1, 2):
        assert g.call(cmd(wire.CMD_CTX_CREATE, (0, b"release"), ctx_id=ctx))[0][0] == wire.RESP_OK_NODATA
        assert g.call(cmd(wire.CMD_MEM_ALLOC, (ctx, 0, 64 << 10), ctx_id=ctx))[0][0] == wire.RESP_OK_MEM_ALLOC
    for event in (1, 2):
        assert g.call(cmd(wire.CMD_EVENT_RECORD, (event,), ctx_id=1))[0][0] == wire.RESP_OK_NODATA
        assert g.call(cmd(wire.CMD_EVENT_EXPORT, (event,), ctx_id=1))[0][0] == wire.RESP_OK_EVENT_HANDLE
    assert g.call(cmd(wire.CMD_RESOURCE_EXPORT, (1,), ctx_id=1))[0][0] == wire.RESP_OK_EXPORT
    return g


def settle(backend, refs, timeout=30.0) -> None:
    """Let the engines finish and the backend run what they posted (a completion posted
    for an ended session holds it until then), until no session object is alive."""
    deadline = time.monotonic() + timeout
    while True:
        for kmd in backend.kmds:
            kmd.wait_idle(5.0)
        backend.run_completions()
        gc.collect()
        if all(r() is None for r in refs) or time.monotonic() > deadline:
            return
        time.sleep(0.01)


def test_ended_sessions_leave_nothing_behind(backend):
    refs = []
    for i in range(6):
        g = busy_session(backend, f"g{i}".encode(), dev=i % 2)
        session = backend.sessions[g.peer]
        refs.append(weakref.ref(session))
        devices = [weakref.ref(d) for d in session.devices]
        refs += devices
        if i % 3 == 2:  # some end silently: reclaimed on heartbeat loss
            backend.expire(10.0 * (i + 1))
        else:
            assert g.request(wire.OP_BYE)["ok"]
        del g, session
    settle(backend, refs)
    assert not backend.sessions and not backend._routes
    assert backend.pending_releases() == 0 and not backend._inflight
    assert len(backend.event_exports) == 0 and len(backend.resource_exports) == 0
    assert all(j.count == 0 for j in backend.device_jobs)
    for kmd in backend.kmds:
        assert not kmd.contexts
        assert all(not s.queued() and not s.entities for s in kmd.schedulers)
        assert kmd.gpu.sysmem.num_mappings == 0
    assert [r for r in refs if r() is not None] == []
