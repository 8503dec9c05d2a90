"""spec §4 — the device validates every chain it pops (clauses VQ-*).

Each malformed chain is written byte by byte into the driver's rings, then kicked. The
device must set DEVICE_NEEDS_RESET on that device of that session only and send
config_changed; the session's other device, a second guest process running at the same
time, and the same device after a reset all keep working.
"""

import struct
import time

import numpy as np

from pvgpu import guest
from pvgpu.spec import wire

from pvgpu.conformance.expect import raises
from pvgpu.procs import reap
from pvgpu.conformance.rawdevice import Raw, cmd
from pvgpu.conformance.registry import check

F_NEXT, F_WRITE, F_INDIRECT = wire.VIRTQ_DESC_F_NEXT, wire.VIRTQ_DESC_F_WRITE, wire.VIRTQ_DESC_F_INDIRECT


def _desc(mem, layout, i, addr, length, flags, nxt):
    mem.write(layout.desc + 16 * i, struct.pack(wire.VIRTQ_DESC_FORMAT, addr, length, flags, nxt))


def _publish(mem, q, head, advance=1):
    layout = q.layout
    idx = q.avail_idx
    mem.write(layout.avail + 4 + 2 * (idx % layout.size), struct.pack("<H", head))
    mem.write(layout.avail + 2, struct.pack("<H", (idx + advance) & 0xFFFF))


def _buffers(conn):
    heap = conn.session.heap
    return heap.alloc(4096), heap.alloc(4096)


def loop(mem, q, rd, wr):
    Q = q.layout.size
    _desc(mem, q.layout, Q - 2, rd, 64, F_NEXT, Q - 1)
    _desc(mem, q.layout, Q - 1, wr, 256, F_WRITE | F_NEXT, Q - 2)
    _publish(mem, q, Q - 2)


def next_range(mem, q, rd, wr):
    _desc(mem, q.layout, q.layout.size - 1, rd, 64, F_NEXT, q.layout.size + 7)
    _publish(mem, q, q.layout.size - 1)


def head_range(mem, q, rd, wr):
    _publish(mem, q, q.layout.size + 1)


def avail_jump(mem, q, rd, wr):
    _desc(mem, q.layout, q.layout.size - 1, wr, 256, F_WRITE, 0)
    _publish(mem, q, q.layout.size - 1, advance=q.layout.size + 1)


def write_order(mem, q, rd, wr):
    Q = q.layout.size
    _desc(mem, q.layout, Q - 2, wr, 256, F_WRITE | F_NEXT, Q - 1)
    _desc(mem, q.layout, Q - 1, rd, 24, 0, 0)
    _publish(mem, q, Q - 2)


def indirect_len(mem, q, rd, wr):
    _desc(mem, q.layout, q.layout.size - 1, rd + 1024, 24, F_INDIRECT, 0)
    _publish(mem, q, q.layout.size - 1)


def indirect_nested(mem, q, rd, wr):
    table = rd + 1024
    mem.write(table, struct.pack(wire.VIRTQ_DESC_FORMAT, rd + 2048, 32, F_INDIRECT, 0))
    _desc(mem, q.layout, q.layout.size - 1, table, 16, F_INDIRECT, 0)
    _publish(mem, q, q.layout.size - 1)


def indirect_next(mem, q, rd, wr):
    Q = q.layout.size
    table = rd + 1024
    mem.write(table, struct.pack(wire.VIRTQ_DESC_FORMAT, wr, 256, F_WRITE, 0))
    _desc(mem, q.layout, Q - 2, table, 16, F_INDIRECT | F_NEXT, Q - 1)
    _desc(mem, q.layout, Q - 1, wr, 256, F_WRITE, 0)
    _publish(mem, q, Q - 2)


def addr_range(mem, q, rd, wr):
    _desc(mem, q.layout, q.layout.size - 1, mem.size - 8, 64, 0, 0)
    _publish(mem, q, q.layout.size - 1)


def chain_len(mem, q, rd, wr):
    Q = q.layout.size
    _desc(mem, q.layout, Q - 3, rd, 0xFFFF_FFFF, F_NEXT, Q - 2)
    _desc(mem, q.layout, Q - 2, rd, 0xFFFF_FFFF, F_NEXT, Q - 1)
    _desc(mem, q.layout, Q - 1, wr, 256, F_WRITE, 0)
    _publish(mem, q, Q - 3)


CASES = {"VQ-LOOP": loop, "VQ-NEXT-RANGE": next_range, "VQ-HEAD-RANGE": head_range,
         "VQ-AVAIL-JUMP": avail_jump, "VQ-WRITE-ORDER": write_order, "VQ-INDIRECT-LEN": indirect_len,
         "VQ-INDIRECT-NESTED": indirect_nested, "VQ-INDIRECT-NEXT": indirect_next,
         "VQ-ADDR-RANGE": addr_range, "VQ-CHAIN-LEN": chain_len}


def malformed_chain_needs_reset_for_that_device_only(ctx, clause):
    with ctx.connect(mem_size=16 << 20) as conn:
        dev0, dev1 = conn.devices
        ctx1 = dev1.create_context()
        before = ctx1.to_device(np.arange(1000, dtype=np.float32))
        drv = dev0.driver
        rd, wr = _buffers(conn)
        CASES[clause](drv.mem, drv.queue, rd, wr)
        drv.session.kick(0)
        conn.session.wait_for(lambda: drv.needs_reset, timeout=10)
        status = conn.session.control("get_status", dev=0)["status"]
        assert status & wire.STATUS_DEVICE_NEEDS_RESET
        with raises(guest.DeviceNeedsReset):
            dev0.create_context()
        # the session's other device is untouched
        np.testing.assert_array_equal(before.to_host(), np.arange(1000, dtype=np.float32))
        # and the device works again after a reset
        dev0.reset()
        with dev0.create_context() as gpu:
            assert gpu.to_device(np.ones(10, np.float32)).to_host().sum() == 10


def _register_malformed_chain(clause):
    """One check per kind of malformed chain, named after its clause (vq_loop_needs_...)."""
    @check(clause, "VQ-INVALID-1", "VQ-INVALID-4", per_memory=True,
           name=f"{clause.lower().replace('-', '_')}_needs_reset_for_that_device_only")
    def run(ctx):
        malformed_chain_needs_reset_for_that_device_only(ctx, clause)


for _clause in sorted(CASES):
    _register_malformed_chain(_clause)


@check("VQ-INVALID-4", "DEV-ISOLATE-3")
def another_guest_process_is_unaffected(ctx):
    other = ctx.spawn_guest(["run", "vector-add", "gemm", "--repeat", "8", "--size", "200",
                             "--connect", ctx.endpoint, "--memory", "inline", "--mem-size", "16M"])
    try:
        with ctx.connect(mem_size=16 << 20) as conn:
            for clause in ("VQ-LOOP", "VQ-INDIRECT-NESTED", "VQ-AVAIL-JUMP"):
                drv = conn.devices[0].driver
                rd, wr = _buffers(conn)
                CASES[clause](drv.mem, drv.queue, rd, wr)
                drv.session.kick(0)
                conn.session.wait_for(lambda: drv.needs_reset, timeout=10)
                conn.devices[0].reset()
            with conn.devices[0].create_context() as gpu:
                gpu.launch("burn", 1, 1, (1000,))
                gpu.synchronize()
    finally:
        code, out = reap(other, timeout=ctx.timeout)
    assert code == 0, out
    assert out.count("OK") == 16, out


@check("CMD-CHAIN-4")
def chain_without_room_for_a_response_is_returned_empty(ctx):
    # the shared model: the used ring is polled in guest memory, no call applied
    with ctx.connect(memory=wire.MEMORY_SHARED, mem_size=16 << 20) as conn:
        drv = conn.devices[0].driver
        rd, wr = _buffers(conn)
        cmd = wire.pack_ctrl_hdr(wire.CMD_NOP)
        drv.mem.write(rd, cmd)
        head = drv.queue.add_chain([(rd, len(cmd))], [(wr, 8)])
        drv.session.kick(0)
        deadline = time.monotonic() + 10
        got = []
        while not got and time.monotonic() < deadline:
            got = drv.queue.pop_used()  # notifications are suppressed: poll the used ring
        assert got == [(head, 0)]
        with conn.devices[0].create_context():
            pass


@check("CTL-VRING-5", "VQ-LAYOUT-2", per_memory=True)
def ctl_vring_5_a_queue_started_near_the_wrap_crosses_it(ctx):
    """set_vring `base` starts the indices at 65530: requests cross 65535 -> 0 at once,
    instead of after 65,536 requests."""
    with ctx.connect(mem_size=16 << 20) as conn:
        drv = conn.devices[0].driver
        drv.queue_base = 65530
        drv.initialize()  # a device reset, then set_vring with base
        assert drv.queue.avail_idx == drv.queue.last_used_idx == 65530
        raw = Raw(conn)
        ctx = raw.context()
        for i in range(24):  # across 65535 -> 0
            hdr, _, _ = raw.call(cmd(wire.CMD_NOP, ctx_id=ctx, flags=wire.FLAG_FENCE, fence_id=i + 1))
            assert hdr[0] == wire.RESP_OK_NODATA
        assert drv.queue.avail_idx == drv.queue.last_used_idx == (65530 + 25) & 0xFFFF  # CTX_CREATE, 24 NOPs
        # conn's own API still works over the wrapped queue
        ctx2 = conn.devices[0].create_context()
        data = np.arange(100, dtype=np.float32)
        assert np.array_equal(ctx2.to_device(data).to_host(), data)


@check("CTL-VRING-5")
def ctl_vring_5_base_beyond_16_bits_is_malformed(raw_peer):
    p = raw_peer()
    p.request({"op": "hello", "version": list(wire.PROTOCOL_VERSION), "name": "b", "memory": "inline",
               "mem_size": 1 << 20})
    for s in (1, 3):
        p.request({"op": "set_status", "dev": 0, "status": s})
    p.request({"op": "set_features", "dev": 0, "features": 1 << wire.VIRTIO_F_VERSION_1})
    assert p.request({"op": "set_status", "dev": 0, "status": 11})["ok"]
    vr = {"op": "set_vring", "dev": 0, "queue": 0, "size": 64, "desc": 0, "avail": 1024, "used": 2048}
    assert p.request(dict(vr, base=1 << 16))["error"] == wire.CTL_ERR_MALFORMED
    assert p.request(dict(vr, base=-1))["error"] == wire.CTL_ERR_MALFORMED
    assert p.request(dict(vr, base="x"))["error"] == wire.CTL_ERR_MALFORMED
    assert p.request(dict(vr, base=65535))["ok"]
