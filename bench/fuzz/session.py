"""A raw guest session for the fuzzer: the control channel and one control queue, by hand.

`RawSession` speaks the wire itself (a bare ZeroMQ DEALER, frames built with
transport/codec.py) so that any frame can be sent, and drives the control queue of device 0
with transport/virtqueue.py over guest memory of either model (transport/memory.py). It
answers what a case needs to know: the reply to a request (or that none came), the used
entry of a chain (or that none came), and whether the device announced DEVICE_NEEDS_RESET.

Layout of the guest memory (MEM_SIZE bytes): the challenge at gpa 0 (shared model), the
queue at QUEUE_GPA, a readable and a writable buffer for the one request in flight, and a
scratch area for the invalid chains' indirect tables.
"""

from __future__ import annotations

import struct
import time

import msgpack
import zmq

from pvgpu.bench.fuzz import shapes
from pvgpu.spec import wire
from pvgpu.transport.codec import encode
from pvgpu.transport.memory import InlineGuestMemory, SharedGuestMemory
from pvgpu.transport.virtqueue import DriverQueue, VirtqLayout

MEM_SIZE = 2 << 20
QUEUE_GPA = 0x1000
QUEUE_SIZE = 64
# Buffers of the requests in flight: SLOTS slots, each with a readable part, a writable
# part and room for an indirect table. Slot 0 takes the largest requests.
SLOTS = 8
READ_GPA = 0x10000
READ_SLOT = 0x8000
WRITE_GPA = 0x50000
WRITE_SLOT = 0x8000
TABLE_GPA = 0x90000
TABLE_SLOT = 0x1000
READ_MAX = SLOTS * READ_SLOT  # the most slot 0 takes (it may run over into the others)
WRITE_MAX = SLOTS * WRITE_SLOT
SCRATCH_GPA = 0x100000  # indirect tables and buffers of invalid chains
SCRATCH_SIZE = MEM_SIZE - SCRATCH_GPA
SLICE = 0.02  # seconds between looks at the used ring while waiting
PING_EVERY = 0.3  # keep the session alive (CTL-HB-2) during long waits
_HDR = struct.Struct(wire.CTRL_HDR_FORMAT)


class NoReply(Exception):
    """The host did not answer within the bound."""


class RawSession:
    """One connection to the host; `open()` makes it a session with device 0 ready."""

    def __init__(self, endpoint: str, memory: str, *, timeout: float = 5.0,
                 features: int = wire.DEVICE_FEATURES):
        self.endpoint = endpoint
        self.memory = memory
        self.inline = memory == wire.MEMORY_INLINE
        self.timeout = timeout
        self.wanted = features
        self.zctx = zmq.Context.instance()
        self.sock = self.zctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(endpoint)
        self.seq = 0
        self.mem = None
        self.queue = None
        self.features = 0
        self.needs_reset = False  # config_changed seen for device 0
        self.write_gpa = {}  # head -> gpa of its writable part
        self.last_sent = time.monotonic()

    # ------------------------------------------------------------------ channel
    def send(self, frames) -> None:
        self.sock.send_multipart(frames, copy=True)
        self.last_sent = time.monotonic()

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def _recv(self, timeout: float):
        """-> (msg, frames) or None; notifications are handled here and returned too."""
        if not self.sock.poll(max(0, int(timeout * 1000))):
            return None
        frames = self.sock.recv_multipart(copy=True)
        msg = msgpack.unpackb(frames[0], raw=False)
        extra = frames[1:]
        op = msg.get("op")
        if op == wire.OP_CALL and self.inline and msg.get("patches") and self.mem is not None:
            self.mem.apply_patches(msg["patches"], extra)
        elif op == wire.OP_CONFIG_CHANGED and msg.get("dev") == 0:
            self.needs_reset = True
        return msg, extra

    def await_reply(self, seq: int, timeout: float | None = None) -> tuple:
        """-> (reply, replies to other seqs that came first). Raises NoReply."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        others = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise NoReply(f"no reply to seq {seq}")
            got = self._recv(min(left, PING_EVERY))
            if got is None:
                continue
            msg = got[0]
            if msg.get("op") == wire.OP_REPLY:
                if msg.get("seq") == seq:
                    return msg, others
                others.append(msg)

    def request(self, op: str, **fields) -> dict:
        seq = self.next_seq()
        self.send(encode({"op": op, "seq": seq, **fields}))
        return self.await_reply(seq)[0]

    def control(self, op: str, **fields) -> dict:
        """A request that must succeed (session set-up)."""
        reply = self.request(op, **fields)
        if not reply.get("ok"):
            raise RuntimeError(f"{op}: {reply.get('error')}: {reply.get('message')}")
        return reply

    # ------------------------------------------------------------------ session
    def hello_fields(self) -> dict:
        return {"version": list(wire.PROTOCOL_VERSION), "name": "fuzz",
                "memory": self.memory, "mem_size": MEM_SIZE}

    def open(self) -> "RawSession":
        hello = self.control(wire.OP_HELLO, **self.hello_fields())
        self.devices = hello["devices"]
        if self.inline:
            self.mem = InlineGuestMemory(MEM_SIZE)
        else:
            self.mem = SharedGuestMemory.create(MEM_SIZE)
            self.mem.write(wire.MEM_CHALLENGE_GPA, hello["mem_challenge"])
            self.control(wire.OP_SET_MEM_TABLE, regions=self.mem_table())
        self.init_device()
        return self

    def mem_table(self) -> list:
        return [{"gpa": 0, "size": MEM_SIZE, "name": self.mem.name}]

    def init_device(self) -> None:
        """virtio initialisation of device 0 (DEV-INIT-1), from a reset."""
        c = self.control
        c(wire.OP_SET_STATUS, dev=0, status=0)
        while self._recv(0) is not None:  # calls of before the reset (DEV-RESET-5)
            pass
        self.needs_reset = False
        status = wire.STATUS_ACKNOWLEDGE | wire.STATUS_DRIVER
        c(wire.OP_SET_STATUS, dev=0, status=wire.STATUS_ACKNOWLEDGE)
        c(wire.OP_SET_STATUS, dev=0, status=status)
        self.features = c(wire.OP_GET_FEATURES, dev=0)["features"] & self.wanted
        c(wire.OP_SET_FEATURES, dev=0, features=self.features)
        status |= wire.STATUS_FEATURES_OK
        c(wire.OP_SET_STATUS, dev=0, status=status)
        self.layout = VirtqLayout.at(QUEUE_GPA, QUEUE_SIZE)
        self.write_gpa = {}
        self.queue = DriverQueue(self.mem, self.layout, event_idx=self.has(wire.VIRTIO_F_EVENT_IDX),
                                 indirect=self.indirect)
        c(wire.OP_SET_VRING, dev=0, queue=wire.CONTROLQ, size=self.layout.size,
          desc=self.layout.desc, avail=self.layout.avail, used=self.layout.used)
        c(wire.OP_ENABLE_VRING, dev=0, queue=wire.CONTROLQ, enable=True)
        c(wire.OP_SET_STATUS, dev=0, status=status | wire.STATUS_DRIVER_OK)

    def has(self, bit: int) -> bool:
        return bool(self.features >> bit & 1)

    @property
    def indirect(self) -> bool:
        return self.has(wire.VIRTIO_F_INDIRECT_DESC)

    # ------------------------------------------------------------------ control queue
    def kick_message(self) -> list:
        """The frames of a kick carrying every byte written since the last one."""
        msg = {"op": wire.OP_KICK, "dev": 0, "queue": wire.CONTROLQ}
        if not self.inline:
            return encode(msg)
        dirty = self.mem.take_dirty()
        msg["patches"] = [[gpa, i] for i, (gpa, _n) in enumerate(dirty)]
        return encode(msg, [self.mem.read(gpa, n) for gpa, n in dirty])

    def kick(self) -> None:
        self.send(self.kick_message())

    def submit(self, readable: bytes, writable_len: int, *, rng=None, shape=None,
               slot: int = 0, kick: bool = True) -> int:
        """Publish one request chain (readable bytes, then writable_len bytes) in buffer
        slot `slot` (of SLOTS), split into descriptors as `shape` says, and kick. -> head"""
        read_gpa, write_gpa = READ_GPA + slot * READ_SLOT, WRITE_GPA + slot * WRITE_SLOT
        if shape is None:
            pieces = [(read_gpa, readable)] if readable else []
            wr = [(write_gpa, writable_len)] if writable_len else []
        else:
            pieces, wr = shapes.segments(rng, shape, readable, read_gpa, writable_len, write_gpa,
                                          READ_SLOT)
        for gpa, data in pieces:
            self.mem.write(gpa, data)
        rd = [(gpa, len(data)) for gpa, data in pieces]
        if not rd and not wr:
            wr = [(write_gpa, 0)]  # a chain has at least one descriptor
        table = TABLE_GPA + slot * TABLE_SLOT if shape is not None and shape.indirect \
            and self.indirect else None
        head = self.queue.add_chain(rd, wr, indirect_table=table)
        self.write_gpa[head] = write_gpa
        if kick:
            self.kick()
        return head

    def reap(self) -> list:
        """-> [(head, used len, response bytes)] of every chain returned so far."""
        out = []
        for head, n in self.queue.pop_used():
            gpa = self.write_gpa.pop(head)
            out.append((head, n, self.mem.read(gpa, min(n, WRITE_SLOT))))
        return out

    def wait_used(self, timeout: float) -> tuple | None:
        """-> (used len, response bytes) of the one chain in flight; None when no used
        entry came within timeout or the device announced DEVICE_NEEDS_RESET."""
        got = self.wait_all(1, timeout)
        return got[0][1:] if got else None

    def wait_all(self, count: int, timeout: float) -> list | None:
        """-> [(head, used len, response bytes)] once `count` chains came back; None when
        they did not within timeout or the device announced DEVICE_NEEDS_RESET."""
        deadline = time.monotonic() + timeout
        done = []
        while True:
            done += self.reap()
            if len(done) >= count:
                return done
            if self.needs_reset:
                return None
            now = time.monotonic()
            if now >= deadline:
                return None
            if now - self.last_sent > PING_EVERY:
                self.send(encode({"op": wire.OP_PING, "seq": self.next_seq()}))
            self._recv(min(SLICE, deadline - now))

    def call(self, readable: bytes, writable_len: int = wire.MIN_RESPONSE_SIZE,
             timeout: float | None = None, *, rng=None, shape=None):
        self.submit(readable, writable_len, rng=rng, shape=shape)
        return self.wait_used(self.timeout if timeout is None else timeout)

    def command(self, type_: int, body=(), *, ctx_id: int = 0, extra: bytes = b"",
                read_back: int = 0):
        """A well-formed command; -> (response header tuple, body bytes) or None."""
        req = (_HDR.pack(type_, 0, 0, ctx_id, 0)
               + struct.pack(wire.CMD_BODY_FORMATS[type_], *body) + extra)
        got = self.call(req, wire.MIN_RESPONSE_SIZE + read_back)
        if got is None or got[0] < wire.CTRL_HDR_SIZE:
            return None
        return _HDR.unpack_from(got[1]), got[1][wire.CTRL_HDR_SIZE:]

    def wait_needs_reset(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.needs_reset:
            now = time.monotonic()
            if now >= deadline:
                return False
            self._recv(min(SLICE, deadline - now))
        return True

    # ------------------------------------------------------------------ teardown
    def close(self, bye: bool = True) -> None:
        try:
            if bye:
                try:
                    self.request(wire.OP_BYE)
                except NoReply:
                    pass
        finally:
            self.sock.close()
            if self.mem is not None and hasattr(self.mem, "close"):
                self.mem.close()
            self.mem = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
