"""spec §2.1 and §2.7 — what a session may claim: its connection and its own memory
(clauses CTL-ENDPOINT-4, CTL-ENDPOINT-5, CTL-MEMTABLE-3, CTL-MEMTABLE-5). Each check
repeats an attack that once worked against the reference host."""

import secrets

import numpy as np

from pvgpu.spec import wire

from pvgpu.conformance.rawpeer import NoAnswer
from pvgpu.conformance.registry import check

HELLO = {"op": "hello", "version": list(wire.PROTOCOL_VERSION), "name": "conformance",
         "memory": "inline", "mem_size": 1 << 20}


@check("CTL-ENDPOINT-4", "CTL-ENDPOINT-5")
def a_session_is_not_served_to_a_later_connection_with_its_identity(ctx, raw_peer):
    """[CTL-ENDPOINT-4] The victim says hello and vanishes without bye; a new connection
    presenting the victim's routing identity must get no_session, not the victim's session.
    Best against a host that keeps a vanished guest's session for long (ctx.patient_endpoint:
    tests/conformance starts one with a 10 s heartbeat), so that the takeover meets the
    old session still alive."""
    patient_host = ctx.patient_endpoint
    identity = b"victim-" + secrets.token_bytes(8)
    victim = raw_peer(patient_host, identity)
    assert victim.request(HELLO)["ok"]
    assert victim.request({"op": "get_status", "dev": 0})["ok"]
    victim.close()  # no bye: the session lives on until heartbeats or [CTL-ENDPOINT-5]
    # The host learns of the close when it learns it; ZeroMQ holds back a connection that
    # presents an identity still in use and takes its first message for an identity. So
    # only a connection whose first request is answered really presents the victim's.
    for _attempt in range(30):
        thief = raw_peer(patient_host, identity)
        try:
            reply = thief.request({"op": "get_status", "dev": 0}, timeout_ms=1000)
            break
        except NoAnswer:
            reply = None
            thief.close()
    assert reply is not None, "no connection with the victim's identity was ever served"
    assert reply["ok"] is False and reply["error"] == wire.CTL_ERR_NO_SESSION
    assert thief.request({"op": "bye"})["error"] == wire.CTL_ERR_NO_SESSION
    # the thief may start a session of its own, which holds nothing of the victim's
    assert thief.request(HELLO)["ok"]
    assert thief.request({"op": "get_status", "dev": 0})["status"] == 0


@check("CTL-MEMTABLE-5")
def another_guests_memory_cannot_be_mapped(ctx, raw_peer):
    """[CTL-MEMTABLE-5] A raw client names a live guest's memfd (/proc/<pid>/fd/<n>, which
    anyone can list) in set_mem_table: the host must refuse it with bad_memory. On every
    endpoint of the host (ctx.endpoints: ipc and tcp in tests/conformance)."""
    for endpoint in ctx.endpoints:
        _another_guests_memory_cannot_be_mapped(ctx, raw_peer, endpoint)


def _another_guests_memory_cannot_be_mapped(ctx, raw_peer, endpoint):
    with ctx.connect(endpoint, memory=wire.MEMORY_SHARED, mem_size=8 << 20) as victim:
        victim_memory = victim.session.mem
        victim_memory.write(1 << 20, b"the victim's secret")
        thief = raw_peer(endpoint)
        r = thief.request(dict(HELLO, memory="shared", mem_size=victim_memory.size))
        assert r["ok"] and len(r["mem_challenge"]) == wire.MEM_CHALLENGE_SIZE
        r = thief.request({"op": "set_mem_table", "regions": [
            {"gpa": 0, "size": victim_memory.size, "name": victim_memory.name}]})
        assert r["ok"] is False and r["error"] == wire.CTL_ERR_BAD_MEMORY
        # the thief's session has no memory: it cannot go live
        for status in (1, 3):
            thief.request({"op": "set_status", "dev": 0, "status": status})
        thief.request({"op": "set_features", "dev": 0, "features": 1 << wire.VIRTIO_F_VERSION_1})
        thief.request({"op": "set_status", "dev": 0, "status": 11})
        r = thief.request({"op": "set_status", "dev": 0, "status": 15})
        assert r["error"] == wire.CTL_ERR_BAD_STATE
        # and the victim is unharmed
        assert victim.devices[0].info()["vram_size"] > 0


@check("CTL-MEMTABLE-5")
def the_shared_model_works_on_every_endpoint_for_a_guest_that_proves_ownership(ctx):
    """[CTL-MEMTABLE-5] The reference driver writes the challenge: shared memory works over
    tcp too when guest and host share a machine."""
    for endpoint in ctx.endpoints:
        with ctx.connect(endpoint, memory=wire.MEMORY_SHARED, mem_size=8 << 20) as conn:
            assert conn.memory_model == wire.MEMORY_SHARED
            with conn.devices[0].create_context() as gpu:
                a = gpu.to_device(np.arange(1024, dtype=np.float32))
                assert (a.to_host() == np.arange(1024, dtype=np.float32)).all()
