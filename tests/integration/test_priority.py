"""Context priorities end to end (CMD-CTX-CREATE-3): with the compute engine busy, a
waiting job of a high-priority context runs before one of a low-priority context that
was submitted earlier."""

import pytest
from pvgpu.conformance.burns import with_longer_burns

from pvgpu import guest


def test_high_priority_context_overtakes_a_waiting_low_priority_one(host_factory, tmp_endpoint):
    host = host_factory([tmp_endpoint], vram="64M", extra_args=["--hw-limit", "1"])
    with guest.connect(host.endpoint, mem_size=16 << 20) as conn:
        dev = conn.devices[0]
        blocker = dev.create_context("blocker")
        low = dev.create_context("low", priority="low")
        high = dev.create_context("high", priority="high")

        def attempt(burn_us):
            blocker.launch("burn", 1, 1, (burn_us,))  # holds the only hardware slot
            blocking = blocker.default_stream.record_event()
            low.launch("burn", 1, 1, (1_000,))
            low_done = low.default_stream.record_event()
            high.launch("burn", 1, 1, (1_000,))
            high_done = high.default_stream.record_event()  # answered: both launches taken
            both_waited = blocking.query() is False  # for the slot, when the high one came
            low_done.synchronize()
            high_done.synchronize()
            if both_waited:
                assert high_done.timestamp_ns < low_done.timestamp_ns
            return both_waited
        with_longer_burns(attempt)
        for ctx in (blocker, low, high):
            ctx.destroy()
        with pytest.raises(ValueError):
            dev.create_context(priority="urgent")
