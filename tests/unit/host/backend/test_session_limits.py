"""Per-session limits (spec §10.3): one session is driven to every limit and gets `limit`
(CTL_ERR_LIMIT at hello, RESP_ERR_LIMIT for device commands, [DEV-LIMIT-1]/[DEV-LIMIT-2]),
exports beyond the bound withdraw the oldest ([DEV-LIMIT-3]), and another session carries
on unaffected ([DEV-LIMIT-5]). The limits are lowered for the test; the defaults are the
constants of spec/wire."""

import dataclasses
import struct

import pytest

from pvgpu.host.backend import commands
from pvgpu.spec import wire

from test_backend import Guest, _backend, cmd, ok

HANDLE = struct.Struct(wire.RESP_EVENT_HANDLE_FORMAT)
EXPORT = struct.Struct(wire.RESP_EXPORT_FORMAT)
VA = struct.Struct(wire.RESP_VA_FORMAT)
N = 2  # every lowered limit


@pytest.fixture
def backend(monkeypatch):
    monkeypatch.setattr(wire, "MAX_CONTEXTS", N)
    monkeypatch.setattr(wire, "MAX_EVENTS", N)
    monkeypatch.setattr(commands, "GUEST_CONTEXT_LIMITS", dataclasses.replace(
        commands.GUEST_CONTEXT_LIMITS, max_va_reservations=N, max_va_mappings=N, max_imports=N))
    yield from _backend(backend_options={"max_sessions": 2})


def session(backend, name: bytes) -> Guest:
    g = Guest(backend, name)
    g.init()
    backend.sessions[g.peer].devices[0].compute.shm.limit = N
    return g


def limited(g, command) -> bool:
    """Whether `command` completes with RESP_ERR_LIMIT."""
    return g.call(command)[0][0] == wire.RESP_ERR_LIMIT


def fill_and_overflow(g, make, ok_resp=wire.RESP_OK_NODATA):
    """Run make(i) for i in 1..N (each succeeds), then make(N + 1); -> whether that was
    refused with RESP_ERR_LIMIT."""
    bodies = [ok(g, make(i), ok_resp) for i in range(1, N + 1)]
    return limited(g, make(N + 1)), bodies


def ctx(i):
    return cmd(wire.CMD_CTX_CREATE, (0, b"limits"), ctx_id=i)


def alloc(ctx_id, rid, size=64 << 10):
    return cmd(wire.CMD_MEM_ALLOC, (rid, 0, size), ctx_id=ctx_id)


def test_one_session_reaches_every_limit_and_another_carries_on(backend):
    """[DEV-LIMIT-2] every count refused with RESP_ERR_LIMIT; [DEV-LIMIT-5] only for a."""
    a, b = session(backend, b"a"), session(backend, b"b")

    def b_carries_on():
        ok(b, cmd(wire.CMD_NOP))

    # contexts (per session and device): b's own count is untouched by a's
    refused, _ = fill_and_overflow(a, ctx)
    assert refused
    b_carries_on()
    assert not limited(b, ctx(1)) and not limited(b, ctx(2)) and limited(b, ctx(3))
    ok(a, cmd(wire.CMD_CTX_DESTROY, ctx_id=2))  # destroying makes room again
    ok(a, ctx(2))

    # events, recorded or imported
    record = lambda i: cmd(wire.CMD_EVENT_RECORD, (i,), ctx_id=1)  # noqa: E731
    refused, _ = fill_and_overflow(a, record)
    assert refused
    ok(a, record(1))  # re-recording is not a new event
    b_carries_on()
    ok(b, record(1))
    handle = HANDLE.unpack(ok(b, cmd(wire.CMD_EVENT_EXPORT, (1,), ctx_id=1),
                              wire.RESP_OK_EVENT_HANDLE)[:HANDLE.size])
    assert limited(a, cmd(wire.CMD_EVENT_IMPORT, (N + 1, *handle), ctx_id=1))

    # shared segment ids
    shm = lambda i: cmd(wire.CMD_SHM_GET, (i, 4096, 0))  # noqa: E731
    refused, _ = fill_and_overflow(a, shm, wire.RESP_OK_SHM)
    assert refused
    b_carries_on()
    ok(b, shm(N + 1), wire.RESP_OK_SHM)

    # VA reservations and mappings (per context)
    reserve = lambda i: cmd(wire.CMD_VA_RESERVE, (1 << 20, 0), ctx_id=1)  # noqa: E731
    refused, bodies = fill_and_overflow(a, reserve, wire.RESP_OK_VA)
    assert refused
    va = VA.unpack(bodies[0][:VA.size])[0]
    ok(a, alloc(1, 1), wire.RESP_OK_MEM_ALLOC)
    mem_map = lambda i: cmd(wire.CMD_MEM_MAP, (va + (i - 1) * (64 << 10), 0, 64 << 10, 1,  # noqa: E731
                                               wire.MEM_MAP_ACCESS_READ | wire.MEM_MAP_ACCESS_WRITE),
                            ctx_id=1)
    refused, _ = fill_and_overflow(a, mem_map)
    assert refused
    b_carries_on()
    ok(b, reserve(1), wire.RESP_OK_VA)

    # imports (per context) of a buffer b exported
    ok(b, alloc(1, 1), wire.RESP_OK_MEM_ALLOC)
    handle, token, _size = EXPORT.unpack(ok(b, cmd(wire.CMD_RESOURCE_EXPORT, (1,), ctx_id=1),
                                            wire.RESP_OK_EXPORT)[:EXPORT.size])
    imp = lambda i: cmd(wire.CMD_RESOURCE_IMPORT, (handle, token, 100 + i, 0), ctx_id=2)  # noqa: E731
    refused, _ = fill_and_overflow(a, imp, wire.RESP_OK_IMPORT)
    assert refused
    b_carries_on()

    # nothing of it stopped a's queue: a is served as before
    ok(a, cmd(wire.CMD_NOP))


def test_sessions_beyond_the_hosts_limit_are_refused_at_hello(backend):
    """[DEV-LIMIT-1] a hello beyond the session limit is `limit`; [DEV-LIMIT-5] the others go on."""
    a, b = session(backend, b"a"), session(backend, b"b")
    c = Guest(backend, b"c")
    reply = c.request(wire.OP_HELLO, version=list(wire.PROTOCOL_VERSION), name="c",
                      memory=wire.MEMORY_INLINE, mem_size=4 << 20)
    assert not reply["ok"] and reply["error"] == wire.CTL_ERR_LIMIT
    ok(a, cmd(wire.CMD_NOP))
    assert b.request(wire.OP_BYE)["ok"]
    session(backend, b"c")  # b's end made room


def test_exports_beyond_the_bound_withdraw_the_oldest(backend, monkeypatch):
    monkeypatch.setattr(wire, "MAX_EVENTS", N + 1)
    a, b = session(backend, b"a"), session(backend, b"b")
    backend.event_exports.max_per_owner = N
    ok(a, ctx(1))
    ok(b, ctx(1))
    handles = []
    for i in range(1, N + 2):
        ok(a, cmd(wire.CMD_EVENT_RECORD, (i,), ctx_id=1))
        handles.append(HANDLE.unpack(ok(a, cmd(wire.CMD_EVENT_EXPORT, (i,), ctx_id=1),
                                        wire.RESP_OK_EVENT_HANDLE)[:HANDLE.size]))
    assert backend.event_exports.count(backend.sessions[a.peer]) == N
    oldest, newest = handles[0], handles[-1]
    assert b.call(cmd(wire.CMD_EVENT_IMPORT, (1, *oldest), ctx_id=1))[0][0] == wire.RESP_ERR_INVALID_EVENT
    ok(b, cmd(wire.CMD_EVENT_IMPORT, (2, *newest), ctx_id=1))
