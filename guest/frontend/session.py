"""The guest side of one session: connection, guest memory, devices, notifications (spec §2, §3).

`FrontendSession` says hello, creates the guest's "physical memory" in the chosen
model (a POSIX shared-memory segment announced with set_mem_table, or a local buffer
whose changes travel as kick patches), lays it out (per device: virtqueue and request
slots; the rest: a heap for bounce buffers) and brings every device up.

It is the only place the guest blocks: `wait_for(cond)` first kicks the chains the
drivers deferred (guest/frontend/driver.py, kick policy), then reaps used rings and, while the
condition is false, receives notifications from the host (`call` applies inline patches
and wakes waiters; `config_changed` fails that device's pending requests with
DeviceNeedsReset). The channel underneath sends heartbeats and turns a silent host into
HostLost.

With $PVGPU_GUEST_TRACE set, the session stamps its kicks and the ends of its waits and
writes them at close (guest/frontend/latency_log.py), the guest's half of a host trace.

The endpoint is the one given, else $PVGPU_ENDPOINT, else the default (`resolve_endpoint`,
spec CTL-ENDPOINT-2). The session logs to the `pvgpu.guest` logger: its start and end at
INFO, a lost host at WARNING; it installs no handler (the application configures logging).
"""

from __future__ import annotations

import logging
import os
import time

from pvgpu.spec import wire
from pvgpu.guest.frontend.driver import DeviceNeedsReset, VirtioGpuDriver
from pvgpu.guest.frontend.heap import GuestHeap
from pvgpu.guest.frontend.latency_log import LatencyLog
from pvgpu.transport.channel import GuestChannel, default_endpoint
from pvgpu.transport.curve import guest_keys
from pvgpu.transport.codec import encode
from pvgpu.transport.errors import (AuthenticationFailed, ChannelError, ChannelTimeout, HostLost,
                              HostNotFound, PvgpuError)
from pvgpu.transport.memory import GuestMemory, InlineGuestMemory, SharedGuestMemory


__all__ = ["FrontendSession", "ControlRequestError", "HostLost", "HostNotFound",
           "ChannelTimeout", "ChannelError", "AuthenticationFailed", "PvgpuError",
           "resolve_endpoint", "ENDPOINT_ENV"]

log = logging.getLogger("pvgpu.guest")
ENDPOINT_ENV = "PVGPU_ENDPOINT"


def resolve_endpoint(endpoint: str | None = None) -> str:
    """The endpoint a guest connects to: `endpoint` if given, else $PVGPU_ENDPOINT if set,
    else the default endpoint (spec CTL-ENDPOINT-2)."""
    return endpoint or os.environ.get(ENDPOINT_ENV) or default_endpoint()


class ControlRequestError(PvgpuError, RuntimeError):
    """The host refused a control message (`ok: false`)."""

    def __init__(self, op: str, error: str, message: str):
        self.op, self.error, self.message = op, error, message
        super().__init__(f"{op}: {error}: {message}")


class FrontendSession:
    POLL_SECONDS = 300e-6  # busy-poll the used rings at least this long before blocking
    POLL_MAX = 2e-3  # ... and up to this long when recent waits were that short
    POLL_FROM_START = 1e-3  # a wait expected longer blocks until shortly before its end
    CHANNEL_TICK = 1e-3  # a blocking receive ends up to this late (whole milliseconds)
    POLL_NAP = 100e-6  # between two looks at the rings near a long wait's end
    BLOCK_SLICE = 0.05  # while blocked, re-check the rings at least this often
    session_id = None  # the host's name of the session, from its hello reply
    latency_log = None  # a LatencyLog with $PVGPU_GUEST_TRACE set (latency_log.py)
    def __init__(self, endpoint: str | None = None, *, memory: str = wire.MEMORY_SHARED,
                 mem_size: int = wire.DEFAULT_GUEST_MEM_SIZE, name: str | None = None,
                 heartbeat_ms: int | None = None, timeout: float = 10.0,
                 features: int | None = None, vgpu: str | None = None,
                 server_key=None, client_key=None):
        if memory not in wire.MEMORY_MODELS:
            raise ValueError(f"memory model must be one of {wire.MEMORY_MODELS}, not {memory!r}")
        self.endpoint = resolve_endpoint(endpoint)
        self.memory = memory
        self.inline = memory == wire.MEMORY_INLINE
        self.mem_size = mem_size
        self.timeout = timeout
        self.features = wire.DEVICE_FEATURES if features is None else features
        self.name = name or f"guest-{os.getpid()}"
        self.requested_vgpu = vgpu
        self.vgpu = None  # the host's answer: {name, compute, copy, mem} or None
        self.mem: GuestMemory = None  # type: ignore[assignment]  # set by the hello below
        self.devices: list[VirtioGpuDriver] = []
        self.closed = False
        self._wait_ewma = 0.0  # seconds: how long recent waits took (shared model)
        self._kind_waits: dict = {}  # ... waits of each `kind` (wait_for)
        self._kicks: dict[tuple[int, int], list] = {}  # (dev, queue) -> the encoded kick
        self.latency_log = LatencyLog.from_env(self.name)
        self.host_lost = False
        heartbeat_ms = heartbeat_ms or wire.DEFAULT_HEARTBEAT_MS
        server, client = guest_keys(self.endpoint, server_key, client_key)  # tcp: CURVE
        self.channel = GuestChannel(self.endpoint, heartbeat_ms=heartbeat_ms,
                                    server_key=server, client_key=client)
        # No handler: notifications queue up and wait_for() applies them in order on the
        # application's thread (inline patches must never race the application).
        try:
            # a refused handshake raises here, at once (CTL-AUTH-6), not as a silent host
            self.channel.await_handshake(self._handshake_window(heartbeat_ms))
            self._open()
        except BaseException as e:
            log.info("cannot open a session with %s: %s", self.endpoint, e)
            self._close_quietly()
            raise
        log.info("session %s with %s: %s memory of %d MiB, %d device(s)%s", self.session_id,
                 self.endpoint, self.memory, self.mem_size >> 20, len(self.devices),
                 f", vGPU {self.vgpu['name']}" if self.vgpu else "")

    # ------------------------------------------------------------------ setup
    def _handshake_window(self, heartbeat_ms: int) -> float:
        """How long a tcp handshake may take: the liveness window (CTL-HB-4), within
        the control timeout."""
        window = wire.HEARTBEAT_MISSES * (heartbeat_ms if heartbeat_ms > 0
                                          else wire.DEFAULT_HEARTBEAT_MS) / 1000
        return min(window, self.timeout) if self.timeout else window

    def _open(self) -> None:
        fields = {"vgpu": self.requested_vgpu} if self.requested_vgpu is not None else {}
        hello = self.control(wire.OP_HELLO, version=list(wire.PROTOCOL_VERSION), name=self.name,
                             memory=self.memory, mem_size=self.mem_size, **fields)
        self.session_id = hello["session"]
        for info in hello["devices"]:  # this driver binds to pvgpu devices only (DEV-ID-3)
            if info.get("device_id") != wire.VIRTIO_ID_PVGPU:
                raise ControlRequestError(
                    wire.OP_HELLO, wire.CTL_ERR_MALFORMED,
                    f"device {info.get('index')} has device id {info.get('device_id')!r}, "
                    f"not VIRTIO_ID_PVGPU ({wire.VIRTIO_ID_PVGPU:#x}): not a pvgpu device "
                    f"(DEV-ID-3)")
        self.vgpu = hello.get("vgpu")
        self.heartbeat_ms = hello["heartbeat_ms"]
        self.channel.heartbeat_ms = self.heartbeat_ms
        if self.inline:
            self.mem = InlineGuestMemory(self.mem_size)
        else:
            challenge = hello.get("mem_challenge")
            if not isinstance(challenge, bytes) or len(challenge) != wire.MEM_CHALLENGE_SIZE:
                raise ControlRequestError(wire.OP_HELLO, wire.CTL_ERR_MALFORMED,
                                          "the reply has no valid mem_challenge (CTL-MEMTABLE-5)")
            self.mem = mem = SharedGuestMemory.create(self.mem_size)
            mem.write(wire.MEM_CHALLENGE_GPA, challenge)  # proves the memory is ours
            self.control(wire.OP_SET_MEM_TABLE,
                         regions=[{"gpa": 0, "size": self.mem_size, "name": mem.name}])
        area = VirtioGpuDriver.area_size()
        infos = hello["devices"]
        heap_base = area * len(infos)
        if heap_base >= self.mem_size:
            raise ValueError(f"guest memory of {self.mem_size} bytes is too small for {len(infos)} devices")
        self.heap = GuestHeap(heap_base, self.mem_size - heap_base, align=4096)
        for i, info in enumerate(infos):
            drv = VirtioGpuDriver(self, info["index"], info, base=i * area,
                                  wanted_features=self.features)
            drv.initialize()
            self.devices.append(drv)

    # ------------------------------------------------------------------ control channel
    def control(self, op: str, **fields) -> dict:
        try:
            reply, _frames = self.channel.request({"op": op, **fields}, timeout=self.timeout)
        except HostLost as e:
            self._lost(e)
            raise
        except ChannelTimeout as e:
            raise ChannelTimeout(f"{op}: {e}: the host is alive but slow to answer; connect "
                                 f"with a longer timeout (now {self.timeout:g} s)") from None
        if not reply.get("ok"):
            raise ControlRequestError(op, reply.get("error", "?"), reply.get("message", ""))
        return reply

    def kick(self, dev: int, queue: int = wire.CONTROLQ) -> None:
        if self.latency_log is not None:
            self.latency_log.kicked()
        if self.inline:
            dirty = self.mem.take_dirty()
            if dirty:
                buf = self.mem.buf
                self.channel.send({"op": wire.OP_KICK, "dev": dev, "queue": queue,
                                   "patches": [[gpa, i] for i, (gpa, _n) in enumerate(dirty)]},
                                  [buf[gpa:gpa + n] for gpa, n in dirty])
                return
        parts = self._kicks.get((dev, queue))
        if parts is None:  # a kick without patches never changes: encoded once
            parts = self._kicks[dev, queue] = encode({"op": wire.OP_KICK, "dev": dev,
                                                      "queue": queue})
        self.channel.send_encoded(parts)

    def _on_notification(self, msg, frames) -> None:
        op = msg.get("op")
        if op == wire.OP_CALL:
            if isinstance(self.mem, InlineGuestMemory) and msg.get("patches"):  # the inline model
                self.mem.apply_patches(msg["patches"], frames)
        elif op == wire.OP_CONFIG_CHANGED:
            dev = msg.get("dev")
            if isinstance(dev, int) and 0 <= dev < len(self.devices):
                self.devices[dev].reap()
                self.devices[dev].fail_all(DeviceNeedsReset(
                    f"device {dev} reported DEVICE_NEEDS_RESET (a malformed request was rejected); "
                    "reset it to continue"))

    def drain_notifications(self) -> None:
        """Apply every notification received so far, without blocking. A device reset does
        this between the reply to set_status 0 and re-initialising the rings (spec
        DEV-RESET-5): the device's writes of before the reset land now, not in new rings."""
        while True:
            try:
                msg, frames = self.channel.recv_until(
                    lambda m: m.get("op") in (wire.OP_CALL, wire.OP_CONFIG_CHANGED), timeout=0)
            except ChannelTimeout:
                return
            self._on_notification(msg, frames)

    def wait_for(self, cond, timeout: float | None = None, kind=None) -> None:
        """Block until cond() is true, processing used rings and host notifications.
        `kind` (hashable, from a bounded set): what is waited for, e.g. a copy of a size
        class; its waits are expected to take as long as the earlier ones of that kind
        did, instead of as long as recent waits of any kind did (a wait whose request was
        done at the first look says nothing of that, and is not counted).

        Shared model: used-buffer notifications stay suppressed (EVENT_IDX used_event /
        NO_INTERRUPT) and the driver polls the used rings in guest memory for up to
        a while, as a busy-polling virtio driver does; only then does it re-enable
        notifications, re-check the rings (virtqueue_enable_cb semantics) and block for
        a `call`. A short request therefore completes without any device->driver message.
        The poll window adapts to recent waits: 1.5x their moving average, between
        POLL_SECONDS and POLL_MAX. When they take longer than POLL_FROM_START, the driver
        blocks (notifications enabled: a `call` still ends it early) until a lead before
        the wait's expected end, a quarter of it (between POLL_SECONDS and POLL_MAX / 2),
        and polls from there for up to twice the lead before it blocks again: a long job
        (a 16 MiB copy, a long kernel) leaves every core to the host while it runs, and its
        completion is still seen without a `call`. Blocking to the end costs a `call`
        message and a wakeup, measured at ~250 µs here, more than a short job itself;
        polling through a 2 ms copy costs its DMA lanes a core. A long wait that a `call`
        ended before its poll began counts a lead less (the request completed a call's
        latency earlier), and a long wait's expectation falls faster than it rises (0.7
        against 0.3 of the difference), so the next one begins polling in time. The
        channel's blocking receive ends on a whole millisecond (rounded up): the block
        asks for a CHANNEL_TICK less and sleeps the rest.
        Between two looks at the rings the poll yields the core (sched_yield): on a
        machine with more runnable threads than cores, the host threads that are to
        answer may be waiting for the very core this loop spins on. Near a long wait's
        end it sleeps POLL_NAP between looks instead: spinning there slowed a 16 MiB
        copy's DMA lanes more than the naps delay seeing its completion.
        Inline model: the device's writes arrive in `call` messages, so it always blocks.
        """
        self.flush()
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        waits = self._kind_waits if kind is not None else None
        expected = self._wait_ewma if waits is None else waits.get(kind, self._wait_ewma)
        polling = not self.inline and expected <= self.POLL_FROM_START
        poll_until = 0.0  # set after the first look (most requests are done by then)
        lead, poll_at = 0.0, None
        if not self.inline and not polling:
            # a longer wait: block until shortly before its expected end, then poll for it
            lead = min(self.POLL_MAX / 2, max(self.POLL_SECONDS, expected / 4))
            poll_at = start + expected - lead
        devices = self.devices
        first_look = True
        while True:
            for d in devices:
                d.reap()
            if cond():
                if self.latency_log is not None:
                    self.latency_log.wait_done()
                if first_look and waits is not None:
                    return  # done before the wait: says nothing of how long its kind takes
                took = min(time.monotonic() - start, 1.0)
                if poll_at is not None:  # seen before the poll began: it ended a lead earlier
                    took = max(0.0, took - lead)
                # a long wait's expectation falls faster than it rises: polling too late
                # costs a `call`, too early a little CPU
                rate = 0.7 if not polling and took < expected else 0.3
                if waits is None:
                    self._wait_ewma += rate * (took - self._wait_ewma)
                else:
                    waits[kind] = expected + rate * (took - expected)
                return
            if first_look:
                first_look = False
                if polling:
                    poll_until = start + min(self.POLL_MAX, max(self.POLL_SECONDS, 1.5 * expected))
            now = time.monotonic()
            if now < poll_until:
                if polling:
                    os.sched_yield()  # the host threads we wait for may need this core
                else:  # near a long job's end: its DMA lanes may need every core
                    time.sleep(self.POLL_NAP)
                continue
            if deadline is not None and now >= deadline:
                raise ChannelTimeout(f"the device did not finish within {timeout:g} s")
            if poll_at is not None and now >= poll_at - self.CHANNEL_TICK:
                if now < poll_at:  # the rest is shorter than the channel's tick
                    time.sleep(poll_at - now)
                poll_at, poll_until = None, time.monotonic() + 2 * lead
                continue
            if not self.inline:
                pending = [d for d in devices if d.queue is not None and not d.queue.enable_interrupts()]
                if pending:
                    self._suppress_interrupts()
                    continue
            slice_s = self.BLOCK_SLICE if deadline is None else min(self.BLOCK_SLICE, deadline - now)
            if poll_at is not None:
                slice_s = min(slice_s, poll_at - self.CHANNEL_TICK - now)
            try:
                msg, frames = self.channel.recv_until(
                    lambda m: m.get("op") in (wire.OP_CALL, wire.OP_CONFIG_CHANGED), timeout=slice_s)
            except ChannelTimeout:
                self._check_host_alive(start)
                continue  # re-check the rings: a notification is only a hint
            except HostLost as e:
                self._lost(e)
                raise
            finally:
                if not self.inline:
                    self._suppress_interrupts()
            self._on_notification(msg, frames)

    def flush(self) -> None:
        """Kick every device's deferred chains (the driver's kick policy, spec VQ-NOTIFY-6):
        before any wait, since what is waited for may depend on them, and at close."""
        for d in self.devices:
            if d.deferred:
                d.kick()

    def _check_host_alive(self, start: float) -> None:
        """The channel measures silence per wait; across our short slices we do it here,
        for the wait that began at start, from the silence the channel has seen (its
        socket found empty that long after the later of the last message and start),
        not from the clock: a thread descheduled, or stepped aside while another read
        the socket, has not seen the host fall silent. Nor is silence from before the
        wait the host's: a driver that only kicked (async launches polled to
        completion) asked nothing of it and, sending all the while, sent no ping."""
        if self.channel.heartbeat_ms <= 0:
            return
        limit = wire.HEARTBEAT_MISSES * self.channel.heartbeat_ms / 1000.0
        silent = self.channel.silence_since(start)
        if silent > limit:
            e = HostLost(f"host at {self.endpoint} stopped answering "
                         f"(no message for {silent * 1000:.0f} ms)")
            self._lost(e)
            raise e

    def _lost(self, e: HostLost) -> None:
        """The host is gone: say so once (a session that never opened just failed)."""
        if not self.host_lost and self.devices:
            log.warning("session %s: %s", self.session_id, e)
        self.host_lost = True

    def _suppress_interrupts(self) -> None:
        for d in self.devices:
            if d.queue is not None:
                d.queue.disable_interrupts()

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        log.info("session %s with %s closed%s", self.session_id, self.endpoint,
                 " (the host was lost)" if self.host_lost else "")
        try:
            if not self.host_lost:
                self.flush()
                self.control(wire.OP_BYE)
        except (HostLost, ControlRequestError, TimeoutError, OSError):
            pass
        finally:
            self._close_quietly()
            self._write_latency_log()

    def _write_latency_log(self) -> None:
        if self.latency_log is None:
            return
        try:
            path = self.latency_log.write()
            log.info("session %s: latency log written to %s", self.session_id, path)
        except OSError as e:  # the application's close must not fail for it
            log.warning("session %s: cannot write the latency log: %s", self.session_id, e)

    def _close_quietly(self) -> None:
        self.closed = True
        try:
            self.channel.close()
        finally:
            if self.mem is not None and hasattr(self.mem, "close"):
                try:
                    self.mem.close()
                except BufferError:
                    pass
