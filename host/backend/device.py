"""The virtio device of one guest session on one GPU (spec §4 virtqueue, §5 device).

Owns what virtio says a device owns: the status byte and its state machine (virtio
§2.1, §3.1), feature negotiation, the queue configuration and the device side of the
control virtqueue. Chains popped from the queue are decoded into typed commands
(host/backend/protocol.py) and handed to `ComputeDevice`; responses are encoded into the
chain's writable part and the chain is returned on the used ring. The jobs of a kick's
chains are submitted in one KMD submission batch, opened by the first command that
submits one; a sync point met in it (CTX_SYNC, a fenced command) ends the batch, whose
exit runs the short jobs before it on this thread, and is answered at once if they are
done. A chain still waiting for a fence is held and answered by the thread that signals
it, under the session's queue lock (GuestSession.complete_now), or by the backend thread
when that holds the lock.

The host's I/O loop never waits inside the KMD: commands run in the KMD's non-blocking
mode (host/kmd/wouldblock.py). One that would wait for the GPU (MEM_ALLOC or SHM_GET
while VRAM is held by busy contexts, MEM_MAP of a range still being unmapped, a
RESOURCE_IMPORT whose buffer must migrate while in use, the first LAUNCH_CODE's
parameter buffer) is held, the chains behind it stay in the avail ring (spec VQ-ORDER-3),
and it runs again when the fence it would have waited for signals; after the KMD's
`timeout` it is answered with the error the wait would have ended in.

A malformed chain (a VirtqError with its spec clause) puts this device of this session
into DEVICE_NEEDS_RESET: held chains are dropped, the queue stops until the driver
resets the device, and the session sends `config_changed` (spec VQ-* clauses, DEV-*).

With PVGPU_F_EVENTQ negotiated the device also has the event queue (spec §5.7): the
faults and losses of this session's contexts arrive from engine threads through
`ComputeDevice.event_sink`, are queued on the backend thread (at most
MAX_PENDING_EVENTS, oldest dropped and counted) and written into the buffers the driver
posts on queue 1.
"""

from __future__ import annotations

import collections
import logging
import struct
import time

from pvgpu.spec import wire
from pvgpu.host.backend import protocol
from pvgpu.host.backend.commands import ComputeDevice
from pvgpu.host.backend.protocol import Header, Pending, Response
from pvgpu.host.backend.errors import CommandError, ControlError
from pvgpu.host.backend.inflight import SessionJobs
from pvgpu.host.kmd import wouldblock
from pvgpu.host.kmd.wouldblock import WouldBlock
from pvgpu.transport.errors import VirtqError, VirtqLayoutError
from pvgpu.transport.virtqueue import DeviceQueue, VirtqLayout

log = logging.getLogger("pvgpu.backend")

_HDR = struct.Struct(wire.CTRL_HDR_FORMAT)
_EVTQ_BODY = struct.Struct(wire.EVTQ_BODY_FORMAT)
_ADDABLE = (wire.STATUS_ACKNOWLEDGE | wire.STATUS_DRIVER | wire.STATUS_FEATURES_OK
            | wire.STATUS_DRIVER_OK | wire.STATUS_FAILED)


class VirtioGpuDevice:
    """Device `index` as seen by one session."""

    def __init__(self, session, index: int, kmd):
        self.session = session
        self.index = index
        self.kmd = kmd
        self.status = 0
        self.driver_features = 0
        self.generation = 0  # bumped by reset: completions of an older generation are dropped
        self.queue_layout = None
        self.queue_base = 0  # set_vring `base`: the queue's first avail and used index
        self.queue_enabled = False
        self.queue: DeviceQueue | None = None
        self.eventq_layout = None
        self.eventq_base = 0
        self.eventq_enabled = False
        self.eventq: DeviceQueue | None = None
        self.incoming_events = collections.deque()  # from engine threads, not yet numbered
        self.events = collections.deque()  # (seq, type, ctx_id, ring_idx, fields) not yet posted
        self.event_seq = 0
        self.events_missed = 0  # dropped since the last delivered event
        self.eventq_added = False  # used entries added to the event queue, call not yet sent
        self.compute: ComputeDevice | None = None
        self.held = 0  # chains held for a fence
        self.call_owed = False  # a fence completion asked the I/O loop for a control-queue call
        self.reset_announced = False  # config_changed sent for the current NEEDS_RESET
        self.stalled = False  # holding back chains until the GPU has room again
        self.blocked = False  # holding back chains behind one that would wait in the KMD
        self.requeued = False  # processing goes on at the I/O loop's next turn (weight spent)
        self.abandoned = []  # fences of work torn down by DEVICE_NEEDS_RESET
        self._batch = None  # the KMD SubmissionBatch of the kick process_queue runs
        self._sync = None  # (generation, chain, hdr, Pending): a sync point met in it
        self.stats = {"chains": 0, "bad_chains": 0, "unanswerable": 0, "ignored_kicks": 0,
                      "stalls": 0, "blocked": 0, "requeues": 0, "events": 0, "events_posted": 0,
                      "events_dropped": 0, "bad_event_buffers": 0}

    # ------------------------------------------------------------------ control ops
    def get_config(self) -> bytes:
        return struct.pack(wire.CONFIG_FORMAT, self.kmd.vram_size, wire.NUM_QUEUES,
                           wire.MAX_QUEUE_SIZE, wire.PAGE_SIZE, wire.MAX_KERNEL_ARGS,
                           self.index, 0, self.kmd.name.encode()[:32])

    def set_features(self, features: int) -> None:
        if not (self.status & wire.STATUS_DRIVER) or self.status & wire.STATUS_FEATURES_OK:
            raise ControlError(wire.CTL_ERR_BAD_STATE,
                               "set_features is allowed only after DRIVER and before FEATURES_OK")
        if features < 0 or features & ~wire.DEVICE_FEATURES:
            raise ControlError(wire.CTL_ERR_BAD_FEATURES,
                               f"features {features:#x} include bits the device does not offer")
        self.driver_features = features

    def has(self, bit: int) -> bool:
        return bool(self.driver_features & (1 << bit))

    def set_status(self, status: int) -> None:
        if status == 0:
            self.reset()
            return
        if status & ~0xFF or status & ~(self.status | _ADDABLE) or (self.status & ~status):
            raise ControlError(wire.CTL_ERR_BAD_STATE,
                               f"status {status:#x} would clear bits of {self.status:#x} "
                               "(only a reset, status 0, clears bits)")
        new = status & ~self.status
        if new & wire.STATUS_FEATURES_OK:
            ok = (self.driver_features & wire.REQUIRED_FEATURES) == wire.REQUIRED_FEATURES
            if not ok:  # virtio §3.1.1: the device does not keep FEATURES_OK
                status &= ~wire.STATUS_FEATURES_OK
        if new & wire.STATUS_DRIVER_OK:
            if not status & wire.STATUS_FEATURES_OK:
                raise ControlError(wire.CTL_ERR_BAD_STATE, "DRIVER_OK before FEATURES_OK")
            if self.queue_layout is None or not self.queue_enabled:
                raise ControlError(wire.CTL_ERR_BAD_STATE,
                                   "DRIVER_OK before the control queue is set up and enabled")
            if not self.session.memory_ready():
                raise ControlError(wire.CTL_ERR_BAD_STATE, "DRIVER_OK before set_mem_table")
            self._go_live()
        self.status = status

    def set_vring(self, queue: int, size: int, desc: int, avail: int, used: int,
                  base: int = 0) -> None:
        self._check_queue(queue)
        if not self.status & wire.STATUS_FEATURES_OK or self.status & wire.STATUS_DRIVER_OK:
            raise ControlError(wire.CTL_ERR_BAD_STATE,
                               "set_vring is allowed after FEATURES_OK and before DRIVER_OK")
        if base > 0xFFFF:  # CTL-VRING-5
            raise ControlError(wire.CTL_ERR_MALFORMED, f"base {base} is not a 16-bit ring index")
        if size <= 0 or size & (size - 1) or size > wire.MAX_QUEUE_SIZE:
            raise ControlError(wire.CTL_ERR_BAD_MEMORY,
                               f"queue size {size} must be a power of two <= {wire.MAX_QUEUE_SIZE}")
        layout = VirtqLayout(size, desc, avail, used)
        try:
            layout.validate_in(self.session.mem_size)
        except VirtqLayoutError as e:
            raise ControlError(wire.CTL_ERR_BAD_MEMORY, str(e)) from None
        if queue == wire.EVENTQ:
            self.eventq_layout, self.eventq_base = layout, base
        else:
            self.queue_layout, self.queue_base = layout, base

    def enable_vring(self, queue: int, enable: bool) -> None:
        self._check_queue(queue)
        layout = self.eventq_layout if queue == wire.EVENTQ else self.queue_layout
        if enable and layout is None:
            raise ControlError(wire.CTL_ERR_BAD_STATE, "enable_vring before set_vring")
        if queue == wire.EVENTQ:
            self.eventq_enabled = enable
            if enable and self.eventq is None and self.status & wire.STATUS_DRIVER_OK:
                self._open_eventq()
        else:
            self.queue_enabled = enable

    def _check_queue(self, queue: int) -> None:
        if not 0 <= queue < wire.NUM_QUEUES:
            raise ControlError(wire.CTL_ERR_BAD_QUEUE, f"queue {queue} does not exist")
        if queue == wire.EVENTQ and not self.has(wire.PVGPU_F_EVENTQ):
            raise ControlError(wire.CTL_ERR_BAD_QUEUE,
                               "queue 1 (the event queue) needs PVGPU_F_EVENTQ, not negotiated")

    def _go_live(self) -> None:
        mem = self.session.mem
        self.queue = DeviceQueue(mem, self.queue_layout,
                                 event_idx=self.has(wire.VIRTIO_F_EVENT_IDX),
                                 indirect=self.has(wire.VIRTIO_F_INDIRECT_DESC),
                                 start_idx=self.queue_base)
        self.compute = ComputeDevice(self.kmd, self.session.dma_mapping(self.index),
                                     self.session.mem_size, self.driver_features,
                                     exports=getattr(self.session.backend, "event_exports", None),
                                     resource_exports=getattr(self.session.backend,
                                                              "resource_exports", None),
                                     owner=self.session, device_index=self.index,
                                     vgpu=getattr(self.session, "vgpu", None),
                                     event_sink=self._event_sink(),
                                     jobs=SessionJobs(self.kmd.max_client_queued_jobs,
                                                      self.session.backend.device_jobs[self.index]))
        if self.eventq_layout is not None:
            self._open_eventq()

    def _open_eventq(self) -> None:
        self.eventq = DeviceQueue(self.session.mem, self.eventq_layout,
                                  event_idx=self.has(wire.VIRTIO_F_EVENT_IDX),
                                  indirect=self.has(wire.VIRTIO_F_INDIRECT_DESC),
                                  start_idx=self.eventq_base)

    def reset(self) -> list:
        """Device reset (status 0): -> fences still in flight for what was torn down,
        including work abandoned by an earlier DEVICE_NEEDS_RESET (spec DEV-RESET-1)."""
        # the generation goes first: callbacks of fences the teardown signals may run here
        self.generation += 1
        pending = self.compute.reset() if self.compute is not None else []
        pending = [f for f in self.abandoned + pending if not f.signaled]
        self.abandoned = []
        self.status = 0
        self.driver_features = 0
        self.queue_layout = None
        self.queue_enabled = False
        self.queue = None
        self.eventq_layout = None
        self.eventq_enabled = False
        self.eventq = None
        self.events.clear()
        self.incoming_events.clear()
        self.event_seq = 0
        self.events_missed = 0
        self.eventq_added = False
        self.compute = None
        self.held = 0
        self.call_owed = False
        self.reset_announced = False
        self.stalled = False
        self.blocked = False
        return pending

    def live(self) -> bool:
        return (self.status & wire.STATUS_DRIVER_OK
                and not self.status & (wire.STATUS_DEVICE_NEEDS_RESET | wire.STATUS_FAILED)
                and self.queue is not None and self.queue_enabled)

    def needs_reset(self, reason: str) -> None:
        log.warning("session %s device %d: DEVICE_NEEDS_RESET: %s", self.session.name, self.index, reason)
        self.generation += 1  # first: the teardown may run callbacks of the fences it signals
        if self.compute is not None:
            torn = self.compute.reset()
            self.abandoned += torn  # the driver's reset waits for them
            self.session.retire_fences(torn)
        self.held = 0
        self.blocked = False
        self.reset_announced = False
        self.status |= wire.STATUS_DEVICE_NEEDS_RESET

    # ------------------------------------------------------------------ queue processing
    def process_queue(self) -> bool:
        """Pop and execute the available chains, at most one queue size of them (vhost's
        weight, spec VQ-ORDER-4): a driver that adds chains while they run (a polling
        guest launching again) must not keep the I/O loop from answering pings
        ([CTL-PING-1]) and other sessions; the rest run at the loop's next turn, without
        a kick. -> whether used entries were added."""
        if not self.live():
            self.stats["ignored_kicks"] += 1
            return False
        added = False
        mem = self.session.mem
        weight = self.queue_layout.size
        try:
            while True:
                if self.blocked:
                    break  # a command waits for the GPU: the chains behind it stay
                if (not self.compute.jobs.room() and not self.kmd.has_headroom(self.session)
                        and self._stall()):
                    # Backpressure: leave the chains in the avail ring (the driver sees its
                    # queue fill up) and resume when the oldest job on the GPU completes, so
                    # the host's I/O loop never waits inside the KMD. The KMD is asked only
                    # when the session's unfinished jobs might have filled it (inflight.py).
                    break
                try:
                    chain = self.queue.pop()
                except VirtqError as e:
                    self.stats["bad_chains"] += 1
                    self.needs_reset(f"[{e.clause}] {e.message}")
                    break
                if chain is None:
                    break
                self.stats["chains"] += 1
                added |= self._execute(chain, mem)
                if self._sync is not None:
                    added |= self._end_batch()
                weight -= 1
                if not weight:
                    self._requeue()
                    break
        finally:
            if self._batch is not None:
                added |= self._end_batch()
        return added

    def _end_batch(self) -> bool:
        """Close the kick's submission batch, whose exit runs its short jobs on this
        thread (host/kmd/batch.py); then answer the sync point that ended it, if one did:
        usually at once, without holding its chain for a fence callback."""
        batch, self._batch = self._batch, None
        batch.close()
        sync, self._sync = self._sync, None
        return self._answer(*sync) if sync is not None else False

    def _requeue(self) -> None:
        """The weight is spent: go on with the queue at the I/O loop's next turn."""
        if self.requeued:
            return
        self.requeued = True
        self.stats["requeues"] += 1
        self.session.post_completion(self, self._continue, self.generation)

    def _continue(self, generation: int) -> bool:
        """On the backend thread, a turn of the loop after the weight was spent."""
        self.requeued = False
        if generation != self.generation:
            return False
        return self.process_queue()

    def _execute(self, chain, mem) -> bool:
        if chain.writable_len < wire.MIN_RESPONSE_SIZE:
            self.stats["unanswerable"] += 1
            self.queue.add_used(chain.head, 0)
            return True
        try:
            cmd = self.compute.decode(protocol.Reader(chain, mem))
        except protocol.MalformedCommand as e:
            return self._complete(chain, e.hdr, error=e)
        if cmd.SUBMITS and self._batch is None:
            # the kick's jobs from here on: one KMD lock hold, one ring commit and
            # doorbell per engine (a kick without jobs opens no batch)
            self._batch = self.kmd.submission_batch()
            self._batch.open()
        return self._run(chain, cmd, None)

    def _run(self, chain, cmd, deadline: float | None) -> bool:
        """Execute a decoded command; KMD calls never wait (host/kmd/wouldblock.py): one
        that would blocks the queue until its fence re-drives the command."""
        # once it has waited as long as the KMD itself would, the wait's error answers it
        expired = deadline is not None and time.monotonic() >= deadline
        try:
            with wouldblock.nonblocking(expired=expired):
                result = self.compute.execute(cmd, protocol.Writer(chain, self.session.mem))
        except CommandError as e:
            return self._complete(chain, cmd.hdr, error=e)
        except WouldBlock as e:
            if deadline is None:
                deadline = time.monotonic() + self.kmd.timeout
            self._block(chain, cmd, e.fence, deadline)
            return False
        if isinstance(result, Pending):
            if self._batch is not None:  # answered once the batch has run (_end_batch)
                self._sync = (self.generation, chain, cmd.hdr, result)
            else:
                self._hold(chain, cmd.hdr, result)
            return False
        return self._complete(chain, cmd.hdr, response=result)

    def _block(self, chain, cmd, fence, deadline: float) -> None:
        """Hold a command that would wait inside the KMD (VRAM held by busy contexts, a
        range still being unmapped, a shared buffer in use): take no later chain of this
        queue (spec VQ-ORDER-3) until it has run, and run it again once `fence` signals."""
        self.blocked = True
        self.stats["blocked"] += 1
        generation = self.generation
        fence.add_done_callback(lambda _f: self.session.post_completion(
            self, self._redrive, generation, chain, cmd, deadline))

    def _redrive(self, generation: int, chain, cmd, deadline: float) -> bool:
        """On the backend thread, once the fence a blocked command waited for signalled."""
        if generation != self.generation:
            return False  # the device was reset meanwhile: the chain is dropped
        self.blocked = False
        added = self._run(chain, cmd, deadline)
        if not self.blocked:
            added |= self.process_queue()  # the chains left behind it, without a kick
        return added

    # ------------------------------------------------------------------ event queue (§5.7)
    def _event_sink(self):
        """The ComputeDevice's event sink: from an engine thread, queue the event on the
        backend thread (dropped if the device is reset meanwhile)."""
        if not self.has(wire.PVGPU_F_EVENTQ):
            return None
        generation = self.generation

        def sink(etype, ctx_id, ring_idx, address, access, vmid, engine, detail=0):
            # Queued before the KMD sets the job's error, so any response reporting that
            # error is built after this append and takes the event first (EVTQ-EVENT-1).
            self.incoming_events.append((generation, etype, ctx_id, ring_idx,
                                         (self.kmd.clock_ns(), address, vmid, access, engine,
                                          detail)))
            self.session.post_completion(self, self._take_events)
        return sink

    def _take_events(self) -> bool:
        """On the backend thread: number the incoming events and post what fits.
        -> False: no control-queue entries were added."""
        while self.incoming_events:
            generation, etype, ctx_id, ring_idx, fields = self.incoming_events.popleft()
            if generation != self.generation:
                continue
            self.event_seq += 1
            self.stats["events"] += 1
            self.events.append((self.event_seq, etype, ctx_id, ring_idx, fields))
            if len(self.events) > wire.MAX_PENDING_EVENTS:  # EVTQ-EVENT-2
                self.events.popleft()
                self.events_missed += 1
                self.stats["events_dropped"] += 1
        self.process_eventq()
        return False

    def process_eventq(self) -> None:
        """Fill posted event buffers with pending events (spec EVTQ-BUF-1, EVTQ-ENTRY-1)."""
        if not self.live() or self.eventq is None or not self.eventq_enabled:
            return
        mem = self.session.mem
        while self.events:
            try:
                chain = self.eventq.pop()
            except VirtqError as e:
                self.stats["bad_chains"] += 1
                self.needs_reset(f"event queue: [{e.clause}] {e.message}")
                return
            if chain is None:
                return
            if chain.readable_len or chain.writable_len < wire.EVTQ_ENTRY_SIZE:
                self.stats["bad_event_buffers"] += 1
                self.eventq.add_used(chain.head, 0)
                self.eventq_added = True
                continue
            seq, etype, ctx_id, ring_idx, (timestamp, address, vmid, access, engine, detail) = \
                self.events.popleft()
            missed, self.events_missed = self.events_missed, 0
            entry = (_HDR.pack(etype, wire.EVTQ_FLAG_MISSED if missed else 0, 0, ctx_id, ring_idx)
                     + _EVTQ_BODY.pack(seq, timestamp, address, vmid, access, engine, missed,
                                       detail))
            chain.write(mem, 0, entry)
            self.eventq.add_used(chain.head, len(entry))
            self.eventq_added = True
            self.stats["events_posted"] += 1

    def owe_call(self) -> None:
        """Under the queue lock, after a completion off the backend thread added used
        entries: remember whether the driver wants a call for them (EVENT_IDX used_event,
        or avail.flags NO_INTERRUPT), for the I/O loop to send."""
        if self.queue is not None and self.queue.should_notify():
            self.call_owed = True

    def take_call(self, added: bool) -> bool:
        """-> whether a control-queue call is owed: for used entries added by the caller
        (`added`) that the driver wants to hear of, or for an earlier owe_call()."""
        notify = bool(added and self.queue is not None and self.queue.should_notify())
        notify |= self.call_owed
        self.call_owed = False
        return notify

    def take_eventq_call(self) -> tuple:
        """-> (entries were added to the event queue, the driver wants a call for them)."""
        if not self.eventq_added:
            return False, False
        self.eventq_added = False
        return True, self.eventq is not None and self.eventq.should_notify()

    def _stall(self) -> bool:
        """-> True if processing should pause until a resume is posted."""
        if self.stalled:
            return True
        fence = self.kmd.oldest_pending_fence(self.session)
        if fence is None:
            return False  # nothing in flight: the space is free by now
        self.stats["stalls"] += 1
        self.stalled = True
        generation = self.generation
        fence.add_done_callback(
            lambda _f: self.session.post_completion(self, self._resume, generation))
        return True

    def _resume(self, generation: int) -> bool:
        """On the backend thread, once the fence we stalled on signalled."""
        self.stalled = False
        if generation != self.generation:
            return False
        return self.process_queue()

    def _hold(self, chain, hdr: Header, pending: Pending) -> None:
        self.held += 1
        generation = self.generation
        remaining = [len(pending.fences)]
        lock = self.session.lock

        def on_signal(_fence):  # the signalling thread, never under a KMD device lock
            with lock:
                remaining[0] -= 1
                done = remaining[0] == 0
            if done:
                self.session.complete_now(self, self._finish_held, generation, chain, hdr,
                                          pending)

        for f in pending.fences:
            f.add_done_callback(on_signal)

    def _finish_held(self, generation: int, chain, hdr: Header, pending: Pending,
                     events: bool = True) -> bool:
        """Under the session's queue lock, after the fences of a held chain signalled: on
        the signalling thread (events=False: it leaves the event queue to the backend
        thread), or on the backend thread when that held the lock."""
        if generation != self.generation:
            return False  # the device was reset meanwhile: the chain is dropped
        self.held -= 1
        return self._finish(chain, hdr, pending, events)

    def _answer(self, generation: int, chain, hdr: Header, pending: Pending) -> bool:
        """A sync point met in a kick's batch, once the batch has run: answered now if its
        fences have signalled, else held until they do."""
        if generation != self.generation:
            return False  # the device was reset meanwhile: the chain is dropped
        for f in pending.fences:
            if not f.signaled:
                self._hold(chain, hdr, pending)
                return False
        return self._finish(chain, hdr, pending)

    def _finish(self, chain, hdr: Header, pending: Pending, events: bool = True) -> bool:
        try:
            resp = pending.finish()
        except CommandError as e:
            return self._complete(chain, hdr, error=e, events=events)
        return self._complete(chain, hdr, response=resp, events=events)

    def _complete(self, chain, hdr: Header, response: Response | None = None,
                  error: CommandError | None = None, events: bool = True) -> bool:
        if events and self.incoming_events:
            self._take_events()
        if error is not None:
            response = protocol.ErrorResponse.of(error)
        mem = self.session.mem
        used = response.encode(protocol.Writer(chain, mem), hdr)
        if mem.tracks_dirty and response.data_len:
            data_len = response.data_len
            for gpa, n in chain.writable_extents(used - data_len, data_len):
                mem.mark_dirty(gpa, n)
        self.queue.add_used(chain.head, used)
        trace = self.kmd.trace
        if trace is not None:
            trace.request_completed(self.kmd, self.session,
                                    wire.CMD_NAMES.get(hdr.type, f"command {hdr.type:#x}"),
                                    chain.head)
        return True
