"""Freed VRAM is cleared (it always reads as zero) without the KMD touching pages nobody
wrote: destroying a context that holds most of a 1 GiB device is cheap for the host's I/O
thread, which runs CTX_DESTROY."""

import os

MiB = 1 << 20


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_destroying_large_untouched_buffers_does_not_populate_vram(make_dev):
    dev = make_dev(vram_size=1 << 30)
    ctx = dev.create_context()
    for _ in range(3):
        ctx.alloc(256 * MiB)
    before = resident_bytes()
    dev.destroy_context(ctx)
    assert dev.deferred_frees == 0  # released now, by this thread
    assert resident_bytes() - before < 64 * MiB
    assert dev.vram_free() >= 3 * 256 * MiB


def test_freed_vram_reads_zero_in_the_next_allocation(make_dev):
    # [CMD-ALLOC-2] [DEV-ISOLATE-2] a new allocation shows no earlier owner's data
    dev = make_dev(vram_size=64 * MiB)
    ctx = dev.create_context()
    bo = ctx.alloc(48 * MiB)
    for b in bo.blocks:
        dev.vram.mem[b.offset:b.offset + b.size] = 0x5A
    dev.destroy_context(ctx)
    assert dev.deferred_frees == 0
    again = dev.create_context()
    bo = again.alloc(48 * MiB)
    assert not any(dev.vram.mem[b.offset:b.offset + b.size].any() for b in bo.blocks)
