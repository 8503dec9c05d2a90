"""What the device does with the commands of a chain (spec §5.5, §5.6, §6, clauses CMD-*,
DEV-*, MEM-WINDOW-1, KRN-ARGS-1): framing it tolerates, chains too short to answer, device
information answered at once, the guest window of every context, kernel argument slots,
the configuration space and what a reset leaves alone. Sans-IO through Backend.handle."""

import struct
import time

import numpy as np
import pytest

from pvgpu.conformance.burns import with_longer_burns
from pvgpu.spec import wire

from test_backend import MEM, Guest, _backend, cmd, d2h, ok

W = wire.GUEST_WINDOW_VA


@pytest.fixture
def backend():
    yield from _backend()


def status(g, dev=0):
    return g.request(wire.OP_GET_STATUS, dev=dev)["status"]


def test_cmd_chain_2_readable_bytes_beyond_the_command_are_ignored(backend):
    g = Guest(backend)
    g.init()
    ok(g, cmd(wire.CMD_NOP), data=b"\xff" * 100)
    ok(g, cmd(wire.CMD_CTX_CREATE, (0, b"c"), ctx_id=1), data=b"trailing junk")
    body = ok(g, cmd(wire.CMD_MEM_ALLOC, (1, 0, 4096), ctx_id=1), resp=wire.RESP_OK_MEM_ALLOC,
              data=bytes(range(50)))
    assert struct.unpack_from(wire.RESP_MEM_ALLOC_FORMAT, body)[0] != 0


def test_cmd_chain_4_a_chain_without_room_for_a_response_is_returned_empty(backend):
    g = Guest(backend)
    g.init()
    dev = backend.sessions[g.peer].devices[0]
    for writable in (0, 1, wire.MIN_RESPONSE_SIZE - 1):
        before = dev.stats["unanswerable"]
        head, _ = g.submit(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=5), writable=writable)
        assert g.complete(head) == 0
        assert dev.stats["unanswerable"] == before + 1
    assert status(g) == 15  # not a reason for DEVICE_NEEDS_RESET
    # not executed: context 5 was never created, so creating it now succeeds
    ok(g, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=5))


def test_cmd_hdr_1_the_device_ignores_pad_and_unknown_flag_bits(backend):
    g = Guest(backend)
    g.init()
    unknown = 0xFFFF_FFFF & ~(wire.FLAG_FENCE | wire.FLAG_INFO_RING_IDX)
    raw = struct.pack("<IIQIB3s", wire.CMD_NOP, unknown, 77, 0, 0, b"\x01\x02\x03")
    hdr, _ = g.call(raw)
    assert hdr[0] == wire.RESP_OK_NODATA
    raw = struct.pack("<IIQIB3s", wire.CMD_CTX_CREATE, unknown, 0, 3, 0, b"\xff\xff\xff")
    hdr, _ = g.call(raw + struct.pack(wire.CMD_BODY_FORMATS[wire.CMD_CTX_CREATE], 0, b""))
    assert hdr[0] == wire.RESP_OK_NODATA


def test_cmd_info_1_get_device_info_is_answered_at_once(backend):
    g = Guest(backend)
    g.init()
    ok(g, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))

    def attempt(burn_us):
        g.call(cmd(wire.CMD_LAUNCH, (wire.KERNEL_BURN, 1, 1, 1, 1, 1, 1, 1), ctx_id=1,
                   extra=struct.pack("<Q", burn_us)))
        burn = backend.sessions[g.peer].devices[0].compute.contexts[1].timeline(0).last_fence
        head, _ = g.submit(cmd(wire.CMD_GET_DEVICE_INFO, ctx_id=1))
        answered = g.queue.pop_used()
        running = not burn.signaled
        if not answered:
            g.complete(head)
        if not running:
            return False  # the burn was over: no proof either way
        assert answered == [(head, answered[0][1])]  # answered in the kick, not held
        return True
    with_longer_burns(attempt)


def test_mem_window_1_every_context_sees_guest_memory_at_the_window(backend):
    g = Guest(backend)
    g.init()
    gpa, n = 3 << 20, 256  # a D2H of n bytes leaves room for any response
    pattern = np.arange(n // 4, dtype=np.float32) + 0.5
    g.mem.write(gpa, pattern.tobytes())  # reaches the mirror with the next kick's patches
    for ctx in (1, 2):
        ok(g, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=ctx))
        body = ok(g, cmd(wire.CMD_MEM_ALLOC, (ctx, 0, 4096), ctx_id=ctx), resp=wire.RESP_OK_MEM_ALLOC)
        va = struct.unpack_from(wire.RESP_MEM_ALLOC_FORMAT, body)[0]
        ok(g, cmd(wire.CMD_COPY_D2D, (W + gpa, va, n), ctx_id=ctx, flags=wire.FLAG_FENCE, fence_id=1))
        np.testing.assert_array_equal(d2h(g, ctx, va, n // 4), pattern)
        # written through the window: the bytes land at the gpa, in the inline model in
        # the mirror only ([MEM-WINDOW-4])
        ok(g, cmd(wire.CMD_COPY_D2D, (va, W + gpa + 4096 * ctx, n), ctx_id=ctx,
                  flags=wire.FLAG_FENCE, fence_id=2))
        assert backend.sessions[g.peer].mem.read(gpa + 4096 * ctx, n) == pattern.tobytes()
        # beyond mem_size the window is not mapped
        hdr, _ = g.call(cmd(wire.CMD_COPY_D2D, (W + MEM - 16, va, 64), ctx_id=ctx,
                            flags=wire.FLAG_FENCE, fence_id=3))
        assert hdr[0] == wire.RESP_ERR_PAGE_FAULT


def test_krn_args_1_the_device_ignores_the_high_half_of_u32_and_f32_slots(backend):
    g = Guest(backend)
    g.init()
    ok(g, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    body = ok(g, cmd(wire.CMD_MEM_ALLOC, (1, 0, 4096), ctx_id=1), resp=wire.RESP_OK_MEM_ALLOC)
    va = struct.unpack_from(wire.RESP_MEM_ALLOC_FORMAT, body)[0]
    ok(g, cmd(wire.CMD_COPY_H2D, (va, 4 * 64), ctx_id=1), data=bytes(4 * 64))
    slots = struct.pack("<QfIII", va, 2.5, 0xDEADBEEF, 16, 0xCAFEF00D)  # dst, value, n
    ok(g, cmd(wire.CMD_LAUNCH, (wire.KERNEL_FILL, 1, 1, 1, 64, 1, 1, 3), ctx_id=1,
              flags=wire.FLAG_FENCE, fence_id=1, extra=slots))
    out = d2h(g, 1, va, 64)
    assert (out[:16] == 2.5).all() and not out[16:].any()


def test_dev_config_2_config_matches_the_hello_entry(backend):
    g = Guest(backend)
    devices = g.request(wire.OP_HELLO, version=list(wire.PROTOCOL_VERSION), name="t",
                        memory=wire.MEMORY_INLINE, mem_size=MEM)["devices"]
    for entry in devices:
        fields = struct.unpack(wire.CONFIG_FORMAT, g.request(wire.OP_GET_CONFIG, dev=entry["index"])["config"])
        assert fields[0] == entry["vram_size"]
        assert fields[-1].rstrip(b"\0").decode() == entry["name"]
        assert fields[5] == entry["index"]


def test_dev_reset_3_a_reset_leaves_other_devices_memory_and_sessions_alone(backend):
    g, other = Guest(backend, b"g"), Guest(backend, b"other")
    g.init()
    other.init()
    for s in (1, 3):
        assert g.request(wire.OP_SET_STATUS, dev=1, status=s)["ok"]
    ok(other, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    ok(g, cmd(wire.CMD_NOP), data=b"kept in the mirror")
    session = backend.sessions[g.peer]
    mirror = session.mem.read(0, MEM)
    assert g.request(wire.OP_SET_STATUS, dev=0, status=0)["ok"]
    assert status(g) == 0 and status(g, dev=1) == 3
    assert session.mem is backend.sessions[g.peer].mem and session.mem.read(0, MEM) == mirror
    assert status(other) == 15
    ok(other, cmd(wire.CMD_MEM_ALLOC, (1, 0, 4096), ctx_id=1), resp=wire.RESP_OK_MEM_ALLOC)


VA_COMMANDS = {wire.CMD_VA_RESERVE, wire.CMD_VA_RELEASE, wire.CMD_MEM_MAP, wire.CMD_MEM_UNMAP}


def _random_body(rng, fmt):
    """Field values for a body format, kept small so that no command runs for long."""
    out = []
    for code in struct.Struct(fmt).format.lstrip("<"):
        if code.isdigit() or code == "x":
            continue
        if code == "s":
            out.append(bytes(rng.integers(0, 256, 8, dtype=np.uint8)))
        elif code == "f":
            out.append(float(rng.standard_normal()))
        else:
            out.append(int(rng.choice([0, 1, 2, 3, 4096, 1 << 20, int(rng.integers(0, 1 << 16))])))
    return out


def test_err_resp_1_every_response_code_is_one_of_the_table():
    rng = np.random.default_rng(14)
    gen = _backend()
    backend = next(gen)
    try:
        g = Guest(backend)
        g.init()
        ok(g, cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
        types = sorted(t for t in wire.CMD_BODY_FORMATS if t not in (wire.CMD_LAUNCH, wire.CMD_LAUNCH_CODE))
        seen = set()
        for _ in range(300):
            type_ = int(rng.choice(types))
            fmt = wire.CMD_BODY_FORMATS[type_]
            flags = int(rng.choice([0, wire.FLAG_FENCE]))
            try:
                body = struct.pack(fmt, *_random_body(rng, fmt))
            except struct.error:
                continue
            hdr, _ = g.call(struct.pack(wire.CTRL_HDR_FORMAT, type_, flags, 1, int(rng.integers(0, 3)), 0)
                            + body, data=bytes(int(rng.integers(0, 64))))
            code = hdr[0]
            seen.add(code)
            assert code in wire.RESP_NAMES and code != wire.RESP_ERR_DEVICE_LOST, hex(code)
            if code == wire.RESP_ERR_INVALID_ADDRESS:
                assert type_ in VA_COMMANDS, wire.CMD_NAMES[type_]
            if status(g) != 15:  # a command left the device needing a reset: start again
                g.request(wire.OP_SET_STATUS, dev=0, status=0)
                g = Guest(backend, f"g{len(seen)}{_}".encode())
                g.init()
        assert len(seen) > 3, seen  # errors and successes of several kinds were seen
    finally:
        gen.close()
