"""The driver's end of the control channel without sockets or threads
(transport/channel_protocol.py; spec/pvgpu.md §2.11 and §2.12).

Every test drives one ChannelProtocol with a clock it advances itself: the timing rules
(pings after a silent period, HostLost after HEARTBEAT_MISSES periods, pings while
waiting) are checked exactly, never by sleeping.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pvgpu.spec.wire import (
    CTL_ERR_MALFORMED,
    DEFAULT_HEARTBEAT_MS,
    HEARTBEAT_MISSES,
    OP_CALL,
    OP_CONFIG_CHANGED,
    OP_GET_STATUS,
    OP_KICK,
    OP_PING,
    OP_REPLY,
    OP_SHUTDOWN,
)
from pvgpu.transport.channel_protocol import (
    ChannelProtocol,
    ConnectionLost,
    HostSilent,
    Malformed,
    Notification,
    Reply,
    RequestFailed,
    Transmit,
)
from pvgpu.transport.codec import decode, encode, reply_error, reply_ok

P = 0.1  # heartbeat period (s) of these tests
WINDOW = P * HEARTBEAT_MISSES


def proto(now=0.0, heartbeat_ms=int(P * 1000)):
    return ChannelProtocol(heartbeat_ms, now)


def msg_of(event):
    """The message a Transmit carries."""
    assert isinstance(event, Transmit)
    return decode(event.parts)[0]


def pings(events):
    return [msg_of(e) for e in events if isinstance(e, Transmit) and msg_of(e)["op"] == OP_PING]


def silent(events):
    return [e for e in events if isinstance(e, HostSilent)]


def host_reply(seq, **fields):
    return encode(reply_ok(seq, **fields))


def answer_ping(p, events, now):
    """The host answers every ping in events at now -> what the protocol made of it."""
    out = []
    for m in pings(events):
        out += p.receive(host_reply(m["seq"]), now)
    return out


# --------------------------------------------------------------------------- requests

def test_request_gets_a_fresh_seq_and_its_reply_goes_to_its_token():
    p = proto()
    a, b = object(), object()
    sa, parts_a = p.send_request({"op": OP_GET_STATUS, "dev": 0}, [b"bulk"], a)
    sb, _ = p.send_request({"op": OP_GET_STATUS, "dev": 1}, (), b)
    assert sb > sa and p.next_seq() > sb
    sent, extra = decode(parts_a)
    assert sent == {"op": OP_GET_STATUS, "dev": 0, "seq": sa} and bytes(extra[0]) == b"bulk"
    # replies in any order, each to its own token, frames as they came
    [rb] = p.receive(host_reply(sb, dev=1), 1.0)
    [ra] = p.receive(encode(reply_ok(sa), [b"data"]), 1.0)
    assert rb == Reply(b, reply_ok(sb, dev=1), [])
    assert ra.token is a and ra.msg["seq"] == sa and [bytes(f) for f in ra.frames] == [b"data"]


def test_an_error_reply_is_a_reply():
    p = proto()
    tok = object()
    seq, _ = p.send_request({"op": "frobnicate"}, (), tok)
    [r] = p.receive(encode(reply_error(seq, "unknown_op", "no such op")), 0.5)
    assert isinstance(r, Reply) and r.token is tok and r.msg["ok"] is False


def test_stale_unknown_and_cancelled_replies_are_notifications():
    p = proto()
    tok = object()
    seq, _ = p.send_request({"op": OP_GET_STATUS, "dev": 0}, (), tok)
    assert p.receive(host_reply(seq + 1000), 0.1) == [Notification(reply_ok(seq + 1000), [])]
    p.cancel_request(seq)  # its waiter gave up
    assert p.receive(host_reply(seq), 0.2) == [Notification(reply_ok(seq), [])]
    # a reply is delivered once: a duplicate is stale
    seq2, _ = p.send_request({"op": OP_GET_STATUS, "dev": 0}, (), tok)
    assert isinstance(p.receive(host_reply(seq2), 0.3)[0], Reply)
    assert isinstance(p.receive(host_reply(seq2), 0.3)[0], Notification)


def test_notifications_pass_through():
    p = proto()
    call = {"op": OP_CALL, "dev": 0, "queue": 0, "notify": True, "patches": [[4096, 0]]}
    [n] = p.receive(encode(call, [b"used"]), 0.1)
    assert isinstance(n, Notification) and n.msg == call and bytes(n.frames[0]) == b"used"
    assert p.receive(encode({"op": OP_CONFIG_CHANGED, "dev": 1}), 0.2) == [
        Notification({"op": OP_CONFIG_CHANGED, "dev": 1}, [])]


def test_a_malformed_reply_fails_its_request_and_garbage_is_dropped():
    p = proto()
    tok = object()
    seq, _ = p.send_request({"op": OP_GET_STATUS, "dev": 0}, (), tok)
    [f] = p.receive(encode({"op": OP_REPLY, "seq": seq, "ok": "yes"}), 0.1)
    assert isinstance(f, RequestFailed) and f.token is tok and f.error.error == CTL_ERR_MALFORMED
    [g] = p.receive([b"\xc1garbage"], 0.2)
    assert isinstance(g, Malformed)
    # a malformed reply naming no pending request is dropped too
    [h] = p.receive(encode({"op": OP_REPLY, "seq": seq, "ok": "yes"}), 0.3)
    assert isinstance(h, Malformed)
    assert p.malformed == 3
    assert p.last_heard == 0.3  # undecodable, but the host is alive


def test_the_hosts_ping_is_answered_at_once():
    p = proto(heartbeat_ms=0)  # answered with heartbeats disabled as well
    [t] = p.receive(encode({"op": OP_PING, "seq": 424242}), 2.0)
    assert msg_of(t) == reply_ok(424242)
    assert p.last_sent == 2.0


# --------------------------------------------------------------------------- connection

def test_a_close_after_the_handshake_loses_the_host_for_every_wait_and_request():
    """[CTL-HB-6]: long before any heartbeat window, whatever the clock says."""
    p = proto()
    req, waiter, idle = object(), object(), object()
    p.handshake_succeeded()
    p.send_request({"op": OP_GET_STATUS, "dev": 0}, (), req)
    p.begin_wait(req, 1.0)
    p.begin_wait(waiter, 1.0)
    p.send_request({"op": OP_GET_STATUS, "dev": 1}, (), idle)  # sent, not waited for yet
    events = p.disconnected()
    assert {e.token for e in events} == {req, waiter, idle}
    assert all(isinstance(e, ConnectionLost) and "closed" in e.reason for e in events)
    assert p.lost is not None
    # once: a later close (the DEALER reconnected and lost that too) reports nothing
    assert p.disconnected() == []
    # and the lost session has no timers: no pings, no deadline
    assert p.tick(100.0) == [] and p.next_deadline(100.0) is None


def test_a_reply_received_before_the_close_is_still_the_reply():
    p = proto()
    tok = object()
    p.handshake_succeeded()
    seq, _ = p.send_request({"op": OP_GET_STATUS, "dev": 0}, (), tok)
    p.begin_wait(tok, 0.0)
    [r] = p.receive(host_reply(seq, status=7), 0.1)  # the pump hands over what came first
    assert isinstance(r, Reply)
    p.end_wait(tok)
    assert p.disconnected() == []  # nothing was pending
    assert p.lost is not None


def test_a_close_before_any_handshake_loses_nothing():
    """The host is not up yet, or refused the handshake: the DEALER retries."""
    p = proto()
    tok = object()
    p.send_request({"op": OP_GET_STATUS, "dev": 0}, (), tok)
    p.begin_wait(tok, 0.0)
    assert p.disconnected() == [] and p.lost is None
    p.handshake_succeeded()
    assert [e.token for e in p.disconnected()] == [tok]


def test_the_hosts_shutdown_notice_loses_it_at_once_with_its_reason():
    """[CTL-BYE-3]: no handshake event needed, no heartbeat window."""
    p = proto()
    tok, waiter = object(), object()
    p.send_request({"op": OP_GET_STATUS, "dev": 0}, (), tok)
    p.begin_wait(tok, 0.0)
    p.begin_wait(waiter, 0.0)
    events = p.receive(encode({"op": OP_SHUTDOWN, "reason": "received SIGTERM"}), 0.01)
    assert {e.token for e in events} == {tok, waiter}
    assert all(isinstance(e, ConnectionLost) for e in events)
    assert events[0].reason == "host shut down (received SIGTERM)" == p.lost
    p.handshake_succeeded()
    assert p.disconnected() == []  # the close that follows adds nothing


# --------------------------------------------------------------------------- pings

def test_idle_pings_once_per_silent_period():
    p = proto(now=0.0)
    assert p.next_deadline(0.0) == pytest.approx(P)
    assert p.tick(P * 0.99) == []
    [ping] = pings(p.tick(P))  # [CTL-HB-2] silent for P: a ping
    assert p.next_deadline(P) == pytest.approx(2 * P)
    assert p.tick(P * 1.5) == []  # one per period, not one per tick
    # its reply is absorbed, not a notification, and counts as hearing the host
    assert p.receive(host_reply(ping["seq"]), 1.1 * P) == []
    assert p.last_heard == pytest.approx(1.1 * P)
    assert len(pings(p.tick(2 * P))) == 1


def test_sending_postpones_the_ping():
    p = proto(now=0.0)
    t = 0.0
    for _ in range(20):  # busy: something sent every 0.9 P
        t += 0.9 * P
        assert pings(p.tick(t)) == []  # [CTL-HB-2] whatever is sent counts as the message of P
        p.sent(t)
    assert p.next_deadline(t) == pytest.approx(t + P)
    assert len(pings(p.tick(t + P))) == 1


def test_no_host_lost_without_a_wait():
    p = proto(now=0.0)
    p.input_empty(100.0)
    events = p.tick(100.0)
    assert silent(events) == [] and len(pings(events)) == 1


def test_ping_seqs_of_a_host_that_never_answers_stay_bounded():
    p = proto(now=0.0)
    for k in range(1, 1000):
        p.tick(k * P)
    assert len(p._pings) <= 64


# --------------------------------------------------------------------------- liveness

def test_a_wait_fails_after_heartbeat_misses_silent_periods_and_pings_meanwhile():
    p = proto(now=0.0)
    w = object()
    p.begin_wait(w, 0.0)
    sent_pings = 0
    t = 0.0
    while True:  # the pump: tick, sleep until next_deadline, find nothing, repeat
        events = p.tick(t)
        sent_pings += len(pings(events))
        if silent(events):
            break
        t = p.next_deadline(t)
        p.input_empty(t)
        assert t <= WINDOW + 1e-9
    [lost] = silent(events)
    assert lost.token is w and lost.silent == pytest.approx(WINDOW) and t == pytest.approx(WINDOW)
    # the waiter pinged every period, giving the host its chance to answer
    assert sent_pings == HEARTBEAT_MISSES
    assert silent(p.tick(t + 1)) == []  # reported once; the wait is over


def test_not_lost_one_instant_before_the_window():
    p = proto(now=0.0)
    w = object()
    p.begin_wait(w, 0.0)
    p.input_empty(WINDOW * 0.999)
    assert silent(p.tick(WINDOW * 0.999)) == []
    p.input_empty(WINDOW)
    assert [e.token for e in silent(p.tick(WINDOW))] == [w]


def test_silence_counts_from_the_later_of_last_heard_and_the_start_of_the_wait():
    p = proto(now=0.0)
    early, late = object(), object()
    p.begin_wait(early, 0.0)
    p.receive(encode({"op": OP_CALL, "dev": 0, "queue": 0, "notify": True}), 1.0)  # any message
    p.begin_wait(late, 1.2)
    p.input_empty(1.0 + WINDOW)
    assert [e.token for e in silent(p.tick(1.0 + WINDOW))] == [early]
    assert p.next_deadline(1.0 + WINDOW) <= 1.2 + WINDOW
    p.input_empty(1.2 + WINDOW)
    assert [e.token for e in silent(p.tick(1.2 + WINDOW))] == [late]


def test_proven_silence_is_silence_seen_not_time_passed():
    p = proto(now=0.0)
    p.receive(encode({"op": OP_CALL, "dev": 0, "queue": 0, "notify": True}), 1.0)
    assert p.proven_silence == 0.0  # nothing looked at since the message
    p.input_empty(0.5)  # a look from before the message proves nothing
    assert p.proven_silence == 0.0
    p.input_empty(1.0 + WINDOW)
    assert p.proven_silence == pytest.approx(WINDOW)
    p.receive(encode({"op": OP_CALL, "dev": 0, "queue": 0, "notify": True}), 1.0 + 2 * WINDOW)
    assert p.proven_silence == 0.0


def test_silence_since_a_wait_counts_from_the_later_of_last_heard_and_its_start():
    """A driver that only kicked for a long time heard nothing because it asked nothing:
    that silence is not the host's, only what a wait itself sees is."""
    p = proto(now=0.0)
    p.receive(encode({"op": OP_CALL, "dev": 0, "queue": 0, "notify": True}), 1.0)
    p.input_empty(1.0 + 10 * WINDOW)
    assert p.proven_silence == pytest.approx(10 * WINDOW)
    assert p.silence_since(1.0 + 10 * WINDOW - 0.01) == pytest.approx(0.01)
    assert p.silence_since(0.5) == pytest.approx(10 * WINDOW)  # heard since the start
    assert p.silence_since(1.0 + 11 * WINDOW) == 0.0  # nothing looked at since the start


def test_answered_pings_keep_a_slow_request_alive():
    """Liveness is 'heard anything', not 'got my reply'."""
    p = proto(now=0.0)
    w = object()
    seq, _ = p.send_request({"op": OP_GET_STATUS, "dev": 0}, (), w)
    p.sent(0.0)
    p.begin_wait(w, 0.0)
    t = 0.0
    while t < 10 * WINDOW:
        events = p.tick(t)
        assert silent(events) == []
        assert answer_ping(p, events, t) == []
        t = p.next_deadline(t)
        p.input_empty(t)
    [r] = p.receive(host_reply(seq, slow=True), t)
    assert r.token is w and r.msg["slow"] is True


def test_a_descheduled_waiter_reads_what_arrived_before_the_host_is_lost():
    """Silence is proven only by finding the input empty: a waiter that did not run for
    longer than the window (a loaded machine) is not told the host is lost by the clock."""
    p = proto(now=0.0)
    w = object()
    seq, _ = p.send_request({"op": OP_GET_STATUS, "dev": 0}, (), w)
    p.begin_wait(w, 0.0)
    p.input_empty(0.0)
    assert silent(p.tick(10.0)) == []  # back after 10 s, not yet looked at the socket
    [r] = p.receive(host_reply(seq), 10.0)  # the reply had been waiting there
    assert r.token is w


def test_an_ended_wait_is_not_reported():
    p = proto(now=0.0)
    w = object()
    p.begin_wait(w, 0.0)
    p.end_wait(w)
    p.input_empty(10 * WINDOW)
    assert silent(p.tick(10 * WINDOW)) == []
    p.end_wait(w)  # ending twice is harmless


def test_next_deadline_is_the_earlier_of_the_ping_and_the_window():
    p = proto(now=0.0)
    w = object()
    p.begin_wait(w, 0.0)
    assert p.next_deadline(0.0) == pytest.approx(P)
    p.sent(5.0)  # sending does not move the silence window
    p.receive(encode({"op": OP_CONFIG_CHANGED, "dev": 0}), 0.05)
    assert p.next_deadline(5.0) == pytest.approx(0.05 + WINDOW)


def test_heartbeats_disabled_and_set_later():
    p = proto(now=0.0, heartbeat_ms=0)
    w = object()
    p.begin_wait(w, 0.0)
    p.input_empty(1000.0)
    assert p.next_deadline(1000.0) is None and p.tick(1000.0) == []
    assert p.silence == pytest.approx(DEFAULT_HEARTBEAT_MS / 1000 * HEARTBEAT_MISSES)
    p.heartbeat_ms = int(P * 1000)  # the period the host announced in its hello reply
    assert p.heartbeat_ms == int(P * 1000) and p.silence == pytest.approx(WINDOW)
    events = p.tick(1000.0)
    assert len(pings(events)) == 1 and [e.token for e in silent(events)] == [w]
    p.heartbeat_ms = -5
    assert p.period is None and p.tick(2000.0) == []


def test_notification_send_is_plain_encoding():
    p = proto()
    parts = p.send({"op": OP_KICK, "dev": 0, "queue": 3}, [b"x"])
    assert decode(parts)[0] == {"op": OP_KICK, "dev": 0, "queue": 3}
    assert p.last_sent == 0.0  # nothing is sent until the pump says so


# --------------------------------------------------------------------------- properties

_steps = st.lists(st.one_of(
    st.tuples(st.just("advance"), st.floats(0, 3 * P)),
    st.tuples(st.just("hear"), st.none()),
    st.tuples(st.just("look"), st.none()),
    st.tuples(st.just("send"), st.none()),
    st.tuples(st.just("wait"), st.none()),
    st.tuples(st.just("tick"), st.none()),
), max_size=60)


@settings(max_examples=200, deadline=None)
@given(_steps)
def test_liveness_and_ping_rules_hold_for_any_schedule(steps):
    """Over any interleaving: a wait is reported lost only when the input was found
    empty a full window after both its start and the last message; a ping goes out
    only after a full period without sending, and tick never lets one be overdue."""
    p = proto(now=0.0)
    t, looked, heard, last_sent = 0.0, 0.0, 0.0, 0.0
    waits = {}
    for kind, arg in steps:
        if kind == "advance":
            t += arg
        elif kind == "hear":
            p.receive(encode({"op": OP_CALL, "dev": 0, "queue": 0, "notify": False}), t)
            heard = t
        elif kind == "look":
            p.input_empty(t)
            looked = t
        elif kind == "send":
            p.sent(t)
            last_sent = t
        elif kind == "wait":
            tok = object()
            p.begin_wait(tok, t)
            waits[tok] = t
        else:
            events = p.tick(t)
            for e in silent(events):
                start = waits.pop(e.token)
                assert looked >= max(heard, start) + WINDOW
            for tok, start in waits.items():  # the ones not reported are not overdue
                assert looked < max(heard, start) + WINDOW
            if pings(events):
                assert t >= last_sent + P
                last_sent = t
            assert t < last_sent + P
