"""Shared device memory (Gdev's gshmget/gshmat): two contexts attach the same VRAM, one
writes it with a kernel, the other reads it with a kernel — no copy through the host.

    python examples/shared_memory.py [ENDPOINT]
"""

import sys

import numpy as np

import pvgpu


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    n = 1 << 16
    with pvgpu.connect(argv[0] if argv else None, mem_size=64 << 20) as conn:
        dev = conn.devices[0]
        with dev.create_context("producer") as producer, dev.create_context("consumer") as consumer:
            seg = producer.shm_get("example-buffer", 4 * n)  # the first call allocates
            src = seg.attach(producer, shape=(n,), dtype=np.float32)
            dst = seg.attach(consumer, shape=(n,), dtype=np.float32)  # same pages, its own VM
            producer.launch("fill", n // 256, 256, (src, 5.0, n))
            producer.synchronize()  # no implicit synchronisation between contexts
            out = consumer.empty(n, np.float32)
            consumer.launch("scale", n // 256, 256, (out, dst, 2.0, n))
            assert np.array_equal(out.to_host(), np.full(n, 10.0, np.float32))
            print(f"producer (VA {src.ptr:#x} in its VM) and consumer (VA {dst.ptr:#x} in its) share "
                  f"{seg.nbytes >> 10} KiB of VRAM; result verified")
            src.detach()
            dst.detach()
            seg.remove()  # freed now that nobody is attached


if __name__ == "__main__":
    main()
