"""host/backend/commands.Timeline: the unfenced jobs' fences a stream keeps until it
reports their errors."""

from pvgpu.host.backend.commands import Timeline


class CountingFence:
    """A fence whose `signaled` reads are counted (the cost of a prune)."""

    reads = 0

    def __init__(self, signaled=False, error=None):
        self._signaled = signaled
        self.error = error

    @property
    def signaled(self):
        CountingFence.reads += 1
        return self._signaled


def test_prune_keeps_pending_and_failed_fences_and_drops_the_rest():
    t = Timeline()
    pending = [CountingFence() for _ in range(40)]
    failed = [CountingFence(True, "fault") for _ in range(5)]
    done = [CountingFence(True) for _ in range(40)]
    t.unreported = done + pending + failed
    t.prune()
    assert t.unreported == pending + failed
    assert t.take_error() is not None and t.unreported == []


def test_prune_is_amortised_constant_per_job_with_many_jobs_queued():
    """Thousands of asynchronous launches queued on one stream, none finished yet: a
    prune after each submission must not rescan the whole list every time (that made
    the host's cost per launch grow with the queue)."""
    t = Timeline()
    CountingFence.reads = 0
    n = 4000
    for _ in range(n):
        t.unreported.append(CountingFence())
        t.prune()
    assert len(t.unreported) == n
    assert CountingFence.reads < 4 * n  # a rescan per submission would be ~n*n/2
