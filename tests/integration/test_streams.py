"""Streams and events through the API against a real host process: launch chains on two
streams, host-side ordering by events (the guest never blocks for a wait), elapsed device
time, events shared between guests by export handle, asynchronous copies, CTX_SYNC,
device statistics, and the errors of a job that times out."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from pvgpu.conformance.burns import with_longer_burns

from pvgpu import guest
from pvgpu.guest.api.copy import STAGING_DEPTH
from pvgpu.spec import wire

N = 1 << 16
GRID, BLOCK = N // 256, 256
LONG_BURN_US = 300_000


def test_two_streams_each_run_a_launch_chain(conn):
    with conn.devices[0].create_context() as ctx:
        s1, s2 = ctx.create_stream(), ctx.create_stream()
        assert {s1.ring_idx, s2.ring_idx} == {1, 2} and ctx.default_stream.ring_idx == 0
        bufs = {}
        for k, s in ((1, s1), (2, s2)):
            x, y, z = ctx.empty(N), ctx.empty(N), ctx.empty(N)
            s.launch("fill", GRID, BLOCK, (x, float(k), N))
            s.launch("scale", GRID, BLOCK, (y, x, 10.0, N))  # y = 10k
            s.launch("vector_add", GRID, BLOCK, (x, y, z, N))  # z = 11k
            s.launch("saxpy", GRID, BLOCK, (2.0, z, y, N))  # y = 22k + 10k
            bufs[k] = (y, z)
        for k, s in ((1, s1), (2, s2)):
            y, z = bufs[k]
            np.testing.assert_array_equal(z.to_host(stream=s), np.full(N, 11.0 * k, np.float32))
            np.testing.assert_array_equal(y.to_host(stream=s), np.full(N, 32.0 * k, np.float32))
        s1.destroy()
        assert ctx.create_stream().ring_idx == 1  # the ring_idx came back


def test_wait_event_orders_another_stream_on_the_host(conn):
    with conn.devices[0].create_context() as ctx:
        a, b = ctx.create_stream(), ctx.create_stream()
        src, out = ctx.zeros(N), ctx.empty(N)
        values = iter((3.0, 4.0, 5.0))

        def attempt(burn_us):
            value = next(values)
            a.launch("burn", 1, 1, (burn_us,))
            a.launch("fill", GRID, BLOCK, (src, value, N))
            ev = a.record_event()
            b.wait_event(ev)
            # wait_event returned while the burn still ran: the guest did not block for it
            returned_at_once = ev.query() is False
            b.launch("scale", GRID, BLOCK, (out, src, 2.0, N))
            np.testing.assert_array_equal(out.to_host(stream=b),
                                          np.full(N, 2 * value, np.float32))
            assert ev.query() is True
            ev.destroy()
            return returned_at_once
        with_longer_burns(attempt)


def test_elapsed_time_between_events_covers_a_burn(conn):
    with conn.devices[0].create_context() as ctx:
        s = ctx.create_stream()
        start = s.record_event()
        s.launch("burn", 1, 1, (50_000,))
        end = s.record_event()
        end.synchronize()
        assert start.elapsed_time(end) >= 45.0
        assert end.timestamp_ns >= start.timestamp_ns

        def attempt(burn_us):
            s.launch("burn", 1, 1, (burn_us,))
            later = s.record_event()
            try:
                start.elapsed_time(later)
            except guest.NotReadyError:
                not_ready = True  # asked while the burn ran
            else:
                not_ready = False
            later.synchronize()
            assert start.elapsed_time(later) >= end.elapsed_time(later) >= 0.9 * burn_us / 1000
            return not_ready
        with_longer_burns(attempt)


def test_async_copies_land_at_the_next_synchronize(conn):
    dev = conn.devices[0]
    with dev.create_context() as ctx:
        s = ctx.create_stream()
        n = dev.staging_chunk * (STAGING_DEPTH + 2) // 4  # more chunks than the pool has
        host = np.arange(n, dtype=np.float32)
        d = ctx.empty(n)
        d.copy_from_host_async(host, stream=s)
        host[:] = -1  # staged already: changing the source does not change the copy
        s.launch("scale", -(-n // 256), 256, (d, d, 2.0, n))
        out = d.to_host_async(stream=s)
        ev = s.record_event()
        ev.synchronize()  # the event covers the copy: the data has landed
        np.testing.assert_array_equal(out, 2 * np.arange(n, dtype=np.float32))
        out2 = np.zeros(n, np.float32)
        ctx.copy_d2h_async(d.ptr, out2, s)
        s.synchronize()
        np.testing.assert_array_equal(out2, out)
        assert dev._staging.count <= STAGING_DEPTH and not dev._staging.lent


def test_async_errors_surface_on_their_stream_and_at_ctx_sync(conn):
    dev = conn.devices[0]
    with dev.create_context() as ctx, dev.create_context() as other:
        bad, good = ctx.create_stream(), ctx.create_stream()
        x = ctx.zeros(16)
        bad.launch("fill", 1, 16, (0x5100_0000_0000, 1.0, 16))
        good.launch("fill", 1, 16, (x, 2.0, 16))
        good.synchronize()  # not this stream's error
        ev = bad.record_event()
        with pytest.raises(guest.PageFaultError) as ei:
            ev.synchronize()
        assert ei.value.address == 0x5100_0000_0000
        with pytest.raises(guest.PageFaultError):
            ctx.synchronize()  # CTX_SYNC reports any of the context's streams
        bad.synchronize()  # reported once
        other.launch("fill", 1, 16, (0x5200_0000_0000, 1.0, 16))
        with pytest.raises(guest.PageFaultError):
            dev.synchronize()  # every context of the device
        dev.synchronize()
        np.testing.assert_array_equal(x.to_host(), np.full(16, 2.0, np.float32))


def test_events_across_devices_and_streams_exhausted(conn):
    d0, d1 = conn.devices
    with d0.create_context() as c0, d1.create_context() as c1:
        a = c0.create_stream()
        a.launch("burn", 1, 1, (100_000,))
        ev = a.record_event()
        b = c1.create_stream()
        b.wait_event(ev)  # another device: exported and imported under the hood
        b.launch("burn", 1, 1, (1_000,))
        mine = b.record_event()
        mine.synchronize()
        assert ev.query() and mine.timestamp_ns >= ev.timestamp_ns
        streams = [c0.create_stream() for _ in range(62)]  # 63 in all with `a`
        with pytest.raises(guest.PvgpuError):
            c0.create_stream()
        streams[5].destroy()
        assert c0.create_stream().ring_idx == streams[5].ring_idx


def test_device_stats(conn):
    for dev in conn.devices:
        stats = dev.stats()
        assert isinstance(stats, dict) and stats["device"] == dev.index


def test_cross_guest_event_orders_in_time(shared_host):
    """Guest A exports an event recorded after a long burn; guest B (another session)
    imports it, makes a stream wait for it and records its own event after a short
    kernel: B's event completes no earlier than A's. A wrong token is refused."""
    with guest.connect(shared_host.endpoint, mem_size=16 << 20) as ga, \
            guest.connect(shared_host.endpoint, memory="inline", mem_size=16 << 20) as gb:
        with ga.devices[0].create_context() as ca, gb.devices[0].create_context() as cb:
            sb = cb.create_stream()
            events = []

            def attempt(burn_us):
                ca.launch("burn", 1, 1, (burn_us,))
                ea = ca.default_stream.record_event()
                handle = str(ea.export())  # what would travel to the other process
                eb_in = cb.import_event(handle)
                sb.wait_event(eb_in)
                events[:] = [ea, handle, eb_in]
                return eb_in.query() is False  # the burn was still running
            with_longer_burns(attempt)
            ea, handle, eb_in = events
            sb.launch("burn", 1, 1, (1_000,))
            eb = sb.record_event()
            eb.synchronize()
            ea.synchronize()
            assert eb.timestamp_ns >= ea.timestamp_ns
            assert eb_in.timestamp_ns == ea.timestamp_ns
            h = guest.EventHandle.parse(handle)
            with pytest.raises(guest.InvalidEventError):
                cb.import_event(guest.EventHandle(h.handle_id, h.token ^ 1))
            with pytest.raises(ValueError):
                cb.import_event("evt:nonsense")


CHILD = textwrap.dedent("""
    import sys, pvgpu.guest as guest
    endpoint, handle = sys.argv[1], sys.argv[2]
    with guest.connect(endpoint, mem_size=16 << 20) as conn:
        with conn.devices[0].create_context() as ctx:
            s = ctx.create_stream()
            theirs = ctx.import_event(handle)
            s.wait_event(theirs)
            print("pending" if not theirs.query() else "complete", flush=True)
            s.launch("burn", 1, 1, (1000,))
            mine = s.record_event()
            mine.synchronize()
            print(mine.timestamp_ns, theirs.timestamp_ns, flush=True)
""")


def test_cross_process_event_handle(shared_host):
    """The string form of a handle is all another guest process needs."""
    with guest.connect(shared_host.endpoint, mem_size=16 << 20) as conn:
        with conn.devices[0].create_context() as ctx:
            ctx.launch("burn", 1, 1, (2 * LONG_BURN_US,))
            ev = ctx.default_stream.record_event()
            child = subprocess.run([sys.executable, "-c", CHILD, shared_host.endpoint, str(ev.export())],
                                   capture_output=True, text=True, timeout=60)
            assert child.returncode == 0, child.stdout + child.stderr
            lines = child.stdout.split("\n")
            ev.synchronize()
            theirs_ts, mine_ts = int(lines[1].split()[1]), int(lines[1].split()[0])
            assert theirs_ts == ev.timestamp_ns and mine_ts >= ev.timestamp_ns
            assert lines[0] in ("pending", "complete")


def test_job_timeout_loses_the_context_only(host_factory, tmp_endpoint):
    host = host_factory([tmp_endpoint], vram="64M", extra_args=["--job-timeout-ms", "300"])
    with guest.connect(host.endpoint, mem_size=16 << 20) as conn:
        dev = conn.devices[0]
        with dev.create_context() as good:
            bad = dev.create_context()
            s = bad.create_stream()
            x = good.zeros(16)
            s.launch("burn", 1, 1, (wire.BURN_FOREVER,))
            ev = s.record_event()
            with pytest.raises(guest.JobTimeoutError):
                ev.synchronize()  # the event reports its work's error (it never ends else)...
            with pytest.raises(guest.JobTimeoutError):
                s.synchronize()  # ...and leaves it to the stream's sync point
            with pytest.raises(guest.ContextLostError):
                bad.launch("fill", 1, 16, (0, 1.0, 16))
                bad.synchronize()
            bad.destroy()  # a lost context can be destroyed
            good.launch("fill", 1, 16, (x, 4.0, 16))
            np.testing.assert_array_equal(x.to_host(), np.full(16, 4.0, np.float32))
