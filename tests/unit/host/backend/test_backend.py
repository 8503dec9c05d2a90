"""host/backend without processes or sockets: Backend.handle driven with encoded messages,
a guest-side DriverQueue over inline memory, and real in-process KMDs and GPUs."""

import struct
import time

import numpy as np
import pytest
from pvgpu.conformance.burns import with_longer_burns

from pvgpu.host.backend.events import EventSnapshot
from pvgpu.host.backend.session import Backend
from pvgpu.host.hw.gpu import Platform
from pvgpu.host.kmd.device import KmdDevice
from pvgpu.host.kmd.fence import Fence
from pvgpu.spec import wire
from pvgpu.transport import codec
from pvgpu.transport.memory import InlineGuestMemory
from pvgpu.transport.peer import Peer
from pvgpu.transport.virtqueue import DriverQueue, VirtqLayout

MEM = 4 << 20
HDR = struct.Struct(wire.CTRL_HDR_FORMAT)


class Guest:
    """The driver side, speaking to the backend through encoded messages only."""

    def __init__(self, backend, name=b"g1"):
        self.backend = backend
        self.peer = Peer(0, name, f"conn-{name.decode()}")
        self.mem = InlineGuestMemory(MEM)
        self.seq = 0
        self.notifications = []
        self.queue = None

    def _deliver(self, out):
        replies = []
        for peer, frames in out:
            assert peer == self.peer
            msg, extra = codec.decode(frames)
            if msg.get("patches"):
                self.mem.apply_patches(msg["patches"], extra)
            (replies if msg["op"] == wire.OP_REPLY else self.notifications).append(msg)
        return replies

    def request(self, op, now=0.0, **fields):
        self.seq += 1
        out = self.backend.handle(self.peer, codec.encode({"op": op, "seq": self.seq, **fields}), now)
        (reply,) = [r for r in self._deliver(out) if r["seq"] == self.seq]
        return reply

    def init(self, dev=0, features=wire.DEVICE_FEATURES, qsize=64):
        assert self.request(wire.OP_HELLO, version=[0, 1], name="t", memory="inline", mem_size=MEM)["ok"]
        for status in (1, 3):
            assert self.request(wire.OP_SET_STATUS, dev=dev, status=status)["ok"]
        assert self.request(wire.OP_SET_FEATURES, dev=dev, features=features)["ok"]
        assert self.request(wire.OP_SET_STATUS, dev=dev, status=11)["ok"]
        layout = VirtqLayout.at(0, qsize)
        self.queue = DriverQueue(self.mem, layout, event_idx=bool(features & (1 << wire.VIRTIO_F_EVENT_IDX)),
                                 indirect=bool(features & (1 << wire.VIRTIO_F_INDIRECT_DESC)))
        assert self.request(wire.OP_SET_VRING, dev=dev, queue=0, size=qsize, desc=layout.desc,
                            avail=layout.avail, used=layout.used)["ok"]
        assert self.request(wire.OP_ENABLE_VRING, dev=dev, queue=0, enable=True)["ok"]
        assert self.request(wire.OP_SET_STATUS, dev=dev, status=15)["ok"]
        self.dev = dev

    def submit(self, command, data=b"", writable=wire.MIN_RESPONSE_SIZE, at=1 << 20):
        self.mem.write(at, command + data)
        head = self.queue.add_chain([(at, len(command) + len(data))], [(at + (1 << 19), writable)])
        dirty = self.mem.take_dirty()
        msg = {"op": wire.OP_KICK, "dev": self.dev, "queue": 0,
               "patches": [[g, i] for i, (g, _n) in enumerate(dirty)]}
        self._deliver(self.backend.handle(self.peer, codec.encode(
            msg, [self.mem.read(g, n) for g, n in dirty]), 0.0))
        return head, at + (1 << 19)

    def complete(self, head, timeout=5.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for h, n in self.queue.pop_used():
                assert h == head
                return n
            self._deliver(self.backend.run_completions())
            time.sleep(0.001)
        raise TimeoutError("request never completed")

    def call(self, command, data=b"", writable=wire.MIN_RESPONSE_SIZE):
        head, resp = self.submit(command, data, writable)
        n = self.complete(head)
        raw = self.mem.read(resp, n)
        return HDR.unpack_from(raw), raw[wire.CTRL_HDR_SIZE:]


def cmd(type_, body=(), ctx_id=0, flags=0, fence_id=0, ring_idx=0, extra=b""):
    return (HDR.pack(type_, flags, fence_id, ctx_id, ring_idx)
            + struct.pack(wire.CMD_BODY_FORMATS[type_], *body) + extra)

def ok(g, command, resp=wire.RESP_OK_NODATA, data=b"", writable=wire.MIN_RESPONSE_SIZE):
    hdr, body = g.call(command, data, writable)
    assert hdr[0] == resp, (hex(hdr[0]), body[16:16 + struct.unpack_from("<I", body, 12)[0]]
                            if hdr[0] >= 0x1200 else b"")
    return body

def h2d(g, ctx, va, arr):
    ok(g, cmd(wire.CMD_COPY_H2D, (va, arr.nbytes), ctx_id=ctx), data=arr.tobytes())

def d2h(g, ctx, va, n):
    head, resp = g.submit(cmd(wire.CMD_COPY_D2H, (va, 4 * n), ctx_id=ctx),
                          writable=wire.CTRL_HDR_SIZE + 4 * n)
    assert g.complete(head) == wire.CTRL_HDR_SIZE + 4 * n
    return np.frombuffer(g.mem.read(resp + wire.CTRL_HDR_SIZE, 4 * n), np.float32)

def scale(g, ctx, dst, src, alpha, n):
    slots = struct.pack("<QQfxxxxQ", dst, src, alpha, n)
    ok(g, cmd(wire.CMD_LAUNCH, (wire.KERNEL_SCALE, n // 256, 1, 1, 256, 1, 1, 4), ctx_id=ctx,
              flags=wire.FLAG_FENCE, fence_id=1, extra=slots))


def _backend(num_gpus=2, backend_options=None, topology="switch", **kmd_options):
    plat = Platform(num_gpus=num_gpus, vram_size=32 << 20, topology=topology)
    kmds = [KmdDevice(g, **kmd_options) for g in plat.gpus]
    for k in kmds:
        k.start()
    b = Backend(kmds, heartbeat_ms=100, **(backend_options or {}))
    try:
        yield b
    finally:
        b.shutdown()
        for k in kmds:
            k.stop()
        plat.stop()


@pytest.fixture
def backend():
    yield from _backend()


@pytest.fixture
def backend_small_ring():
    yield from _backend(ring_size=4096, max_queued_jobs=16)


def test_launch_without_compute_feature_is_an_unknown_command(backend):
    # [DEV-FEAT-3] a feature not negotiated (COMPUTE) is not used by the device
    g = Guest(backend)
    g.init(features=1 << wire.VIRTIO_F_VERSION_1)
    hdr, _ = g.call(cmd(wire.CMD_CTX_CREATE, (0, b"x"), ctx_id=1))
    assert hdr[0] == wire.RESP_OK_NODATA
    hdr, _ = g.call(cmd(wire.CMD_LAUNCH, (wire.KERNEL_BURN, 1, 1, 1, 1, 1, 1, 1), ctx_id=1,
                        extra=struct.pack("<Q", 1)))
    assert hdr[0] == wire.RESP_ERR_UNKNOWN_COMMAND


def test_without_compute_launches_are_unknown_before_the_body_and_ring_checks(backend):
    """[CMD-CHECK-1]: step 2 (unknown command, which LAUNCH and LAUNCH_CODE are without
    PVGPU_F_COMPUTE) comes before step 3 (short body) and step 4 (ring_idx)."""
    g = Guest(backend)
    g.init(features=1 << wire.VIRTIO_F_VERSION_1)
    for type_ in (wire.CMD_LAUNCH, wire.CMD_LAUNCH_CODE):
        hdr, _ = g.call(HDR.pack(type_, 0, 0, 1, 0) + bytes(8))  # body cut short
        assert hdr[0] == wire.RESP_ERR_UNKNOWN_COMMAND, wire.CMD_NAMES[type_]
        hdr, _ = g.call(HDR.pack(type_, 0, 0, 1, wire.MAX_RING_IDX + 1)
                        + bytes(wire.CMD_BODY_SIZES[type_]))
        assert hdr[0] == wire.RESP_ERR_UNKNOWN_COMMAND, wire.CMD_NAMES[type_]
    # with the feature, the same requests fail the later checks
    g = Guest(backend, name=b"g2")
    g.init()
    hdr, _ = g.call(HDR.pack(wire.CMD_LAUNCH, 0, 0, 1, 0) + bytes(8))
    assert hdr[0] == wire.RESP_ERR_SHORT_COMMAND
    hdr, _ = g.call(HDR.pack(wire.CMD_LAUNCH, 0, 0, 1, wire.MAX_RING_IDX + 1)
                    + bytes(wire.CMD_BODY_SIZES[wire.CMD_LAUNCH]))
    assert hdr[0] == wire.RESP_ERR_INVALID_PARAMETER


def test_response_echoes_ring_idx_and_fence(backend):
    # [FENCE-ID-1] fence ids are only echoed
    g = Guest(backend)
    g.init(features=wire.DEVICE_FEATURES & ~(1 << wire.PVGPU_F_CONTEXT_INIT))
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=3))
    hdr, _ = g.call(cmd(wire.CMD_NOP, ctx_id=3, ring_idx=5, fence_id=77, flags=wire.FLAG_FENCE))
    assert hdr == (wire.RESP_OK_NODATA, wire.FLAG_FENCE, 77, 3, 5)
    hdr, _ = g.call(cmd(wire.CMD_NOP, ring_idx=64))
    assert hdr[0] == wire.RESP_ERR_INVALID_PARAMETER


def timeline_fence(backend, g, ctx_id, ring_idx=0):
    """The fence of the last job on a timeline of guest g's device 0."""
    compute = backend.sessions[g.peer].devices[0].compute
    return compute.contexts[ctx_id].timeline(ring_idx).last_fence


def test_fenced_nop_is_held_until_the_timeline_completes(backend):
    # [CMD-NOP-1] a fenced NOP is answered only when its timeline completed
    g = Guest(backend)
    g.init()
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))

    def attempt(burn_us):
        g.call(cmd(wire.CMD_LAUNCH, (wire.KERNEL_BURN, 1, 1, 1, 1, 1, 1, 1), ctx_id=1,
                   extra=struct.pack("<Q", burn_us)))
        burn = timeline_fence(backend, g, 1)
        head, _ = g.submit(cmd(wire.CMD_NOP, ctx_id=1, flags=wire.FLAG_FENCE, fence_id=9))
        answered = g.queue.pop_used()
        running = not burn.signaled  # still, after the NOP was handled
        if not answered:
            g.complete(head)
        assert burn.signaled  # answered only once the burn had completed
        if not running:
            return False  # the burn was over before the NOP was handled
        assert answered == []  # held, not answered, while the burn ran
        return True
    with_longer_burns(attempt)


def test_unfenced_fault_is_reported_once_by_the_next_sync_point(backend):
    # [FENCE-ERROR-1] the error of an accepted command is remembered and reported once
    g = Guest(backend)
    g.init()
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    bad = 0x3000_0000_0000
    hdr, _ = g.call(cmd(wire.CMD_LAUNCH, (wire.KERNEL_FILL, 1, 1, 1, 64, 1, 1, 3), ctx_id=1,
                        extra=struct.pack("<QQQ", bad, 0, 64)))
    assert hdr[0] == wire.RESP_OK_NODATA  # accepted
    hdr, body = g.call(cmd(wire.CMD_NOP, ctx_id=1, flags=wire.FLAG_FENCE, fence_id=1))
    assert hdr[0] == wire.RESP_ERR_PAGE_FAULT
    info0, info1, mlen = struct.unpack_from(wire.RESP_ERROR_FORMAT, body)
    assert info0 == bad and info1 == wire.ACCESS_WRITE and b"page fault" in body[16:16 + mlen]
    hdr, _ = g.call(cmd(wire.CMD_NOP, ctx_id=1, flags=wire.FLAG_FENCE, fence_id=2))
    assert hdr[0] == wire.RESP_OK_NODATA


def test_copies_round_trip_and_used_len_counts_data(backend):
    # [VQ-USED-2] [CMD-CHAIN-5] used len is the response size plus the data of a COPY_D2H
    g = Guest(backend)
    g.init()
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    hdr, body = g.call(cmd(wire.CMD_MEM_ALLOC, (7, 0, 5000), ctx_id=1))
    va, size = struct.unpack_from(wire.RESP_MEM_ALLOC_FORMAT, body)
    assert hdr[0] == wire.RESP_OK_MEM_ALLOC and size == 8192 and va >= wire.VA_USER_BASE
    data = bytes(range(256)) * 16
    hdr, _ = g.call(cmd(wire.CMD_COPY_H2D, (va, len(data)), ctx_id=1), data)
    assert hdr[0] == wire.RESP_OK_NODATA
    head, resp = g.submit(cmd(wire.CMD_COPY_D2H, (va, len(data)), ctx_id=1),
                          writable=wire.CTRL_HDR_SIZE + len(data))
    assert g.complete(head) == wire.CTRL_HDR_SIZE + len(data)
    assert g.mem.read(resp + wire.CTRL_HDR_SIZE, len(data)) == data
    hdr, _ = g.call(cmd(wire.CMD_COPY_D2H, (va, 1 << 20), ctx_id=1))
    assert hdr[0] == wire.RESP_ERR_INVALID_PARAMETER  # no room for the data


def test_handles_are_checked(backend):
    g = Guest(backend)
    g.init()
    assert g.call(cmd(wire.CMD_MEM_ALLOC, (1, 0, 4096), ctx_id=9))[0][0] == wire.RESP_ERR_INVALID_CONTEXT_ID
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    assert g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))[0][0] == wire.RESP_ERR_INVALID_CONTEXT_ID
    assert g.call(cmd(wire.CMD_MEM_FREE, (5,), ctx_id=1))[0][0] == wire.RESP_ERR_INVALID_RESOURCE_ID
    assert g.call(cmd(wire.CMD_MEM_ALLOC, (0, 0, 4096), ctx_id=1))[0][0] == wire.RESP_ERR_INVALID_RESOURCE_ID
    assert g.call(cmd(wire.CMD_MEM_ALLOC, (1, 0, 1 << 40), ctx_id=1))[0][0] == wire.RESP_ERR_OUT_OF_MEMORY


def test_failed_status_stops_the_queue(backend):
    # [VQ-ORDER-2] [DEV-STATUS-2] no chain is taken with STATUS_FAILED set
    g = Guest(backend)
    g.init()
    assert g.request(wire.OP_SET_STATUS, dev=0, status=15 | wire.STATUS_FAILED)["ok"]
    g.submit(cmd(wire.CMD_NOP))
    backend.run_completions()
    assert g.queue.pop_used() == []
    assert backend.sessions[g.peer].devices[0].stats["ignored_kicks"] == 1


def test_silent_session_is_reclaimed(backend):
    # [CTL-RECLAIM-1] reclaimed when its heartbeat expires, its memory freed
    g = Guest(backend)
    g.init()
    free = backend.kmds[0].vram_free()
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    g.call(cmd(wire.CMD_MEM_ALLOC, (1, 0, 8 << 20), ctx_id=1))
    assert backend.kmds[0].vram_free() < free
    backend.expire(now=0.25)  # 2.5 periods: still alive ([CTL-HB-3]: not reclaimed earlier)
    assert g.peer in backend.sessions
    backend.expire(now=0.35)
    assert g.peer not in backend.sessions and backend.stats["expired_sessions"] == 1  # [CTL-HB-3]
    assert backend.kmds[0].vram_free() == free
    assert backend.pending_releases() == 0



def test_a_closed_connection_s_session_is_reclaimed_at_once(backend):
    """CTL-HB-7: the loop reports the connection's name; only its session goes, now."""
    g, other = Guest(backend), Guest(backend, b"g2")
    backend.credentials = {g.peer.connection: {"transport": "ipc", "pid": 7, "uid": 1,
                                               "gid": 1}}.get
    g.init()
    other.init()
    assert backend.sessions[g.peer].peer_credentials == {"transport": "ipc", "pid": 7,
                                                         "uid": 1, "gid": 1}
    assert backend.sessions[other.peer].peer_credentials is None  # not known: not guessed
    free = backend.kmds[0].vram_free()
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    g.call(cmd(wire.CMD_MEM_ALLOC, (1, 0, 8 << 20), ctx_id=1))
    backend.connection_closed("no-such-connection")
    assert g.peer in backend.sessions
    backend.connection_closed(g.peer.connection)
    assert g.peer not in backend.sessions and other.peer in backend.sessions
    assert backend.stats["disconnected_sessions"] == 1
    assert backend.kmds[0].vram_free() == free


def test_shutdown_is_announced_to_every_session(backend):
    """CTL-BYE-2: one `shutdown` notification per session, with the reason."""
    guests = [Guest(backend, name) for name in (b"g1", b"g2")]
    for g in guests:
        g.init()
    out = backend.announce_shutdown("received SIGTERM")
    assert sorted(peer for peer, _ in out) == sorted(g.peer for g in guests)
    for _peer, frames in out:
        assert codec.decode(frames)[0] == {"op": wire.OP_SHUTDOWN, "reason": "received SIGTERM"}


N_FLOOD = 120  # chains of two descriptors in a 256-entry queue


def test_full_engine_ring_holds_chains_back_instead_of_blocking(backend_small_ring):
    """Flow control: with the GPU scheduler's queue full the device leaves chains in the
    avail ring (no handle() call waits inside the KMD) and resumes as jobs complete."""
    # [VQ-USED-3] every chain comes back, and once only: a second return would fail DriverQueue's used-id check
    backend = backend_small_ring
    g = Guest(backend)
    g.init(qsize=256)
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    hdr, body = g.call(cmd(wire.CMD_MEM_ALLOC, (1, 0, 4096), ctx_id=1))
    va, _ = struct.unpack_from(wire.RESP_MEM_ALLOC_FORMAT, body)
    # the context's jobs wait behind a fence only the test signals (an imported event):
    # however slow the machine, the flood finds the GPU busy
    gate = Fence(-1, 1)
    handle, token = backend.event_exports.export(
        "the test", EventSnapshot([gate], clock=backend.kmds[0].clock_ns))
    assert g.call(cmd(wire.CMD_EVENT_IMPORT, (5, handle, token)))[0][0] == wire.RESP_OK_NODATA
    assert g.call(cmd(wire.CMD_EVENT_WAIT, (5,), ctx_id=1))[0][0] == wire.RESP_OK_NODATA
    heads = []
    for i in range(N_FLOOD):  # far more jobs than a 4 KiB ring holds
        at = (1 << 20) + 1024 * i
        launch = cmd(wire.CMD_LAUNCH, (wire.KERNEL_FILL, 1, 1, 1, 1, 1, 1, 3), ctx_id=1,
                     extra=struct.pack("<QQQ", va + 4 * (i % 1024), struct.unpack("<I", struct.pack("<f", float(i)))[0], 1))
        g.mem.write(at, launch)
        heads.append(g.queue.add_chain([(at, len(launch))],
                                       [(at + (1 << 19), wire.MIN_RESPONSE_SIZE)]))
        dirty = g.mem.take_dirty()
        g._deliver(backend.handle(g.peer, codec.encode(
            {"op": wire.OP_KICK, "dev": 0, "queue": 0,
             "patches": [[a, k] for k, (a, _n) in enumerate(dirty)]},
            [g.mem.read(a, n) for a, n in dirty]), 0.0))
    kmd = backend.kmds[0]
    assert all(r.full_waits == 0 for r in kmd.rings)  # never waited inside the KMD
    assert kmd.stats["ib_pool_waits"] == 0
    dev = backend.sessions[g.peer].devices[0]
    assert dev.stats["stalls"] >= 1
    gate.signal()
    done = set()
    deadline = time.monotonic() + 10
    while len(done) < len(heads) and time.monotonic() < deadline:
        done.update(h for h, _n in g.queue.pop_used())
        g._deliver(backend.run_completions())
        time.sleep(0.001)
    assert done == set(heads)
    n = N_FLOOD - 1
    hdr, body = g.call(cmd(wire.CMD_COPY_D2H, (va + 4, 4 * n), ctx_id=1),
                       writable=wire.CTRL_HDR_SIZE + 4 * n)
    assert hdr[0] == wire.RESP_OK_NODATA
    assert list(struct.unpack(f"<{n}f", body[:4 * n])) == [float(i) for i in range(1, N_FLOOD)]


def test_calls_built_in_one_loop_iteration_carry_their_own_ring_state(backend):
    """The host loop handles several messages before it sends anything: each call must
    carry the used ring as it was when the call was built, not as it is at send time
    (a used.idx that ran ahead of its elements broke the driver: VQ-USED-ID)."""
    g = Guest(backend)
    g.init()
    outs = []
    for i in range(3):
        at = (1 << 20) + 4096 * i
        g.mem.write(at, cmd(wire.CMD_NOP))
        g.queue.add_chain([(at, wire.CTRL_HDR_SIZE)], [(at + 2048, wire.MIN_RESPONSE_SIZE)])
        dirty = g.mem.take_dirty()
        outs.append(backend.handle(g.peer, codec.encode(
            {"op": wire.OP_KICK, "dev": 0, "queue": 0,
             "patches": [[a, k] for k, (a, _n) in enumerate(dirty)]},
            [g.mem.read(a, n) for a, n in dirty]), 0.0))
    seen = 0
    for i, out in enumerate(outs):  # now deliver, in order, like the loop's send phase
        g._deliver(out)
        assert g.mem.read_u16(g.queue.layout.used + 2) == i + 1  # used.idx as built
        seen += len(g.queue.pop_used())
    assert seen == 3


def test_reset_replies_only_when_nothing_can_still_write_guest_memory(backend):
    """DEV-RESET-1/2: work already on the GPU (here a burn, then a copy into guest memory
    behind it) finishes before the reply to set_status 0; only then may the driver
    reuse its buffers."""
    # [VQ-USED-3] [DEV-RESET-2] a chain dropped by reset never comes back, nothing is written after the reply
    g = Guest(backend)
    g.init()
    g.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))
    hdr, body = g.call(cmd(wire.CMD_MEM_ALLOC, (1, 0, 4096), ctx_id=1))
    va, _ = struct.unpack_from(wire.RESP_MEM_ALLOC_FORMAT, body)
    burn, _ = g.submit(cmd(wire.CMD_LAUNCH, (wire.KERNEL_BURN, 1, 1, 1, 1, 1, 1, 1), ctx_id=1,
                           extra=struct.pack("<Q", 100_000)))
    g.submit(cmd(wire.CMD_COPY_D2H, (va, 4096), ctx_id=1),
             writable=wire.CTRL_HDR_SIZE + 4096, at=2 << 20)
    kmd = backend.kmds[0]
    assert kmd.oldest_pending_fence() is not None
    g.seq += 1
    out = backend.handle(g.peer, codec.encode({"op": wire.OP_SET_STATUS, "seq": g.seq, "dev": 0,
                                               "status": 0}), 0.0)
    replies = [r for r in g._deliver(out) if r.get("seq") == g.seq]
    # not yet, unless the GPU had finished by then (a stalled test: nothing to see)
    assert not replies or kmd.oldest_pending_fence() is None
    deadline = time.monotonic() + 5
    while not replies and time.monotonic() < deadline:
        replies = [r for r in g._deliver(backend.run_completions()) if r.get("seq") == g.seq]
        if not replies:
            time.sleep(0.005)
    assert replies and replies[0]["ok"]
    assert kmd.oldest_pending_fence() is None  # the burn and the copy are done
    # the burn was answered ("accepted") before the reset; the held copy never comes back
    assert [h for h, _n in g.queue.pop_used()] == [burn]
