"""pvgpu.host.kmd.buddy: drm_buddy-style allocation, unit and property tests."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pvgpu.host.kmd.buddy import CONTIGUOUS, RANGE, TOPDOWN, BuddyAllocator
from pvgpu.host.kmd.errors import InvalidArgument, KmdError, OutOfMemory

P = 4096


def free_state(mm):
    return sorted((b.order, b.offset) for fl in mm._free for b in fl.blocks.values())


def total(blocks):
    return sum(b.size for b in blocks)


def is_contiguous(blocks):
    bs = sorted(blocks, key=lambda b: b.offset)
    return all(a.end == b.offset for a, b in zip(bs, bs[1:]))


def test_power_of_two_single_root_and_full_merge():
    mm = BuddyAllocator(64 * P)
    assert len(mm.roots) == 1 and mm.max_order == 6
    blocks = [mm.alloc_blocks(P) for _ in range(64)]
    assert mm.avail == 0
    with pytest.raises(OutOfMemory):
        mm.alloc_blocks(P)
    for b in blocks[::2] + blocks[1::2]:
        mm.free_blocks(b)
        mm.check()
    assert mm.avail == mm.size
    assert free_state(mm) == [(6, 0)]


def test_non_power_of_two_size_gives_several_roots():
    mm = BuddyAllocator(13 * P + 100)  # the odd tail is cut off
    assert mm.size == 13 * P
    assert [(r.offset, r.size) for r in mm.roots] == [(0, 8 * P), (8 * P, 4 * P), (12 * P, P)]
    everything = mm.alloc_blocks(13 * P)
    assert total(everything) == 13 * P and mm.avail == 0
    mm.free_blocks(everything)
    assert free_state(mm) == [(0, 12 * P), (2, 8 * P), (3, 0)]


def test_non_power_of_two_request_is_largest_first():
    mm = BuddyAllocator(64 * P)
    blocks = mm.alloc_blocks(7 * P)
    assert [b.size for b in blocks] == [4 * P, 2 * P, P]
    assert mm.avail == 57 * P
    mm.check()


def test_size_rounds_up_to_chunk():
    mm = BuddyAllocator(16 * P)
    blocks = mm.alloc_blocks(P + 1)
    assert total(blocks) == 2 * P


def test_min_block_size_rounds_and_trims_last_block():
    mm = BuddyAllocator(64 * P)
    blocks = mm.alloc_blocks(5 * P, min_block_size=4 * P)
    assert total(blocks) == 5 * P and mm.avail == 59 * P
    assert blocks[0].size == 4 * P and blocks[0].offset % (4 * P) == 0
    mm.check()
    mm.free_blocks(blocks)
    assert free_state(mm) == [(6, 0)]


def test_contiguous_rounds_to_pow2_then_trims():
    mm = BuddyAllocator(64 * P)
    mm.alloc_blocks(P)  # offset 0
    blocks = mm.alloc_blocks(3 * P, flags=CONTIGUOUS)
    assert total(blocks) == 3 * P and is_contiguous(blocks)
    assert min(b.offset for b in blocks) % (4 * P) == 0
    assert mm.avail == 60 * P
    mm.check()


def test_contiguous_tries_harder_on_unaligned_free_run():
    mm = BuddyAllocator(8 * P)
    pages = [mm.alloc_blocks(P)[0] for _ in range(8)]
    mm.free_blocks(pages[1:5])  # free run [1, 5): no aligned 4-page block is free
    assert mm.largest_free_block() == 2 * P
    blocks = mm.alloc_blocks(4 * P, flags=CONTIGUOUS)
    assert is_contiguous(blocks) and total(blocks) == 4 * P
    assert min(b.offset for b in blocks) == P
    mm.check()


def test_contiguous_fails_without_a_long_enough_run():
    mm = BuddyAllocator(8 * P)
    pages = [mm.alloc_blocks(P)[0] for _ in range(8)]
    mm.free_blocks(pages[0:3] + pages[4:7])
    before = free_state(mm)
    with pytest.raises(OutOfMemory):
        mm.alloc_blocks(4 * P, flags=CONTIGUOUS)
    assert free_state(mm) == before
    assert total(mm.alloc_blocks(3 * P, flags=CONTIGUOUS)) == 3 * P


def test_topdown_prefers_high_offsets():
    mm = BuddyAllocator(64 * P)
    b = mm.alloc_blocks(P, flags=TOPDOWN)
    assert b[0].offset == 63 * P
    b2 = mm.alloc_blocks(2 * P, flags=TOPDOWN)
    assert b2[0].offset == 60 * P
    # without TOPDOWN: best fit (smallest free order), lowest offset within it
    assert mm.alloc_blocks(P)[0].offset == 62 * P
    assert mm.alloc_blocks(4 * P)[0].offset == 56 * P
    assert mm.alloc_blocks(32 * P)[0].offset == 0
    mm.check()


def test_range_restricts_blocks():
    mm = BuddyAllocator(64 * P)
    blocks = mm.alloc_blocks(6 * P, start=10 * P, end=20 * P)
    assert total(blocks) == 6 * P
    assert all(10 * P <= b.offset and b.end <= 20 * P for b in blocks)
    top = mm.alloc_blocks(2 * P, start=10 * P, end=20 * P, flags=RANGE | TOPDOWN)
    assert all(b.end <= 20 * P for b in top) and max(b.end for b in top) == 20 * P
    mm.check()
    before = free_state(mm)
    with pytest.raises(OutOfMemory):
        mm.alloc_blocks(3 * P, start=10 * P, end=20 * P)
    assert free_state(mm) == before


def test_exact_range():
    mm = BuddyAllocator(64 * P)
    blocks = mm.alloc_blocks(5 * P, start=3 * P, end=8 * P)
    assert sorted((b.offset, b.size) for b in blocks) == [(3 * P, P), (4 * P, 4 * P)]
    with pytest.raises(OutOfMemory):
        mm.alloc_blocks(2 * P, start=7 * P, end=9 * P)
    mm.check()


def test_oom_leaves_state_unchanged():
    mm = BuddyAllocator(16 * P)
    mm.alloc_blocks(5 * P)
    before, avail = free_state(mm), mm.avail
    with pytest.raises(OutOfMemory) as e:
        mm.alloc_blocks(12 * P)
    assert e.value.code == "out_of_memory" and isinstance(e.value, KmdError)
    assert free_state(mm) == before and mm.avail == avail
    with pytest.raises(OutOfMemory):
        mm.alloc_blocks(11 * P, min_block_size=8 * P)
    assert free_state(mm) == before and mm.avail == avail


def test_bad_arguments_and_bad_frees():
    mm = BuddyAllocator(16 * P)
    for kwargs in ({"size": 0}, {"size": P, "min_block_size": 3 * P},
                   {"size": P, "min_block_size": P // 2}, {"size": P, "start": 100},
                   {"size": P, "start": 8 * P, "end": 4 * P}, {"size": P, "end": 32 * P}):
        with pytest.raises(InvalidArgument):
            mm.alloc_blocks(**kwargs)
    with pytest.raises(InvalidArgument):
        BuddyAllocator(16 * P, chunk_size=3000)
    blocks = mm.alloc_blocks(P)
    mm.free_blocks(blocks)
    with pytest.raises(InvalidArgument):
        mm.free_blocks(blocks)  # double free
    other = BuddyAllocator(16 * P).alloc_blocks(P)
    with pytest.raises(InvalidArgument):
        mm.free_blocks(other)
    b = mm.alloc_blocks(P)
    with pytest.raises(InvalidArgument):
        mm.free_blocks(b + b)  # the same block twice in one call: nothing freed
    assert b[0].state == 1
    mm.check()


def test_stats():
    mm = BuddyAllocator(16 * P)
    s = mm.stats()
    assert s["avail"] == 16 * P and s["largest_free_block"] == 16 * P and s["fragmentation"] == 0
    mm.alloc_blocks(P)
    s = mm.stats()
    assert s["free_blocks"] == {0: 1, 1: 1, 2: 1, 3: 1}
    assert s["largest_free_block"] == 8 * P
    assert 0 < s["fragmentation"] < 1
    assert mm.used == P


def test_many_small_allocations_are_cheap():
    mm = BuddyAllocator(1 << 30)
    blocks = [mm.alloc_blocks(P) for _ in range(5000)]
    assert blocks[-1][0].offset == 4999 * P  # lowest offset first: dense packing
    mm.free_blocks([b for bl in blocks for b in bl])
    assert mm.avail == mm.size


# ---------------------------------------------------------------------- properties
op = st.one_of(
    st.tuples(st.just("alloc"), st.integers(1, 40), st.sampled_from([0, TOPDOWN, CONTIGUOUS,
                                                                    CONTIGUOUS | TOPDOWN]),
              st.sampled_from([1, 1, 1, 2, 4]), st.none() | st.tuples(st.integers(0, 70),
                                                                       st.integers(1, 70))),
    st.tuples(st.just("free"), st.integers(0, 1000)),
)


@settings(max_examples=150, deadline=None)
@given(pages=st.integers(1, 100), ops=st.lists(op, max_size=40))
def test_random_alloc_free_sequences(pages, ops):
    mm = BuddyAllocator(pages * P + 17)
    live = []  # (blocks, requested pages, flags, range)
    for o in ops:
        if o[0] == "free":
            if live:
                blocks = live.pop(o[1] % len(live))[0]
                mm.free_blocks(blocks)
        else:
            _, n, flags, minb, rng = o
            kwargs = {"min_block_size": minb * P}
            start, end = 0, mm.size
            if rng is not None:
                start = min(rng[0], pages - 1) * P
                end = min(start + rng[1] * P, mm.size)
                kwargs.update(start=start, end=end)
                flags |= RANGE
            before, avail = free_state(mm), mm.avail
            runs = mm._free_runs(start, end)
            free_in_range = sum(e - s for s, e in runs)
            longest = max((e - s for s, e in runs), default=0)
            try:
                blocks = mm.alloc_blocks(n * P, flags=flags, **kwargs)
            except OutOfMemory:
                assert free_state(mm) == before and mm.avail == avail
                # plain page-granular requests fail only for real lack of memory
                if minb == 1 and not flags & CONTIGUOUS:
                    assert free_in_range < n * P
                if flags & CONTIGUOUS and end - start == mm.size:
                    assert longest < n * P
                continue
            assert total(blocks) == n * P
            assert all(start <= b.offset and b.end <= end for b in blocks)
            if flags & CONTIGUOUS:
                assert is_contiguous(blocks)
            live.append((blocks, n, flags, rng))
        mm.check()
        spans = sorted((b.offset, b.end) for bl, *_ in live for b in bl)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "live blocks overlap"
        assert all(0 <= s and e <= mm.size for s, e in spans)
        assert mm.avail == mm.size - sum(e - s for s, e in spans)
    for blocks, *_ in live:
        mm.free_blocks(blocks)
    mm.check()
    assert mm.avail == mm.size
    assert free_state(mm) == sorted((r.order, r.offset) for r in mm.roots)
