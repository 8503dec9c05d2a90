"""pvgpu.host.kmd.resv: implicit-sync dependencies by usage, one fence per context, pruning."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pvgpu.host.kmd.fence import Fence
from pvgpu.host.kmd.resv import (DMA_RESV_USAGE_BOOKKEEP, DMA_RESV_USAGE_KERNEL, DMA_RESV_USAGE_READ,
                           DMA_RESV_USAGE_WRITE, DmaResv, dma_resv_usage_rw)

USAGES = (DMA_RESV_USAGE_KERNEL, DMA_RESV_USAGE_WRITE, DMA_RESV_USAGE_READ,
          DMA_RESV_USAGE_BOOKKEEP)


class Timeline:
    """A stand-in FenceDriver: fences of one (device, engine) with rising sequence numbers."""

    def __init__(self, device, engine=0):
        self.device = device
        self.engine = engine
        self.seq = 0

    def fence(self) -> Fence:
        self.seq += 1
        return Fence(self.engine, self.seq, self)


def test_usages_are_ordered_as_in_linux():
    assert DMA_RESV_USAGE_KERNEL < DMA_RESV_USAGE_WRITE < DMA_RESV_USAGE_READ \
        < DMA_RESV_USAGE_BOOKKEEP
    assert dma_resv_usage_rw(write=False) == DMA_RESV_USAGE_WRITE
    assert dma_resv_usage_rw(write=True) == DMA_RESV_USAGE_READ


def test_reader_waits_for_writers_writer_waits_for_all():
    resv = DmaResv()
    move, write, read, book = (Timeline(d).fence() for d in "mwrb")
    resv.add_fence(move, DMA_RESV_USAGE_KERNEL)
    resv.add_fence(write, DMA_RESV_USAGE_WRITE)
    resv.add_fence(read, DMA_RESV_USAGE_READ)
    resv.add_fence(book, DMA_RESV_USAGE_BOOKKEEP)
    assert set(resv.implicit_deps(write=False)) == {move, write}
    assert set(resv.implicit_deps(write=True)) == {move, write, read}
    assert resv.fences(DMA_RESV_USAGE_KERNEL) == [move]
    assert set(resv.fences()) == {move, write, read, book}


def test_readers_of_other_contexts_accumulate():
    resv = DmaResv()
    a, b, c = Timeline("gpu0", 0), Timeline("gpu0", 1), Timeline("gpu1", 0)
    fences = [a.fence(), b.fence(), c.fence()]
    for f in fences:
        resv.add_fence(f, DMA_RESV_USAGE_READ)
    assert resv.implicit_deps(write=False) == []
    assert set(resv.implicit_deps(write=True)) == set(fences)


def test_later_fence_of_a_context_replaces_the_earlier():
    resv = DmaResv()
    t = Timeline("gpu0")
    f1, f2 = t.fence(), t.fence()
    resv.add_fence(f1, DMA_RESV_USAGE_READ)
    resv.add_fence(f2, DMA_RESV_USAGE_READ)
    assert resv.fences() == [f2] and len(resv) == 1
    resv.add_fence(f1, DMA_RESV_USAGE_READ)  # older than what is held: it adds nothing
    assert resv.fences() == [f2]


def test_later_write_replaces_read_but_later_read_keeps_the_write():
    resv = DmaResv()
    t = Timeline("gpu0")
    r1, w2, r3 = t.fence(), t.fence(), t.fence()
    resv.add_fence(r1, DMA_RESV_USAGE_READ)
    resv.add_fence(w2, DMA_RESV_USAGE_WRITE)
    assert resv.fences() == [w2]
    resv.add_fence(r3, DMA_RESV_USAGE_READ)  # readers must still see the write
    assert resv.implicit_deps(write=False) == [w2]
    assert set(resv.implicit_deps(write=True)) == {w2, r3}


def test_older_write_after_newer_read_is_kept():
    resv = DmaResv()
    t = Timeline("gpu0")
    w1, r2 = t.fence(), t.fence()
    resv.add_fence(r2, DMA_RESV_USAGE_READ)
    resv.add_fence(w1, DMA_RESV_USAGE_WRITE)
    assert resv.implicit_deps(write=False) == [w1]
    assert set(resv.implicit_deps(write=True)) == {w1, r2}


def test_signalled_fences_are_pruned():
    resv = DmaResv()
    a, b, c = (Timeline(d).fence() for d in "abc")
    resv.add_fence(a, DMA_RESV_USAGE_WRITE)
    resv.add_fence(b, DMA_RESV_USAGE_READ)
    assert not resv.test_signaled(DMA_RESV_USAGE_WRITE)
    a.signal()
    assert resv.test_signaled(DMA_RESV_USAGE_WRITE)
    assert not resv.test_signaled(DMA_RESV_USAGE_READ)
    assert resv.implicit_deps(write=True) == [b]
    b.signal()
    resv.add_fence(c, DMA_RESV_USAGE_READ)
    assert len(resv) == 1 and resv.fences() == [c]
    resv.add_fence(Fence.signaled_fence(), DMA_RESV_USAGE_KERNEL)
    assert len(resv) == 1 and resv.test_signaled(DMA_RESV_USAGE_KERNEL)


def test_failed_fence_counts_as_signalled():
    resv = DmaResv()
    f = Timeline("gpu0").fence()
    resv.add_fence(f, DMA_RESV_USAGE_WRITE)
    f.signal("fault")
    assert resv.test_signaled()


@pytest.mark.parametrize("usage", [-1, 4, True, "write", None])
def test_bad_usage_is_refused(usage):
    resv = DmaResv()
    with pytest.raises(ValueError):
        resv.add_fence(Timeline("gpu0").fence(), usage)
    with pytest.raises(ValueError):
        resv.fences(usage)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(("add", "signal")), st.integers(0, 3),
                          st.sampled_from(USAGES), st.integers(0, 5)), max_size=40))
def test_waiting_on_the_fences_covers_every_unsignalled_fence(ops):
    """Whatever is added in whatever order: fences(u) holds one fence per (context, usage)
    at most, and for every unsignalled fence added at usage <= u a fence of its context
    that is at least as late — in-order timelines make waiting for it enough."""
    resv = DmaResv()
    timelines = [Timeline(f"gpu{i // 2}", i % 2) for i in range(4)]
    made = [[] for _ in timelines]
    added = []
    for op, t, usage, back in ops:
        if op == "add":
            made[t].append(timelines[t].fence())
            # sometimes an older fence of the timeline, as a late submitter would
            f = made[t][max(0, len(made[t]) - 1 - back)]
            resv.add_fence(f, usage)
            added.append((f, usage))
        elif made[t]:
            # a timeline signals in order: a prefix of its fences
            for f in made[t][:back + 1]:
                f.signal()
    for u in USAGES:
        held = resv.fences(u)
        assert all(not f.signaled for f in held)
        for f, usage in added:
            if usage <= u and not f.signaled:
                assert any(h.driver is f.driver and h.seq >= f.seq for h in held), (f, u)
    held = [(f.driver, u) for f, u in resv._fences]
    assert len(held) == len(set(held))
