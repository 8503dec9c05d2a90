"""Device reset with requests in flight (spec §5.5): in both memory models the requests the
reset caught fail with a guest exception, and the device serves new work at once."""

import numpy as np
import pytest

from pvgpu import guest
from pvgpu.guest.api import errors

ROUNDS = 5
N = 4096


def _record_submits(monkeypatch, drv) -> list:
    """Every Request the driver hands out from now on."""
    submitted = []
    submit = drv.submit

    def recording(*args, **kwargs):
        req = submit(*args, **kwargs)
        submitted.append(req)
        return req

    monkeypatch.setattr(drv, "submit", recording)
    return submitted


def test_reset_fails_the_requests_in_flight_and_service_resumes(conn, monkeypatch):
    dev = conn.devices[0]
    submitted = _record_submits(monkeypatch, dev.driver)
    for _ in range(ROUNDS):
        del submitted[:]
        ctx = dev.create_context()
        a = ctx.to_device(np.arange(N, dtype=np.float32))
        b = ctx.zeros(N, np.float32)
        slow, quick = ctx.create_stream(), ctx.create_stream()
        ctx.launch("burn", 1, 1, (200_000,), stream=slow)
        a.to_host_async(stream=slow)  # both copies wait on the device behind the burn
        b.copy_from_host_async(np.ones(N, np.float32), stream=slow)
        event = slow.record_event()
        for _ in range(3):  # in the driver's open LAUNCH_BATCH, not sent yet
            ctx.launch("fill", 16, 256, (b, 2.0, N), stream=quick)
        batcher = dev.driver.batcher
        assert batcher.open.count == 3
        in_flight = [r for r in submitted if not r.done]
        assert len(in_flight) >= 2  # the copies, held behind the burn
        del submitted[:]

        dev.reset()

        # the launches never sent fail with the reset too, at their stream's next sync
        assert batcher.open is None  # dropped by the reset (the driver has a new batcher)
        assert isinstance(errors.translate(quick._take_error()), guest.DeviceNeedsReset)

        for req in in_flight:
            assert req.done
            with pytest.raises(Exception) as ei:
                req.response()
            assert isinstance(errors.translate(ei.value), guest.DeviceNeedsReset)
        with pytest.raises(guest.InvalidContextError):
            ctx.synchronize()
        with pytest.raises(guest.PvgpuError):
            event.synchronize()
        # the device works again, at once
        dev.nop()
        with dev.create_context() as fresh:
            x = fresh.to_device(np.arange(N, dtype=np.float32))
            y = fresh.to_device(np.full(N, 0.5, np.float32))
            z = fresh.empty(N, np.float32)
            fresh.launch("vector_add", grid=N // 256, block=256, args=(x, y, z, N))
            np.testing.assert_allclose(z.to_host(), np.arange(N, dtype=np.float32) + 0.5)
        assert all(r.done and r.failed is None for r in submitted)
