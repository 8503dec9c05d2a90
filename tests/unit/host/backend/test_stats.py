"""host/backend/stats.py and the GET_STATS view of a session ([CMD-STATS-4])."""

from __future__ import annotations

import struct

import msgpack

from pvgpu.host.backend.stats import session_usage, session_view
from pvgpu.host.kmd.sched import VgpuShares
from pvgpu.host.hw.regs import ENGINE_NAMES as NAMES
from pvgpu.spec import wire

from test_backend import Guest, _backend, cmd


def _snapshot() -> dict:
    eng = {"busy_ns": 9, "vgpus": {"A": {"busy_ns": 5}, "B": {"busy_ns": 4}}}
    return {"device": 0, "now_ns": 1, "engines": {"compute": eng, "copy0": dict(eng)},
            "vgpus": {"A": {"contexts": 1}, "B": {"contexts": 2}},
            "mem": {"vram_free": 7, "contexts": {"1": {"name": "alice"}, "2": {"name": "bob"},
                                                 "3": {"name": "bob2"}}},
            "timeouts": 0}


def test_cmd_stats_4_the_view_keeps_only_the_sessions_vgpu_and_contexts():
    # [CMD-STATS-4]
    full = _snapshot()
    v = session_view(full, "B", [2, 3])
    assert v["vgpus"] == {"B": {"contexts": 2}}
    assert all(set(e["vgpus"]) == {"B"} for e in v["engines"].values())
    assert v["engines"]["compute"]["busy_ns"] == 9  # device-wide totals stay
    assert set(v["mem"]["contexts"]) == {"2", "3"} and v["mem"]["contexts_total"] == 3
    assert v["mem"]["vram_free"] == 7 and v["timeouts"] == 0
    assert "alice" not in repr(v)
    assert full == _snapshot()  # the KMD's map is not changed


def _hello(g, name, vgpu=None):
    fields = {"vgpu": vgpu} if vgpu else {}
    assert g.request(wire.OP_HELLO, version=[0, 2], name=name, memory="inline",
                     mem_size=1 << 20, **fields)["ok"]


def _stats(g) -> dict:
    hdr, body = g.call(cmd(wire.CMD_GET_STATS), writable=64 << 10)
    assert hdr[0] == wire.RESP_OK_STATS
    (length,) = struct.unpack_from(wire.RESP_STATS_FORMAT, body)
    return msgpack.unpackb(body[wire.RESP_STATS_SIZE:wire.RESP_STATS_SIZE + length], raw=False,
                           strict_map_key=False)


def test_cmd_stats_4_a_second_session_cannot_see_the_first_ones_names():
    # [CMD-STATS-4] two sessions on two vGPUs of a real backend
    vgpus = (VgpuShares("vgpu-alice", 50, 50, 50), VgpuShares("vgpu-bob", 50, 50, 50))
    for backend in _backend(backend_options={"vgpus": vgpus}):
        alice2, bob2 = Guest(backend, b"a2"), Guest(backend, b"b2")
        for g, name, vgpu in ((alice2, "alice-guest", "vgpu-alice"), (bob2, "bob-guest", "vgpu-bob")):
            _init_named(g, name, vgpu)
            g.call(cmd(wire.CMD_CTX_CREATE, (0, f"{name}-ctx".encode()), ctx_id=1))
        seen = _stats(bob2)
        text = repr(seen)
        assert "alice" not in text, text  # no session name, context name or vGPU of alice
        assert seen["session"]["name"] == "bob-guest"
        assert set(seen["vgpus"]) == {"vgpu-bob"}
        assert [c["name"] for c in seen["mem"]["contexts"].values()] == ["bob-guest-ctx"]
        assert seen["mem"]["contexts_total"] == 2
        assert "bob" not in repr(_stats(alice2))


def _init_named(g, name, vgpu):
    """Guest.init with a hello of our own (name, vGPU)."""
    orig = g.request

    def request(op, now=0.0, **fields):
        if op == wire.OP_HELLO:
            fields.update(name=name, vgpu=vgpu)
        return orig(op, now, **fields)
    g.request = request
    g.init()
    g.request = orig


def test_session_usage_sums_contexts_and_keeps_destroyed_ones_time():
    for backend in _backend():
        g = Guest(backend, b"u")
        g.init()
        g.call(cmd(wire.CMD_CTX_CREATE, (0, b"one"), ctx_id=1))
        g.call(cmd(wire.CMD_CTX_CREATE, (0, b"two"), ctx_id=2))
        g.call(cmd(wire.CMD_MEM_ALLOC, (1, 0, 1 << 16), ctx_id=1))
        (session,) = backend.sessions.values()
        compute = session.devices[0].compute
        kctx1 = compute.contexts[1].kmd_ctx
        kctx1.busy_ns[0] += 100  # as the scheduler charges a finished job (engine 0)
        compute.contexts[2].kmd_ctx.busy_ns[1] += 7
        mem = backend.kmds[0].mem_stats()["contexts"]
        u = session_usage(compute, mem, NAMES)
        assert [(c["id"], c["name"]) for c in u["contexts"]] == [(1, "one"), (2, "two")]
        assert u["vram_bytes"] == 1 << 16 and u["evicted_bytes"] == 0
        assert u["busy_ns"] == {"compute": 100, "copy0": 7, "copy1": 0}
        g.call(cmd(wire.CMD_CTX_DESTROY, (), ctx_id=1))
        u = session_usage(compute, backend.kmds[0].mem_stats()["contexts"], NAMES)
        assert [c["id"] for c in u["contexts"]] == [2]
        assert u["busy_ns"] == {"compute": 100, "copy0": 7, "copy1": 0}  # the destroyed context's time stays
