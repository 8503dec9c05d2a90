"""Streams and events: a producer stream and a consumer stream ordered by an event that
the host's scheduler resolves (the guest never blocks for it), elapsed device time, and
an async copy into pinned host memory.

    python examples/streams_events.py [ENDPOINT]
"""

import sys

import numpy as np

import pvgpu


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    n = 1 << 16
    with pvgpu.connect(argv[0] if argv else None, mem_size=64 << 20) as conn:
        dev = conn.devices[0]
        with dev.create_context("streams") as ctx:
            x = ctx.empty(n, np.float32)
            producer, consumer = ctx.create_stream(), ctx.create_stream()
            start = producer.record_event()
            producer.launch("burn", 1, 1, (20_000,))  # 20 ms of device time
            producer.launch("fill", n // 256, 256, (x, 3.0, n))
            produced = producer.record_event()
            consumer.wait_event(produced)  # returns at once
            waiting = not produced.query()
            consumer.launch("scale", n // 256, 256, (x, x, 2.0, n))
            out = dev.pinned_empty(n, np.float32)  # page-locked: the copy is one DMA
            x.to_host_async(out, consumer)
            consumer.synchronize()
            assert np.array_equal(out, np.full(n, 6.0, np.float32))
            print(f"consumer waited on the host: {waiting}; result verified; producer took "
                  f"{start.elapsed_time(produced):.1f} ms of device time")
            out.free()


if __name__ == "__main__":
    main()
