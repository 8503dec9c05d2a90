"""Appendix A of spec/pvgpu.md, generated from a recorded session.

The appendix is a worked example: one COPY_H2D request, shown as the control messages and
the bytes in guest memory that carry it, in both memory models. Nothing in it is typed by
hand: `record(endpoint, memory)` drives a real host through a minimal driver written here
(pvgpu.transport.channel, pvgpu.transport.virtqueue, pvgpu.transport.memory; none of guest/), keeps every
control message it sent and received and the guest-memory bytes of the request, and
`render()` turns two recordings into the appendix's text. tests/conformance/
test_spec_appendix.py records a fresh session and fails when the text differs from the
spec's, so the appendix cannot drift from what a host does.

    python tests/appendix_a.py            # print the appendix recorded from a fresh host
    python tests/appendix_a.py --write    # and replace Appendix A of spec/pvgpu.md with it

Values that differ from run to run are shown as placeholders: the `mem_challenge` bytes
and the memory object's path.
"""

from __future__ import annotations

import re
import struct
import sys
from pathlib import Path

from pvgpu.spec import wire
from pvgpu.transport.channel import GuestChannel
from pvgpu.transport.codec import encode
from pvgpu.transport.memory import InlineGuestMemory, SharedGuestMemory
from pvgpu.transport.virtqueue import DriverQueue, VirtqLayout

SPEC = Path(__file__).resolve().parents[1] / "spec" / "pvgpu.md"
HEADING = "## Appendix A"
VRAM = "1G"  # the host's --vram, fixed so that the recorded devices are too

Q = 256
DESC, AVAIL, USED = 0x0, 0x1000, 0x2000
INDIRECT, CMD, DATA, RESP = 0x10000, 0x10100, 0x11000, 0x12000
SETUP = 0x20000  # the earlier requests' buffers (CTX_CREATE, MEM_ALLOC)
MEM_SIZE = 1 << 20
CTX, FENCE, SIZE = 1, 7, 4096
PAYLOAD = bytes(range(256)) * (SIZE // 256)
HDR = struct.Struct(wire.CTRL_HDR_FORMAT)
STATUS_NAMES = {wire.STATUS_ACKNOWLEDGE: "ACKNOWLEDGE", wire.STATUS_DRIVER: "DRIVER",
                wire.STATUS_FEATURES_OK: "FEATURES_OK", wire.STATUS_DRIVER_OK: "DRIVER_OK"}


class Recording:
    """What one session said and heard, and the request's bytes in guest memory."""

    def __init__(self, memory: str):
        self.memory = memory
        self.messages = []  # (direction, msg, [len of each extra frame])
        self.bytes = {}  # name -> bytes read from guest memory
        self.kick_frame0 = b""
        self.head = self.avail_slot = self.used_slot = self.used_idx = None
        self.used_len = None


class _Driver:
    """Just enough of a driver for the example: one device, one queue, one request."""

    def __init__(self, endpoint: str, memory: str):
        self.rec = Recording(memory)
        self.channel = GuestChannel(endpoint)
        self.inline = memory == wire.MEMORY_INLINE

    def request(self, op: str, **fields) -> dict:
        reply, _ = self.channel.request({"op": op, **fields}, timeout=30)
        sent = {"op": op, "seq": reply["seq"], **fields}
        self.rec.messages.append(("D→H", sent, []))
        self.rec.messages.append(("H→D", reply, []))
        if not reply["ok"]:
            raise RuntimeError(f"{op}: {reply['error']}: {reply['message']}")
        return reply

    def kick(self) -> None:
        msg, frames = {"op": wire.OP_KICK, "dev": 0, "queue": wire.CONTROLQ}, []
        if self.inline:
            dirty = self.mem.take_dirty()
            msg["patches"] = [[gpa, i] for i, (gpa, _n) in enumerate(dirty)]
            frames = [self.mem.read(gpa, n) for gpa, n in dirty]
        self.rec.kick_frame0 = encode(msg)[0]
        self.channel.send(msg, frames)
        self.rec.messages.append(("D→H", msg, [len(f) for f in frames]))

    def wait_call(self) -> None:
        msg, frames = self.channel.recv_until(lambda m: m.get("op") == wire.OP_CALL, timeout=30)
        if self.inline and msg.get("patches"):
            self.mem.apply_patches(msg["patches"], frames)
        self.rec.messages.append(("H→D", msg, [len(memoryview(f).cast("B")) for f in frames]))

    def open(self) -> None:
        hello = self.request(wire.OP_HELLO, version=list(wire.PROTOCOL_VERSION), name="guest-a",
                             memory=self.rec.memory, mem_size=MEM_SIZE)
        if self.inline:
            self.mem = InlineGuestMemory(MEM_SIZE)
        else:
            self.mem = SharedGuestMemory.create(MEM_SIZE)
            self.mem.write(wire.MEM_CHALLENGE_GPA, hello["mem_challenge"])
            self.request(wire.OP_SET_MEM_TABLE, regions=[{"gpa": 0, "size": MEM_SIZE, "name": self.mem.name}])
        status = 0
        for bit in (wire.STATUS_ACKNOWLEDGE, wire.STATUS_DRIVER):
            status |= bit
            self.request(wire.OP_SET_STATUS, dev=0, status=status)
        offered = self.request(wire.OP_GET_FEATURES, dev=0)["features"]
        # the simplest ring: no EVENT_IDX, no event queue
        features = offered & ~(1 << wire.VIRTIO_F_EVENT_IDX) & ~(1 << wire.PVGPU_F_EVENTQ)
        self.request(wire.OP_SET_FEATURES, dev=0, features=features)
        status |= wire.STATUS_FEATURES_OK
        self.request(wire.OP_SET_STATUS, dev=0, status=status)
        self.request(wire.OP_GET_STATUS, dev=0)
        self.queue = DriverQueue(self.mem, VirtqLayout(Q, DESC, AVAIL, USED), indirect=True)
        self.queue.enable_interrupts()
        self.request(wire.OP_SET_VRING, dev=0, queue=wire.CONTROLQ, size=Q, desc=DESC, avail=AVAIL,
                     used=USED)
        self.request(wire.OP_ENABLE_VRING, dev=0, queue=wire.CONTROLQ, enable=True)
        status |= wire.STATUS_DRIVER_OK
        self.request(wire.OP_SET_STATUS, dev=0, status=status)
        self.setup_messages = len(self.rec.messages)

    def call_quietly(self, command: bytes, at: int) -> bytes:
        """An earlier request (not shown in the example): -> its response."""
        self.mem.write(at, command)
        self.queue.add_chain([(at, len(command))], [(at + 0x100, wire.MIN_RESPONSE_SIZE)],
                             indirect_table=at + 0x800)
        self.kick()
        self.wait_call()
        del self.rec.messages[-2:]
        (head, n), = self.queue.pop_used()
        return self.mem.read(at + 0x100, n)

    def setup(self) -> None:
        """CTX_CREATE of context 1 and a MEM_ALLOC of SIZE bytes in it."""
        create = (HDR.pack(wire.CMD_CTX_CREATE, 0, 0, CTX, 0)
                  + struct.pack(wire.CMD_BODY_FORMATS[wire.CMD_CTX_CREATE], 0, b"example"))
        assert HDR.unpack_from(self.call_quietly(create, SETUP))[0] == wire.RESP_OK_NODATA
        alloc = (HDR.pack(wire.CMD_MEM_ALLOC, 0, 0, CTX, 0)
                 + struct.pack(wire.CMD_BODY_FORMATS[wire.CMD_MEM_ALLOC], 1, 0, SIZE))
        resp = self.call_quietly(alloc, SETUP + 0x1000)
        assert HDR.unpack_from(resp)[0] == wire.RESP_OK_MEM_ALLOC
        self.va = struct.unpack_from(wire.RESP_MEM_ALLOC_FORMAT, resp, wire.CTRL_HDR_SIZE)[0]

    def copy(self) -> None:
        rec = self.rec
        command = (HDR.pack(wire.CMD_COPY_H2D, wire.FLAG_FENCE, FENCE, CTX, 0)
                   + struct.pack(wire.CMD_BODY_FORMATS[wire.CMD_COPY_H2D], self.va, SIZE))
        self.mem.write(CMD, command)
        self.mem.write(DATA, PAYLOAD)
        rec.avail_slot = self.queue.avail_idx % Q
        rec.head = self.queue.add_chain([(CMD, len(command)), (DATA, SIZE)],
                                        [(RESP, wire.MIN_RESPONSE_SIZE)], indirect_table=INDIRECT)
        rec.bytes["command"] = self.mem.read(CMD, len(command))
        rec.bytes["indirect"] = self.mem.read(INDIRECT, 3 * 16)
        rec.bytes["desc"] = self.mem.read(DESC + 16 * rec.head, 16)
        rec.bytes["avail_entry"] = self.mem.read(AVAIL + 4 + 2 * rec.avail_slot, 2)
        rec.bytes["avail_idx"] = self.mem.read(AVAIL + 2, 2)
        rec.avail_idx = self.queue.avail_idx
        rec.used_slot = self.queue.last_used_idx % Q
        self.kick()
        self.wait_call()
        (head, n), = self.queue.pop_used()
        assert head == rec.head
        rec.used_len = n
        rec.bytes["response"] = self.mem.read(RESP, n)
        rec.bytes["used_elem"] = self.mem.read(USED + 4 + 8 * rec.used_slot, 8)
        rec.bytes["used_idx"] = self.mem.read(USED + 2, 2)
        rec.used_idx = self.queue.last_used_idx

    def close(self) -> None:
        try:
            self.channel.send({"op": wire.OP_BYE})
        finally:
            self.channel.close()
            if isinstance(self.mem, SharedGuestMemory):
                self.mem.close()


def record(endpoint: str, memory: str) -> Recording:
    drv = _Driver(endpoint, memory)
    try:
        drv.open()
        drv.setup()
        drv.copy()
    finally:
        drv.close()
    return drv.rec


# ---------------------------------------------------------------------------- rendering
BREAK = "\0"  # where a long message may be broken across lines


def _value(v, key=None) -> str:
    """A msgpack value in the appendix's notation, with BREAK after every comma."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (bytes, bytearray, memoryview)):
        return f"<{len(v)} random bytes>" if key == "mem_challenge" else f"<{len(v)} bytes>"
    if isinstance(v, str):
        if key == "name" and v.startswith("/"):  # a memfd path: the pid and fd vary
            v = re.sub(r"\d+", "<n>", v)
        return f'"{v}"'
    if isinstance(v, int):
        return str(v)
    if isinstance(v, dict):
        return "{" + f",{BREAK}".join(f"{k}: {_value(x, k)}" for k, x in v.items()) + "}"
    if key == "patches":
        return "[" + f",{BREAK}".join(f"[{gpa:#x}, {i}]" for gpa, i in v) + "]"
    return "[" + f",{BREAK}".join(_value(x, key) for x in v) + "]"


def _wrap(prefix: str, text: str, note: str = "", width: int = 90) -> list:
    """prefix + text, broken at BREAKs to fit width; continuation lines indented 6."""
    lines, cur = [], prefix
    for i, piece in enumerate(text.split(BREAK)):
        piece = piece if i == 0 else " " + piece
        if len(cur) + len(piece) > width and cur.strip():
            lines.append(cur.rstrip())
            cur = " " * 6 + piece.lstrip()
        else:
            cur += piece
    if note:
        if len(cur) + 2 + len(note) <= width:
            cur = f"{cur}  {note}"
        else:
            lines.append(cur)
            cur = " " * 6 + note
    lines.append(cur)
    return lines


def _note(direction: str, msg: dict) -> str:
    op = msg["op"]
    if direction == "D→H" and op == wire.OP_SET_STATUS:
        names = [n for bit, n in STATUS_NAMES.items() if msg["status"] & bit]
        return f"({' | '.join(names)})"
    if "features" in msg:
        return f"({msg['features']:#x})"
    if "mem_challenge" in msg:
        return "(the driver writes mem_challenge at gpa 0)"
    return ""


def _what(gpa: int, n: int) -> str:
    """What a patch of the example holds."""
    if DESC <= gpa < DESC + 16 * Q and not (gpa - DESC) % 16 and n == 16:
        return f"descriptor {(gpa - DESC) // 16}"
    parts = {AVAIL + 2: "avail.idx", USED + 2: "used.idx",
             INDIRECT: "indirect table", CMD: "header + body", DATA: "data",
             RESP: "response header"}
    if gpa in parts:
        return parts[gpa]
    if AVAIL + 4 <= gpa < AVAIL + 4 + 2 * Q:
        return f"avail.ring[{(gpa - AVAIL - 4) // 2}]"
    if USED + 4 <= gpa < USED + 4 + 8 * Q:
        return f"used.ring[{(gpa - USED - 4) // 8}]"
    return ""


def _messages(lines: list, which, frame0: bytes = b"") -> None:
    for direction, msg, frames in which:
        if direction == "H→D" and msg["op"] == wire.OP_REPLY and len(msg) == 3:
            continue  # a bare {op: reply, seq, ok: true}: shown as nothing
        head = {k: msg[k] for k in ("op", "seq", "ok") if k in msg}
        shown = {**head, **{k: v for k, v in msg.items() if k not in head}}
        lines += _wrap(f"{direction}  ", _value(shown), _note(direction, msg))
        if msg["op"] == wire.OP_KICK and frame0:
            lines.append(f"     frame 0 bytes: {_hex(frame0)}")
        for i, n in enumerate(frames):
            gpa = msg["patches"][i][0]
            lines.append(f"     extra {i}: {n:4d} bytes   {_what(gpa, n)}".rstrip())


def _hex(b: bytes) -> str:
    return " ".join(f"{x:02x}" for x in b)


def _desc(b: bytes) -> tuple:
    addr, length, flags, nxt = struct.unpack("<QIHH", b)
    names = [n for bit, n in ((wire.VIRTQ_DESC_F_NEXT, "NEXT"), (wire.VIRTQ_DESC_F_WRITE, "WRITE"),
                              (wire.VIRTQ_DESC_F_INDIRECT, "INDIRECT")) if flags & bit]
    return addr, length, " \\| ".join(names), (str(nxt) if flags & wire.VIRTQ_DESC_F_NEXT else "—")


def render(shared: Recording, inline: Recording) -> str:
    r = shared
    cmd = r.bytes["command"]
    out = [f"{HEADING} (informative): a worked example", "",
           "Generated from recorded sessions by `tests/appendix_a.py` (a test records a fresh",
           "session and compares it with this text). One request, COPY_H2D of "
           f"{SIZE} bytes from guest",
           "memory to VRAM, fenced, through an indirect table, on device 0 of a host started",
           f"with `--vram {VRAM}`. Q = {Q}. Guest memory layout:", "",
           "| gpa | contents |", "|---|---|",
           f"| {DESC:#07x} | descriptor table ({16 * Q} bytes) |",
           f"| {AVAIL:#07x} | available ring ({wire.virtq_avail_size(Q)} bytes) |",
           f"| {USED:#07x} | used ring ({wire.virtq_used_size(Q)} bytes) |",
           f"| {INDIRECT:#07x} | indirect table, 3 entries (48 bytes) |",
           f"| {CMD:#07x} | header + body ({len(cmd)} bytes) |",
           f"| {DATA:#07x} | data ({SIZE} bytes) |",
           f"| {RESP:#07x} | response buffer ({wire.MIN_RESPONSE_SIZE} bytes = `MIN_RESPONSE_SIZE`) |",
           f"| {SETUP:#07x} | the earlier requests' buffers |", "",
           "### A.1 Control messages (shared model)", "",
           "A reply that carries nothing but `ok: true` is left out.", "", "```"]
    _messages(out, r.messages[:_setup_count(r)])
    out += ["```", "",
            f"Two earlier requests, CTX_CREATE of context {CTX} and MEM_ALLOC of {SIZE} bytes in it (which",
            f"placed the buffer at VA {_va(cmd):#x}), went the same way as the one below. The kick of the",
            "shared model carries no extra frames:", "", "```"]
    _messages(out, r.messages[_setup_count(r):], r.kick_frame0)
    out += ["```", "", "### A.2 The request in guest memory", "",
            f"Control header at {CMD:#x} (type `CMD_COPY_H2D`, flags `FLAG_FENCE`, fence_id {FENCE}, "
            f"ctx_id {CTX},", "ring_idx 0):", "", "```", _hex(cmd[:wire.CTRL_HDR_SIZE]), "```", "",
            f"Body at {CMD + wire.CTRL_HDR_SIZE:#x} (dst_va {_va(cmd):#x}, size {SIZE}):", "", "```",
            _hex(cmd[wire.CTRL_HDR_SIZE:]), "```", "",
            f"Indirect table at {INDIRECT:#x}:", "",
            "| entry | addr | len | flags | next | bytes |", "|---|---|---|---|---|---|"]
    for i in range(3):
        b = r.bytes["indirect"][16 * i:16 * i + 16]
        addr, length, flags, nxt = _desc(b)
        out.append(f"| {i} | {addr:#x} | {length} | {flags} | {nxt} | `{_hex(b)}` |")
    addr, length, flags, _ = _desc(r.bytes["desc"])
    out += ["", f"Descriptor table entry {r.head} (the chain's head): addr {addr:#x}, len {length}, "
            f"flags {flags}:", "", "```", _hex(r.bytes["desc"]), "```", "",
            f"Available ring after the driver's update: ring[{r.avail_slot}] = {r.head} "
            f"(`{_hex(r.bytes['avail_entry'])}` at {AVAIL + 4 + 2 * r.avail_slot:#x}),",
            f"then idx = {r.avail_idx} (`{_hex(r.bytes['avail_idx'])}` at {AVAIL + 2:#x}).", "",
            f"When the copy has completed (and everything before it on timeline ({CTX}, 0)), the device",
            f"writes the response at {RESP:#x} (`RESP_OK_NODATA`, echoing the fence):", "", "```",
            _hex(r.bytes["response"]), "```", "",
            f"then used.ring[{r.used_slot}] = {{id {r.head}, len {r.used_len}}} at "
            f"{USED + 4 + 8 * r.used_slot:#x} (`{_hex(r.bytes['used_elem'])}`), then used.idx = "
            f"{r.used_idx}", f"at {USED + 2:#x} (`{_hex(r.bytes['used_idx'])}`), then it sends the call.", "",
            "### A.3 The same request in the inline model", "",
            "`hello` has `memory: \"inline\"` and there is no `set_mem_table`; the rest of the setup",
            "is the same. The kick carries the bytes the driver wrote since its last kick, merged",
            "into ranges, each patch `[gpa, frame_index]` with `frame_index` counting the extra",
            "frames from 0; the device applies them in order, processes the queue, and when the",
            "copy has completed sends back what it wrote the same way:", "", "```"]
    _messages(out, inline.messages[_setup_count(inline):])
    out += ["```", "", "(In msgpack the gpas are plain integers; they are shown in hex here.)", ""]
    return "\n".join(out)


def _setup_count(rec: Recording) -> int:
    return next(i for i, (d, m, _) in enumerate(rec.messages) if m["op"] == wire.OP_KICK)


def _va(cmd: bytes) -> int:
    return struct.unpack_from(wire.CMD_BODY_FORMATS[wire.CMD_COPY_H2D], cmd, wire.CTRL_HDR_SIZE)[0]


def appendix_in_spec(text: str | None = None) -> str:
    text = SPEC.read_text() if text is None else text
    return text[text.index(HEADING):]


def generate(endpoint: str) -> str:
    return render(record(endpoint, wire.MEMORY_SHARED), record(endpoint, wire.MEMORY_INLINE))


def main(argv=None) -> int:
    import shutil

    from pvgpu.procs import HostProcess, private_endpoint

    argv = sys.argv[1:] if argv is None else argv
    endpoint, tmpdir = private_endpoint("pvgpu-appendix")
    host = HostProcess([endpoint], vram=VRAM)
    try:
        text = generate(endpoint)
    finally:
        host.stop()
        shutil.rmtree(tmpdir, ignore_errors=True)
    if "--write" in argv:
        spec = SPEC.read_text()
        SPEC.write_text(spec[:spec.index(HEADING)] + text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
