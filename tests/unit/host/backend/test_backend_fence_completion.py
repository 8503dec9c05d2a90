"""A held chain is completed on the thread that signals its fence (host/backend/session.py
`complete_now`): its response and used entry are in guest memory without the backend's
I/O loop running anything, the loop is asked for a `call` only when the driver wants one,
and a reset racing the completion drops the chain.

The guest speaks the shared memory model (what the device writes is what the driver
reads); in the inline model the writes travel in the I/O loop's calls, so completions
stay there. A chain is held by a fenced EVENT_QUERY of an imported event whose only
fence belongs to the test, which signals it from a thread of its own."""

import struct
import threading

import pytest

from pvgpu.host.backend.events import EventSnapshot
from pvgpu.host.kmd.fence import Fence
from pvgpu.spec import wire
from pvgpu.transport import codec
from pvgpu.transport.memory import SharedGuestMemory
from pvgpu.transport.peer import Peer
from pvgpu.transport.virtqueue import DriverQueue, VirtqLayout

from test_backend import HDR, Guest, _backend, cmd

MEM = 4 << 20
EVENT = struct.Struct(wire.RESP_EVENT_FORMAT)


@pytest.fixture
def backend():
    yield from _backend(num_gpus=1)


class SharedGuest:
    """The driver side over shared memory, talking to Backend.handle directly; nothing
    here calls run_completions unless a test says so."""

    def __init__(self, backend, mem):
        self.backend = backend
        self.mem = mem
        self.peer = Peer(0, b"shared", "conn-shared")
        self.seq = 0

    def request(self, op, **fields):
        self.seq += 1
        out = self.backend.handle(self.peer, codec.encode({"op": op, "seq": self.seq, **fields}),
                                  0.0)
        (reply,) = [codec.decode(f)[0] for _p, f in out
                    if codec.decode(f)[0].get("seq") == self.seq]
        assert reply["ok"], reply
        return reply

    def init(self, features=wire.DEVICE_FEATURES, qsize=16):
        reply = self.request(wire.OP_HELLO, version=list(wire.PROTOCOL_VERSION), name="t",
                             memory=wire.MEMORY_SHARED, mem_size=MEM)
        self.mem.write(wire.MEM_CHALLENGE_GPA, reply["mem_challenge"])
        self.request(wire.OP_SET_MEM_TABLE, regions=[{"gpa": 0, "size": MEM,
                                                      "name": self.mem.name}])
        for status in (1, 3):
            self.request(wire.OP_SET_STATUS, dev=0, status=status)
        self.request(wire.OP_SET_FEATURES, dev=0, features=features)
        self.request(wire.OP_SET_STATUS, dev=0, status=11)
        layout = VirtqLayout.at(1 << 16, qsize)
        self.queue = DriverQueue(self.mem, layout,
                                 event_idx=bool(features & (1 << wire.VIRTIO_F_EVENT_IDX)))
        self.request(wire.OP_SET_VRING, dev=0, queue=0, size=qsize, desc=layout.desc,
                     avail=layout.avail, used=layout.used)
        self.request(wire.OP_ENABLE_VRING, dev=0, queue=0, enable=True)
        self.request(wire.OP_SET_STATUS, dev=0, status=15)

    def kick(self, command, at=1 << 20):
        """-> (head, where the response goes, the messages the backend sent)."""
        self.mem.write(at, command)
        head = self.queue.add_chain([(at, len(command))], [(at + 4096, wire.MIN_RESPONSE_SIZE)])
        out = self.backend.handle(self.peer, codec.encode(
            {"op": wire.OP_KICK, "dev": 0, "queue": 0}), 0.0)
        return head, at + 4096, out

    def call(self, command):
        head, resp, _out = self.kick(command)
        assert [h for h, _n in self.queue.pop_used()] == [head]
        return HDR.unpack_from(self.mem.read(resp, HDR.size))

    def used_idx(self) -> int:
        return self.mem.read_u16(self.queue.layout.used + 2)


@pytest.fixture
def guest(backend):
    with SharedGuestMemory.create(MEM) as mem:
        g = SharedGuest(backend, mem)
        g.init()
        yield g
        backend.close_session(backend.sessions[g.peer], "test over")


def hold_on(backend, g, fence):
    """A fenced EVENT_QUERY of an event that waits for `fence` only: -> (head, resp)."""
    snapshot = EventSnapshot([fence], clock=backend.kmds[0].clock_ns)
    handle, token = backend.event_exports.export("the test", snapshot)
    assert g.call(cmd(wire.CMD_EVENT_IMPORT, (7, handle, token)))[0] == wire.RESP_OK_NODATA
    head, resp, out = g.kick(cmd(wire.CMD_EVENT_QUERY, (7,), flags=wire.FLAG_FENCE))
    assert out == [] and g.queue.pop_used() == []  # held
    return head, resp


def signal_elsewhere(fence) -> None:
    """Signal `fence` on a thread of its own, and return once its callbacks have run."""
    t = threading.Thread(target=fence.signal)
    t.start()
    t.join()


def test_held_chain_is_in_guest_memory_once_its_fence_signals(backend, guest):
    fence = Fence(-1, 1)
    head, resp = hold_on(backend, guest, fence)
    signal_elsewhere(fence)
    # the backend's I/O loop has run nothing since the kick: the signalling thread wrote it
    assert guest.queue.pop_used() == [(head, HDR.size + EVENT.size)]
    assert HDR.unpack_from(guest.mem.read(resp, HDR.size))[0] == wire.RESP_OK_EVENT
    status = EVENT.unpack_from(guest.mem.read(resp + HDR.size, EVENT.size))[0]
    assert status == wire.EVENT_STATUS_COMPLETE


@pytest.mark.parametrize("wants_call", [False, True])
def test_a_call_is_requested_only_when_the_driver_wants_one(backend, guest, wants_call):
    fence = Fence(-1, 1)
    head, _resp = hold_on(backend, guest, fence)
    if wants_call:
        assert guest.queue.enable_interrupts()  # used_event: the next used entry
    else:
        guest.queue.disable_interrupts()  # a polling driver
    signal_elsewhere(fence)
    assert [h for h, _n in guest.queue.pop_used()] == [head]
    calls = [codec.decode(f)[0] for _p, f in backend.run_completions()]
    if wants_call:
        assert calls == [{"op": wire.OP_CALL, "dev": 0, "queue": wire.CONTROLQ,
                          "notify": True}]
    else:
        assert calls == []
        assert not backend._completions  # the I/O loop was not even woken


def test_reset_before_the_fence_signals_drops_the_chain(backend, guest):
    fence = Fence(-1, 1)
    hold_on(backend, guest, fence)
    before = guest.used_idx()
    guest.request(wire.OP_SET_STATUS, dev=0, status=0)
    signal_elsewhere(fence)
    assert guest.used_idx() == before
    assert backend.run_completions() == []


def test_reset_while_the_fence_signals_drops_the_chain(backend, guest):
    """The I/O loop holds the queue lock (it is handling a message) when the fence
    signals: the completion goes to the loop, and the reset it handles drops it."""
    fence = Fence(-1, 1)
    hold_on(backend, guest, fence)
    before = guest.used_idx()
    session = backend.sessions[guest.peer]
    with session.queue_lock:
        signal_elsewhere(fence)  # finds the lock held: posted, not waiting for it
        assert guest.used_idx() == before
        guest.request(wire.OP_SET_STATUS, dev=0, status=0)
    assert backend.run_completions() == []
    assert guest.used_idx() == before


def test_reset_that_cancels_the_held_job_writes_nothing(backend, guest):
    """The reset itself signals the held job's fence (a queued job fails with its
    context); the callback runs on the resetting thread, re-entering the queue lock, and
    must find the chain already dropped."""
    fence = Fence(-1, 1)
    hold_on(backend, guest, fence)
    assert guest.call(cmd(wire.CMD_CTX_CREATE, (0, b""), ctx_id=1))[0] == wire.RESP_OK_NODATA
    assert guest.call(cmd(wire.CMD_EVENT_WAIT, (7,), ctx_id=1))[0] == wire.RESP_OK_NODATA
    head, _resp, out = guest.kick(cmd(wire.CMD_LAUNCH, (wire.KERNEL_BURN, 1, 1, 1, 1, 1, 1, 1),
                                      ctx_id=1, flags=wire.FLAG_FENCE,
                                      extra=struct.pack("<Q", 0)), at=2 << 20)
    assert guest.queue.pop_used() == []  # queued behind the event, held
    before = guest.used_idx()
    session = backend.sessions[guest.peer]
    job = session.devices[0].compute.contexts[1].timeline(0).last_fence
    guest.seq += 1
    backend.handle(guest.peer, codec.encode({"op": wire.OP_SET_STATUS, "seq": guest.seq,
                                             "dev": 0, "status": 0}), 0.0)
    assert job.signaled and job.error is not None  # the reset failed the queued job...
    assert guest.used_idx() == before  # ...and its chain was not answered
    signal_elsewhere(fence)
    backend.run_completions()
    assert guest.used_idx() == before


def test_inline_model_completes_on_the_backend_thread(backend):
    """Inline memory: the bytes reach the driver only as a call's patches, which the I/O
    loop builds and sends; a completion elsewhere could change the mirror in between."""
    g = Guest(backend, b"inline")
    g.init()
    fence = Fence(-1, 1)
    snapshot = EventSnapshot([fence], clock=backend.kmds[0].clock_ns)
    handle, token = backend.event_exports.export("the test", snapshot)
    g.call(cmd(wire.CMD_EVENT_IMPORT, (7, handle, token)))
    head, _resp = g.submit(cmd(wire.CMD_EVENT_QUERY, (7,), flags=wire.FLAG_FENCE))
    mirror = backend.sessions[g.peer].mem
    used_idx = g.queue.layout.used + 2
    before = mirror.read_u16(used_idx)
    signal_elsewhere(fence)
    assert mirror.read_u16(used_idx) == before  # posted to the I/O loop, not written
    g._deliver(backend.run_completions())
    assert g.queue.pop_used() == [(head, HDR.size + EVENT.size)]
