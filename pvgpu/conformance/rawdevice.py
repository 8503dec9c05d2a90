"""The device side of the conformance suite: raw requests through a real driver.

Requests are raw bytes and responses are read back raw, so every header field the device
writes is checked. A check's `raw` and `two` (context.py) are Raw objects."""

import struct

from pvgpu.spec import wire

HDR = struct.Struct(wire.CTRL_HDR_FORMAT)


def cmd(type_, body=(), *, ctx_id=0, flags=0, fence_id=0, ring_idx=0, extra=b""):
    if fence_id:
        flags |= wire.FLAG_FENCE
    return (HDR.pack(type_, flags, fence_id, ctx_id, ring_idx)
            + struct.pack(wire.CMD_BODY_FORMATS[type_], *body) + extra)


def launch(kernel, *args, ctx_id, fence_id=0, ring_idx=0):
    sig = wire.BUILTIN_KERNELS[kernel]
    slots = b"".join(struct.pack("<f", a) + b"\0" * 4 if kind == wire.ARG_F32 else struct.pack("<Q", a)
                     for (_, kind), a in zip(sig.args, args))
    return cmd(wire.CMD_LAUNCH, (kernel, 1, 1, 1, 64, 1, 1, len(args)), ctx_id=ctx_id,
               fence_id=fence_id, ring_idx=ring_idx, extra=slots)


def h2d(raw, ctx, va, data):
    """COPY_H2D of `data` to `va` of context ctx; -> (header, body, used length)."""
    return raw.call(cmd(wire.CMD_COPY_H2D, (va, len(data)), ctx_id=ctx), data)


def d2h(raw, ctx, va, n):
    """COPY_D2H of n bytes from `va` of context ctx, which must succeed; -> the bytes."""
    hdr, body, used = raw.call(cmd(wire.CMD_COPY_D2H, (va, n), ctx_id=ctx), read_back=n)
    assert hdr[0] == wire.RESP_OK_NODATA and used == wire.CTRL_HDR_SIZE + n, hdr
    return body[:n]


def completes(order, name, req):
    """Append `name` to `order` when request `req` completes (used buffers are reaped in
    the order the device returned them); -> req."""
    if req.done:
        order.append(name)
    else:
        req.on_done = lambda _req: order.append(name)
    return req


class Raw:
    """Submit raw requests through a real driver; read responses without interpreting them."""

    def __init__(self, conn, dev=0):
        self.conn = conn
        self.drv = conn.devices[dev].driver
        self.heap = conn.session.heap
        self.ctx_ids = iter(range(100, 10_000))
        self.timeout = conn.session.timeout  # the session's wait for any answer

    def submit(self, command, data=b"", read_back=0):
        readable, writable = [], []
        if data:
            gpa = self.heap.alloc(len(data))
            self.drv.mem.write(gpa, data)
            readable.append((gpa, len(data)))
        if read_back:
            writable.append((self.heap.alloc(read_back), read_back))
        return self.drv.submit(command, readable, writable)

    def wait(self, req):
        self.conn.session.wait_for(lambda: req.done, timeout=self.timeout)
        mem = self.drv.mem
        raw = b"".join(mem.read(g, n) for g, n in req.writable)[:req.used_len]
        return HDR.unpack_from(raw), raw[wire.CTRL_HDR_SIZE:], req.used_len

    def call(self, command, data=b"", read_back=0):
        return self.wait(self.submit(command, data, read_back))

    def context(self):
        ctx_id = next(self.ctx_ids)
        hdr, _, _ = self.call(cmd(wire.CMD_CTX_CREATE, (0, b"conformance"), ctx_id=ctx_id))
        assert hdr[0] == wire.RESP_OK_NODATA
        return ctx_id

    def alloc(self, ctx_id, size, rid):
        hdr, body, _ = self.call(cmd(wire.CMD_MEM_ALLOC, (rid, 0, size), ctx_id=ctx_id))
        assert hdr[0] == wire.RESP_OK_MEM_ALLOC
        return struct.unpack_from(wire.RESP_MEM_ALLOC_FORMAT, body)
