"""The backend never waits inside the KMD (host/kmd/wouldblock.py): a command that would
wait for the GPU is held, the chains behind it on its queue stay in the avail ring (spec
VQ-ORDER-3), and it runs again when the fence it would have waited for signals, while
every other session is served. The busy work is a gate in hardware: a code launch that
spins until the test writes a flag in host memory (tests/hwgate.py), so it is on the
hardware for exactly as long as the test says, however loaded the machine."""

import struct
import time

import numpy as np
import pytest

from hwgate import DEADLINE, SpinGates
from pvgpu.spec import wire

from test_backend import Guest, _backend, cmd, d2h, h2d, ok

MiB = 1 << 20
ALLOC = struct.Struct(wire.RESP_MEM_ALLOC_FORMAT)


@pytest.fixture
def backend():
    # no job timeout or KMD wait may run out while a gate is closed, however slow the test
    yield from _backend(num_gpus=1, timeout=DEADLINE, job_timeout_ns=int(600e9))


def answered(g) -> dict:
    """{head: used length} of g's chains returned since the last look, after the backend
    ran its completions."""
    g._deliver(g.backend.run_completions())
    return dict(g.queue.pop_used())


def await_answers(g, heads) -> dict:
    """{head: used length} once every chain of `heads` was returned (DEADLINE bound)."""
    got, end = {}, time.monotonic() + DEADLINE
    while not set(heads) <= set(got):
        assert time.monotonic() < end, f"chains {set(heads) - set(got)} never answered"
        got.update(answered(g))
        time.sleep(0.001)
    return got


def mem_alloc(size):
    return cmd(wire.CMD_MEM_ALLOC, (5, 0, size), ctx_id=1), wire.RESP_OK_MEM_ALLOC


def shm_get(size):
    return cmd(wire.CMD_SHM_GET, (wire.SHM_KEY_PRIVATE, size, 0)), wire.RESP_OK_SHM


@pytest.mark.parametrize("command", [mem_alloc, shm_get])
def test_allocation_blocked_on_busy_victims_keeps_other_sessions_served(backend, command):
    # [FENCE-HOLD-3] the chain is held, other sessions are served, then it is answered
    kmd = backend.kmds[0]
    busy = kmd.create_context("busy")  # another client of the same KMD
    gates = SpinGates(kmd, busy)
    victim = busy.alloc(20 * MiB)
    gates.close()
    a, b = Guest(backend, b"a"), Guest(backend, b"b")
    for g in (a, b):
        g.init()
        ok(g, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    size = kmd.vram_free() + MiB  # fits only once the busy context's buffer is evicted
    request, resp = command(size)
    alloc, alloc_resp = a.submit(request)
    # a's next chain stays behind the blocked allocation (VQ-ORDER-3)
    later, _ = a.submit(cmd(wire.CMD_NOP, ctx_id=1), at=2 * MiB)
    assert answered(a) == {}

    ok(b, cmd(wire.CMD_NOP))  # the other session is served at once...
    arr = np.arange(1024, dtype=np.float32)
    body = ok(b, cmd(wire.CMD_MEM_ALLOC, (1, 0, arr.nbytes), ctx_id=1),
              resp=wire.RESP_OK_MEM_ALLOC)
    h2d(b, 1, ALLOC.unpack_from(body)[0], arr)  # ...GPU work included
    assert np.array_equal(d2h(b, 1, ALLOC.unpack_from(body)[0], arr.size), arr)
    assert answered(a) == {}, "the allocation did not wait for the busy context"
    assert not victim.evicted

    gates.open()
    done = await_answers(a, (alloc, later))
    hdr = struct.unpack_from(wire.CTRL_HDR_FORMAT, a.mem.read(alloc_resp, done[alloc]))
    assert hdr[0] == resp and victim.evicted
    assert backend.sessions[a.peer].devices[0].stats["blocked"] >= 1
    if command is mem_alloc:  # the allocation works
        va, got = ALLOC.unpack_from(a.mem.read(alloc_resp + wire.CTRL_HDR_SIZE, ALLOC.size))
        assert got >= size
        h2d(a, 1, va, arr)
        assert np.array_equal(d2h(a, 1, va, arr.size), arr)


@pytest.fixture
def backend_no_wait():
    yield from _backend(num_gpus=1, timeout=0, job_timeout_ns=int(600e9))


def test_blocked_allocation_gives_out_of_memory_once_the_timeout_passed(backend_no_wait):
    """Re-driven after the KMD's timeout and still blocked: answered with the error the
    KMD's own wait would have ended in, and the queue goes on."""
    # [FENCE-HOLD-3] giving up after the KMD's timeout answers RESP_ERR_OUT_OF_MEMORY
    backend = backend_no_wait
    kmd = backend.kmds[0]
    busy = kmd.create_context("busy")
    gates = SpinGates(kmd, busy)
    busy.alloc(20 * MiB)
    gates.close()
    gates.close()  # a second job: the context stays busy after the first one
    a = Guest(backend, b"a")
    a.init()
    ok(a, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    alloc, alloc_resp = a.submit(cmd(wire.CMD_MEM_ALLOC, (5, 0, kmd.vram_free() + MiB),
                                     ctx_id=1))
    later, _ = a.submit(cmd(wire.CMD_NOP, ctx_id=1), at=2 * MiB)
    assert answered(a) == {}
    gates.open(0)
    done = await_answers(a, (alloc, later))
    hdr = struct.unpack_from(wire.CTRL_HDR_FORMAT, a.mem.read(alloc_resp, done[alloc]))
    assert hdr[0] == wire.RESP_ERR_OUT_OF_MEMORY
    gates.open(1)
