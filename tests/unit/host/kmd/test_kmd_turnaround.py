"""A vGPU's measured turnaround (host/kmd/turnaround.py): the gaps between its jobs and
the bound BAND holds a free ring for."""

from pvgpu.host.kmd.turnaround import MARGIN, MIN_SAMPLES, SAMPLES, Turnaround

MS = 1_000_000
US = 1_000


def gaps(t, *values, start=0):
    now = start
    for g in values:
        t.idle(now)
        now += g
        t.pushed(now)
        now += MS  # the job runs
    return now


def test_no_bound_before_enough_gaps():
    t = Turnaround(30 * MS)
    gaps(t, *[500 * US] * (MIN_SAMPLES - 1))
    assert t.bound() is None
    gaps(t, 500 * US)
    assert t.bound() == MARGIN * 500 * US


def test_bound_is_the_longest_gap_with_a_margin():
    """A gap past the bound costs the short tenant a long job's time; a bound too long
    costs at most itself, once: every gap remembered is covered, with room to spare."""
    t = Turnaround(30 * MS)
    gaps(t, *[400 * US] * (SAMPLES - 1), 600 * US)
    assert t.bound() == 900 * US
    gaps(t, 5 * MS)  # a guest descheduled once: covered while it is remembered ...
    assert t.bound() == 7500 * US
    gaps(t, *[400 * US] * (SAMPLES - 1))
    assert t.bound() == 7500 * US
    gaps(t, 400 * US)  # ... and no longer once SAMPLES later gaps have replaced it
    assert t.bound() == 600 * US


def test_only_the_last_samples_count():
    t = Turnaround(30 * MS)
    gaps(t, *[5 * MS] * SAMPLES)
    gaps(t, *[300 * US] * SAMPLES)
    assert t.bound() == 450 * US


def test_a_gap_of_a_period_is_going_quiet_not_a_sample():
    t = Turnaround(30 * MS)
    gaps(t, *[300 * US] * MIN_SAMPLES, 30 * MS)
    assert list(t.gaps) == [300 * US] * MIN_SAMPLES


def test_a_push_while_busy_is_no_sample():
    t = Turnaround(30 * MS)
    t.pushed(5 * MS)  # never idle: jobs back to back
    assert not t.gaps and t.idle_since is None


def test_due_is_the_idle_start_plus_the_bound_while_idle():
    t = Turnaround(30 * MS)
    now = gaps(t, *[700 * US] * MIN_SAMPLES)
    assert t.due() is None  # not idle
    t.idle(now)
    assert t.due() == now + 1050 * US
    t.pushed(now + 100 * US)
    assert t.due() is None
