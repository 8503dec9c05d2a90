"""A vGPU's measured turnaround (host/kmd/turnaround.py): the gaps between its jobs and
the bound BAND holds a free ring for."""

from pvgpu.host.kmd.turnaround import MIN_SAMPLES, SAMPLES, Turnaround

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
    assert t.bound() == 500 * US


def test_bound_is_a_high_quantile_so_one_outlier_does_not_stretch_it():
    t = Turnaround(30 * MS)
    gaps(t, *[400 * US] * (SAMPLES - 2), 600 * US, 20 * MS)  # one guest descheduled
    assert t.bound() == 600 * US
    gaps(t, 20 * MS)  # a second outlier of 16 is within the quantile's 10 %: covered
    assert t.bound() == 20 * MS


def test_only_the_last_samples_count():
    t = Turnaround(30 * MS)
    gaps(t, *[5 * MS] * SAMPLES)
    gaps(t, *[300 * US] * SAMPLES)
    assert t.bound() == 300 * US


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
    assert t.due() == now + 700 * US
    t.pushed(now + 100 * US)
    assert t.due() is None
