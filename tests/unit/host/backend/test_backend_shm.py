"""host/backend SHM_* commands (spec §6.5.19–§6.5.24, §6.6): shared device memory through
the real backend, KMD and GPU, with sans-IO guests (test_backend.Guest) as two sessions."""

import struct

import numpy as np
import pytest

from pvgpu.host.backend.session import Backend
from pvgpu.host.backend.shm import ShmTable
from pvgpu.host.hw.gpu import Platform
from pvgpu.host.kmd.device import KmdDevice
from pvgpu.host.kmd.sched import VgpuShares
from pvgpu.spec import wire

from test_backend import Guest, _backend, cmd, d2h, h2d, ok, scale

SHM = struct.Struct(wire.RESP_SHM_FORMAT)
ATTACH = struct.Struct(wire.RESP_SHM_ATTACH_FORMAT)
HANDLE = struct.Struct(wire.RESP_SHM_HANDLE_FORMAT)
STAT = struct.Struct(wire.RESP_SHM_STAT_FORMAT)


@pytest.fixture
def backend():
    yield from _backend()


def guest(backend, name):
    g = Guest(backend, name)
    g.init()
    return g



def err(g, command):
    hdr, _ = g.call(command)
    assert wire.is_error_response(hdr[0])
    return hdr[0]


def shm_get(g, key, size, flags=0):
    return SHM.unpack_from(ok(g, cmd(wire.CMD_SHM_GET, (key, size, flags)), wire.RESP_OK_SHM))


def attach(g, ctx, shm_id, flags=0):
    return ATTACH.unpack_from(ok(g, cmd(wire.CMD_SHM_ATTACH, (shm_id, flags), ctx_id=ctx),
                                 wire.RESP_OK_SHM_ATTACH))


def stat(g, shm_id, ctx=0):
    return STAT.unpack_from(ok(g, cmd(wire.CMD_SHM_CONTROL, (shm_id, wire.SHM_CTL_STAT),
                                      ctx_id=ctx), wire.RESP_OK_SHM_STAT))





def test_get_attach_and_share_between_two_contexts_of_a_session(backend):
    g = guest(backend, b"g1")
    for c in (1, 2):
        ok(g, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=c))
    shm_id, flags, size = shm_get(g, 0xCAFE, 5000)
    assert shm_id != 0 and flags == wire.SHM_FLAG_CREATED and size == 8192
    assert shm_get(g, 0xCAFE, 8192) == (shm_id, 0, 8192)  # the same segment, not created
    assert shm_get(g, 0xCAFE, 0) == (shm_id, 0, 8192)
    va1, s1 = attach(g, 1, shm_id)
    va2, _ = attach(g, 2, shm_id)
    assert s1 == 8192 and wire.VA_USER_BASE <= va1 < wire.VA_USER_LIMIT
    data = np.arange(2048, dtype=np.float32)
    h2d(g, 1, va1, data)
    scale(g, 2, va2, va2, 3.0, 2048)  # in place, in the other context
    assert np.array_equal(d2h(g, 1, va1, 2048), 3 * data)
    assert stat(g, shm_id, ctx=2) == (8192, va2, 2, wire.SHM_STAT_CREATOR)
    assert stat(g, shm_id) == (8192, 0, 2, wire.SHM_STAT_CREATOR)
    ok(g, cmd(wire.CMD_SHM_DETACH, (shm_id,), ctx_id=2))
    assert err(g, cmd(wire.CMD_SHM_DETACH, (shm_id,), ctx_id=2)) == wire.RESP_ERR_INVALID_SEGMENT
    assert stat(g, shm_id, ctx=2)[1:3] == (0, 1)


def test_errors(backend):
    g = guest(backend, b"g1")
    ok(g, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    shm_id, _, _ = shm_get(g, 1, 4096)
    assert err(g, cmd(wire.CMD_SHM_GET, (2, 4096, 1))) == wire.RESP_ERR_INVALID_PARAMETER
    assert err(g, cmd(wire.CMD_SHM_GET, (1, 8192, 0))) == wire.RESP_ERR_INVALID_PARAMETER
    assert err(g, cmd(wire.CMD_SHM_GET, (3, 0, 0))) == wire.RESP_ERR_INVALID_SEGMENT
    assert err(g, cmd(wire.CMD_SHM_GET, (3, 1 << 40, 0))) == wire.RESP_ERR_OUT_OF_MEMORY
    for bad in (0, shm_id + 1):
        assert err(g, cmd(wire.CMD_SHM_ATTACH, (bad, 0), ctx_id=1)) == wire.RESP_ERR_INVALID_SEGMENT
        assert err(g, cmd(wire.CMD_SHM_CONTROL, (bad, 0))) == wire.RESP_ERR_INVALID_SEGMENT
        assert err(g, cmd(wire.CMD_SHM_EXPORT, (bad,))) == wire.RESP_ERR_INVALID_SEGMENT
    assert err(g, cmd(wire.CMD_SHM_ATTACH, (shm_id, 0), ctx_id=9)) == wire.RESP_ERR_INVALID_CONTEXT_ID
    assert err(g, cmd(wire.CMD_SHM_ATTACH, (shm_id, 2), ctx_id=1)) == wire.RESP_ERR_INVALID_PARAMETER
    attach(g, 1, shm_id)
    assert err(g, cmd(wire.CMD_SHM_ATTACH, (shm_id, 0), ctx_id=1)) == wire.RESP_ERR_INVALID_PARAMETER
    assert err(g, cmd(wire.CMD_SHM_CONTROL, (shm_id, 7))) == wire.RESP_ERR_INVALID_PARAMETER
    assert err(g, cmd(wire.CMD_SHM_IMPORT, (12345, 678))) == wire.RESP_ERR_PERMISSION


def test_export_import_across_sessions_and_permissions(backend):
    a, b = guest(backend, b"a"), guest(backend, b"b")
    ok(a, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    ok(b, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    shm_a, _, _ = shm_get(a, 42, 1 << 20)
    # b's key 42 is another segment: keys are private to the session
    shm_b, flags, _ = shm_get(b, 42, 1 << 20)
    assert flags == wire.SHM_FLAG_CREATED
    va_a, _ = attach(a, 1, shm_a)
    h2d(a, 1, va_a, np.full(1024, 7, np.float32))
    handle, token = HANDLE.unpack_from(ok(a, cmd(wire.CMD_SHM_EXPORT, (shm_a,)), wire.RESP_OK_SHM_HANDLE))
    assert HANDLE.unpack_from(ok(a, cmd(wire.CMD_SHM_EXPORT, (shm_a,)),
                                 wire.RESP_OK_SHM_HANDLE)) == (handle, token)
    assert err(b, cmd(wire.CMD_SHM_IMPORT, (handle, token ^ 1))) == wire.RESP_ERR_PERMISSION
    imp, flags, size = SHM.unpack_from(ok(b, cmd(wire.CMD_SHM_IMPORT, (handle, token)), wire.RESP_OK_SHM))
    assert flags == 0 and size == 1 << 20 and imp != shm_b
    assert SHM.unpack_from(ok(b, cmd(wire.CMD_SHM_IMPORT, (handle, token)), wire.RESP_OK_SHM))[0] == imp
    va_b, _ = attach(b, 1, imp)
    assert np.all(d2h(b, 1, va_b, 1024) == 7)
    assert stat(b, imp, ctx=1) == (1 << 20, va_b, 2, 0)  # not the creator
    # only the creator removes or exports
    assert err(b, cmd(wire.CMD_SHM_CONTROL, (imp, wire.SHM_CTL_RMID))) == wire.RESP_ERR_PERMISSION
    assert err(b, cmd(wire.CMD_SHM_EXPORT, (imp,))) == wire.RESP_ERR_PERMISSION
    # the other device does not know the handle
    kmd1 = backend.kmds[1]
    assert kmd1.shm._exports == {}


def test_remove_while_attached_and_free_on_last_detach(backend):
    a, b = guest(backend, b"a"), guest(backend, b"b")
    kmd = backend.kmds[0]
    baseline = kmd.vram_free()
    for g in (a, b):
        ok(g, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    shm_a, _, _ = shm_get(a, 9, 4 << 20)
    handle, token = HANDLE.unpack_from(ok(a, cmd(wire.CMD_SHM_EXPORT, (shm_a,)), wire.RESP_OK_SHM_HANDLE))
    imp = SHM.unpack_from(ok(b, cmd(wire.CMD_SHM_IMPORT, (handle, token)), wire.RESP_OK_SHM))[0]
    attach(a, 1, shm_a)
    va_b, _ = attach(b, 1, imp)
    attached = kmd.vram_free()  # (page tables stay until their VM goes)
    ok(a, cmd(wire.CMD_SHM_CONTROL, (shm_a, wire.SHM_CTL_RMID)))
    ok(a, cmd(wire.CMD_SHM_CONTROL, (shm_a, wire.SHM_CTL_RMID)))  # idempotent
    assert stat(a, shm_a)[2:] == (2, wire.SHM_STAT_REMOVED | wire.SHM_STAT_CREATOR)
    assert err(a, cmd(wire.CMD_SHM_GET, (9, 0, 0))) == wire.RESP_ERR_INVALID_SEGMENT  # key freed
    ok(a, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=2))
    assert err(a, cmd(wire.CMD_SHM_ATTACH, (shm_a, 0), ctx_id=2)) == wire.RESP_ERR_INVALID_SEGMENT
    assert err(b, cmd(wire.CMD_SHM_IMPORT, (handle, token))) == wire.RESP_ERR_PERMISSION  # withdrawn
    ok(a, cmd(wire.CMD_CTX_DESTROY, ctx_id=2))
    ok(a, cmd(wire.CMD_SHM_DETACH, (shm_a,), ctx_id=1))
    h2d(b, 1, va_b, np.ones(16, np.float32))  # b's attachment still works
    assert kmd.vram_free() == attached
    ok(b, cmd(wire.CMD_SHM_DETACH, (imp,), ctx_id=1))
    assert kmd.vram_free() == attached + (4 << 20)
    # ids of a dead segment are gone
    assert err(a, cmd(wire.CMD_SHM_CONTROL, (shm_a, wire.SHM_CTL_STAT))) == wire.RESP_ERR_INVALID_SEGMENT
    assert err(b, cmd(wire.CMD_SHM_CONTROL, (imp, wire.SHM_CTL_STAT))) == wire.RESP_ERR_INVALID_SEGMENT
    for g in (a, b):
        assert g.request(wire.OP_BYE)["ok"]
    assert kmd.vram_free() == baseline


def test_reclaim_of_the_creator_removes_and_of_an_importer_detaches(backend):
    a, b = guest(backend, b"a"), guest(backend, b"b")
    kmd = backend.kmds[0]
    baseline = kmd.vram_free()
    for g in (a, b):
        ok(g, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    shm_a, _, _ = shm_get(a, 1, 1 << 20)
    va_a, _ = attach(a, 1, shm_a)
    h2d(a, 1, va_a, np.full(256, 4, np.float32))
    imp = SHM.unpack_from(ok(b, cmd(wire.CMD_SHM_IMPORT, HANDLE.unpack_from(
        ok(a, cmd(wire.CMD_SHM_EXPORT, (shm_a,)), wire.RESP_OK_SHM_HANDLE))), wire.RESP_OK_SHM))[0]
    va_b, _ = attach(b, 1, imp)
    assert a.request(wire.OP_BYE)["ok"]  # the creator goes: its segment is removed...
    seg = backend.sessions[b.peer].devices[0].compute.shm.ids[imp]
    assert seg.removed and not seg.released
    assert np.all(d2h(b, 1, va_b, 256) == 4)  # ... but b keeps its attachment
    assert stat(b, imp, ctx=1) == (1 << 20, va_b, 1, wire.SHM_STAT_REMOVED)
    assert kmd.sched_stats()["shm"]["segments"] == 1
    assert b.request(wire.OP_BYE)["ok"]  # the importer goes: detached, and so freed
    assert seg.released and kmd.vram_free() == baseline
    assert kmd.shm.segments == {}

    # an importer that dies leaves the creator's segment alone
    a, b = guest(backend, b"a2"), guest(backend, b"b2")
    for g in (a, b):
        ok(g, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    shm_a, _, _ = shm_get(a, 1, 1 << 20)
    imp = SHM.unpack_from(ok(b, cmd(wire.CMD_SHM_IMPORT, HANDLE.unpack_from(
        ok(a, cmd(wire.CMD_SHM_EXPORT, (shm_a,)), wire.RESP_OK_SHM_HANDLE))), wire.RESP_OK_SHM))[0]
    attach(b, 1, imp)
    assert stat(a, shm_a)[2] == 1
    assert a.request(wire.OP_PING, now=10.0)["ok"]
    backend.expire(now=10.1)  # b was silent: reclaimed by heartbeat
    assert b.peer not in backend.sessions and a.peer in backend.sessions
    assert stat(a, shm_a)[2:] == (0, wire.SHM_STAT_CREATOR)  # detached, not removed
    assert a.request(wire.OP_BYE)["ok"]
    assert kmd.shm.segments == {} and kmd.vram_free() == baseline


def test_device_reset_removes_the_sessions_segments(backend):
    g = guest(backend, b"g")
    kmd = backend.kmds[0]
    baseline = kmd.vram_free()
    ok(g, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    shm_id, _, _ = shm_get(g, 5, 2 << 20)
    attach(g, 1, shm_id)
    assert g.request(wire.OP_SET_STATUS, dev=0, status=0)["ok"]
    assert kmd.vram_free() == baseline and kmd.shm.segments == {}


def test_vgpu_memory_share_counts_segments():
    A = VgpuShares("A", mem=25)
    plat = Platform(num_gpus=1, vram_size=32 << 20)
    kmd = KmdDevice(plat.gpus[0], vgpus=(A,))
    kmd.start()
    backend = Backend([kmd], heartbeat_ms=100, vgpus=(A,))
    try:
        g = guest(backend, b"g")
        limit = kmd.vgpu_mem_limit(A)
        half = limit // 2 // 4096 * 4096
        shm_get(g, 1, half)
        assert err(g, cmd(wire.CMD_SHM_GET, (2, limit - half + 4096, 0))) == wire.RESP_ERR_OUT_OF_MEMORY
        ok(g, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
        assert err(g, cmd(wire.CMD_MEM_ALLOC, (1, 0, limit - half + 4096), ctx_id=1)) == \
            wire.RESP_ERR_OUT_OF_MEMORY
        ok(g, cmd(wire.CMD_MEM_ALLOC, (1, 0, limit - half), ctx_id=1), wire.RESP_OK_MEM_ALLOC)
        assert kmd.sched_stats()["vgpus"]["A"]["mem_bytes"] == limit
    finally:
        backend.shutdown()
        kmd.stop()
        plat.stop()


def test_id_table_limit(backend):
    g = guest(backend, b"g")
    backend.sessions[g.peer].devices[0].compute.shm.limit = 2
    a = shm_get(g, 1, 4096)[0]
    shm_get(g, 2, 4096)
    assert shm_get(g, 1, 4096)[0] == a  # an existing segment still has its id
    before = len(backend.kmds[0].shm.segments)
    assert err(g, cmd(wire.CMD_SHM_GET, (3, 4096, 0))) == wire.RESP_ERR_LIMIT
    assert len(backend.kmds[0].shm.segments) == before  # nothing left behind
    ok(g, cmd(wire.CMD_SHM_CONTROL, (a, wire.SHM_CTL_RMID)))  # dead: its id is free
    shm_get(g, 3, 4096)


def test_shm_table_ids():
    class Seg:
        dead = released = False
    t = ShmTable(limit=3)
    s1, s2 = Seg(), Seg()
    assert t.bind(s1) == 1 and t.bind(s1) == 1 and t.bind(s2) == 2
    s1.dead = True
    t.purge()
    assert t.id_of(s1) is None and t.bind(Seg()) == 3
