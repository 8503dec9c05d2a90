"""host/backend RESOURCE_EXPORT / IMPORT / REVOKE (spec §6.5.29–§6.5.31, §12) through the
real backend, KMDs and GPUs, with sans-IO guests (test_backend.Guest) as sessions."""

import struct

import numpy as np
import pytest

from pvgpu.host.backend.prime import ResourceExports
from pvgpu.spec import wire

from test_backend import Guest, _backend, cmd, d2h, h2d, scale

EXPORT = struct.Struct(wire.RESP_EXPORT_FORMAT)
IMPORT = struct.Struct(wire.RESP_IMPORT_FORMAT)
ALLOC = struct.Struct(wire.RESP_MEM_ALLOC_FORMAT)
N = 4096  # floats


@pytest.fixture
def backend():
    yield from _backend()


@pytest.fixture
def backend_sockets():
    yield from _backend(topology="sockets")


def guest(backend, name, dev=0):
    g = Guest(backend, name)
    g.init(dev=dev)
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    return g


def alloc(g, rid, size=4 * N):
    hdr, body = g.call(cmd(wire.CMD_MEM_ALLOC, (rid, 0, size), ctx_id=1))
    assert hdr[0] == wire.RESP_OK_MEM_ALLOC
    return ALLOC.unpack_from(body)[0]




def export(g, rid):
    hdr, body = g.call(cmd(wire.CMD_RESOURCE_EXPORT, (rid,), ctx_id=1))
    assert hdr[0] == wire.RESP_OK_EXPORT, hdr
    return EXPORT.unpack_from(body)


def import_(g, handle, token, rid, flags=wire.IMPORT_FLAG_PEER2PEER):
    hdr, body = g.call(cmd(wire.CMD_RESOURCE_IMPORT, (handle, token, rid, flags), ctx_id=1))
    if hdr[0] != wire.RESP_OK_IMPORT:
        return hdr[0], None
    return hdr[0], IMPORT.unpack_from(body)



def test_export_import_across_sessions_and_devices(backend):
    a, b = guest(backend, b"a", dev=0), guest(backend, b"b", dev=1)
    va = alloc(a, 1)
    data = np.arange(N, dtype=np.float32)
    h2d(a, 1, va, data)
    handle, token, size = export(a, 1)
    assert size == 4 * N and token
    code, (vb, size_b, placement) = import_(b, handle, token, 7)
    assert code == wire.RESP_OK_IMPORT and size_b == 4 * N
    assert placement == wire.IMPORT_PLACEMENT_PEER  # switch layout, PEER2PEER asked for
    np.testing.assert_array_equal(d2h(b, 1, vb, N), data)
    scale(b, 1, vb, vb, 3.0, N)  # b writes through its import ...
    np.testing.assert_array_equal(d2h(a, 1, va, N), 3 * data)  # ... into a's buffer
    # two exports are two handles of one buffer
    h2, t2, _ = export(a, 1)
    assert h2 != handle
    code, (vb2, _, _) = import_(b, h2, t2, 8)
    np.testing.assert_array_equal(d2h(b, 1, vb2, N), 3 * data)


def test_without_the_token_or_after_revoke_there_is_no_import(backend):
    # [PRIME-EXPORT-1] without the token there is no import
    a, b = guest(backend, b"a"), guest(backend, b"b")
    alloc(a, 1)
    handle, token, _ = export(a, 1)
    assert import_(b, handle, token ^ 1, 2)[0] == wire.RESP_ERR_PERMISSION
    assert import_(b, handle + 1000, token, 2)[0] == wire.RESP_ERR_PERMISSION
    # only the exporting session revokes
    hdr, _ = b.call(cmd(wire.CMD_RESOURCE_REVOKE, (handle,)))
    assert hdr[0] == wire.RESP_ERR_PERMISSION
    code, _ = import_(b, handle, token, 2)
    assert code == wire.RESP_OK_IMPORT
    hdr, _ = a.call(cmd(wire.CMD_RESOURCE_REVOKE, (handle,)))
    assert hdr[0] == wire.RESP_OK_NODATA
    assert import_(b, handle, token, 3)[0] == wire.RESP_ERR_PERMISSION
    hdr, _ = a.call(cmd(wire.CMD_RESOURCE_REVOKE, (handle,)))
    assert hdr[0] == wire.RESP_ERR_PERMISSION  # already withdrawn


def test_freeing_the_export_stops_imports_but_not_the_importer(backend):
    a, b = guest(backend, b"a"), guest(backend, b"b", dev=1)
    va = alloc(a, 1)
    h2d(a, 1, va, np.full(N, 5.0, np.float32))
    handle, token, _ = export(a, 1)
    _, (vb, _, _) = import_(b, handle, token, 2)
    hdr, _ = a.call(cmd(wire.CMD_MEM_FREE, (1,), ctx_id=1))
    assert hdr[0] == wire.RESP_OK_NODATA
    assert import_(b, handle, token, 3)[0] == wire.RESP_ERR_PERMISSION
    np.testing.assert_array_equal(d2h(b, 1, vb, N), np.full(N, 5.0, np.float32))
    # the exporting session ends: the importer still has the memory
    a.request(wire.OP_BYE)
    np.testing.assert_array_equal(d2h(b, 1, vb, N), np.full(N, 5.0, np.float32))
    assert len(backend.resource_exports) == 0
    hdr, _ = b.call(cmd(wire.CMD_MEM_FREE, (2,), ctx_id=1))  # ends the import
    assert hdr[0] == wire.RESP_OK_NODATA


def test_without_p2p_the_import_is_placed_in_system_memory(backend_sockets):
    a, b = guest(backend_sockets, b"a", dev=0), guest(backend_sockets, b"b", dev=1)
    va = alloc(a, 1)
    data = np.arange(N, dtype=np.float32)
    h2d(a, 1, va, data)
    handle, token, _ = export(a, 1)
    _, (vb, _, placement) = import_(b, handle, token, 2)
    assert placement == wire.IMPORT_PLACEMENT_SYSTEM
    scale(b, 1, vb, vb, 2.0, N)
    np.testing.assert_array_equal(d2h(a, 1, va, N), 2 * data)


def test_same_device_and_no_peer2peer_flag(backend):
    a, b = guest(backend, b"a"), guest(backend, b"b")
    alloc(a, 1)
    handle, token, _ = export(a, 1)
    _, (_, _, placement) = import_(b, handle, token, 2)
    assert placement == wire.IMPORT_PLACEMENT_LOCAL
    c = guest(backend, b"c", dev=1)
    _, (_, _, placement) = import_(c, handle, token, 2, flags=0)
    assert placement == wire.IMPORT_PLACEMENT_SYSTEM  # the importer refused P2P


def test_bad_requests(backend):
    a = guest(backend, b"a")
    alloc(a, 1)
    handle, token, _ = export(a, 1)
    hdr, _ = a.call(cmd(wire.CMD_RESOURCE_EXPORT, (99,), ctx_id=1))
    assert hdr[0] == wire.RESP_ERR_INVALID_RESOURCE_ID
    assert import_(a, handle, token, 1)[0] == wire.RESP_ERR_INVALID_RESOURCE_ID  # id in use
    assert import_(a, handle, token, 0)[0] == wire.RESP_ERR_INVALID_RESOURCE_ID
    assert import_(a, handle, token, 5, flags=2)[0] == wire.RESP_ERR_INVALID_PARAMETER
    code, (va, size, _) = import_(a, handle, token, 5)
    hdr, _ = a.call(cmd(wire.CMD_MEM_MAP, (va, 0, size, 5, 3), ctx_id=1))
    assert hdr[0] == wire.RESP_ERR_INVALID_PARAMETER  # an import is not MEM_MAPped
    # re-exporting an import gives another handle of the same buffer
    h2, t2, _ = export(a, 5)
    assert import_(a, h2, t2, 6)[0] == wire.RESP_OK_IMPORT


class _Buf:
    def __init__(self, exporter=None):
        self.exporter = exporter
        self.puts = 0

    def put(self):
        self.puts += 1


def test_registry_bounds_and_withdrawals():
    reg = ResourceExports(max_per_owner=2)
    a, b = object(), object()
    bufs = [_Buf("gpu0"), _Buf("gpu0"), _Buf("gpu1")]
    h = [reg.export(a, buf) for buf in bufs]
    assert bufs[0].puts == 1 and reg.lookup(*h[0]) is None  # the oldest went
    assert reg.lookup(*h[1]) is bufs[1] and reg.lookup(h[1][0], h[1][1] + 1) is None
    assert not reg.revoke(b, h[1][0]) and reg.count(a) == 2
    reg.withdraw_device(a, "gpu1")
    assert bufs[2].puts == 1 and reg.count(a) == 1
    reg.withdraw_dmabuf(a, bufs[1])
    assert bufs[1].puts == 1 and len(reg) == 0
