"""Guest sessions and the control channel's device side (spec §2 control, §3 memory, §10 reclaim).

`Backend` is sans-IO: the host main loop hands it each decoded-or-not multipart message
with `handle(peer, frames, now)` and sends whatever `(peer, frames)` it returns. It never
imports zmq (only transport/channel does). Engine threads reach it through `post_completion`,
which queues work for the backend thread and calls the `wakeup` function the main loop
gave it; the main loop then calls `run_completions()`.

In the shared memory model a held chain is completed on the thread that signals its
last fence (`complete_now`, as crosvm completes on the fence and rust-vmm's QueueSync
shares a queue): the response and the used entry are written there, under the session's
queue lock, and the I/O loop is woken only to send a `call` the driver asked for
(EVENT_IDX used_event, or no NO_INTERRUPT flag). The backend thread holds the same lock
whenever it touches a session's devices, queues or guest memory; a completion that finds
it held goes to the backend thread instead, so a signalling thread never waits for the
I/O loop. In the inline model the device's writes reach the driver only as the patches
of a `call`, built and sent by the I/O loop, so completions stay on the backend thread:
nothing writes the mirror between a call's patches being taken and being sent.

One connection = one `GuestSession` ("a VM"): a session is keyed by the `Peer` (route
and transport connection) its hello came from, so a later connection that presents the
same routing identity is not served in it; its first message ends the old session
instead (spec [CTL-ENDPOINT-4]). The main loop also reports the connections it saw close
(`connection_closed`): their sessions are reclaimed at once ([CTL-HB-7]). A session
records who is at the other end of its connection (`peer_credentials`: ipc pid and uid,
tcp address; GET_STATS `session`) from the `credentials` function the main loop gives
the backend. A session owns its guest memory (a shared POSIX segment or an inline
mirror), one DMA mapping of that memory per GPU, and one `VirtioGpuDevice` per GPU. A
session ends with `bye`, with heartbeat loss, with its connection closed or replaced, or
with host shutdown (after a `shutdown` notification, [CTL-BYE-2]); everything it owned
is reclaimed, and its guest memory is unmapped only after the engines have finished
every job that might still touch it.
"""

from __future__ import annotations

import collections
import functools
import hmac
import itertools
import logging
import secrets
import threading

from pvgpu.spec import wire
from pvgpu.host.backend.device import VirtioGpuDevice
from pvgpu.host.backend.errors import ControlError
from pvgpu.host.backend.events import EventExports
from pvgpu.host.backend.inflight import DeviceJobs
from pvgpu.host.backend.prime import ResourceExports
from pvgpu.transport import codec
from pvgpu.transport.codec import ZERO_COPY_MIN
from pvgpu.transport.errors import GuestMemoryError
from pvgpu.transport.memory import InlineGuestMemory, SharedGuestMemory

log = logging.getLogger("pvgpu.backend")


# the distinct kicks without patches a guest sends: one per device and queue, unless it
# encodes them in several ways (msgpack allows that); the cache stops growing here
_MAX_KICK_FORMS = 64


@functools.lru_cache(maxsize=None)
def _call_frame(dev: int, queue: int) -> bytes:
    """Frame 0 of a `call` that carries no patches: the same bytes every time."""
    return codec.encode({"op": wire.OP_CALL, "dev": dev, "queue": queue, "notify": True})[0]


class GuestSession:
    def __init__(self, backend, peer, sid: str, name: str, memory: str, mem_size: int, now: float,
                 vgpu=None, peer_credentials=None):
        self.backend = backend
        # who is at the other end of the connection: ipc {pid, uid, gid}, tcp {address}
        self.peer_credentials = peer_credentials
        self.vgpu = vgpu  # pvgpu.host.kmd.sched.VgpuShares, or None for the default vGPU
        self.peer = peer
        # fingerprint of the CURVE key the connection authenticated with (CTL-AUTH-5)
        self.key = getattr(peer, "key", None)
        self.sid = sid
        self.name = name
        self.memory = memory
        self.mem_size = mem_size
        self.last_heard = now
        self.lock = backend.lock
        # devices, virtqueues and dirty ranges of this session: the backend thread and
        # fence completions (complete_now); re-entrant, for callbacks the backend thread
        # runs itself
        self.queue_lock = threading.RLock()
        self.closed = False
        # the inline model: the device's writes reach the driver as the patches of a call
        self.tracks_dirty = memory == wire.MEMORY_INLINE
        self.mem = InlineGuestMemory(mem_size) if self.tracks_dirty else None
        # shared model: set_mem_table must find these bytes in the memory it names
        self.mem_challenge = (secrets.token_bytes(wire.MEM_CHALLENGE_SIZE)
                              if memory == wire.MEMORY_SHARED else None)
        self._dma = {}  # device index -> DmaMapping of self.mem
        self.devices = [VirtioGpuDevice(self, i, kmd) for i, kmd in enumerate(backend.kmds)]

    def memory_ready(self) -> bool:
        return self.mem is not None

    def dma_mapping(self, index: int):
        m = self._dma.get(index)
        if m is None:
            m = self._dma[index] = self.backend.kmds[index].dma_map(self.mem.buf)
        return m

    def post_completion(self, device, fn, *args) -> None:
        """From an engine thread: run fn(*args) -> bool (used entries added) for `device`
        on the backend thread."""
        self.backend.post_completion(self, device, fn, *args)

    def complete_now(self, device, fn, *args) -> None:
        """From a fence callback: run fn(*args, events=False) -> bool (used entries added)
        here, under the queue lock, and wake the I/O loop only for a call it owes the
        driver. Posted to the backend thread instead in the inline model, when the lock
        is busy, or when events wait to be posted first (EVTQ-EVENT-1: an event the
        response may report goes out before it)."""
        if (self.tracks_dirty or device.incoming_events
                or not self.queue_lock.acquire(blocking=False)):
            self.post_completion(device, fn, *args)
            return
        try:
            if self.closed or not fn(*args, events=False):
                return
            device.owe_call()
            wake = device.call_owed
        finally:
            self.queue_lock.release()
        if wake:  # run_completions sends the call (_after_processing, take_call)
            self.post_completion(device, lambda: False)

    def retire_fences(self, fences) -> None:
        """Fences of torn-down work (DEVICE_NEEDS_RESET): guest memory is not released
        while they are pending, since the engines may still touch it."""
        self.backend.track_inflight(fences)

    def set_mem_table(self, regions) -> None:
        if self.memory != wire.MEMORY_SHARED:
            raise ControlError(wire.CTL_ERR_BAD_STATE, "set_mem_table is for the shared memory model only")
        if self.mem is not None:
            raise ControlError(wire.CTL_ERR_BAD_STATE, "set_mem_table was already done")
        for region in regions:  # CTL-MEMTABLE-2: a region's shape is malformed, its values bad_memory
            if not isinstance(region, dict) or not all(
                    type(region.get(key)) is kind for key, kind in (("gpa", int), ("size", int), ("name", str))):
                raise ControlError(wire.CTL_ERR_MALFORMED,
                                   f"a region is a map {{gpa: int, size: int, name: str}}, not {region!r:.80}")
        if len(regions) != 1 or regions[0]["gpa"] != 0 or regions[0]["size"] != self.mem_size:
            raise ControlError(wire.CTL_ERR_BAD_MEMORY,
                               f"expected one region {{gpa: 0, size: {self.mem_size}, name: str}}")
        name = regions[0]["name"]
        try:  # attach() accepts only a sealed memfd path (or, without memfd, a pvgpu- name)
            mem = SharedGuestMemory.attach(name, self.mem_size)
        except (OSError, ValueError, GuestMemoryError) as e:
            raise ControlError(wire.CTL_ERR_BAD_MEMORY, f"cannot map shared memory {name!r}: {e}") from None
        # CTL-MEMTABLE-5: only memory the session's own peer can write holds its challenge
        found = mem.read(wire.MEM_CHALLENGE_GPA, wire.MEM_CHALLENGE_SIZE)
        if not hmac.compare_digest(found, self.mem_challenge):
            mem.close()
            raise ControlError(wire.CTL_ERR_BAD_MEMORY,
                               f"shared memory {name!r} does not hold this session's mem_challenge "
                               f"at gpa {wire.MEM_CHALLENGE_GPA:#x}: a session maps only memory "
                               "its own guest controls")
        self.mem = mem
        self.mem_challenge = None

    def teardown(self) -> list:
        """Reset every device; -> fences that must signal before memory is released."""
        pending = []
        for dev in self.devices:
            pending += dev.reset()
        return pending

    def release_memory(self) -> None:
        for index, m in self._dma.items():
            self.backend.kmds[index].dma_unmap(m)
        self._dma.clear()
        if isinstance(self.mem, SharedGuestMemory):
            try:
                self.mem.close()
            except BufferError:
                log.warning("session %s: guest memory still referenced at close", self.name)
        self.mem = None


class Backend:
    def __init__(self, kmds, *, heartbeat_ms: int = wire.DEFAULT_HEARTBEAT_MS,
                 max_mem_size: int = wire.MAX_GUEST_MEM_SIZE, wakeup=lambda: None, vgpus=(),
                 max_sessions: int = wire.MAX_SESSIONS):
        self.kmds = list(kmds)
        # vGPUs a session may bind to at hello (CTL-HELLO-8); none: everyone shares the
        # KMD's default vGPU
        self.vgpus = {v.name: v for v in vgpus}
        self.heartbeat_ms = heartbeat_ms
        self.max_mem_size = max_mem_size
        self.max_sessions = max_sessions  # DEV-LIMIT-1
        self.wakeup = wakeup
        # connection name -> its peer's credentials (dict) or None; the main loop's channel
        self.credentials = lambda connection: None
        self.lock = threading.Lock()
        self.sessions: dict = {}  # Peer (route and connection) -> GuestSession
        self.revoked_keys = frozenset()  # fingerprints of CURVE keys no longer authorized
        self._routes: dict = {}  # Peer.route -> the GuestSession its messages go to
        self._completions = collections.deque()
        self._kicks = {}  # frame 0 of a kick without patches -> its decoded map (read only)
        self._outbox = []  # deferred control replies (set_status 0 waiting for the GPU)
        self._ids = itertools.count(1)
        self._inflight = []  # fences of torn-down work, kept until they signal
        self._releases = []  # (session, fences) waiting to release guest memory
        self.event_exports = EventExports()  # host-global: events shared across sessions
        self.resource_exports = ResourceExports()  # host-global: buffers shared (dma-bufs)
        self.stats = collections.Counter()
        # unfinished jobs of every session, per GPU: the I/O loop's headroom check
        self.device_jobs = [DeviceJobs(k.max_queued_jobs) for k in self.kmds]

    # ------------------------------------------------------------------ engine side
    def post_completion(self, session, device, fn, *args) -> None:
        self._completions.append((session, device, fn, args))
        self.wakeup()

    def track_inflight(self, fences) -> None:
        self._inflight.extend(f for f in fences if not f.signaled)

    # ------------------------------------------------------------------ backend thread
    def handle(self, peer, frames, now: float) -> list:
        """One incoming multipart message -> messages to send."""
        # a kick of the shared memory model is the same few bytes each time: decoded once
        raw = frames[0] if len(frames) == 1 else None
        msg = self._kicks.get(raw) if type(raw) is bytes else None
        if msg is not None:
            extra = []
        else:
            try:
                msg, extra = codec.decode(frames)
            except codec.CodecError as e:
                return self._undecodable(peer, e, now)
            if (msg["op"] == wire.OP_KICK and not extra and type(raw) is bytes
                    and len(self._kicks) < _MAX_KICK_FORMS):
                self._kicks[raw] = msg
        op = msg["op"]
        session = self.sessions.get(peer)
        if session is not None:
            session.last_heard = now
        elif self._revoked(peer):
            return []
        else:
            self._close_replaced(peer)
        if op in wire.NOTIFY_OPS:
            if session is None:
                self.stats["orphan_notifications"] += 1
                return []
            if op == wire.OP_KICK:
                with session.queue_lock:
                    return self._kick(session, msg, extra)
            self.stats["unexpected_notifications"] += 1
            return []
        if op == wire.OP_REPLY:  # the host sends no requests ([CTL-PARSE-2])
            self.stats["unexpected_replies"] += 1
            return []
        seq = msg["seq"]
        try:
            if op == wire.OP_HELLO:
                reply = self._hello(peer, msg, now)
                return [(peer, codec.encode(codec.reply_ok(seq, **reply)))]
            if session is None:
                raise ControlError(wire.CTL_ERR_NO_SESSION, f"{op} before hello")
            out = []
            with session.queue_lock:
                reply = self._request(session, op, msg, out)
            if reply is None:  # deferred: sent from run_completions
                return out
            return [(peer, codec.encode(codec.reply_ok(seq, **reply)))] + out
        except ControlError as e:
            self.stats["control_errors"] += 1
            log.info("refused %s from %s: %s: %s", op, session.name if session else peer, e.error, e.message)
            return [(peer, codec.encode(codec.reply_error(seq, e.error, e.message)))]

    def _undecodable(self, peer, e: codec.CodecError, now: float) -> list:
        self.stats["bad_messages"] += 1
        session = self.sessions.get(peer)
        if session is not None:
            session.last_heard = now
        elif self._revoked(peer):
            return []
        if e.seq is None:
            log.info("dropped an undecodable message from %r: %s", peer, e.message)
            return []
        return [(peer, codec.encode(codec.reply_error(e.seq, e.error, e.message)))]

    def _close_replaced(self, peer) -> None:
        """A connection without a session speaks: if a session's connection had the same
        route, that connection has ended (ZeroMQ gives a routing identity to one
        connection at a time), so its session ends now ([CTL-ENDPOINT-4]). Nothing of it
        is ever served on, or sent to, the new connection."""
        old = self._routes.get(peer.route)
        if old is not None and old.peer != peer:
            self.stats["replaced_connections"] += 1
            self.close_session(old, f"its connection {old.peer.connection} ended (connection "
                                    f"{peer.connection} now has its routing identity)")

    def _hello(self, peer, msg, now) -> dict:
        if peer in self.sessions:
            raise ControlError(wire.CTL_ERR_BAD_STATE, "this connection already said hello")
        version = msg["version"]
        if not version or version[0] != wire.PROTOCOL_VERSION[0]:
            raise ControlError(wire.CTL_ERR_BAD_VERSION,
                               f"protocol version {version} is not {list(wire.PROTOCOL_VERSION)}")
        memory, mem_size = msg["memory"], msg["mem_size"]
        if memory not in wire.MEMORY_MODELS:
            raise ControlError(wire.CTL_ERR_MALFORMED, f"memory model {memory!r} is not one of {wire.MEMORY_MODELS}")
        if mem_size <= 0 or mem_size % wire.PAGE_SIZE:
            raise ControlError(wire.CTL_ERR_MALFORMED, f"mem_size {mem_size} must be a positive multiple of 4096")
        if mem_size > self.max_mem_size:
            raise ControlError(wire.CTL_ERR_LIMIT, f"mem_size {mem_size} exceeds the host limit {self.max_mem_size}")
        if len(self.sessions) >= self.max_sessions:  # DEV-LIMIT-1
            raise ControlError(wire.CTL_ERR_LIMIT, f"the host serves at most {self.max_sessions} "
                                                   "sessions at once")
        vgpu = self._bind_vgpu(msg.get("vgpu"))
        sid = f"s{next(self._ids)}"
        self.stats["sessions"] += 1
        name = str(msg["name"])[:64] or sid
        creds = self.credentials(peer.connection)
        session = GuestSession(self, peer, sid, name, memory, mem_size, now, vgpu,
                               {k: v for k, v in creds.items() if k != "ip"} if creds else None)
        self.sessions[peer] = session
        self._routes[peer.route] = session
        log.info("session %s (%s) opened: %s memory, %d MiB, vGPU %s%s", sid, name, memory,
                 mem_size >> 20, vgpu.name if vgpu else "default",
                 f", key {session.key}" if session.key else "")
        reply = {}
        if vgpu is not None:
            reply["vgpu"] = {"name": vgpu.name, "compute": vgpu.compute, "copy": vgpu.copy,
                             "mem": vgpu.mem}
        if session.mem_challenge is not None:
            reply["mem_challenge"] = session.mem_challenge
        return {
            **reply,
            "session": sid,
            "devices": [{"index": k.index, "name": k.name, "vram_size": k.vram_size,
                         "device_id": wire.VIRTIO_ID_PVGPU, "peers": self._peers(k)}
                        for k in self.kmds],
            "heartbeat_ms": self.heartbeat_ms,
            "max_mem_size": self.max_mem_size,
        }

    def _peers(self, kmd) -> list:
        """hello `peers` of a device (spec CTL-HELLO-9): how each other device reaches it."""
        out = []
        for other in self.kmds:
            if other is not kmd:
                link, distance = kmd.p2p_distance(other)
                out.append({"dev": other.index, "p2p": link != "NOT_SUPPORTED",
                            "link": link.lower(), "distance": distance})
        return out

    def _bind_vgpu(self, requested):
        """The vGPU a new session joins: the one it names, else the configured vGPU with
        the fewest sessions (the first on a tie); None when no vGPUs are configured."""
        if requested is not None:
            vgpu = self.vgpus.get(requested)
            if vgpu is None:
                known = ", ".join(self.vgpus) or "none are configured"
                raise ControlError(wire.CTL_ERR_LIMIT, f"no vGPU named {requested!r} ({known})")
            return vgpu
        if not self.vgpus:
            return None
        bound = collections.Counter(s.vgpu.name for s in self.sessions.values() if s.vgpu)
        return min(self.vgpus.values(), key=lambda v: bound[v.name])

    def _device(self, session, msg) -> VirtioGpuDevice:
        dev = msg["dev"]
        if not 0 <= dev < len(session.devices):
            raise ControlError(wire.CTL_ERR_BAD_DEVICE, f"no device {dev}")
        return session.devices[dev]

    def _request(self, session, op, msg, out) -> dict:
        if op == wire.OP_PING:
            return {}
        if op == wire.OP_BYE:
            self.close_session(session, "bye")
            return {}
        if op == wire.OP_SET_MEM_TABLE:
            session.set_mem_table(msg["regions"])
            return {}
        dev = self._device(session, msg)
        if op == wire.OP_GET_FEATURES:
            return {"features": wire.DEVICE_FEATURES}
        if op == wire.OP_SET_FEATURES:
            dev.set_features(msg["features"])
            return {}
        if op == wire.OP_GET_STATUS:
            return {"status": dev.status}
        if op == wire.OP_SET_STATUS:
            if msg["status"] == 0:
                pending = dev.reset()
                if pending:  # DEV-RESET-1/2: reply once nothing can write guest memory
                    self.track_inflight(pending)
                    self._reply_when_done(session, dev, msg["seq"], pending)
                    return None
            else:
                dev.set_status(msg["status"])
            return {}
        if op == wire.OP_GET_CONFIG:
            return {"config": dev.get_config()}
        if op == wire.OP_SET_VRING:
            dev.set_vring(msg["queue"], msg["size"], msg["desc"], msg["avail"], msg["used"],
                          msg.get("base", 0))
            return {}
        if op == wire.OP_ENABLE_VRING:
            dev.enable_vring(msg["queue"], msg["enable"])
            if msg["enable"] and dev.live():
                if msg["queue"] == wire.EVENTQ:
                    dev.process_eventq()
                    self._after_processing(session, dev, False, out)
                else:
                    self._after_processing(session, dev, dev.process_queue(), out)
            return {}
        raise ControlError(wire.CTL_ERR_UNKNOWN_OP, f"unknown op {op!r}")

    def _kick(self, session, msg, extra) -> list:
        dev_index, queue = msg["dev"], msg["queue"]
        if not 0 <= dev_index < len(session.devices) or queue not in (wire.CONTROLQ, wire.EVENTQ):
            self.stats["bad_kicks"] += 1
            return []
        dev = session.devices[dev_index]
        patches = msg.get("patches")
        if patches:
            if session.memory != wire.MEMORY_INLINE or session.mem is None:
                self.stats["bad_kicks"] += 1
                return []
            try:
                session.mem.apply_patches(patches, extra)
            except GuestMemoryError as e:
                self.stats["bad_kicks"] += 1
                dev.needs_reset(f"bad kick patch: {e}")
                out = []
                self._after_processing(session, dev, False, out)
                return out
        out = []
        if queue == wire.EVENTQ:
            dev.process_eventq()
            self._after_processing(session, dev, False, out)
        else:
            trace = dev.kmd.trace
            if trace is not None:  # received when the I/O loop's poll returned
                trace.kick(dev.kmd, int(session.last_heard * 1e9), session)
            self._after_processing(session, dev, dev.process_queue(), out)
        return out

    def _after_processing(self, session, dev, added: bool, out: list) -> None:
        """Queue the `call`s (and `config_changed`) the device owes the driver: one for
        the control queue if it added used entries, one for the event queue if it did."""
        if dev.status & wire.STATUS_DEVICE_NEEDS_RESET and not dev.reset_announced:
            dev.reset_announced = True
            out.append((session.peer, codec.encode({"op": wire.OP_CONFIG_CHANGED, "dev": dev.index})))
        events, events_notify = dev.take_eventq_call()
        if session.tracks_dirty:
            dirty = session.mem.take_dirty() if session.mem is not None else []
            if not dirty and not added:
                return
            if added or not events:
                queue = wire.CONTROLQ
                notify = dev.take_call(added)
            else:
                queue, notify = wire.EVENTQ, events_notify
            buf = session.mem.buf
            msg = {"op": wire.OP_CALL, "dev": dev.index, "queue": queue, "notify": notify,
                   "patches": [[gpa, i] for i, (gpa, _n) in enumerate(dirty)]}
            # Ring and response bytes are copied now: the loop sends later, after handling
            # more messages that may already have moved used.idx on. Large ranges are
            # device-written buffers nobody touches until the driver has this call.
            frames = [buf[gpa:gpa + n] if n >= ZERO_COPY_MIN else bytes(buf[gpa:gpa + n])
                      for gpa, n in dirty]
            out.append((session.peer, codec.encode(msg, frames)))
            if events_notify and queue == wire.CONTROLQ:  # after the patches it relies on
                out.append((session.peer, [_call_frame(dev.index, wire.EVENTQ)]))
        else:
            if dev.take_call(added):
                out.append((session.peer, [_call_frame(dev.index, wire.CONTROLQ)]))
            if events_notify:
                out.append((session.peer, [_call_frame(dev.index, wire.EVENTQ)]))

    def _reply_when_done(self, session, dev, seq: int, fences) -> None:
        """Send `{ok: true}` for request `seq` once every fence has signalled."""
        remaining = [len(fences)]

        def reply() -> bool:
            self._outbox.append((session.peer, codec.encode(codec.reply_ok(seq))))
            return False

        def on_signal(_fence):  # engine thread
            with self.lock:
                remaining[0] -= 1
                done = remaining[0] == 0
            if done:
                self.post_completion(session, dev, reply)

        for f in fences:
            f.add_done_callback(on_signal)

    def run_completions(self) -> list:
        """Finish held chains whose fences signalled; -> the messages to send. Runs what
        was posted before it started: what that posts (a queue's next turn, device.py
        `_requeue`) waits for the loop's next turn, after the messages that came meanwhile."""
        out = []
        touched = {}
        for _ in range(len(self._completions)):
            session, device, fn, args = self._completions.popleft()
            if self.sessions.get(session.peer) is not session:
                continue
            with session.queue_lock:
                added = fn(*args)
            key = (id(session), device.index)
            touched[key] = (session, device, added or (key in touched and touched[key][2]))
        for session, dev, added in touched.values():
            with session.queue_lock:
                self._after_processing(session, dev, added, out)
        out += self._outbox
        self._outbox = []
        self._reap_releases()
        return out

    # ------------------------------------------------------------------ lifetime
    def close_session(self, session, reason: str) -> None:
        if self.sessions.get(session.peer) is not session:
            return
        del self.sessions[session.peer]
        if self._routes.get(session.peer.route) is session:
            del self._routes[session.peer.route]
        with session.queue_lock:  # no fence completion writes past this point
            session.closed = True
            for dev in session.devices:
                self.stats.update(dev.stats)  # keep the totals after the session is gone
            pending = session.teardown() + [f for f in self._inflight if not f.signaled]
        self.event_exports.withdraw_owner(session)  # (teardown withdrew them per event)
        self.resource_exports.withdraw_owner(session)
        self._releases.append((session, pending))
        self._reap_releases()
        log.info("session %s (%s) closed: %s", session.sid, session.name, reason)

    def revoke_keys(self, fingerprints) -> None:
        """CTL-AUTH-4: the CURVE keys with these fingerprints are no longer authorized
        (the full set: a key authorized again is left out). Their sessions are closed
        now, and nothing that comes on a connection they authenticated is served or
        answered any more: to it the host is gone (ZeroMQ cannot close one connection of
        a ROUTER), so its driver declares the host lost (CTL-HB-4) instead of waiting."""
        self.revoked_keys = frozenset(fingerprints)
        for session in list(self.sessions.values()):
            if session.key is not None and session.key in self.revoked_keys:
                self.stats["revoked_sessions"] += 1
                self.close_session(session, f"its key {session.key} was revoked")

    def _revoked(self, peer) -> bool:
        """A message on a connection whose key was revoked: dropped, counted."""
        if self.revoked_keys and getattr(peer, "key", None) in self.revoked_keys:
            self.stats["revoked_messages"] += 1
            return True
        return False

    def _reap_releases(self) -> None:
        keep = []
        for session, fences in self._releases:
            if all(f.signaled for f in fences):
                session.release_memory()
            else:
                keep.append((session, fences))
        self._releases = keep
        self._inflight = [f for f in self._inflight if not f.signaled]

    def connection_closed(self, connection: str) -> None:
        """The transport connection named `connection` closed: its session, if it has
        one, is reclaimed now ([CTL-HB-7]), not after missed heartbeats."""
        for session in self.sessions.values():
            if session.peer.connection == connection:
                self.stats["disconnected_sessions"] += 1
                self.close_session(session, "disconnected")
                return

    def expire(self, now: float) -> None:
        """Reclaim sessions silent for HEARTBEAT_MISSES periods (spec CTL heartbeat)."""
        limit = wire.HEARTBEAT_MISSES * self.heartbeat_ms / 1000.0
        for session in list(self.sessions.values()):
            if now - session.last_heard > limit:
                self.stats["expired_sessions"] += 1
                self.close_session(session, f"no message for {now - session.last_heard:.1f}s")
        self._reap_releases()

    def pending_releases(self) -> int:
        return len(self._releases)

    def summary(self) -> str:
        st = self.stats
        return (f"{st['sessions']} session(s), {st['chains']} request(s); rejected: "
                f"{st['bad_chains']} malformed chain(s), {st['bad_messages']} undecodable "
                f"message(s), {st['control_errors']} control error(s); "
                f"{st['disconnected_sessions']} session(s) reclaimed on disconnect, "
                f"{st['expired_sessions']} after missed heartbeats")

    def announce_shutdown(self, reason: str) -> list:
        """-> a `shutdown` notification for every session ([CTL-BYE-2]): the host is
        stopping; the main loop sends them, lets them leave, then calls `shutdown`."""
        frames = codec.encode({"op": wire.OP_SHUTDOWN, "reason": reason})
        return [(session.peer, frames) for session in self.sessions.values()]

    def shutdown(self) -> None:
        for session in list(self.sessions.values()):
            self.close_session(session, "host shutdown")
