"""Control channel over real ZeroMQ sockets (spec/pvgpu.md §2), ipc:// and tcp://.

A FakeHost thread drives a HostChannel the way the host main loop does; the guest side
is the real GuestChannel. Every socket and thread is closed in fixtures; every wait has
a timeout so a failure cannot hang the suite.
"""

import os
import select
import socket
import threading
import time

import numpy as np
import pytest
import zmq

from pvgpu.spec.wire import (
    CTL_ERR_UNKNOWN_OP,
    DEFAULT_ENDPOINT_NAME,
    DEFAULT_HEARTBEAT_MS,
    HEARTBEAT_MISSES,
    OP_CALL,
    OP_CONFIG_CHANGED,
    OP_GET_STATUS,
    OP_KICK,
    OP_PING,
    OP_REPLY,
)
from pvgpu.transport import channel as channel_mod
from pvgpu.transport.channel import (
    ChannelError,
    ChannelTimeout,
    GuestChannel,
    HostChannel,
    HostLost,
    Waker,
    default_endpoint,
)
from pvgpu.transport.codec import CodecError, decode, encode, reply_error, reply_ok

HB_MS = 50  # heartbeat tests: short, so misses are seen quickly
# every other test: the default period, so a host thread starved for a few hundred
# milliseconds on a loaded machine is not declared lost
QUIET_HB_MS = DEFAULT_HEARTBEAT_MS


def heartbeat_threads():
    return [t for t in threading.enumerate()
            if t.name.startswith("pvgpu-heartbeat") and t.is_alive()]


def wait_for(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


class FakeHost(threading.Thread):
    """A host main loop in miniature: decode, answer pings, hand the rest to on_message."""

    def __init__(self, endpoints, on_message=None, answer_pings=True):
        super().__init__(daemon=True, name="fake-host")
        self.chan = HostChannel([endpoints] if isinstance(endpoints, str) else endpoints)
        self.endpoint = self.chan.endpoints[0]
        self.on_message = on_message
        self.answer_pings = answer_pings
        self.received = []  # (peer, msg, extra) of everything decoded
        self.errors = []  # CodecErrors
        self.pings = 0
        self._halt = threading.Event()
        self._scheduled = []  # (when, peer, msg, frames); sent by the host thread

    def later(self, delay, peer, msg, frames=()):
        """Send from the host thread after delay seconds (HostChannel is one-thread)."""
        self._scheduled.append((time.monotonic() + delay, peer, msg, list(frames)))

    def run(self):
        while not self._halt.is_set():
            now = time.monotonic()
            for item in [x for x in self._scheduled if x[0] <= now]:
                self._scheduled.remove(item)
                self.chan.send_msg(item[1], item[2], item[3])
            for peer, frames in self.chan.recv(5):
                try:
                    msg, extra = decode(frames)
                except CodecError as e:
                    self.errors.append(e)
                    if e.seq is not None:
                        self.chan.send_msg(peer, reply_error(e.seq, e.error, e.message))
                    continue
                self.received.append((peer, msg, extra))
                if msg["op"] == OP_PING:
                    self.pings += 1
                    if self.answer_pings:
                        self.chan.send_msg(peer, reply_ok(msg["seq"]))
                elif self.on_message is not None:
                    self.on_message(self, peer, msg, extra)

    def ops(self):
        return [m["op"] for _, m, _ in self.received]

    def stop(self):
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)
        self.chan.close()


def echo(host, peer, msg, extra):
    """Reply to every request with its seq and the extra frames it carried."""
    if "seq" in msg:
        host.chan.send_msg(peer, reply_ok(msg["seq"], got=msg, nframes=len(extra)), extra)


@pytest.fixture(params=["ipc", "tcp"])
def endpoint(request, tmp_path):
    if request.param == "ipc":
        return f"ipc://{tmp_path}/h.sock"
    return "tcp://127.0.0.1:0"


@pytest.fixture
def make_host():
    hosts = []

    def make(endpoint, on_message=echo, **kw):
        h = FakeHost(endpoint, on_message, **kw)
        hosts.append(h)
        h.start()
        return h

    yield make
    for h in hosts:
        h.stop()


@pytest.fixture
def make_guest():
    guests = []

    def make(endpoint, **kw):
        kw.setdefault("heartbeat_ms", QUIET_HB_MS)
        g = GuestChannel(endpoint, **kw)
        guests.append(g)
        return g

    yield make
    for g in guests:
        g.close()
    assert not heartbeat_threads()


# --------------------------------------------------------------------------- request/reply

def test_request_reply_with_raw_frames(endpoint, make_host, make_guest):
    host = make_host(endpoint)
    g = make_guest(host.endpoint)
    big = np.random.default_rng(1).integers(0, 256, 1 << 20, dtype=np.uint8)
    reply, frames = g.request({"op": OP_GET_STATUS, "dev": 0}, [big, b"tail"], timeout=5)
    assert reply["op"] == OP_REPLY and reply["ok"] is True and reply["nframes"] == 2
    assert reply["got"]["dev"] == 0 and reply["got"]["seq"] == reply["seq"]
    assert len(frames) == 2
    assert np.array_equal(np.frombuffer(frames[0], dtype=np.uint8), big)
    assert bytes(frames[1]) == b"tail"
    # the host saw the bulk frame as a raw frame, not inside the map
    _, msg, extra = [r for r in host.received if r[1]["op"] == OP_GET_STATUS][0]
    assert "got" not in msg and memoryview(extra[0]).nbytes == big.nbytes


def test_sequential_requests_get_distinct_seqs(endpoint, make_host, make_guest):
    host = make_host(endpoint)
    g = make_guest(host.endpoint)
    seqs = [g.request({"op": OP_GET_STATUS, "dev": i}, timeout=5)[0]["seq"] for i in range(50)]
    assert len(set(seqs)) == 50
    assert g.next_seq() > max(seqs)


def test_error_reply_is_returned_as_is(endpoint, make_host, make_guest):
    host = make_host(endpoint)
    g = make_guest(host.endpoint)
    reply, _ = g.request({"op": "frobnicate"}, timeout=5)
    assert reply["ok"] is False and reply["error"] == CTL_ERR_UNKNOWN_OP
    assert host.errors and host.errors[0].error == CTL_ERR_UNKNOWN_OP


def test_notifications_interleaved_with_reply_go_to_handler(endpoint, make_host, make_guest):
    def on_message(host, peer, msg, extra):
        host.chan.send_msg(peer, {"op": OP_CALL, "dev": 0, "queue": 0, "notify": True})
        host.chan.send_msg(peer, {"op": OP_CONFIG_CHANGED, "dev": 1})
        host.chan.send_msg(peer, reply_ok(msg["seq"]))
        host.chan.send_msg(peer, {"op": OP_CALL, "dev": 0, "queue": 0, "notify": True,
                                  "patches": [[4096, 0]]}, [b"used"])

    host = make_host(endpoint, on_message)
    g = make_guest(host.endpoint)
    seen = []
    g.set_notification_handler(lambda m, f: seen.append((m, [bytes(x) for x in f])))
    reply, _ = g.request({"op": OP_GET_STATUS, "dev": 0}, timeout=5)
    assert reply["ok"] is True
    assert [m["op"] for m, _ in seen[:2]] == [OP_CALL, OP_CONFIG_CHANGED]
    # the one after the reply arrives later (next receive or the heartbeat thread)
    assert wait_for(lambda: len(seen) == 3)
    assert seen[2] == ({"op": OP_CALL, "dev": 0, "queue": 0, "notify": True, "patches": [[4096, 0]]}, [b"used"])


def test_notifications_are_queued_without_handler(endpoint, make_host, make_guest):
    def on_message(host, peer, msg, extra):
        host.chan.send_msg(peer, {"op": OP_CONFIG_CHANGED, "dev": 1})
        host.chan.send_msg(peer, reply_ok(msg["seq"]))

    host = make_host(endpoint, on_message)
    g = make_guest(host.endpoint)
    g.request({"op": OP_GET_STATUS, "dev": 0}, timeout=5)
    msg, frames = g.recv_until(lambda m: m["op"] == OP_CONFIG_CHANGED, timeout=0)
    assert msg == {"op": OP_CONFIG_CHANGED, "dev": 1} and frames == []
    with pytest.raises(ChannelTimeout):
        g.recv_until(lambda m: m["op"] == OP_CONFIG_CHANGED, timeout=0)


def test_recv_until_waits_for_a_call(endpoint, make_host, make_guest):
    def on_message(host, peer, msg, extra):
        if msg["op"] == OP_KICK:
            host.later(0.05, peer, {"op": OP_CALL, "dev": 0, "queue": 0, "notify": True})

    host = make_host(endpoint, on_message)
    g = make_guest(host.endpoint)
    g.send({"op": OP_KICK, "dev": 0, "queue": 0})
    msg, _ = g.recv_until(lambda m: m["op"] == OP_CALL, timeout=5)
    assert msg["op"] == OP_CALL


def test_stale_replies_do_not_satisfy_a_request(endpoint, make_host, make_guest):
    def on_message(host, peer, msg, extra):
        s = msg["seq"]
        host.chan.send_msg(peer, reply_ok(s + 1000, which="future"))
        host.chan.send_msg(peer, reply_ok(max(s - 1, 0), which="stale"))
        host.chan.send_msg(peer, reply_ok(s, which="mine"))

    host = make_host(endpoint, on_message)
    g = make_guest(host.endpoint)
    seen = []
    g.set_notification_handler(lambda m, f: seen.append(m))
    for _ in range(3):
        reply, _ = g.request({"op": OP_GET_STATUS, "dev": 0}, timeout=5)
        assert reply["which"] == "mine"
    assert wait_for(lambda: len(seen) == 6)
    assert {m["which"] for m in seen} == {"future", "stale"}


def test_malformed_reply_fails_the_request(endpoint, make_host, make_guest):
    def on_message(host, peer, msg, extra):
        host.chan.send(peer, encode({"op": OP_REPLY, "seq": msg["seq"], "ok": "yes"}))

    host = make_host(endpoint, on_message)
    g = make_guest(host.endpoint)
    with pytest.raises(ChannelError, match="malformed reply"):  # not the timeout's error
        g.request({"op": OP_GET_STATUS, "dev": 0}, timeout=5)
    assert g.malformed == 1


def test_garbage_from_host_is_dropped_and_counted(endpoint, make_host, make_guest):
    def on_message(host, peer, msg, extra):
        host.chan.send(peer, [b"\xc1garbage"])
        host.chan.send(peer, encode(reply_ok(msg["seq"])))

    host = make_host(endpoint, on_message)
    g = make_guest(host.endpoint)
    assert g.request({"op": OP_GET_STATUS, "dev": 0}, timeout=5)[0]["ok"]
    assert g.malformed == 1


def test_handler_may_send_but_not_wait(endpoint, make_host, make_guest):
    def on_message(host, peer, msg, extra):
        if msg["op"] == OP_GET_STATUS:
            host.chan.send_msg(peer, {"op": OP_CALL, "dev": 0, "queue": 0, "notify": True})
            host.chan.send_msg(peer, reply_ok(msg["seq"]))

    host = make_host(endpoint, on_message)
    g = make_guest(host.endpoint)
    errors = []

    def handler(m, f):
        g.send({"op": OP_KICK, "dev": 0, "queue": 7})
        try:
            g.request({"op": OP_GET_STATUS, "dev": 0}, timeout=1)
        except ChannelError as e:
            errors.append(e)

    g.set_notification_handler(handler)
    g.request({"op": OP_GET_STATUS, "dev": 0}, timeout=5)
    assert wait_for(lambda: any(m["op"] == OP_KICK and m["queue"] == 7
                                for _, m, _ in host.received))
    assert errors and "handler" in str(errors[0])


# --------------------------------------------------------------------------- liveness
# The timing rules themselves (when a ping is due, when a wait finds the host lost) are
# unit-tested on the protocol object with a clock the test advances
# (test_channel_protocol.py). Here: that the pump carries them out over real sockets,
# without asserting any timing.

def test_host_lost_when_host_never_answers(endpoint, make_host, make_guest):
    host = make_host(endpoint, on_message=None, answer_pings=False)
    g = make_guest(host.endpoint, heartbeat_ms=HB_MS)
    with pytest.raises(HostLost, match="stopped answering") as ei:
        g.request({"op": OP_GET_STATUS, "dev": 0})  # no timeout: only HostLost ends it
    assert host.endpoint in str(ei.value)
    assert wait_for(lambda: host.pings >= 1)  # pings went out; the host ignored them


def test_host_lost_when_nobody_is_there(tmp_path, make_guest):
    for ep in (f"ipc://{tmp_path}/nobody.sock", "tcp://127.0.0.1:9"):
        g = make_guest(ep, heartbeat_ms=HB_MS)
        with pytest.raises(HostLost):
            g.request({"op": OP_GET_STATUS, "dev": 0})  # no timeout: only HostLost ends it


def _four_waits(g) -> tuple:
    """Four threads waiting on g, two for replies and two for any message -> (threads,
    the errors they ended with)."""
    outcome = []

    def wait(k):
        try:
            if k % 2:
                g.request({"op": OP_GET_STATUS, "dev": k})
            else:
                g.recv_until(lambda m: False)
        except ChannelError as e:
            outcome.append(e)

    threads = [threading.Thread(target=wait, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    return threads, outcome


def _all_lost(threads, outcome) -> None:
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert len(outcome) == 4 and all(isinstance(e, HostLost) for e in outcome)


def test_host_lost_fails_every_wait(endpoint, make_host, make_guest):
    """[CTL-HB-4]: every pending operation fails, including waits stepped aside for
    another thread (the thread that finds the host silent fails them all)."""
    host = make_host(endpoint, on_message=None, answer_pings=False)
    g = make_guest(host.endpoint, heartbeat_ms=HB_MS)
    _all_lost(*_four_waits(g))


def test_a_closed_connection_fails_every_wait_and_later_use(endpoint, make_host, make_guest):
    """[CTL-HB-6]: heartbeats disabled, so only the connection's close can end the waits."""
    host = make_host(endpoint, on_message=None)
    g = make_guest(host.endpoint, heartbeat_ms=0)
    assert g.request({"op": OP_PING}, timeout=10)[0]["ok"]  # connected, handshake done
    threads, outcome = _four_waits(g)
    assert wait_for(lambda: sum(1 for _, m, _ in host.received if m["op"] == OP_GET_STATUS) == 2)
    host.stop()  # closes its sockets: the guest's connection closes
    _all_lost(threads, outcome)
    assert all("connection closed" in str(e) for e in outcome)
    with pytest.raises(HostLost):
        g.send({"op": OP_KICK, "dev": 0, "queue": 0})
    with pytest.raises(HostLost):
        g.request({"op": OP_PING}, timeout=10)


def test_the_host_channel_reports_a_closed_connection_and_its_peer(endpoint, make_guest):
    """[CTL-HB-7]: the connection's name, as its messages carried it, once it closes."""
    host = HostChannel([endpoint])
    try:
        g = make_guest(host.endpoints[0])
        g.send({"op": OP_KICK, "dev": 0, "queue": 0})
        got = []
        assert wait_for(lambda: got.extend(host.poll(10)[0]) or got)
        name = got[0][0].connection
        creds = host.peer_credentials(name)
        if endpoint.startswith("ipc"):
            assert (creds["pid"], creds["uid"]) == (os.getpid(), os.getuid())
        else:
            assert creds["address"].startswith("127.0.0.1:")
        assert host.take_disconnected() == []
        g.close()
        ended = []
        assert wait_for(lambda: ended.extend(host.poll(10)[0] and [] or host.take_disconnected())
                        or ended)
        assert ended == [name] and host.peer_credentials(name) is None
    finally:
        host.close()


def test_a_descheduled_waiter_reads_what_arrived_before_declaring_the_host_lost(
        endpoint, make_host, make_guest, monkeypatch):
    """A waiting thread that did not run for longer than the silence window (a loaded
    machine) first reads what arrived meanwhile: the host was not silent."""
    host = make_host(endpoint, echo)
    g = make_guest(host.endpoint, heartbeat_ms=HB_MS)
    real, jump = channel_mod._monotonic, [0.0]
    send = g._send_locked

    def send_then_stall(parts, copy):
        send(parts, copy)
        assert g._sock.poll(5000)  # the reply is there ...
        jump[0] = 10.0  # ... and then this thread did not run for 10 s

    monkeypatch.setattr(channel_mod, "_monotonic", lambda: real() + jump[0])
    monkeypatch.setattr(g, "_send_locked", send_then_stall)
    reply, _ = g.request({"op": OP_GET_STATUS, "dev": 0})
    assert reply["ok"] is True


def test_a_waiter_stepped_aside_is_not_told_the_host_is_lost_by_the_clock(
        endpoint, make_host, make_guest, monkeypatch):
    """A waiter that stepped aside for a sender does not judge silence by the clock:
    only a thread that has looked at the socket can find the host silent. Here the
    host answered, but the sender held the socket past the window before anyone read."""
    held = []

    def on_message(host, peer, msg, extra):  # the waiter's reply only after the kick
        if msg["op"] == OP_GET_STATUS:
            held.append(msg["seq"])
        elif msg["op"] == OP_KICK and held:
            host.chan.send_msg(peer, reply_ok(held.pop()))

    host = make_host(endpoint, on_message)
    g = make_guest(host.endpoint)  # the default period: the host is never really silent
    real, jump = channel_mod._monotonic, [0.0]
    monkeypatch.setattr(channel_mod, "_monotonic", lambda: real() + jump[0])
    send = g._send_locked

    def send_then_stall(parts, copy):
        send(parts, copy)
        if threading.current_thread().name == "sender":
            assert g._sock.poll(5000)  # the waiter's reply is there, unread ...
            jump[0] = 100.0  # ... and the sender keeps the socket for 100 s
            # (meanwhile the waiter, stepped aside, wakes at least once: at most a
            # period, a second, after it went to sleep)
            time.sleep(1.2)

    monkeypatch.setattr(g, "_send_locked", send_then_stall)
    outcome = []

    def wait():
        try:
            outcome.append(g.request({"op": OP_GET_STATUS, "dev": 0})[0])
        except ChannelError as e:
            outcome.append(e)

    waiter = threading.Thread(target=wait)
    waiter.start()
    try:
        assert wait_for(lambda: held)  # the waiter holds the socket, waiting
        sender = threading.Thread(name="sender", target=g.send,
                                  args=({"op": OP_KICK, "dev": 0, "queue": 0},))
        sender.start()
        sender.join(timeout=10)
    finally:
        waiter.join(timeout=30)
    assert outcome and not isinstance(outcome[0], Exception) and outcome[0]["ok"] is True


def test_timeout_is_not_host_lost(endpoint, make_host, make_guest):
    host = make_host(endpoint, on_message=None)  # answers pings only
    g = make_guest(host.endpoint)
    t0 = time.monotonic()
    with pytest.raises(ChannelTimeout):
        g.request({"op": OP_GET_STATUS, "dev": 0}, timeout=0.4)
    assert time.monotonic() - t0 >= 0.4  # a timeout never ends a wait early
    with pytest.raises(TimeoutError):  # ChannelTimeout is a TimeoutError too
        g.recv_until(lambda m: False, timeout=0.05)


def test_heartbeat_thread_pings_an_idle_guest(endpoint, make_host, make_guest):
    host = make_host(endpoint)
    g = make_guest(host.endpoint, heartbeat_ms=HB_MS)
    seen = []
    g.set_notification_handler(lambda m, f: seen.append(m))
    assert wait_for(lambda: host.pings >= 3, timeout=10)
    heard = g.last_heard
    assert wait_for(lambda: g.last_heard > heard, timeout=10)  # the idle thread drains
    assert seen == []  # ping replies are absorbed, not notifications


def test_host_pings_the_guest(endpoint, make_host, make_guest):
    host = make_host(endpoint)
    g = make_guest(host.endpoint)
    g.request({"op": OP_GET_STATUS, "dev": 0}, timeout=5)
    peer = host.received[-1][0]
    host.later(0, peer, {"op": OP_PING, "seq": 424242})
    assert wait_for(lambda: any(m["op"] == OP_REPLY and m["seq"] == 424242
                                for _, m, _ in host.received))


def test_heartbeat_disabled(endpoint, make_host, make_guest):
    host = make_host(endpoint)
    g = make_guest(host.endpoint, heartbeat_ms=0)
    assert not heartbeat_threads()
    assert g.request({"op": OP_GET_STATUS, "dev": 0}, timeout=5)[0]["ok"]
    time.sleep(0.1)
    assert host.pings == 0


def test_heartbeat_period_can_be_set_later(endpoint, make_host, make_guest):
    """The host announces its period in the hello reply; the guest adopts it."""
    host = make_host(endpoint)
    g = make_guest(host.endpoint, heartbeat_ms=0)
    assert g.heartbeat_ms == 0 and not heartbeat_threads()
    g.heartbeat_ms = HB_MS
    assert g.heartbeat_ms == HB_MS and len(heartbeat_threads()) == 1
    assert wait_for(lambda: host.pings >= 3, timeout=10)
    g.heartbeat_ms = 0  # disabled again: the thread stays but goes quiet
    # a ping already under way is sent before this request, so answered before it
    assert g.request({"op": OP_GET_STATUS, "dev": 0}, timeout=5)[0]["ok"]
    n = host.pings
    time.sleep(4 * HB_MS / 1000)
    assert host.pings == n
    g.heartbeat_ms = HB_MS
    assert len(heartbeat_threads()) == 1  # not a second thread
    assert wait_for(lambda: host.pings > n, timeout=10)


# --------------------------------------------------------------------------- threads

def test_concurrent_requests_from_many_threads(endpoint, make_host, make_guest):
    host = make_host(endpoint)
    g = make_guest(host.endpoint)
    results, errors = {}, []

    def worker(k):
        try:
            for i in range(40):
                reply, frames = g.request({"op": OP_GET_STATUS, "dev": k * 1000 + i},
                                          [bytes([k]) * 8], timeout=5)
                assert reply["got"]["dev"] == k * 1000 + i and bytes(frames[0]) == bytes([k]) * 8
            results[k] = True
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    def kicker():
        for _ in range(40):
            g.send({"op": OP_KICK, "dev": 0, "queue": 0})

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    threads.append(threading.Thread(target=kicker))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not errors and len(results) == 4
    assert wait_for(lambda: host.ops().count(OP_KICK) == 40)


def test_every_request_goes_out_beside_long_waits_with_heartbeats_disabled(
        endpoint, make_host, make_guest):
    """Without heartbeats a holder of the socket polls without a timeout: a thread that
    takes over the socket must still let the next one in (the Waker signals once until
    cleared, so the wake of a third thread can be taken by the holder it replaced)."""
    host = make_host(endpoint, on_message=None)  # requests stay unanswered
    g = make_guest(host.endpoint, heartbeat_ms=0)
    assert g.request({"op": OP_PING}, timeout=10)[0]["ok"]

    def wait(k):
        with pytest.raises(ChannelTimeout):
            if k % 2:
                g.request({"op": OP_GET_STATUS, "dev": k}, timeout=8)
            else:
                g.recv_until(lambda m: False, timeout=8)

    threads = [threading.Thread(target=wait, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    try:
        assert wait_for(lambda: sorted(m["dev"] for _, m, _ in host.received
                                       if m["op"] == OP_GET_STATUS) == [1, 3])
    finally:
        for t in threads:
            t.join(timeout=30)


def test_sender_is_not_blocked_by_a_long_wait(endpoint, make_host, make_guest):
    held = []

    def on_message(host, peer, msg, extra):  # the waiter's reply only after the kick
        if msg["op"] == OP_GET_STATUS:
            held.append(msg["seq"])
        elif msg["op"] == OP_KICK and held:
            host.chan.send_msg(peer, reply_ok(held.pop(), after_kick=True))

    host = make_host(endpoint, on_message)
    g = make_guest(host.endpoint, heartbeat_ms=1000)
    outcome = []

    def wait():
        try:
            outcome.append(g.request({"op": OP_GET_STATUS, "dev": 0}, timeout=30)[0])
        except ChannelError as e:
            outcome.append(e)

    waiter = threading.Thread(target=wait)
    waiter.start()
    try:
        # the waiter sent its request: it holds the socket, waiting for the reply
        assert wait_for(lambda: held)
        # a send that waited for the waiter's wait to end would never let the reply come
        g.send({"op": OP_KICK, "dev": 0, "queue": 3})
    finally:
        waiter.join(timeout=40)
    assert outcome and not isinstance(outcome[0], Exception) and outcome[0]["after_kick"]


def test_close_wakes_a_waiter(endpoint, make_host, make_guest):
    host = make_host(endpoint, on_message=None)
    g = make_guest(host.endpoint, heartbeat_ms=1000)
    errors = []

    def wait():
        try:
            g.request({"op": OP_GET_STATUS, "dev": 0}, timeout=30)  # never answered
        except ChannelError as e:
            errors.append(e)

    t = threading.Thread(target=wait)
    t.start()
    assert wait_for(lambda: OP_GET_STATUS in host.ops())  # the waiter is waiting
    g.close()
    t.join(timeout=10)  # it would otherwise wait 30 s
    assert not t.is_alive()
    assert errors and "closed" in str(errors[0])


# --------------------------------------------------------------------------- close, bind

def test_close_stops_heartbeat_and_removes_ipc_file(tmp_path, make_guest):
    path = tmp_path / "c.sock"
    host = HostChannel([f"ipc://{path}"])
    try:
        assert path.exists()
        g = GuestChannel(f"ipc://{path}", heartbeat_ms=HB_MS)
        assert heartbeat_threads()
        g.close()
        g.close()  # idempotent
        assert not heartbeat_threads()
        with pytest.raises(ChannelError, match="closed"):
            g.request({"op": OP_GET_STATUS, "dev": 0}, timeout=1)
        with pytest.raises(ChannelError, match="closed"):
            g.send({"op": OP_KICK, "dev": 0, "queue": 0})
    finally:
        host.close()
    assert not path.exists()
    host.close()  # idempotent


def test_tcp_random_port_is_reported():
    host = HostChannel(["tcp://127.0.0.1:0", "tcp://127.0.0.1:0"])
    try:
        for ep in host.endpoints:
            assert ep.startswith("tcp://127.0.0.1:") and int(ep.rsplit(":", 1)[1]) > 0
        assert host.endpoints[0] != host.endpoints[1]
    finally:
        host.close()


def test_two_endpoints_peers_are_told_apart(tmp_path, make_guest):
    host = FakeHost([f"ipc://{tmp_path}/a.sock", "tcp://127.0.0.1:0"], echo)
    try:
        host.start()
        g1 = make_guest(host.chan.endpoints[0])
        g2 = make_guest(host.chan.endpoints[1])
        g1.request({"op": OP_GET_STATUS, "dev": 0}, timeout=5)
        g2.request({"op": OP_GET_STATUS, "dev": 0}, timeout=5)
        peers = {p for p, m, _ in host.received if m["op"] == OP_GET_STATUS}
        assert {p[0] for p in peers} == {0, 1}
    finally:
        host.stop()


def test_live_ipc_endpoint_is_not_stolen(tmp_path):
    ep = f"ipc://{tmp_path}/live.sock"
    first = HostChannel([ep])
    try:
        with pytest.raises(ChannelError, match="another process"):
            HostChannel([ep])
        assert os.path.exists(f"{tmp_path}/live.sock")
    finally:
        first.close()


def test_stale_ipc_file_is_replaced(tmp_path, make_guest):
    path = str(tmp_path / "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()  # leaves the file, nobody listening
    assert os.path.exists(path)
    host = FakeHost(f"ipc://{path}", echo)
    host.start()
    try:
        g = make_guest(f"ipc://{path}")
        assert g.request({"op": OP_GET_STATUS, "dev": 0}, timeout=5)[0]["ok"]
    finally:
        host.stop()
    assert not os.path.exists(path)


def test_ipc_path_that_is_not_a_socket_is_refused(tmp_path):
    p = tmp_path / "file.sock"
    p.write_text("precious")
    with pytest.raises(ChannelError, match="not a socket"):
        HostChannel([f"ipc://{p}"])
    assert p.read_text() == "precious"


def test_bad_endpoints():
    with pytest.raises(ChannelError):
        HostChannel(["bogus://x"])
    with pytest.raises(ChannelError):
        GuestChannel("bogus://x")
    assert not heartbeat_threads()


# --------------------------------------------------------------------------- host side

def test_host_send_to_gone_peer_is_dropped_not_raised(tmp_path):
    host = HostChannel([f"ipc://{tmp_path}/g.sock"])
    try:
        assert host.send((0, b"\x00nobody"), encode(reply_ok(1))) is False
        assert host.send_msg((0, b"\x00nobody"), reply_ok(2)) is False
        assert host.dropped_sends == 2
        with pytest.raises(ValueError):
            host.send((0, b"\x00nobody"), [])
    finally:
        host.close()


def test_host_recv_is_batched_and_raw(tmp_path, make_guest):
    host = HostChannel([f"ipc://{tmp_path}/b.sock"], max_batch=16)
    try:
        g = make_guest(host.endpoints[0], heartbeat_ms=0)
        for i in range(40):
            g.send({"op": OP_KICK, "dev": 0, "queue": i}, [b"p"])
        got = []
        end = time.monotonic() + 5
        while len(got) < 40 and time.monotonic() < end:
            batch = host.recv(100)
            assert len(batch) <= 16
            got += batch
        assert len(got) == 40
        peer, frames = got[0]
        assert peer[0] == 0 and isinstance(peer[1], bytes)
        assert isinstance(frames[0], bytes) and bytes(frames[1]) == b"p"
        assert [decode(f)[0]["queue"] for _, f in got] == list(range(40))
    finally:
        host.close()


def test_host_poll_wakes_on_extra_fd(tmp_path):
    host = HostChannel([f"ipc://{tmp_path}/w.sock"])
    waker = Waker()
    try:
        msgs, ready = host.poll(0, [waker])
        assert msgs == [] and ready == []
        threading.Timer(0.05, waker.wake).start()
        msgs, ready = host.poll(60_000, [waker])
        assert ready == [waker]  # woken, not timed out
        waker.clear()
        assert host.poll(0, [waker]) == ([], [])
        # raw fds work too
        r, w = os.pipe()
        try:
            os.write(w, b"x")
            assert host.poll(100, [r])[1] == [r]
        finally:
            os.close(r)
            os.close(w)
    finally:
        waker.close()
        host.close()


def _readable(fd) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


@pytest.mark.parametrize("racing_read", [0, 1])
def test_a_wake_racing_with_clear_leaves_the_waker_able_to_wake(monkeypatch, racing_read):
    """A wake from another thread that lands while the poller clears (here: at the
    clear's first or second read of the pipe) must not leave the Waker marked pending
    over an empty pipe: every later wake would then be skipped, and a thread asking a
    socket holder to step aside would wait for the holder's poll to time out."""
    waker = Waker()
    real_read = os.read
    reads = []

    def read_racing(fd, n):
        if len(reads) == racing_read:
            waker.wake()  # another thread's wake, interleaved with clear()
        reads.append(fd)
        return real_read(fd, n)

    try:
        waker.wake()
        monkeypatch.setattr(channel_mod.os, "read", read_racing)
        waker.clear()
        monkeypatch.undo()
        assert len(reads) > racing_read
        # whatever the interleaving, the Waker's flag and its pipe agree ...
        assert waker._pending == _readable(waker.fileno())
        # ... and the next wake wakes a poll
        waker.clear()
        waker.wake()
        assert _readable(waker.fileno())
    finally:
        waker.close()


def test_closed_host_channel_refuses_poll(tmp_path):
    host = HostChannel([f"ipc://{tmp_path}/x.sock"])
    host.close()
    with pytest.raises(ChannelError):
        host.poll(0)


# --------------------------------------------------------------------------- default endpoint

def test_default_endpoint_prefers_xdg_runtime_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert default_endpoint() == f"ipc://{tmp_path}/{DEFAULT_ENDPOINT_NAME}"


def test_default_endpoint_falls_back_to_private_tmp_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(channel_mod.tempfile, "gettempdir", lambda: str(tmp_path))
    d = tmp_path / f"pvgpu-{os.getuid()}"
    assert default_endpoint() == f"ipc://{d}/{DEFAULT_ENDPOINT_NAME}"
    assert d.is_dir() and (d.stat().st_mode & 0o777) == 0o700
    d.chmod(0o755)  # loosened by someone: tightened again
    default_endpoint()
    assert (d.stat().st_mode & 0o777) == 0o700


def test_default_endpoint_not_writable_xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    monkeypatch.setattr(channel_mod.tempfile, "gettempdir", lambda: str(tmp_path))
    assert default_endpoint().startswith(f"ipc://{tmp_path}/pvgpu-")


def test_default_endpoint_is_bindable(tmp_path, monkeypatch, make_guest):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    host = FakeHost(default_endpoint(), echo)
    host.start()
    try:
        g = make_guest(default_endpoint())
        assert g.request({"op": OP_GET_STATUS, "dev": 0}, timeout=5)[0]["ok"]
    finally:
        host.stop()



# ------------------------------------------------------------------ connections (CTL-ENDPOINT-4)

def _raw_request(endpoint, identity, seq, timeout_ms=2000):
    """One request on a fresh DEALER connection presenting `identity`; -> its reply or None."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    s.routing_id = identity
    try:
        s.connect(endpoint)
        s.send(encode({"op": OP_GET_STATUS, "dev": 0, "seq": seq})[0])
        if not s.poll(timeout_ms):
            return None
        return decode(s.recv_multipart())[0]
    finally:
        s.close(linger=0)
        ctx.term()


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_connections_are_named_by_the_host_not_by_their_identity(tmp_path, transport):
    ep = f"ipc://{tmp_path}/c.sock" if transport == "ipc" else "tcp://127.0.0.1:0"
    host = FakeHost(ep, echo)
    host.start()
    try:
        identity = b"\x00same-identity"  # even one shaped like libzmq's own
        got = []
        # One connection after the other with the same identity. The host learns of a
        # close asynchronously; a connection made before that is held back by ZeroMQ and
        # its first message lost, so only an answered first request counts.
        for seq in range(1, 40):
            if _raw_request(host.endpoint, identity, seq) is not None:
                got.append(seq)
                if len(got) == 2:
                    break
        assert len(got) == 2
        peers = [p for p, m, _ in host.received if m.get("seq") in got]
        assert [p.identity for p in peers] == [identity, identity]
        assert peers[0].route == peers[1].route
        assert peers[0].connection != peers[1].connection  # never reused
        assert host.chan.connections_accepted >= 2
    finally:
        host.stop()


def test_messages_of_one_connection_carry_its_name(tmp_path, make_guest):
    host = FakeHost(f"ipc://{tmp_path}/n.sock", echo)
    host.start()
    try:
        g1, g2 = make_guest(host.endpoint), make_guest(host.endpoint)
        for g in (g1, g2, g1, g2):
            g.request({"op": OP_GET_STATUS, "dev": 0}, timeout=5)
        peers = [p for p, m, _ in host.received if m["op"] == OP_GET_STATUS]
        assert len({p.connection for p in peers}) == 2 and len(set(peers)) == 2
        # the guest's identity is 16 bytes nobody can guess (CTL-ENDPOINT-5)
        assert all(len(p.identity) == 16 and p.identity[0] != 0 for p in peers)
    finally:
        host.stop()


def test_host_channels_in_one_process_each_serve_their_own_connections(tmp_path, make_guest):
    a = FakeHost(f"ipc://{tmp_path}/a.sock", echo)
    b = FakeHost(f"ipc://{tmp_path}/b.sock", echo)
    a.start()
    b.start()
    try:
        for h in (a, b):
            assert make_guest(h.endpoint).request({"op": OP_GET_STATUS, "dev": 0}, timeout=5)[0]["ok"]
    finally:
        a.stop()
        b.stop()
