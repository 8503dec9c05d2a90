"""spec §2 — the control channel: message shape, errors, sessions (clauses CTL-*), through
raw DEALER peers."""

import msgpack

from pvgpu.spec import wire

from pvgpu.conformance.registry import check

HELLO = {"op": "hello", "version": [0, 1], "name": "conformance", "memory": "inline", "mem_size": 1 << 20}


@check("CTL-HELLO-4", "DEV-ID-3")
def hello_reply_lists_devices_and_heartbeat(raw_peer):
    p = raw_peer()
    r = p.request(HELLO)
    assert r["ok"] is True and isinstance(r["session"], str)
    assert [d["index"] for d in r["devices"]] == [0, 1]
    # [DEV-ID-3] every device is of pvgpu's own type, not virtio-gpu's
    assert all(d["device_id"] == wire.VIRTIO_ID_PVGPU and d["vram_size"] > 0 for d in r["devices"])
    assert r["heartbeat_ms"] > 0


@check("CTL-PARSE-1", "CTL-PARSE-3", "CTL-PARSE-6")
def undecodable_frame_is_dropped_and_host_carries_on(raw_peer):
    p = raw_peer()
    p.send_frames([b"\xc1\xff not msgpack"])
    p.send_frames([msgpack.packb([1, 2, 3])])
    p.send_frames([msgpack.packb({"op": "hello"})])  # a request without seq
    assert p.recv(300) is None
    assert p.request(HELLO)["ok"] is True


@check("CTL-PARSE-4")
def unknown_op_gets_an_error_reply(raw_peer):
    p = raw_peer()
    r = p.request({"op": "frobnicate"})
    assert r["ok"] is False and r["error"] == wire.CTL_ERR_UNKNOWN_OP and r["message"]


@check("CTL-PARSE-4", "CTL-MSG-5")
def missing_and_mistyped_fields(raw_peer):
    p = raw_peer()
    r = p.request({"op": "hello", "version": [0, 1], "name": "x", "memory": "inline"})
    assert r["ok"] is False and r["error"] == wire.CTL_ERR_MISSING_FIELD
    r = p.request(dict(HELLO, mem_size="big"))
    assert r["ok"] is False and r["error"] == wire.CTL_ERR_MALFORMED
    r = p.request(dict(HELLO, mem_size=True))  # bool is not an int on this wire
    assert r["ok"] is False and r["error"] == wire.CTL_ERR_MALFORMED
    r = p.request(dict(HELLO, mem_size=-4096))  # [CTL-MSG-5] ints are 0 .. 2^64-1
    assert r["ok"] is False and r["error"] == wire.CTL_ERR_MALFORMED and "outside" in r["message"]


@check("CTL-HELLO-7", "CTL-HELLO-6")
def requests_before_hello_and_second_hello(raw_peer):
    p = raw_peer()
    r = p.request({"op": "get_status", "dev": 0})
    assert r["ok"] is False and r["error"] == wire.CTL_ERR_NO_SESSION
    assert p.request(HELLO)["ok"]
    r = p.request(HELLO)
    assert r["ok"] is False and r["error"] == wire.CTL_ERR_BAD_STATE


@check("CTL-HELLO-2", "CTL-HELLO-3")
def bad_version_and_memory_limits(raw_peer):
    p = raw_peer()
    assert p.request(dict(HELLO, version=[9, 0]))["error"] == wire.CTL_ERR_BAD_VERSION
    assert p.request(dict(HELLO, mem_size=1000))["error"] == wire.CTL_ERR_MALFORMED
    assert p.request(dict(HELLO, mem_size=1 << 50))["error"] == wire.CTL_ERR_LIMIT
    assert p.request(dict(HELLO, memory="telepathy"))["error"] == wire.CTL_ERR_MALFORMED


@check("CTL-HELLO-10")
def ctl_hello_10_the_first_error_in_the_spec_order_wins(raw_peer):
    p = raw_peer()
    bad = {"version": [9, 0], "memory": "telepathy", "mem_size": 1 << 50, "vgpu": "no-such-vgpu"}
    r = p.request(dict(HELLO, **bad, name=7))  # a wrongly typed field comes first
    assert r["error"] == wire.CTL_ERR_MALFORMED and "name" in r["message"]
    assert p.request(dict(HELLO, **bad))["error"] == wire.CTL_ERR_BAD_VERSION
    r = p.request(dict(HELLO, **dict(bad, version=[0, 1])))
    assert r["error"] == wire.CTL_ERR_MALFORMED and "telepathy" in r["message"]
    r = p.request(dict(HELLO, **dict(bad, version=[0, 1], memory="inline", mem_size=1000)))
    assert r["error"] == wire.CTL_ERR_MALFORMED and "mem_size" in r["message"]
    r = p.request(dict(HELLO, **dict(bad, version=[0, 1], memory="inline")))
    assert r["error"] == wire.CTL_ERR_LIMIT and "mem_size" in r["message"]
    r = p.request(dict(HELLO, **dict(bad, version=[0, 1], memory="inline", mem_size=1 << 20)))
    assert r["error"] == wire.CTL_ERR_LIMIT and "no-such-vgpu" in r["message"]
    assert p.request(HELLO)["ok"]
    assert p.request(dict(HELLO, **bad))["error"] == wire.CTL_ERR_BAD_STATE  # a session first


@check("CTL-HELLO-4")
def ctl_hello_4_device_entries(raw_peer):
    r = raw_peer().request(HELLO)
    for i, d in enumerate(r["devices"]):
        assert d["index"] == i and isinstance(d["name"], str) and d["name"]
        assert isinstance(d["vram_size"], int) and d["vram_size"] > 0
        assert d["device_id"] == wire.VIRTIO_ID_PVGPU and isinstance(d["peers"], list)
    assert isinstance(r["max_mem_size"], int) and r["max_mem_size"] >= HELLO["mem_size"]


@check("CTL-FEAT-1", "CTL-FEAT-2", "CTL-FEAT-3", "CTL-STATUS-3")
def device_and_queue_checks(raw_peer):
    p = raw_peer()
    p.request(HELLO)
    assert p.request({"op": "get_status", "dev": 7})["error"] == wire.CTL_ERR_BAD_DEVICE
    assert p.request({"op": "get_features", "dev": 0})["features"] == wire.DEVICE_FEATURES
    # set_features only between DRIVER and FEATURES_OK
    assert p.request({"op": "set_features", "dev": 0, "features": 1 << 32})["error"] == wire.CTL_ERR_BAD_STATE
    p.request({"op": "set_status", "dev": 0, "status": 1})
    p.request({"op": "set_status", "dev": 0, "status": 3})
    assert p.request({"op": "set_features", "dev": 0, "features": 1 << 40})["error"] == wire.CTL_ERR_BAD_FEATURES
    # clearing a status bit other than by reset
    assert p.request({"op": "set_status", "dev": 0, "status": 1})["error"] == wire.CTL_ERR_BAD_STATE


@check("CTL-STATUS-5")
def features_ok_not_kept_without_version_1(raw_peer):
    p = raw_peer()
    p.request(HELLO)
    for s in (1, 3):
        p.request({"op": "set_status", "dev": 0, "status": s})
    assert p.request({"op": "set_features", "dev": 0, "features": 1 << wire.VIRTIO_F_INDIRECT_DESC})["ok"]
    assert p.request({"op": "set_status", "dev": 0, "status": 11})["ok"]
    assert not p.request({"op": "get_status", "dev": 0})["status"] & wire.STATUS_FEATURES_OK


@check("CTL-VRING-1", "CTL-VRING-3", "CTL-VRING-4", "DEV-INIT-3")
def set_vring_validation_and_driver_ok_preconditions(raw_peer):
    p = raw_peer()
    p.request(HELLO)
    for s in (1, 3):
        p.request({"op": "set_status", "dev": 0, "status": s})
    p.request({"op": "set_features", "dev": 0, "features": 1 << 32})
    p.request({"op": "set_status", "dev": 0, "status": 11})
    vr = {"op": "set_vring", "dev": 0, "queue": 0, "size": 64, "desc": 0, "avail": 1024, "used": 2048}
    assert p.request(dict(vr, size=100))["error"] == wire.CTL_ERR_BAD_MEMORY
    assert p.request(dict(vr, desc=8))["error"] == wire.CTL_ERR_BAD_MEMORY
    assert p.request(dict(vr, used=(1 << 20) - 8))["error"] == wire.CTL_ERR_BAD_MEMORY
    assert p.request(dict(vr, queue=3))["error"] == wire.CTL_ERR_BAD_QUEUE
    assert p.request({"op": "set_status", "dev": 0, "status": 15})["error"] == wire.CTL_ERR_BAD_STATE
    assert p.request(vr)["ok"]
    assert p.request({"op": "enable_vring", "dev": 0, "queue": 0, "enable": True})["ok"]
    assert p.request({"op": "set_status", "dev": 0, "status": 15})["ok"]


@check("CTL-MEMTABLE-1", "CTL-MEMTABLE-3")
def set_mem_table_rules(raw_peer):
    p = raw_peer()
    p.request(HELLO)  # inline model
    r = p.request({"op": "set_mem_table", "regions": [{"gpa": 0, "size": 1 << 20, "name": "x"}]})
    assert r["error"] == wire.CTL_ERR_BAD_STATE
    q = raw_peer()
    q.request(dict(HELLO, memory="shared"))
    r = q.request({"op": "set_mem_table", "regions": [{"gpa": 0, "size": 1 << 20, "name": "pvgpu-does-not-exist"}]})
    assert r["error"] == wire.CTL_ERR_BAD_MEMORY
    r = q.request({"op": "set_mem_table", "regions": []})
    assert r["error"] == wire.CTL_ERR_BAD_MEMORY


@check("CTL-MEMTABLE-2")
def ctl_memtable_2_a_misshapen_region_is_malformed(raw_peer):
    q = raw_peer()
    q.request(dict(HELLO, memory="shared"))
    good = {"gpa": 0, "size": 1 << 20, "name": "pvgpu-does-not-exist"}
    for region in ({"gpa": 0, "size": 1 << 20}, dict(good, size="x"), dict(good, gpa=None),
                   dict(good, name=5), dict(good, size=True), "region"):
        r = q.request({"op": "set_mem_table", "regions": [region]})
        assert r["error"] == wire.CTL_ERR_MALFORMED, region
    for regions in ([good, good], [dict(good, gpa=4096)], [dict(good, size=2 << 20)]):
        assert q.request({"op": "set_mem_table", "regions": regions})["error"] == wire.CTL_ERR_BAD_MEMORY


@check("CTL-PING-1", "CTL-BYE-1")
def ping_and_bye(raw_peer):
    p = raw_peer()
    p.request(HELLO)
    assert p.request({"op": "ping"})["ok"]
    assert p.request({"op": "bye"})["ok"]
    assert p.request({"op": "get_status", "dev": 0})["error"] == wire.CTL_ERR_NO_SESSION


@check("CTL-PARSE-6", "DEV-ISOLATE-3")
def a_bad_session_does_not_disturb_another(raw_peer):
    good, bad = raw_peer(), raw_peer()
    good.request(HELLO)
    bad.request(HELLO)
    for junk in ([b"\x00"], [msgpack.packb({"op": 5, "seq": 1})], [msgpack.packb({"op": "kick", "dev": "x"})],
                 [msgpack.packb({"op": "kick", "dev": 0, "queue": 0, "patches": [[0, 9]]})]):
        bad.send_frames(junk)
    assert good.request({"op": "get_status", "dev": 0})["ok"]
    assert bad.request({"op": "ping"})["ok"]
