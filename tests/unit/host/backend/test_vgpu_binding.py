"""Sessions bind to vGPUs at hello (CTL-HELLO-8); a vGPU's memory share is a quota
(SCHED-VGPU-1); its contexts are scheduled and flow-controlled as the session's."""

import struct

import pytest

from pvgpu.host.backend.session import Backend
from pvgpu.host.hw.gpu import Platform
from pvgpu.host.kmd.device import KmdDevice
from pvgpu.host.kmd.sched import VgpuShares
from pvgpu.spec import wire
from tests.unit.host.backend.test_backend import Guest, _backend, cmd

A = VgpuShares("A", compute=50, copy=50, mem=25)
B = VgpuShares("B", compute=50, copy=50, mem=50)


@pytest.fixture
def backend():
    yield from _backend(num_gpus=1, backend_options={"vgpus": (A, B)}, vgpus=(A, B))


def hello(g, **fields):
    return g.request(wire.OP_HELLO, version=[0, 1], name="t", memory="inline", mem_size=4 << 20,
                     **fields)


def test_hello_binds_the_named_vgpu_and_reports_its_shares(backend):
    r = hello(Guest(backend, b"g1"), vgpu="B")
    assert r["ok"] and r["vgpu"] == {"name": "B", "compute": 50, "copy": 50, "mem": 50}  # [CTL-HELLO-8]


def test_unknown_vgpu_is_refused_with_limit_and_creates_no_session(backend):
    g = Guest(backend, b"g1")
    r = hello(g, vgpu="nope")
    assert not r["ok"] and r["error"] == wire.CTL_ERR_LIMIT and "nope" in r["message"]  # [CTL-HELLO-8]
    assert g.peer not in backend.sessions
    assert hello(g, vgpu="A")["ok"]  # may try again


def test_without_a_name_the_least_used_vgpu_is_assigned(backend):
    names = [hello(Guest(backend, f"g{i}".encode()))["vgpu"]["name"] for i in range(4)]
    assert sorted(names) == ["A", "A", "B", "B"]


def test_a_host_without_vgpus_has_no_vgpu_in_the_reply():
    plat = Platform(num_gpus=1, vram_size=16 << 20)
    kmd = KmdDevice(plat.gpus[0])
    kmd.start()
    b = Backend([kmd], heartbeat_ms=100)
    try:
        g = Guest(b, b"g1")
        assert "vgpu" not in hello(g)
        assert hello(Guest(b, b"g2"), vgpu="A")["error"] == wire.CTL_ERR_LIMIT  # [CTL-HELLO-8]
    finally:
        b.shutdown()
        kmd.stop()
        plat.stop()


def test_memory_share_is_enforced_across_the_vgpus_sessions(backend):
    # [SCHED-VGPU-1] beyond the vGPU's memory share MEM_ALLOC fails RESP_ERR_OUT_OF_MEMORY
    kmd = backend.kmds[0]
    limit = kmd.vgpu_mem_limit(A)
    g1, g2 = Guest(backend, b"g1"), Guest(backend, b"g2")
    for g in (g1, g2):
        g.init()  # no vgpu named: the host assigns A and B
    assert backend.sessions[g1.peer].vgpu.name != backend.sessions[g2.peer].vgpu.name
    ga = g1 if backend.sessions[g1.peer].vgpu is A else g2
    ga.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    hdr, _ = ga.call(cmd(wire.CMD_MEM_ALLOC, (1, 0, limit), ctx_id=1))
    assert hdr[0] == wire.RESP_OK_MEM_ALLOC
    hdr, body = ga.call(cmd(wire.CMD_MEM_ALLOC, (2, 0, 4096), ctx_id=1))
    assert hdr[0] == wire.RESP_ERR_OUT_OF_MEMORY
    msg_len = struct.unpack_from(wire.RESP_ERROR_FORMAT, body)[2]
    assert b"share" in body[wire.RESP_ERROR_SIZE:wire.RESP_ERROR_SIZE + msg_len]
    stats = kmd.sched_stats()["vgpus"]["A"]
    assert stats["mem_bytes"] == limit and stats["contexts"] == 1


def test_contexts_are_scheduled_as_the_sessions_vgpu(backend):
    g = Guest(backend, b"g1")
    g.init()
    vgpu = backend.sessions[g.peer].vgpu
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    hdr, _ = g.call(cmd(wire.CMD_LAUNCH, (wire.KERNEL_BURN, 1, 1, 1, 1, 1, 1, 1), ctx_id=1,
                        flags=wire.FLAG_FENCE, fence_id=1, extra=struct.pack("<Q", 2000)))
    assert hdr[0] == wire.RESP_OK_NODATA
    compute = backend.kmds[0].sched_stats()["vgpus"][vgpu.name]["compute"]
    assert compute["jobs"] == 1 and compute["busy_ns"] >= 1_000_000
