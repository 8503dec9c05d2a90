"""The host's I/O loop keeps serving every session while one of them tears down a lot of
state: another session's calls and heartbeats are answered throughout, so neither side
declares the other lost (spec CTL-HB-3, CTL-HB-4)."""

import threading
import time

import numpy as np

from pvgpu import guest

MiB = 1 << 20
DEADLINE = 60.0  # seconds; a generous bound, only so that a broken host fails, not hangs


def _await(cond, what: str) -> None:
    end = time.monotonic() + DEADLINE
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_destroying_a_context_with_large_buffers_loses_no_session(host_factory, tmp_endpoint):
    host = host_factory([tmp_endpoint], vram="1G", heartbeat_ms=200)
    stop = threading.Event()
    failures, calls = [], [0]
    with guest.connect(host.endpoint, mem_size=8 * MiB) as other, \
            guest.connect(host.endpoint, mem_size=8 * MiB) as owner:
        dev = owner.devices[0]

        def keep_calling():
            try:
                while not stop.is_set():
                    other.devices[0].nop()
                    calls[0] += 1
            except Exception as e:  # HostLost above all
                failures.append(e)

        ctx = dev.create_context()
        for _ in range(3):
            ctx.empty(256 * MiB, np.uint8)  # never written: fresh VRAM pages
        caller = threading.Thread(target=keep_calling, daemon=True)
        caller.start()
        try:
            _await(lambda: calls[0] or failures, "the other session's first call")
            ctx.destroy()
            answered = calls[0]
            _await(lambda: calls[0] > answered + 2 or failures, "calls after the destroy")
        finally:
            stop.set()
            caller.join(DEADLINE)
        assert not failures, failures
        dev.nop()
        assert dev.info()["vram_free"] >= 3 * 256 * MiB
