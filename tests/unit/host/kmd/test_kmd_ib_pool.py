"""pvgpu.host.kmd.ib_pool: the circular indirect-buffer pool, and IBs too large for it."""

from hypothesis import given, settings
from hypothesis import strategies as st

from pvgpu.host.hw import regs
from pvgpu.host.kmd.ib_pool import IbPool

P = regs.PAGE_SIZE


def test_ib_pool_is_circular_and_reuses_out_of_order_frees():
    pool = IbPool(0x10000, 4096, align=256)
    a, b, c = pool.alloc(1000), pool.alloc(1000), pool.alloc(1000)
    assert (a, b, c) == (0x10000, 0x10400, 0x10800)
    assert pool.alloc(2048) is None
    pool.free(b)  # not the oldest: no space back yet
    assert pool.alloc(1024) == 0x10c00  # the tail still fits
    assert pool.alloc(256) is None
    pool.free(a)  # a and b released: the head moves past both
    assert pool.alloc(1024) == 0x10000  # wraps
    assert pool.alloc(1024) is None  # would make tail == head
    assert pool.alloc(4096) is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 1500)), max_size=80))
def test_ib_pool_live_ranges_never_overlap(ops):
    pool = IbPool(0, 4096, align=256)
    live = {}
    for is_alloc, n in ops:
        if is_alloc or not live:
            phys = pool.alloc(n)
            if phys is None:
                continue
            assert 0 <= phys and phys + n <= 4096
            live[phys] = n
        else:
            phys = sorted(live)[n % len(live)]
            pool.free(phys)
            del live[phys]
        spans = sorted(live.items())
        assert all(a + na <= b for (a, na), (b, _) in zip(spans, spans[1:]))
    for phys in list(live):
        pool.free(phys)
    assert pool.in_use == 0 and pool.alloc(3000) == 0


def test_huge_ib_gets_its_own_vram(make_dev):
    dev = make_dev(ib_pool_size=16 << 10)
    ctx = dev.create_context()
    src, dst = ctx.alloc(P), ctx.alloc(P)
    free_before = dev.vram_free()
    f = ctx.submit_copies([(src.va + i % 512 * 8, dst.va + i % 512 * 8, 8) for i in range(2000)])
    assert dev.vram_free() < free_before  # 56 KB of COPY packets: a dedicated block
    assert f.wait(5) and f.error is None
    assert dev.vram_free() == free_before
