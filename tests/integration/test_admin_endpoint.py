"""The host's admin endpoint with a real host (spec §13) and what guests no longer see (CMD-STATS-4)."""

from __future__ import annotations

import os
import stat

import msgpack
import numpy as np
import pytest
import zmq

from pvgpu import guest
from pvgpu.transport.admin import AdminClient, admin_endpoint_for

VGPUS = ["--vgpu", "vA:compute=50,copy=50,mem=50", "--vgpu", "vB:compute=50,copy=50,mem=50"]
N = 1 << 16


@pytest.fixture
def host(host_factory, tmp_endpoint):
    return host_factory([tmp_endpoint], vram="64M", extra_args=VGPUS)


def _work(ctx) -> None:
    a = np.arange(N, dtype=np.float32)
    da, db, dc = ctx.to_device(a), ctx.to_device(a), ctx.empty(N)
    ctx.launch("vector_add", grid=N // 256, block=256, args=(da, db, dc, N))
    assert np.array_equal(dc.to_host(), a + a)


def test_ctl_admin_4_stats_shows_every_session_with_its_peer(host):
    # [CTL-ADMIN-4] two guests on two vGPUs; the admin endpoint sees both, with names and pids
    admin_ep = admin_endpoint_for(host.endpoint)
    d = os.path.dirname(admin_ep[len("ipc://"):])
    assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700  # [CTL-ADMIN-1]
    with guest.connect(host.endpoint, name="alice", vgpu="vA", mem_size=16 << 20) as a, \
            guest.connect(host.endpoint, name="bob", vgpu="vB", mem_size=16 << 20) as b:
        ca = a.devices[0].create_context(name="alice-ctx")
        cb = b.devices[1].create_context(name="bob-ctx")
        _work(ca)
        with AdminClient(admin_ep) as admin:
            st = admin.request("stats")
        assert st["host"]["pid"] == host.proc.pid and host.endpoint in st["host"]["endpoints"]
        assert [(dv["device"], dv["vram_size"]) for dv in st["devices"]] == [(0, 64 << 20), (1, 64 << 20)]
        assert set(st["devices"][0]["vgpus"]) >= {"vA", "vB"}  # every vGPU, unlike GET_STATS
        sessions = {s["name"]: s for s in st["sessions"]}
        assert set(sessions) == {"alice", "bob"}
        alice, bob = sessions["alice"], sessions["bob"]
        assert alice["peer"]["transport"] == "ipc" and alice["peer"]["pid"] == os.getpid()
        assert (alice["vgpu"], bob["vgpu"], alice["key"]) == ("vA", "vB", None)
        assert alice["memory"] == "shared" and alice["mem_size"] == 16 << 20
        (used,) = [u for u in alice["devices"] if u["contexts"]]
        assert used["device"] == 0 and [c["name"] for c in used["contexts"]] == ["alice-ctx"]
        assert used["vram_bytes"] >= 3 * N * 4 and used["evicted_bytes"] == 0
        assert used["busy_ns"]["compute"] > 0 and used["busy_ns"]["copy0"] > 0
        (bused,) = [u for u in bob["devices"] if u["contexts"]]
        assert bused["device"] == 1 and set(bused["busy_ns"].values()) == {0}
        # [CMD-STATS-4] end to end: bob's GET_STATS names nobody else
        seen = b.devices[0].stats()
        assert "alice" not in repr(seen) and "vA" not in repr(seen)
        assert set(seen["vgpus"]) == {"vB"} and seen["mem"]["contexts"] == {}
        assert seen["mem"]["contexts_total"] == 1 and seen["session"]["name"] == "bob"
        ca.destroy()
        cb.destroy()


def test_ctl_admin_5_an_admin_client_that_never_reads_does_not_delay_guests(host):
    # [CTL-ADMIN-5] one admin connection floods requests and reads nothing, another sends
    # nothing; the guest's work and a well-behaved admin client are served all the same
    admin_ep = admin_endpoint_for(host.endpoint)
    zctx = zmq.Context()
    flood, idle = zctx.socket(zmq.DEALER), zctx.socket(zmq.DEALER)
    try:
        for s in (flood, idle):
            s.linger = 0
            s.connect(admin_ep)
        for seq in range(500):
            flood.send(msgpack.packb({"op": "stats", "seq": seq}), zmq.NOBLOCK)
        with guest.connect(host.endpoint, name="worker", mem_size=16 << 20, timeout=30) as c:
            with c.devices[0].create_context() as ctx:
                for _ in range(3):
                    _work(ctx)
            with AdminClient(admin_ep, timeout=30) as admin:
                names = [s["name"] for s in admin.request("stats")["sessions"]]
        assert names == ["worker"]
    finally:
        flood.close()
        idle.close()
        zctx.term()


def test_ctl_admin_2_an_admin_endpoint_named_by_the_operator(host_factory, tmp_endpoint, tmp_path):
    # [CTL-ADMIN-2] --admin-endpoint replaces the default one beside the guest endpoint
    ep = f"ipc://{tmp_path}/ops/admin.sock"
    h = host_factory([tmp_endpoint], vram="64M", extra_args=["--admin-endpoint", ep])
    with AdminClient(ep) as admin:
        assert admin.request("stats")["host"]["pid"] == h.proc.pid
    assert not os.path.exists(admin_endpoint_for(h.endpoint)[len("ipc://"):])
