"""The virtio driver for one pvgpu device (spec §5 device init, §4 virtqueue driver rules, §6).

Runs the virtio initialisation sequence (reset, ACKNOWLEDGE, DRIVER, features,
FEATURES_OK and its re-read, queue setup, DRIVER_OK), owns the driver side of the
control virtqueue and turns device commands into descriptor chains: one ring slot per
request through an indirect table when VIRTIO_F_INDIRECT_DESC is negotiated, a direct
chain otherwise. Every request has a slot of guest memory for its command, its
response and its indirect table, so the hot path allocates nothing; a request that is its
command and response alone has a table of its own in the slot, which the driver writes
once and publishes again while the slot's such requests keep their command size.

Requests are asynchronous: `submit` returns a `Request` that completes when the device
returns the chain on the used ring; `wait` blocks on the session for it.

Kick policy (spec VQ-NOTIFY-6). A request the API does not wait for (an asynchronous
launch or copy) is submitted with `kick=False`: its chain is published in the avail ring
at once, but the notification is deferred, so one kick covers a run of such chains, as
Linux drivers defer `virtqueue_notify` to the end of a batch. The deferred chains are
kicked (`kick()`) as soon as
  - a request is submitted that the driver will wait for (every `call`, every `submit`
    with kick=True), the kick covering the deferred chains before it;
  - `kick_batch` chains are deferred (KICK_BATCH, measured), or the free request slots or
    descriptors run low;
  - the session is about to wait for anything (`FrontendSession.wait_for` flushes every
    device first), or the session closes.
Before that, the latest asynchronous code launch is not even published: the driver holds
it (`hold`) until the next request, built-in launch joining a batch, held launch or kick,
whichever comes first, or sends it fenced as its timeline's sync point (`send_fenced`), as
it does an open launch batch (launch_batch.py); there is never both. Either counts in
`deferred`, so every wait sends it first.

A kick is sent only if the device asked for one (EVENT_IDX `avail_event` crossed by the
deferred run, or `used.flags` without NO_NOTIFY); in the inline model always, since it
carries the memory the chains point at. Nothing stays unkicked past the next wait:
every call that can observe completion waits.

With PVGPU_F_EVENTQ negotiated the driver also sets up the event queue (spec §5.7): it
keeps EVENTQ_SIZE device-writable buffers posted, and `reap` turns each returned one into
a `DeviceEvent` (a page fault or a lost context), hands it to `event_handler` and
re-posts the buffer.

Timelines. `submit` tells `timelines` (a TimelineLedger, timelines.py) of every request of
a timeline's work, CTX_SYNC, CTX_DESTROY and every fenced one, in the order the chains go
out; `reap` gives it the response type of each sync point's answer; a reset forgets. So the
driver knows which timelines are clean -- all their work covered by a sync point answered
OK -- and `send_fenced_for_context` lets the held-back work, sent fenced, be a whole
context's sync point when every other timeline of the context is.
"""

from __future__ import annotations

import collections
import struct
from typing import Callable, NamedTuple

from pvgpu.guest.frontend.launch_batch import LaunchBatcher, NeverSent
from pvgpu.guest.frontend.timelines import TYPES as _LEDGER_TYPES, TimelineLedger
from pvgpu.spec import isa, wire
from pvgpu.transport.errors import PvgpuError, VirtqError
from pvgpu.transport.virtqueue import DriverQueue, VirtqLayout

QUEUE_SIZE = 256
SLOT_CMD = 256  # header + body + launch args
SLOT_RESP = wire.MIN_RESPONSE_SIZE
SLOT_TABLE_ENTRIES = 16
# the indirect table of a request that is its command and response only (2 entries),
# apart from the table of requests with data extents: it stays valid between them
SLOT_PLAIN_TABLE = SLOT_CMD + SLOT_RESP + SLOT_TABLE_ENTRIES * wire.VIRTQ_DESC_SIZE
SLOT_SIZE = 1024  # cmd 256 | resp 256 | table 256 | plain table 32 | spare
EVENTQ_SIZE = 16  # event buffers kept posted
KICK_BATCH = 32  # deferred chains that make the driver kick unasked (16..64 measured alike)
LOW_WATER = QUEUE_SIZE // 8  # free slots or descriptors below which deferred chains are kicked
_HDR = struct.Struct(wire.CTRL_HDR_FORMAT)
_UNPACK_HDR = _HDR.unpack_from
_TYPE = struct.Struct("<I").unpack_from  # a command's type: the header's first field
_EVTQ_BODY = struct.Struct(wire.EVTQ_BODY_FORMAT)
_ERR = struct.Struct(wire.RESP_ERROR_FORMAT)
WANTED_FEATURES = wire.DEVICE_FEATURES


class DeviceNeedsReset(PvgpuError, RuntimeError):
    """The device reported DEVICE_NEEDS_RESET; pending and new requests fail until reset."""


class DeviceResponseError(PvgpuError, RuntimeError):
    """A device command answered with an error response (RESP_ERR_*)."""

    def __init__(self, resp: int, message: str, info0: int = 0, info1: int = 0, command: int = 0):
        self.resp, self.message, self.info0, self.info1, self.command = resp, message, info0, info1, command
        name = wire.RESP_NAMES.get(resp, hex(resp))
        # a fenced NOP is the sync point where earlier asynchronous errors surface
        cmd = "synchronize" if command == wire.CMD_NOP else wire.CMD_NAMES.get(command, hex(command))
        super().__init__(f"{cmd}: {name}: {message}")

    @property
    def name(self) -> str:
        return wire.RESP_NAMES.get(self.resp, hex(self.resp))


class DeviceEvent(NamedTuple):
    """One event-queue entry (spec EVTQ-ENTRY-1)."""

    type: int  # wire.EVTQ_*
    ctx_id: int
    ring_idx: int
    seq: int
    timestamp_ns: int
    address: int
    vmid: int
    access: int  # wire.ACCESS_*
    engine: int
    missed: int  # events the device dropped just before this one
    detail: int = 0  # EVTQ_CODE_FAULT: why the code faulted (spec/isa.py COBJ_ERR_*)

    @property
    def kind(self) -> str:
        return wire.EVTQ_NAMES.get(self.type, hex(self.type)).lower()

    @classmethod
    def parse(cls, raw: bytes) -> "DeviceEvent":
        etype, _flags, _fence, ctx_id, ring_idx = _HDR.unpack_from(raw)
        seq, ts, address, vmid, access, engine, missed, detail = \
            _EVTQ_BODY.unpack_from(raw, _HDR.size)
        return cls(etype, ctx_id, ring_idx, seq, ts, address, vmid, access, engine, missed,
                   detail)

    def __str__(self) -> str:
        engine = wire.EVTQ_ENGINE_NAMES.get(self.engine, str(self.engine))
        if self.type == wire.EVTQ_PAGE_FAULT:
            access = wire.ACCESS_NAMES.get(self.access, f"access {self.access}")
            return (f"GPU page fault in context {self.ctx_id}: {access} at VA {self.address:#x} "
                    f"(vmid {self.vmid}, {engine} engine, stream {self.ring_idx})")
        if self.type == wire.EVTQ_CODE_FAULT:
            why = isa.COBJ_ERR_NAMES.get(self.detail, f"reason {self.detail}")
            return (f"code fault in context {self.ctx_id}: the device refused the code "
                    f"({why}) at VA {self.address:#x} (vmid {self.vmid}, {engine} engine, "
                    f"stream {self.ring_idx})")
        if self.type == wire.EVTQ_CONTEXT_LOST:
            return (f"context {self.ctx_id} lost: its job on the {engine} engine "
                    f"(stream {self.ring_idx}) ran past the host's timeout")
        return f"device event {self.type:#x} for context {self.ctx_id}"


class Request:
    __slots__ = ("driver", "slot", "head", "command", "done", "used_len", "writable",
                 "failed", "on_done", "bounce", "ledger")

    def __init__(self, driver, slot, command, writable):
        self.driver, self.slot, self.command, self.writable = driver, slot, command, writable
        self.head = None
        self.done = False
        self.failed = None
        self.used_len = 0
        self.on_done = None
        self.bounce = None
        self.ledger = None  # the token its answer goes to the driver's timelines with

    def response(self):
        """-> (resp_type, body bytes); raises DeviceResponseError for an error response."""
        if self.failed is not None:
            raise self.failed
        mem = self.driver.mem
        n = self.used_len
        if n < wire.CTRL_HDR_SIZE:
            raise DeviceResponseError(wire.RESP_ERR_UNSPEC, f"device returned {n} response bytes",
                                      command=self.command)
        want = n if n < SLOT_RESP else SLOT_RESP
        gpa, length = self.writable[0]
        if want <= length:  # the common case: all of it in the first descriptor
            raw = mem.read(gpa, want)
        else:
            raw = self._gather(mem, want)
        rtype = _HDR.unpack_from(raw)[0]
        if wire.is_error_response(rtype):
            if len(raw) >= wire.CTRL_HDR_SIZE + _ERR.size:
                info0, info1, mlen = _ERR.unpack_from(raw, wire.CTRL_HDR_SIZE)
                start = wire.CTRL_HDR_SIZE + _ERR.size
                msg = raw[start:start + mlen].decode("utf-8", "replace")
            else:
                info0 = info1 = 0
                msg = ""
            raise DeviceResponseError(rtype, msg, info0, info1, command=self.command)
        return rtype, raw[wire.CTRL_HDR_SIZE:]

    def _gather(self, mem, want: int) -> bytes:
        """The first `want` response bytes, spilling past the first descriptor."""
        parts = []
        for gpa, length in self.writable:
            take = min(length, want)
            parts.append(mem.read(gpa, take))
            want -= take
            if not want:
                break
        return b"".join(parts)


class VirtioGpuDriver:
    def __init__(self, session, index: int, info: dict, base: int,
                 wanted_features: int = WANTED_FEATURES):
        """`base`: guest-physical address of this device's area (see `area_size`);
        `wanted_features`: the feature bits this driver accepts if offered."""
        self.session = session
        self.index = index
        self.info = info
        self.wanted_features = wanted_features
        self.base = base
        self.mem = session.mem
        self.features = 0
        self.queue: DriverQueue = None  # type: ignore[assignment]  # set by initialize()
        self.needs_reset = False
        self._free_slots = list(range(QUEUE_SIZE - 1, -1, -1))
        self._by_head: dict[int, Request] = {}
        self._unkicked = 0  # chains published since the last kick() (deferred)
        # per request slot: the command size its plain table holds a chain for (0: none),
        # and its response extent; set by initialize()
        self._slot_table: list[int] = []
        self._slot_response: list[tuple] = []
        # ... and the (key, entries, writable bytes, writable list) of the chain with data
        # extents its other table holds, or None
        self._slot_chain: list[tuple | None] = []
        self.kick_batch = KICK_BATCH
        # the control queue's first avail and used index (set_vring `base`, CTL-VRING-5);
        # tests set it near 65535 before initialize() to cross the index wrap early
        self.queue_base = 0
        self.config: tuple = None  # type: ignore[assignment]  # set by initialize()
        self.eventq: DriverQueue | None = None
        self._event_bufs: dict[int, int] = {}  # head -> gpa of a posted event buffer
        self.events: collections.deque[DeviceEvent] = collections.deque(maxlen=256)  # the latest
        self.event_handler: Callable[[DeviceEvent], None] | None = None  # called from reap()
        # the open LAUNCH_BATCH (launch_batch.py); None without PVGPU_F_LAUNCH_BATCH
        self.batcher: LaunchBatcher | None = None
        # the held request (`hold`): (command, readable, ctx_id, ring_idx, on_done), or None
        self._held: tuple | None = None
        # which timelines are known clean, from what was submitted and answered
        self.timelines = TimelineLedger()

    @staticmethod
    def _layout_offsets() -> tuple:
        """-> (offset of the request slots, of the event queue, of the event buffers, of
        the launch batch buffers, total size) of a device's area."""
        page = 4096
        slots = -(-VirtqLayout.at(0, QUEUE_SIZE).end // page) * page
        eventq = slots + QUEUE_SIZE * SLOT_SIZE
        bufs = eventq + -(-VirtqLayout.at(0, EVENTQ_SIZE).end // 64) * 64
        batches = -(-(bufs + EVENTQ_SIZE * wire.EVTQ_ENTRY_SIZE) // page) * page
        end = batches + LaunchBatcher.area_size()
        return slots, eventq, bufs, batches, -(-end // page) * page

    @classmethod
    def area_size(cls) -> int:
        return cls._layout_offsets()[-1]

    def slot_gpa(self, slot: int) -> int:
        return self._slots_base + slot * SLOT_SIZE

    # ------------------------------------------------------------------ init (virtio §3.1.1)
    def initialize(self) -> None:
        s = self.session
        dev = self.index
        if self._by_head:  # DEV-RESET-4: whatever was outstanding is lost to the reset
            self.fail_all(DeviceNeedsReset(f"device {dev} was reset"))
        self._drop_held(DeviceNeedsReset(f"device {dev} was reset"))  # ... and a held launch
        if self.batcher is not None:  # ... and so are launches not yet sent
            self.batcher.drop(DeviceNeedsReset(f"device {dev} was reset"))
            self.batcher = None
        self.timelines.forget()  # ... and whatever the device had on its timelines
        s.control(wire.OP_SET_STATUS, dev=dev, status=0)
        # DEV-RESET-5: calls that came before the reply carry the device's writes of before
        # the reset; they must land now, not in the rings set up below
        s.drain_notifications()
        status = wire.STATUS_ACKNOWLEDGE
        s.control(wire.OP_SET_STATUS, dev=dev, status=status)
        status |= wire.STATUS_DRIVER
        s.control(wire.OP_SET_STATUS, dev=dev, status=status)
        offered = s.control(wire.OP_GET_FEATURES, dev=dev)["features"]
        self.features = offered & self.wanted_features
        if not self.features & (1 << wire.VIRTIO_F_VERSION_1):
            s.control(wire.OP_SET_STATUS, dev=dev, status=status | wire.STATUS_FAILED)
            raise RuntimeError(f"device {dev} does not offer VIRTIO_F_VERSION_1")
        s.control(wire.OP_SET_FEATURES, dev=dev, features=self.features)
        status |= wire.STATUS_FEATURES_OK
        s.control(wire.OP_SET_STATUS, dev=dev, status=status)
        if not s.control(wire.OP_GET_STATUS, dev=dev)["status"] & wire.STATUS_FEATURES_OK:
            s.control(wire.OP_SET_STATUS, dev=dev, status=status | wire.STATUS_FAILED)
            raise RuntimeError(f"device {dev} refused features {self.features:#x}")
        self.config = struct.unpack(wire.CONFIG_FORMAT, s.control(wire.OP_GET_CONFIG, dev=dev)["config"])
        layout = VirtqLayout.at(self.base, QUEUE_SIZE)
        slots, eventq_off, bufs_off, batches_off, _ = self._layout_offsets()
        self._slots_base = self.base + slots
        self.queue = DriverQueue(self.mem, layout,
                                 event_idx=self.has(wire.VIRTIO_F_EVENT_IDX),
                                 indirect=self.has(wire.VIRTIO_F_INDIRECT_DESC),
                                 start_idx=self.queue_base)
        if s.inline:
            self.queue.enable_interrupts()
        else:
            self.queue.disable_interrupts()  # the session polls, see FrontendSession.wait_for
        base = {"base": self.queue_base} if self.queue_base else {}
        s.control(wire.OP_SET_VRING, dev=dev, queue=wire.CONTROLQ, size=layout.size,
                  desc=layout.desc, avail=layout.avail, used=layout.used, **base)
        s.control(wire.OP_ENABLE_VRING, dev=dev, queue=wire.CONTROLQ, enable=True)
        self.eventq = None
        self._event_bufs = {}
        if self.has(wire.PVGPU_F_EVENTQ):
            self._setup_eventq(self.base + eventq_off, self.base + bufs_off)
        if self.has(wire.PVGPU_F_LAUNCH_BATCH) and self.has(wire.PVGPU_F_COMPUTE):
            self.batcher = LaunchBatcher(self, self.base + batches_off)
        self.timelines.rings = self.has(wire.PVGPU_F_CONTEXT_INIT)
        status |= wire.STATUS_DRIVER_OK
        s.control(wire.OP_SET_STATUS, dev=dev, status=status)
        self.needs_reset = False
        self._free_slots = list(range(QUEUE_SIZE - 1, -1, -1))
        self._by_head = {}
        self._unkicked = 0
        self._slot_table = [0] * QUEUE_SIZE
        self._slot_chain = [None] * QUEUE_SIZE
        self._slot_response = [((self.slot_gpa(slot) + SLOT_CMD, SLOT_RESP),)
                               for slot in range(QUEUE_SIZE)]

    def _setup_eventq(self, ring_gpa: int, bufs_gpa: int) -> None:
        """Queue 1 with EVENTQ_SIZE posted buffers, notifications on (spec EVTQ-SETUP-1)."""
        layout = VirtqLayout.at(ring_gpa, EVENTQ_SIZE)
        q = DriverQueue(self.mem, layout, event_idx=self.has(wire.VIRTIO_F_EVENT_IDX),
                        indirect=False)
        for i in range(EVENTQ_SIZE):
            gpa = bufs_gpa + i * wire.EVTQ_ENTRY_SIZE
            self._event_bufs[q.add_chain([], [(gpa, wire.EVTQ_ENTRY_SIZE)])] = gpa
        q.enable_interrupts()
        self.session.control(wire.OP_SET_VRING, dev=self.index, queue=wire.EVENTQ,
                             size=layout.size, desc=layout.desc, avail=layout.avail,
                             used=layout.used)
        self.session.control(wire.OP_ENABLE_VRING, dev=self.index, queue=wire.EVENTQ, enable=True)
        self.eventq = q

    def has(self, bit: int) -> bool:
        return bool(self.features & (1 << bit))

    @property
    def vram_size(self) -> int:
        return self.config[0]

    @property
    def name(self) -> str:
        return self.config[7].split(b"\0", 1)[0].decode()

    # ------------------------------------------------------------------ requests
    def submit(self, command: bytes, readable=(), writable=(), kick: bool = True) -> Request:
        """Queue one request: `command` (header + body [+ args]) then `readable` data
        extents; the response then `writable` data extents. -> Request. `kick=False`
        defers the notification (the kick policy, module docstring): for a request
        nobody waits for until a later call that waits anyway."""
        if self.needs_reset:
            raise DeviceNeedsReset(f"device {self.index} needs a reset")
        batcher = self.batcher
        if self._held is not None or batcher is not None and batcher.open is not None:
            self._send_unsent()  # the launches before this request go first
        queue = self.queue
        while not self._free_slots or queue.num_free < 1:
            self.session.wait_for(lambda: self._free_slots and queue.num_free >= 1)
        slot = self._free_slots.pop()
        base = self._slots_base + slot * SLOT_SIZE
        mem = self.mem
        size = len(command)
        assert size <= SLOT_CMD
        mem.mv[base:base + size] = command
        if mem.tracks_dirty:  # the inline model: the kick carries it
            mem.mark_dirty(base, size)
        if not queue.indirect:
            rd, wr = self._extents(base, size, readable, writable)
            head = self._add_direct(rd, wr)
        elif not readable and not writable:
            # the common request, command and response in its slot: the slot's plain
            # table still holds the last such chain, rewritten only for another size
            wr = self._slot_response[slot]
            table = base + SLOT_PLAIN_TABLE
            if self._slot_table[slot] == size:
                head = queue.add_indirect(table, 2, SLOT_RESP)
            else:
                head = queue.add_chain(((base, size),), wr, indirect_table=table)
                self._slot_table[slot] = size
        else:
            head, wr = self._chain_with_extents(slot, base, size, tuple(readable),
                                                tuple(writable))
        if size >= _HDR.size:
            type_, flags, _fence_id, ctx_id, ring_idx = _UNPACK_HDR(command)
        else:
            type_ = flags = ctx_id = ring_idx = 0
        req = Request(self, slot, type_, wr)
        req.head = head
        self._by_head[head] = req
        if type_ in _LEDGER_TYPES or flags & wire.FLAG_FENCE:
            req.ledger = self.timelines.submitted(type_, flags, ctx_id, ring_idx)
        self._unkicked += 1
        if kick or self._unkicked >= self.kick_batch or len(self._free_slots) < LOW_WATER \
                or queue.num_free < LOW_WATER:
            self.kick()
        return req

    def _chain_with_extents(self, slot: int, base: int, size: int, readable: tuple,
                            writable: tuple) -> tuple:
        """Publish the chain of a request with data extents in `slot` -> (head, its
        writable list): through the slot's table, published again if it holds the same
        extents (a copy through the same bounce chunk, a batch of as many launches)."""
        queue = self.queue
        table = base + SLOT_CMD + SLOT_RESP
        key = (size, readable, writable)
        held = self._slot_chain[slot]
        if held is not None and held[0] == key:
            _key, n, wlen, wr = held
            return queue.add_indirect(table, n, wlen), wr
        rd, wr = self._extents(base, size, readable, writable)
        n = len(rd) + len(wr)
        if n > SLOT_TABLE_ENTRIES:
            return self._add_direct(rd, wr), wr
        head = queue.add_chain(rd, wr, indirect_table=table)
        # kept only when the extents cannot change under it (tuples, not lists)
        self._slot_chain[slot] = (key, n, queue.writable_len(head), wr) \
            if all(type(e) is tuple for e in readable + writable) else None
        return head, wr

    @staticmethod
    def _extents(base: int, size: int, readable, writable) -> tuple:
        """-> the readable and writable (gpa, len) lists of a request in the slot at
        `base` with a command of `size` bytes and data extents of its own: the command
        then `readable`; the response header then `writable`, padded to
        MIN_RESPONSE_SIZE (or the whole response area without `writable`)."""
        rd = [(base, size)]
        if readable:
            rd.extend(readable)
        if not writable:
            return rd, [(base + SLOT_CMD, SLOT_RESP)]
        wr = list(writable)
        data = sum(n for _, n in wr)
        wr.insert(0, (base + SLOT_CMD, wire.CTRL_HDR_SIZE))
        pad = wire.MIN_RESPONSE_SIZE - wire.CTRL_HDR_SIZE - data
        if pad > 0:
            wr.append((base + SLOT_CMD + wire.CTRL_HDR_SIZE, pad))
        return rd, wr

    def _add_direct(self, rd: list, wr: list) -> int:
        """A direct chain, once the descriptor table has room for it -> its head."""
        queue = self.queue
        while queue.num_free < len(rd) + len(wr):
            self.session.wait_for(lambda: queue.num_free >= len(rd) + len(wr))
        return queue.add_chain(rd, wr)

    @property
    def deferred(self) -> int:
        """Chains published since the last kick (deferred by `submit(kick=False)`), and a
        held request or an open launch batch."""
        batcher = self.batcher
        return self._unkicked + (self._held is not None) \
            + (batcher is not None and batcher.open is not None)

    def launch(self, ctx_id: int, ring_idx: int, record: struct.Struct, values, on_done) -> None:
        """An asynchronous built-in launch, as a record (`record` packs its LAUNCH body and
        argument slots from `values`) in the open LAUNCH_BATCH of its timeline; `on_done`
        is called with the batch's request when it completes. Needs `batcher`."""
        if self._held is not None:
            self._send_held()  # the held launch came first
        self.batcher.add(ctx_id, ring_idx, record, values, on_done)  # type: ignore[union-attr]

    def hold(self, command: bytes, readable=(), ctx_id: int = 0, ring_idx: int = 0,
             on_done=None) -> None:
        """An asynchronous request of timeline (ctx_id, ring_idx) nobody waits for (a code
        launch, guest/api/module.py), held back instead of published: it goes out, as
        `submit(command, readable, kick=False)` with `on_done` attached, before anything
        else does (any other request, a built-in launch joining a batch, the next held
        request) and at the next kick; or fenced, as its timeline's sync point
        (`send_fenced`). At most one is held, and never with an open launch batch."""
        if self.needs_reset:
            raise DeviceNeedsReset(f"device {self.index} needs a reset")
        batcher = self.batcher
        if self._held is not None:  # the common case: a run of launches
            self._send_held()
        elif batcher is not None and batcher.open is not None:
            batcher.flush()
        self._held = (command, readable, ctx_id, ring_idx, on_done)

    def _send_unsent(self, fence: bool = False):
        """Send the held request or the open launch batch (there is never both): what the
        API made before whatever goes out next (launch_batch.py), with FLAG_FENCE if
        `fence`; -> its Request, or None (nothing unsent, or it could not be sent)."""
        unsent = self._unsent()
        return None if unsent is None else unsent[2](fence)

    def _unsent(self) -> tuple | None:
        """What the driver has not sent yet: (ctx_id, ring_idx, send) of the held request
        or the open launch batch, `send(fence)` sending it; or None."""
        held = self._held
        if held is not None:
            return held[2], held[3], self._send_held
        batcher = self.batcher
        b = batcher.open if batcher is not None else None
        return None if b is None else (b.ctx_id, b.ring_idx, batcher.flush)  # type: ignore[union-attr]

    def _send_held(self, fence: bool = False):
        """Submit the held request (deferred kick), with FLAG_FENCE if `fence`; -> its
        Request, or None if the device needs a reset: then it fails as the requests in
        flight did, reported to its on_done (as an unsent launch batch is)."""
        held, self._held = self._held, None
        command, readable, _ctx_id, _ring_idx, on_done = held  # type: ignore[misc]
        try:
            req = self.submit(fenced(command) if fence else command, readable, kick=False)
        except Exception as e:
            if not self.needs_reset:
                raise
            if on_done is not None:
                on_done(NeverSent(e))
            return None
        req.on_done = on_done
        return req

    def _drop_held(self, exc: BaseException) -> None:
        """The device was reset before the held request was sent: it fails with `exc`,
        reported to its on_done as a failed request would be."""
        held, self._held = self._held, None
        if held is not None and held[4] is not None:
            held[4](NeverSent(exc))

    def send_fenced(self, ctx_id: int, ring_idx: int):
        """Send what timeline (ctx_id, ring_idx) has not sent yet -- its held request or
        its open launch batch -- with FLAG_FENCE, as a sync point of that timeline
        (launch_batch.py); -> its Request, or None (nothing of that timeline held back, or
        it could not be sent)."""
        unsent = self._unsent()
        if unsent is None or unsent[0] != ctx_id or unsent[1] != ring_idx:
            return None
        return unsent[2](True)

    def send_fenced_for_context(self, ctx_id: int):
        """Send what the driver has not sent yet -- the held request or the open launch
        batch -- with FLAG_FENCE, as the sync point of the whole context ctx_id: when it is
        work of a timeline of that context and every other timeline of it that work was
        seen on is clean (`timelines`), so that what a CTX_SYNC would wait for and report
        is on that one timeline. -> its Request, or None (nothing of the context held back,
        another of its timelines not known clean, or it could not be sent)."""
        unsent = self._unsent()
        if unsent is None or unsent[0] != ctx_id \
                or not self.timelines.others_clean(ctx_id, unsent[1]):
            return None
        return unsent[2](True)

    def kick(self) -> None:
        """Send the held request or the open launch batch, then notify the device of every
        chain published since the last kick, if it asked for a notification (VQ-NOTIFY-1/2;
        inline: always, the kick carries the memory)."""
        batcher = self.batcher
        if self._held is not None or batcher is not None and batcher.open is not None:
            self._send_unsent()
        if not self._unkicked:
            return
        self._unkicked = 0
        if self.queue.should_kick() or self.session.inline:
            self.session.kick(self.index)

    def reap(self) -> int:
        """Collect used entries; -> how many requests completed. The device posts a job's
        event before it answers the request that reports the job's error (EVTQ-EVENT-1),
        and may write both while this runs: so the control queue's used entries are taken
        first and the event queue read after them, which then holds every event those
        responses rely on; the events are handled before the requests complete."""
        if self.queue is None:
            return 0
        try:
            done = self.queue.pop_used()
        except VirtqError as e:
            self._bad_used_ring(e)
            done = None
        if self.eventq is not None:
            self._reap_events(self.eventq)
        if done is None:
            return 0
        for head, length in done:
            req = self._by_head.pop(head, None)
            if req is None:
                continue
            req.used_len = length
            req.done = True
            self._free_slots.append(req.slot)
            if req.ledger is not None and length >= wire.CTRL_HDR_SIZE:
                # the response's type, where Request.response reads it
                self.timelines.answered(req.ledger, _TYPE(self.mem.mv, req.writable[0][0])[0])
            if req.on_done is not None:
                req.on_done(req)
        return len(done)

    def _reap_events(self, q: DriverQueue) -> None:
        try:
            used = q.pop_used()
        except VirtqError as e:
            self._bad_used_ring(e)
            return
        if not used:
            return
        for head, length in used:
            gpa = self._event_bufs.pop(head, None)
            if gpa is None:
                continue
            if length >= wire.EVTQ_ENTRY_SIZE:
                event = DeviceEvent.parse(self.mem.read(gpa, wire.EVTQ_ENTRY_SIZE))
                self.events.append(event)
                if self.event_handler is not None:
                    self.event_handler(event)
            self._event_bufs[q.add_chain([], [(gpa, wire.EVTQ_ENTRY_SIZE)])] = gpa
        q.enable_interrupts()
        if q.should_kick() or self.session.inline:
            self.session.kick(self.index, wire.EVENTQ)

    def _bad_used_ring(self, e: VirtqError) -> None:
        """The device wrote a used ring that fails the driver's checks (VQ-USED-CHECK-1):
        no request completes from it; all fail until the device is reset."""
        self.fail_all(DeviceNeedsReset(f"device {self.index} wrote a bad used ring "
                                       f"([{e.clause}] {e.message}); reset it to continue"))

    def fail_all(self, exc: Exception) -> None:
        """DEVICE_NEEDS_RESET: every pending request fails with `exc`; what the device had
        on its timelines is unknown until it is reset."""
        self.needs_reset = True
        self.timelines.forget()
        for req in self._by_head.values():
            req.failed = exc
            req.done = True
            if req.on_done is not None:
                req.on_done(req)
        self._by_head.clear()

    def wait(self, req: Request, timeout: float | None = None, kind=None):
        if not req.done:
            self.session.wait_for(lambda: req.done, timeout, kind)
        return req.response()

    def call(self, command: bytes, readable=(), writable=(), timeout: float | None = None,
             kind=None):
        """Submit and wait (`kind`: FrontendSession.wait_for); -> (resp_type, body)."""
        return self.wait(self.submit(command, readable, writable), timeout, kind)

    @property
    def in_flight(self) -> int:
        return len(self._by_head)


def command(type_: int, body=(), *, ctx_id: int = 0, ring_idx: int = 0, fence_id: int = 0,
            flags: int = 0, extra: bytes = b"") -> bytes:
    """Encode header + body of a device command."""
    if fence_id:
        flags |= wire.FLAG_FENCE
    cmd = _COMMANDS[type_].pack(type_, flags, fence_id, ctx_id, ring_idx, *body)
    return cmd + extra if extra else cmd


def fenced(command: bytes, fence_id: int = 1) -> bytes:
    """`command` with FLAG_FENCE and a nonzero `fence_id` in its header: a sync point
    ([FENCE-SIGNAL-1])."""
    type_, flags, _fence_id, ctx_id, ring_idx = _HDR.unpack_from(command)
    return _HDR.pack(type_, flags | wire.FLAG_FENCE, fence_id, ctx_id, ring_idx) \
        + command[_HDR.size:]


# header + body of each command type, one struct each (both little-endian, unpadded)
_COMMANDS = {type_: struct.Struct(wire.CTRL_HDR_FORMAT + body.lstrip("<"))
             for type_, body in wire.CMD_BODY_FORMATS.items()}
