"""The chains of one kick are submitted as one KMD submission batch (host/kmd/batch.py):
their launches reach the compute ring in one commit, and a bad chain among them is
answered with its own error while the others complete."""

import struct
import time

import pytest

from pvgpu.host.hw import regs
from pvgpu.spec import wire
from pvgpu.transport import codec

from test_backend import HDR, Guest, _backend, cmd


@pytest.fixture
def backend():
    yield from _backend(num_gpus=1, hw_limit=32)


def _f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def test_a_kick_of_sixteen_launches_is_one_ring_commit_and_errors_stay_in_their_chain(backend):
    g = Guest(backend)
    g.init(qsize=64)
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    _hdr, body = g.call(cmd(wire.CMD_MEM_ALLOC, (1, 0, 4096), ctx_id=1))
    va, _ = struct.unpack_from(wire.RESP_MEM_ALLOC_FORMAT, body)
    kmd = backend.kmds[0]
    engine = kmd.gpu.engines[regs.ENGINE_COMPUTE]
    ring = kmd.rings[regs.ENGINE_COMPUTE]
    before = (engine.doorbells + engine.sync_kicks, ring.packets_committed)

    chains = []  # (head, response address, expected response type)
    for i in range(17):
        at = (1 << 20) + 1024 * i
        ctx_id = 7 if i == 8 else 1  # chain 8 names a context that does not exist
        launch = cmd(wire.CMD_LAUNCH, (wire.KERNEL_FILL, 1, 1, 1, 1, 1, 1, 3), ctx_id=ctx_id,
                     extra=struct.pack("<QQQ", va + 4 * i, _f32_bits(float(i + 1)), 1))
        g.mem.write(at, launch)
        head = g.queue.add_chain([(at, len(launch))], [(at + (1 << 19), wire.MIN_RESPONSE_SIZE)])
        chains.append((head, at + (1 << 19), i == 8))
    dirty = g.mem.take_dirty()
    g._deliver(backend.handle(g.peer, codec.encode(
        {"op": wire.OP_KICK, "dev": 0, "queue": 0,
         "patches": [[a, k] for k, (a, _n) in enumerate(dirty)]},
        [g.mem.read(a, n) for a, n in dirty]), 0.0))

    done = {}
    deadline = time.monotonic() + 10
    while len(done) < len(chains) and time.monotonic() < deadline:
        done.update(g.queue.pop_used())
        g._deliver(backend.run_completions())
        time.sleep(0.001)
    assert set(done) == {h for h, _r, _bad in chains}
    for head, resp, bad in chains:
        hdr = HDR.unpack_from(g.mem.read(resp, done[head]))
        if bad:
            assert hdr[0] == wire.RESP_ERR_INVALID_CONTEXT_ID, hex(hdr[0])
        else:
            assert hdr[0] == wire.RESP_OK_NODATA, hex(hdr[0])
    after = (engine.doorbells + engine.sync_kicks, ring.packets_committed)
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)  # one commit, one kick

    n = 17
    hdr, body = g.call(cmd(wire.CMD_COPY_D2H, (va, 4 * n), ctx_id=1),
                       writable=max(wire.MIN_RESPONSE_SIZE, wire.CTRL_HDR_SIZE + 4 * n))
    assert hdr[0] == wire.RESP_OK_NODATA
    assert list(struct.unpack(f"<{n}f", body[:4 * n])) == [
        0.0 if i == 8 else float(i + 1) for i in range(n)]
