"""The driver's end of the control channel, sans-IO (spec/pvgpu.md §2, §2.11, §2.12).

``ChannelProtocol`` holds the guest's protocol state and never touches a socket or a
clock (h11's shape): the caller passes every received message and the time in, and
gets back events saying what happened and what to send. transport/channel.py is the
thin ZeroMQ pump around it (threads, poll, the socket lock); tests drive this object
alone with a clock they advance.

Theory of operation
    Requests. ``send_request(msg, frames, token)`` gives msg a fresh ``seq``, encodes it
    and remembers ``seq -> token`` (the token is the caller's: the pump passes the
    object a waiting thread sleeps on). A reply with that seq becomes ``Reply(token,
    ...)``; a malformed one that still names the seq becomes ``RequestFailed(token,
    ...)``. ``cancel_request(seq)`` forgets a request whose waiter gave up: its reply,
    if it comes, is then a stale reply.

    Receiving. ``receive(raw, now)`` decodes one message ``[frame0, *extra]``. Any
    message, even one that does not decode, is a sign of life (``last_heard``). A
    ``ping`` from the host is answered (``Transmit``, [CTL-PING-1]); the replies to our
    own pings are absorbed; anything else that is not a reply awaited here (``call``,
    ``config_changed``, stale or unknown replies) is a ``Notification``. A message that
    does not decode and names no pending request is ``Malformed`` (dropped and
    counted in ``malformed``).

    Sending. ``send(msg, frames)`` encodes a notification. ``sent(now)`` tells the
    protocol when the pump actually put something on the wire; ``Transmit`` events
    count as sent when they are made (the pump sends them at once).

    Heartbeats, with P the heartbeat period (``heartbeat_ms``; 0 or less disables
    both rules below):
      * pings ([CTL-HB-2]): ``tick(now)`` makes a ``ping`` once nothing has been sent
        for P, whether or not anyone waits;
      * liveness ([CTL-HB-4]): only a wait can find the host lost. ``begin_wait(token,
        now)`` starts one, ``end_wait(token)`` ends it. A wait fails (``HostSilent``
        from ``tick``, once) when nothing has been heard for ``HEARTBEAT_MISSES``
        periods, counted from the later of the last message heard and the start of
        the wait. Silence is proven only up to the last time the pump looked at its
        input and found nothing (``input_empty(now)``), not up to ``now``: a thread
        that was descheduled past the window reads what arrived meanwhile before the
        host can be called lost.
    ``next_deadline(now)`` is when ``tick`` next has something to do (None: never).

    Connection ([CTL-HB-6]). The pump reports its socket monitor's events:
    ``handshake_succeeded()`` once the connection to the host is up, ``disconnected()``
    when a connection closes. A close after a handshake succeeded loses the host at
    once: the session belonged to that connection, and the DEALER's automatic
    reconnection would be a new connection, so a new session ([CTL-ENDPOINT-4]). Every
    wait and pending request fails (``ConnectionLost``) and ``lost`` says why; the pump
    refuses to use the session afterwards ([CTL-HB-5]). A close before any handshake
    succeeded (the host is not up yet, or refused the handshake) loses nothing. A
    ``shutdown`` notification from the host loses it the same way, with the host's
    reason ([CTL-BYE-3]).

Not thread-safe: the pump serialises every call.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from pvgpu.spec.wire import DEFAULT_HEARTBEAT_MS, HEARTBEAT_MISSES, OP_PING, OP_REPLY, OP_SHUTDOWN
from pvgpu.transport.codec import CodecError, decode, encode, reply_ok

# A host that never answers pings must not grow the set of ping seqs without bound.
_MAX_PINGS_IN_FLIGHT = 64


@dataclass(frozen=True, slots=True)
class Reply:
    """The reply to the request made with ``token`` (ok or not, as it came)."""
    token: Any  # the caller's waiter object
    msg: dict
    frames: list


@dataclass(frozen=True, slots=True)
class RequestFailed:
    """The reply to the request made with ``token`` came but did not decode."""
    token: Any  # the caller's waiter object
    error: CodecError


@dataclass(frozen=True, slots=True)
class Notification:
    """A message nobody here waits for: call, config_changed, a stale reply."""
    msg: dict
    frames: list


@dataclass(frozen=True, slots=True)
class Malformed:
    """A message that did not decode and answers no pending request (dropped)."""
    error: CodecError


@dataclass(frozen=True, slots=True)
class Transmit:
    """Frames to send now: a heartbeat ping or the answer to the host's ping."""
    parts: list


@dataclass(frozen=True, slots=True)
class HostSilent:
    """The wait ``token`` heard nothing for HEARTBEAT_MISSES periods: the host is lost."""
    token: Any  # the caller's waiter object
    silent: float  # seconds of silence proven


@dataclass(frozen=True, slots=True)
class ConnectionLost:
    """The wait or request ``token`` fails: the host is lost for ``reason``."""
    token: Any  # the caller's waiter object
    reason: str


class ChannelProtocol:
    """Seq matching, replies, notifications, pings and liveness of one guest session's
    control connection. Times are seconds on any monotonic clock the caller likes."""

    def __init__(self, heartbeat_ms: int = DEFAULT_HEARTBEAT_MS, now: float = 0.0):
        self.heartbeat_ms = heartbeat_ms
        self.last_heard = now  # the last message from the host
        self.last_sent = now  # the last message to the host
        self._looked = now  # the last time the input was found empty
        self.malformed = 0  # messages from the host that did not decode
        self._seq = itertools.count(1)
        self._pending: dict = {}  # seq -> token of a request awaiting its reply
        self._pings: set = set()  # seqs of our own pings not answered yet
        self._waits: dict = {}  # token -> start of the wait
        self.connected = False  # a handshake with the host has succeeded
        self.lost: str | None = None  # why the host is lost ([CTL-HB-6]); None while it is not

    # ----------------------------------------------------------------- configuration

    @property
    def heartbeat_ms(self) -> int:
        return self._heartbeat_ms

    @heartbeat_ms.setter
    def heartbeat_ms(self, ms: int) -> None:
        self._heartbeat_ms = ms
        self.period = ms / 1000.0 if ms and ms > 0 else None
        # also bounds a send to a host that stopped reading, heartbeats or not
        self.silence = (self.period or DEFAULT_HEARTBEAT_MS / 1000.0) * HEARTBEAT_MISSES

    # ----------------------------------------------------------------- sending

    def next_seq(self) -> int:
        return next(self._seq)

    def send(self, msg: dict, frames=()) -> list:
        """-> the frames of a notification (or of a request carrying its own seq)."""
        return encode(msg, frames)

    def send_request(self, msg: dict, frames=(), token=None) -> tuple:
        """Give msg a fresh seq and await its reply for token -> (seq, frames)."""
        seq = next(self._seq)
        parts = encode({**msg, "seq": seq}, frames)
        self._pending[seq] = token
        return seq, parts

    def cancel_request(self, seq: int) -> None:
        """The request's waiter gave up; a reply to it is a stale reply from now on."""
        self._pending.pop(seq, None)

    def sent(self, now: float) -> None:
        """The pump put a message on the wire at now."""
        self.last_sent = now

    # ----------------------------------------------------------------- receiving

    def receive(self, raw: list, now: float) -> list:
        """One message from the host, ``[frame0, *extra]`` -> events."""
        self.last_heard = now
        try:
            msg, frames = decode(raw)
        except CodecError as e:
            self.malformed += 1
            if e.seq is not None and e.seq in self._pending:
                return [RequestFailed(self._pending.pop(e.seq), e)]
            return [Malformed(e)]
        op = msg["op"]
        if op == OP_REPLY:
            seq = msg["seq"]
            if seq in self._pings:
                self._pings.discard(seq)
                return []
            if seq in self._pending:
                return [Reply(self._pending.pop(seq), msg, frames)]
        elif op == OP_PING:  # the host checks on us
            return [self._transmit(encode(reply_ok(msg["seq"])), now)]
        elif op == OP_SHUTDOWN:  # the host is stopping: nothing more will come
            return self._lose(f"host shut down ({msg['reason']})")
        return [Notification(msg, frames)]

    def input_empty(self, now: float) -> None:
        """The pump looked at its input at now and found no message."""
        if now > self._looked:
            self._looked = now

    @property
    def proven_silence(self) -> float:
        """Seconds from the last message to the last time the input was found empty:
        silence seen, not merely time passed (0 when nothing was looked at since)."""
        return max(0.0, self._looked - self.last_heard)

    def silence_since(self, start: float) -> float:
        """``proven_silence`` of a wait that began at start: counted from the later of the
        last message and start. Silence from before the wait is not the host's: it owes
        no message while the driver asks nothing of it (kicks are not answered, and
        they keep the driver's own pings, which would be, from going out)."""
        return max(0.0, self._looked - max(self.last_heard, start))

    # ----------------------------------------------------------------- connection

    def handshake_succeeded(self) -> None:
        """The connection to the host is up (the socket monitor's HANDSHAKE_SUCCEEDED)."""
        self.connected = True

    def disconnected(self) -> list:
        """A connection to the host closed -> ``ConnectionLost`` for every wait and
        pending request, if a handshake had succeeded (the pump has handed over every
        message received before the close)."""
        if not self.connected:
            return []
        return self._lose("its connection closed")

    def _lose(self, reason: str) -> list:
        if self.lost is not None:
            return []
        self.lost = reason
        tokens = dict.fromkeys(self._waits)
        tokens.update(dict.fromkeys(t for t in self._pending.values() if t is not None))
        self._waits.clear()
        self._pending.clear()
        return [ConnectionLost(t, reason) for t in tokens]

    # ----------------------------------------------------------------- time

    def begin_wait(self, token, now: float) -> None:
        """A thread starts waiting for something from the host (liveness applies)."""
        self._waits[token] = now

    def end_wait(self, token) -> None:
        self._waits.pop(token, None)

    def next_deadline(self, now: float):
        """When ``tick`` next has work (a ping due, a wait's silence window ending),
        or None while heartbeats are disabled or the host is lost."""
        if self.period is None or self.lost is not None:
            return None
        due = self.last_sent + self.period
        if self._waits:
            due = min(due, max(self.last_heard, min(self._waits.values())) + self.silence)
        return due

    def tick(self, now: float) -> list:
        """-> ``HostSilent`` for every wait whose silence window has been proven to
        have passed (the wait ends), then a ``Transmit`` of a ping if one is due."""
        if self.period is None or self.lost is not None:
            return []
        # (the same sums as next_deadline, so that a tick at the deadline acts)
        events: list = []
        for token, start in list(self._waits.items()):
            since = max(self.last_heard, start)
            if self._looked >= since + self.silence:
                del self._waits[token]
                events.append(HostSilent(token, self._looked - since))
        if now >= self.last_sent + self.period:
            seq = next(self._seq)
            if len(self._pings) >= _MAX_PINGS_IN_FLIGHT:
                self._pings.clear()
            self._pings.add(seq)
            events.append(self._transmit(encode({"op": OP_PING, "seq": seq}), now))
        return events

    def _transmit(self, parts: list, now: float) -> Transmit:
        self.last_sent = now
        return Transmit(parts)
