"""A guest driver written from the spec alone: no guest/, no transport/, only pvgpu.spec.wire's
constants, zmq and msgpack. It opens a session, offers its memory, sets up one split
virtqueue and sends three commands: MEM_ALLOC, COPY_H2D and COPY_D2H, then checks that the
bytes came back.

    pvgpu host &
    python examples/raw_guest.py [ENDPOINT]     # default: $PVGPU_ENDPOINT, else the local host
"""

import fcntl
import mmap
import os
import struct
import sys

import msgpack
import zmq

from pvgpu.spec import wire

MEM = 1 << 20  # guest memory: one sealed memfd the host maps (shared model, spec §3.2)
Q = 16  # queue size; the rings sit at fixed guest-physical addresses
DESC, AVAIL, USED = 0x1000, 0x2000, 0x3000
CMD, RESP, DATA = 0x4000, 0x5000, 0x10000
SIZE, CTX = 4096, 1

sock = zmq.Context.instance().socket(zmq.DEALER)
sock.linger = 0
endpoint = (sys.argv[1] if len(sys.argv) > 1 else os.environ.get("PVGPU_ENDPOINT")
            or "ipc://" + os.path.join(os.environ.get("XDG_RUNTIME_DIR", "."), "pvgpu.sock"))
sock.connect(endpoint)
seq = 0


def request(op, **fields):
    """A control request (spec §2): one msgpack frame, answered by a reply with its seq."""
    global seq
    seq += 1
    sock.send(msgpack.packb({"op": op, "seq": seq, **fields}))
    while True:
        reply = msgpack.unpackb(sock.recv_multipart()[0])
        if reply["op"] == wire.OP_REPLY and reply["seq"] == seq:
            assert reply["ok"], reply
            return reply


# Guest memory: a memfd sealed against shrinking, named by its /proc path (spec §2.7).
fd = os.memfd_create("raw-guest", os.MFD_ALLOW_SEALING)
os.ftruncate(fd, MEM)
fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
mem = mmap.mmap(fd, MEM)

hello = request(wire.OP_HELLO, version=list(wire.PROTOCOL_VERSION), name="raw-guest",
                memory=wire.MEMORY_SHARED, mem_size=MEM)
at = wire.MEM_CHALLENGE_GPA  # the challenge proves that this memory is the session's
mem[at:at + wire.MEM_CHALLENGE_SIZE] = hello["mem_challenge"]
request(wire.OP_SET_MEM_TABLE,
        regions=[{"gpa": 0, "size": MEM, "name": f"/proc/{os.getpid()}/fd/{fd}"}])

# Device 0: virtio's initialisation sequence (spec §2.6), accepting only VIRTIO_F_VERSION_1 (no
# indirect descriptors, no EVENT_IDX, no event queue: the simplest ring).
status = wire.STATUS_ACKNOWLEDGE | wire.STATUS_DRIVER
request(wire.OP_SET_STATUS, dev=0, status=status)
offered = request(wire.OP_GET_FEATURES, dev=0)["features"]
assert offered & wire.REQUIRED_FEATURES
request(wire.OP_SET_FEATURES, dev=0, features=wire.REQUIRED_FEATURES)
request(wire.OP_SET_STATUS, dev=0, status=status | wire.STATUS_FEATURES_OK)
request(wire.OP_SET_VRING, dev=0, queue=wire.CONTROLQ, size=Q, desc=DESC, avail=AVAIL, used=USED)
request(wire.OP_ENABLE_VRING, dev=0, queue=wire.CONTROLQ, enable=True)
request(wire.OP_SET_STATUS, dev=0, status=status | wire.STATUS_FEATURES_OK | wire.STATUS_DRIVER_OK)

avail_idx = used_idx = 0


def call(command: bytes, readable=(), writable=()) -> bytes:
    """One request: the command and `readable` buffers for the device to read, a response
    buffer and `writable` buffers for it to write (its data follows the response header:
    spec §6.1), chained from descriptor 0; kick, wait for the used ring to move (§4, §2.9)."""
    global avail_idx, used_idx
    mem[CMD:CMD + len(command)] = command
    resp_len = wire.CTRL_HDR_SIZE if writable else wire.MIN_RESPONSE_SIZE
    bufs = [(CMD, len(command), 0), *((a, n, 0) for a, n in readable),
            (RESP, resp_len, wire.VIRTQ_DESC_F_WRITE),
            *((a, n, wire.VIRTQ_DESC_F_WRITE) for a, n in writable)]
    for i, (addr, n, flags) in enumerate(bufs):
        more = wire.VIRTQ_DESC_F_NEXT if i + 1 < len(bufs) else 0
        struct.pack_into(wire.VIRTQ_DESC_FORMAT, mem, DESC + wire.VIRTQ_DESC_SIZE * i,
                         addr, n, flags | more, i + 1)
    struct.pack_into("<H", mem, AVAIL + 4 + 2 * (avail_idx % Q), 0)  # the chain's head
    avail_idx += 1
    struct.pack_into("<H", mem, AVAIL + 2, avail_idx)  # publish
    sock.send(msgpack.packb({"op": wire.OP_KICK, "dev": 0, "queue": wire.CONTROLQ}))
    while struct.unpack_from("<H", mem, USED + 2)[0] == used_idx:
        msgpack.unpackb(sock.recv_multipart()[0])  # a `call` notification (or a heartbeat)
    head, length = struct.unpack_from("<II", mem, USED + 4 + 8 * (used_idx % Q))
    assert head == 0, head  # the used element names our chain
    used_idx += 1
    resp = bytes(mem[RESP:RESP + min(length, resp_len)])
    kind = wire.unpack_ctrl_hdr(resp)[0]
    assert kind < wire.RESP_ERR_UNSPEC, f"device error {kind:#x}: {resp[wire.CTRL_HDR_SIZE:]!r}"
    return resp


def cmd(kind: int, *body, fence: int = 0) -> bytes:
    """A command: the control header, then the body in its pvgpu.spec.wire format."""
    return (wire.pack_ctrl_hdr(kind, wire.FLAG_FENCE if fence else 0, fence, CTX)
            + struct.pack(wire.CMD_BODY_FORMATS[kind], *body))


call(cmd(wire.CMD_CTX_CREATE, 0, b"raw"))
resp = call(cmd(wire.CMD_MEM_ALLOC, 1, 0, SIZE))
va, _size = struct.unpack_from(wire.RESP_MEM_ALLOC_FORMAT, resp, wire.CTRL_HDR_SIZE)
payload = bytes(range(256)) * (SIZE // 256)
mem[DATA:DATA + SIZE] = payload
call(cmd(wire.CMD_COPY_H2D, va, SIZE, fence=1), readable=[(DATA, SIZE)])  # answered when done
call(cmd(wire.CMD_COPY_D2H, va, SIZE, fence=2), writable=[(DATA + SIZE, SIZE)])
assert mem[DATA + SIZE:DATA + 2 * SIZE] == payload
print(f"{SIZE} bytes to device VA {va:#x} and back through one virtqueue: they match")
request(wire.OP_BYE)
