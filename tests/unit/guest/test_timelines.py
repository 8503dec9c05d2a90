"""The driver's ledger of clean timelines (guest/frontend/timelines.py): a timeline is clean
when every work submitted on it is covered by a sync point of it -- or a CTX_SYNC of its
context -- submitted no earlier and answered OK (spec §7: [FENCE-SIGNAL-1],
[FENCE-ERROR-2], [FENCE-ERROR-4], [FENCE-EVENT-4]); error answers and requests never
answered count as nothing; CTX_DESTROY and a reset forget. Each rule alone, then random
runs of submissions, answers and resets against a reference model that keeps every
request and applies the definition."""

from hypothesis import given, settings, strategies as st

from pvgpu.guest.frontend.timelines import TYPES, TimelineLedger
from pvgpu.spec import wire

F = wire.FLAG_FENCE
OK, ERR = wire.RESP_OK_NODATA, wire.RESP_ERR_PAGE_FAULT
H2D, D2H, D2D = wire.CMD_COPY_H2D, wire.CMD_COPY_D2H, wire.CMD_COPY_D2D
LAUNCH, BATCH, CODE = wire.CMD_LAUNCH, wire.CMD_LAUNCH_BATCH, wire.CMD_LAUNCH_CODE
NOP, WAIT, CTX_SYNC = wire.CMD_NOP, wire.CMD_EVENT_WAIT, wire.CMD_CTX_SYNC
DESTROY = wire.CMD_CTX_DESTROY


def send(ledger, type_, flags=0, ctx=1, ring=0):
    """What the driver does for each request it submits: the ledger's token, or None."""
    if type_ in TYPES or flags & F:
        return ledger.submitted(type_, flags, ctx, ring)
    return None


def answer(ledger, token, resp=OK):
    if token is not None:
        ledger.answered(token, resp)


def test_an_unseen_timeline_is_clean():
    assert TimelineLedger().clean(1, 0)


def test_each_kind_of_work_makes_its_timeline_dirty_until_a_sync_point_answers_ok():
    for work in (H2D, D2H, D2D, LAUNCH, BATCH, CODE, WAIT):
        ledger = TimelineLedger()
        send(ledger, work, ctx=1, ring=2)
        assert not ledger.clean(1, 2), work
        assert ledger.clean(1, 0) and ledger.clean(2, 2)  # other timelines: untouched
        tok = send(ledger, NOP, F, ctx=1, ring=2)
        assert not ledger.clean(1, 2)  # sent, not answered
        answer(ledger, tok)
        assert ledger.clean(1, 2), work


def test_the_sync_points_of_a_timeline():
    # fenced NOP, COPY_D2D and launches; COPY_H2D and COPY_D2H with or without FLAG_FENCE
    for sync, flags in ((NOP, F), (D2D, F), (LAUNCH, F), (BATCH, F), (CODE, F),
                        (H2D, 0), (H2D, F), (D2H, 0), (D2H, F)):
        ledger = TimelineLedger()
        send(ledger, CODE)
        answer(ledger, send(ledger, sync, flags))
        assert ledger.clean(1, 0), (sync, flags)


def test_unfenced_work_is_no_sync_point_and_an_unfenced_nop_is_nothing():
    for kind in (D2D, LAUNCH, BATCH, CODE, WAIT):
        ledger = TimelineLedger()
        send(ledger, BATCH)
        tok = send(ledger, kind)
        assert tok is None
        assert not ledger.clean(1, 0), kind
    ledger = TimelineLedger()
    assert send(ledger, NOP) is None  # the driver does not even tell the ledger
    assert ledger.seq == 0 and ledger.clean(1, 0)
    assert ledger.submitted(NOP, 0, 1, 0) is None and ledger.clean(1, 0)


def test_a_fenced_nop_is_no_work():
    ledger = TimelineLedger()
    send(ledger, NOP, F)  # never answered
    assert ledger.clean(1, 0)


def test_ctx_sync_is_a_sync_point_of_every_timeline_of_its_context_only():
    ledger = TimelineLedger()
    for ring in (0, 1, 5):
        send(ledger, BATCH, ctx=1, ring=ring)
    send(ledger, CODE, ctx=2)
    tok = send(ledger, CTX_SYNC, ctx=1, ring=7)  # its ring_idx is only echoed
    assert not ledger.clean(1, 0)
    answer(ledger, tok)
    assert all(ledger.clean(1, r) for r in (0, 1, 5))
    assert not ledger.clean(2, 0)  # another context's


def test_a_sync_point_covers_only_what_was_submitted_before_it():
    ledger = TimelineLedger()
    send(ledger, BATCH)
    nop = send(ledger, NOP, F)
    ctx_sync = send(ledger, CTX_SYNC)
    send(ledger, CODE)  # after both: neither covers it
    answer(ledger, nop)
    answer(ledger, ctx_sync)
    assert not ledger.clean(1, 0)
    answer(ledger, send(ledger, NOP, F))
    assert ledger.clean(1, 0)


def test_a_sync_point_covers_itself_and_answers_may_come_in_any_order():
    ledger = TimelineLedger()
    first = send(ledger, BATCH, F)
    second = send(ledger, CODE, F)
    answer(ledger, second)
    assert ledger.clean(1, 0)  # the later one covers both
    answer(ledger, first)  # an earlier answer after it does not make it dirty again
    assert ledger.clean(1, 0)
    first = send(ledger, CTX_SYNC)
    send(ledger, BATCH)
    second = send(ledger, CTX_SYNC)
    answer(ledger, second)
    answer(ledger, first)
    assert ledger.clean(1, 0)


def test_an_error_answer_counts_as_nothing():
    for sync, flags in ((NOP, F), (BATCH, F), (H2D, 0), (D2H, 0), (CTX_SYNC, 0)):
        ledger = TimelineLedger()
        send(ledger, LAUNCH)
        for resp in (ERR, wire.RESP_ERR_INVALID_PARAMETER, wire.RESP_ERR_UNSPEC):
            answer(ledger, send(ledger, sync, flags), resp)
            assert not ledger.clean(1, 0), (sync, resp)
    ledger = TimelineLedger()
    send(ledger, LAUNCH)
    answer(ledger, send(ledger, CTX_SYNC, ctx=1))
    send(ledger, LAUNCH)
    answer(ledger, send(ledger, DESTROY, ctx=1), wire.RESP_ERR_INVALID_CONTEXT_ID)
    assert not ledger.clean(1, 0)  # a CTX_DESTROY that failed forgets nothing


def test_ctx_destroy_answered_ok_forgets_its_contexts_timelines():
    ledger = TimelineLedger()
    send(ledger, BATCH, ctx=1, ring=0)
    send(ledger, CODE, ctx=1, ring=3)
    send(ledger, BATCH, ctx=2)
    tok = send(ledger, DESTROY, ctx=1)
    assert not ledger.clean(1, 0) and not ledger.clean(1, 3)  # not answered yet
    answer(ledger, tok)
    assert ledger.clean(1, 0) and ledger.clean(1, 3) and ledger.others_clean(1, 0)
    assert not ledger.clean(2, 0)  # another context's


def test_work_submitted_after_a_ctx_destroy_is_not_forgotten_by_its_answer():
    ledger = TimelineLedger()
    send(ledger, BATCH, ctx=1)
    tok = send(ledger, DESTROY, ctx=1)
    send(ledger, CODE, ctx=1)  # (a context of that id again, or rejected: unknown)
    answer(ledger, tok)
    assert not ledger.clean(1, 0)


def test_without_context_init_every_ring_idx_is_timeline_0():
    ledger = TimelineLedger(rings=False)
    send(ledger, BATCH, ctx=1, ring=4)
    assert not ledger.clean(1, 0) and not ledger.clean(1, 4)
    assert ledger.others_clean(1, 9)  # one timeline: there is no other
    answer(ledger, send(ledger, NOP, F, ctx=1, ring=9))
    assert ledger.clean(1, 0) and ledger.clean(1, 4)


def test_others_clean_ignores_the_timeline_asked_for_and_other_contexts():
    ledger = TimelineLedger()
    assert ledger.others_clean(1, 0)
    send(ledger, BATCH, ctx=1, ring=0)
    send(ledger, BATCH, ctx=2, ring=1)
    assert ledger.others_clean(1, 0)
    send(ledger, WAIT, ctx=1, ring=2)  # a timeline that waits for an event, nothing after
    assert not ledger.others_clean(1, 0)
    assert not ledger.others_clean(1, 2)  # (its own aside, timeline 0's batch is not synced)
    answer(ledger, send(ledger, NOP, F, ctx=1, ring=2))
    assert ledger.others_clean(1, 0)
    send(ledger, H2D, ctx=1, ring=3)  # a copy in flight: dirty until it is answered
    assert not ledger.others_clean(1, 0)


def test_a_reset_forgets_everything_and_no_answer_from_before_it_counts_after_it():
    ledger = TimelineLedger()
    send(ledger, BATCH, ctx=1)
    nop = send(ledger, NOP, F, ctx=1)
    ctx_sync = send(ledger, CTX_SYNC, ctx=1)
    ledger.forget()
    assert ledger.clean(1, 0)
    send(ledger, CODE, ctx=1)  # on the device after the reset
    answer(ledger, nop)  # stale answers (the driver never delivers them): still no cover
    answer(ledger, ctx_sync)
    assert not ledger.clean(1, 0) and not ledger.others_clean(1, 1)
    assert ledger.seq == 4  # the numbering goes on


# ------------------------------------------------------------------ properties
CTXS, RINGS = (1, 2), (0, 1, 2)
TYPES_USED = (H2D, D2H, D2D, LAUNCH, BATCH, CODE, WAIT, NOP, CTX_SYNC, DESTROY,
              wire.CMD_MEM_ALLOC, wire.CMD_EVENT_RECORD)
submit_op = st.tuples(st.just("submit"), st.sampled_from(TYPES_USED), st.sampled_from((0, F)),
                      st.sampled_from(CTXS), st.sampled_from(RINGS))
# an answer to one of the requests not answered yet (picked modulo their number)
answer_op = st.tuples(st.just("answer"), st.integers(0, 7), st.sampled_from((OK, OK, ERR)))
ops = st.lists(st.one_of(submit_op, submit_op, answer_op, st.just(("reset",))), max_size=60)


class Reference:
    """Every request kept; clean by the definition."""

    def __init__(self, rings):
        self.rings = rings
        self.requests = []  # [seq, type, flags, ctx, ring, answered OK]
        self.reset_seq = 0

    def submit(self, type_, flags, ctx, ring):
        self.requests.append([len(self.requests) + 1, type_, flags, ctx,
                              ring if self.rings else 0, False])

    def answer(self, i, resp):
        self.requests[i][5] = resp == OK

    def reset(self):
        self.reset_seq = len(self.requests)

    def clean(self, ctx, ring):
        ring = ring if self.rings else 0
        destroyed = max([s for s, t, _f, c, _r, ok in self.requests
                         if t == DESTROY and c == ctx and ok], default=0)
        for seq, type_, _flags, c, r, _ok in self.requests:
            if (c, r) != (ctx, ring) or seq <= self.reset_seq or seq < destroyed:
                continue
            if type_ not in (H2D, D2H, D2D, LAUNCH, BATCH, CODE, WAIT):
                continue
            if not any(ok and s >= seq and c2 == ctx and (
                    t == CTX_SYNC
                    or r2 == ring and (t in (H2D, D2H)
                                       or f & F and t in (NOP, D2D, LAUNCH, BATCH, CODE)))
                       for s, t, f, c2, r2, ok in self.requests):
                return False
        return True


@settings(max_examples=1000)  # cheap examples; out-of-order answers after a CTX_DESTROY are rare
@given(ops, st.booleans())
def test_the_ledger_agrees_with_the_definition(run, rings):
    ledger, ref = TimelineLedger(rings), Reference(rings)
    tokens = []  # per request: its token (None: the ledger needs no answer)
    pending = []  # the requests not answered yet; each is answered once at most
    for op in run:
        if op[0] == "submit":
            _, type_, flags, ctx, ring = op
            pending.append(len(tokens))
            tokens.append(send(ledger, type_, flags, ctx, ring))
            ref.submit(type_, flags, ctx, ring)
        elif op[0] == "answer":
            _, i, resp = op
            if pending:
                i = pending.pop(i % len(pending))
                answer(ledger, tokens[i], resp)
                ref.answer(i, resp)
        else:
            ledger.forget()
            ref.reset()
        for ctx in CTXS + (3,):
            for ring in RINGS:
                assert ledger.clean(ctx, ring) == ref.clean(ctx, ring), (ctx, ring)
                # without CONTEXT_INIT a context has one timeline: there is no other
                assert ledger.others_clean(ctx, ring) == (not rings or all(
                    ref.clean(ctx, r) for r in RINGS if r != ring)), (ctx, ring)
