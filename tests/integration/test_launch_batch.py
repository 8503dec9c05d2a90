"""The driver's LAUNCH_BATCH through a host process (spec §6.5.33,
guest/frontend/launch_batch.py): a run of asynchronous launches of one stream is one
request, any other request or a wait sends the open batch first so the device sees the
API's order, an error of a batched launch surfaces at the stream's next synchronizing
call, a synchronize sends its timeline's open batch fenced as its sync point (a context's
only while every other stream of it is known clean: its work covered by a sync point
answered OK, guest/frontend/timelines.py; else CTX_SYNC), and a device without
PVGPU_F_LAUNCH_BATCH gets one LAUNCH per launch."""

import numpy as np
import pytest

from pvgpu import guest
from pvgpu.guest.frontend import launch_batch
from pvgpu.spec import wire

N = 256


def test_a_run_of_launches_is_one_request_per_full_batch(conn):
    # [CMD-LAUNCH-BATCH-1] at most MAX_BATCH_LAUNCHES records; buffers come back for reuse
    drv = conn.devices[0].driver
    ctx = conn.devices[0].create_context()
    arr = ctx.zeros(N, np.float32)
    st = ctx.create_stream()
    runs = launch_batch.BATCH_BUFFERS + 2  # more batches than buffers
    n = runs * wire.MAX_BATCH_LAUNCHES - 3
    sent = drv.batcher.sent
    for i in range(n):
        st.launch("fill", 1, N, (arr, float(i), N))
    st.synchronize()
    assert drv.batcher.sent - sent == runs
    np.testing.assert_array_equal(arr.to_host(), np.full(N, n - 1, np.float32))
    ctx.destroy()


def test_other_requests_and_other_streams_keep_the_api_s_order(conn):
    # [CMD-LAUNCH-BATCH-5] each request sends the open batch first
    drv = conn.devices[0].driver
    ctx = conn.devices[0].create_context()
    a, b = ctx.zeros(N, np.float32), ctx.zeros(N, np.float32)
    s1, s2 = ctx.create_stream(), ctx.create_stream()
    sent = drv.batcher.sent
    for i in range(5):
        s1.launch("fill", 1, N, (a, 1.0, N))
        s2.launch("fill", 1, N, (b, 2.0, N))  # another timeline: s1's batch goes first
    assert drv.batcher.sent - sent == 9 and drv.batcher.open is not None
    ctx.synchronize()
    a.copy_from_host(np.arange(N, dtype=np.float32))  # synchronous, on the default stream
    ctx.launch("scale", 1, N, (a, a, 3.0, N))  # batched behind the copy ...
    out = a.to_host()  # ... and sent before the read
    np.testing.assert_array_equal(out, np.arange(N, dtype=np.float32) * 3)
    np.testing.assert_array_equal(b.to_host(), np.full(N, 2.0, np.float32))
    ctx.destroy()


def test_a_fault_in_a_batch_surfaces_at_the_next_synchronize_and_ends_it(conn):
    # [CMD-LAUNCH-BATCH-4]
    ctx = conn.devices[0].create_context()
    arr = ctx.zeros(N, np.float32)
    st = ctx.create_stream()
    st.launch("fill", 1, N, (arr, 1.0, N))
    st.launch("fill", 1, N, (0x3000_0000_0000, 5.0, N))  # no memory there
    st.launch("fill", 1, N, (arr, 9.0, N))  # after the fault: not run
    with pytest.raises(guest.PageFaultError):
        st.synchronize()
    np.testing.assert_array_equal(arr.to_host(), np.full(N, 1.0, np.float32))
    st.launch("fill", 1, N, (arr, 4.0, N))  # the stream goes on
    st.synchronize()
    np.testing.assert_array_equal(arr.to_host(), np.full(N, 4.0, np.float32))
    ctx.destroy()


def test_without_the_feature_each_launch_is_a_launch_request(shared_host):
    features = wire.DEVICE_FEATURES & ~(1 << wire.PVGPU_F_LAUNCH_BATCH)
    with guest.connect(shared_host.endpoint, mem_size=16 << 20, features=features) as c:
        drv = c.devices[0].driver
        assert drv.batcher is None
        ctx = c.devices[0].create_context()
        arr = ctx.zeros(N, np.float32)
        for i in range(10):
            ctx.launch("fill", 1, N, (arr, float(i), N))
        assert drv.deferred == 10  # ten chains, kicked by the next wait
        np.testing.assert_array_equal(arr.to_host(), np.full(N, 9.0, np.float32))
        ctx.destroy()


# ------------------------------------------- a synchronize that sends the batch fenced
def _recorded(monkeypatch, drv) -> list:
    """(type, flags) of each request the driver submits from now on, in the order their
    chains go out (a submit sends the open batch first, from inside)."""
    sent = []
    submit = drv.submit

    def recording(command, *args, **kwargs):
        req = submit(command, *args, **kwargs)
        sent.append((int.from_bytes(command[:4], "little"), int.from_bytes(command[4:8], "little")))
        return req
    monkeypatch.setattr(drv, "submit", recording)
    return sent


def test_a_streams_synchronize_sends_its_open_batch_fenced_instead_of_a_nop(conn, monkeypatch):
    # [FENCE-SIGNAL-1]: a fenced LAUNCH_BATCH is answered when it and everything before it
    # on its timeline have completed; one chain, no separate NOP
    drv = conn.devices[0].driver
    ctx = conn.devices[0].create_context()
    arr = ctx.zeros(N, np.float32)
    st = ctx.create_stream()
    st.launch("burn", 1, 1, (20_000,))  # 20 ms before the fills: the fence must wait for it
    for i in range(3):
        st.launch("fill", 1, N, (arr, float(i), N))
    sent = _recorded(monkeypatch, drv)
    st.synchronize()
    assert sent == [(wire.CMD_LAUNCH_BATCH, wire.FLAG_INFO_RING_IDX | wire.FLAG_FENCE)]
    np.testing.assert_array_equal(arr.to_host(), np.full(N, 2.0, np.float32))
    sent.clear()
    st.synchronize()  # nothing gathered: the fenced NOP
    assert sent == [(wire.CMD_NOP, wire.FLAG_INFO_RING_IDX | wire.FLAG_FENCE)]
    ctx.destroy()


def test_a_context_of_one_stream_synchronizes_on_its_fenced_batch(conn, monkeypatch):
    drv = conn.devices[0].driver
    ctx = conn.devices[0].create_context()
    arr = ctx.zeros(N, np.float32)
    with ctx.create_stream() as st:  # used, then destroyed (synchronized): one timeline again
        st.launch("fill", 1, N, (arr, 3.0, N))
    sent = _recorded(monkeypatch, drv)
    ctx.launch("fill", 1, N, (arr, 7.0, N))
    ctx.synchronize()
    assert sent == [(wire.CMD_LAUNCH_BATCH, wire.FLAG_FENCE)]
    np.testing.assert_array_equal(arr.to_host(), np.full(N, 7.0, np.float32))
    ctx.destroy()


def test_a_context_with_another_stream_keeps_ctx_sync(conn, monkeypatch):
    # [CMD-CTX-SYNC-1]: the other stream's work is waited for too, which the default
    # stream's fence alone would not do
    drv = conn.devices[0].driver
    ctx = conn.devices[0].create_context()
    a, b = ctx.zeros(N, np.float32), ctx.zeros(N, np.float32)
    other = ctx.create_stream()
    other.launch("burn", 1, 1, (200_000,))  # 200 ms, then a fill on that stream
    other.launch("fill", 1, N, (b, 5.0, N))
    sent = _recorded(monkeypatch, drv)
    ctx.launch("fill", 1, N, (a, 1.0, N))
    ctx.synchronize()
    assert sent[-2:] == [(wire.CMD_LAUNCH_BATCH, 0), (wire.CMD_CTX_SYNC, 0)]
    # a synchronous copy on the default stream is not ordered behind the other stream:
    # it sees the other stream's fill only because CTX_SYNC waited for it
    np.testing.assert_array_equal(b.to_host(), np.full(N, 5.0, np.float32))
    ctx.destroy()


def test_a_fault_reported_by_the_fenced_batch_raises_once(conn, monkeypatch):
    # [FENCE-ERROR-2]: the fenced batch reports the timeline's first error, as CTX_SYNC did
    drv = conn.devices[0].driver
    ctx = conn.devices[0].create_context()
    arr = ctx.zeros(N, np.float32)
    ctx.launch("fill", 1, N, (0x3000_0000_0000, 5.0, N))  # no memory there
    sent = _recorded(monkeypatch, drv)
    with pytest.raises(guest.PageFaultError):
        ctx.synchronize()
    assert sent == [(wire.CMD_LAUNCH_BATCH, wire.FLAG_FENCE)]
    ctx.launch("fill", 1, N, (arr, 2.0, N))
    ctx.synchronize()  # reported once: the next sync point is clean
    np.testing.assert_array_equal(arr.to_host(), np.full(N, 2.0, np.float32))
    ctx.destroy()


# ------------------- a context whose other timelines are known clean (guest/frontend/timelines.py)
def test_a_context_whose_other_stream_was_synchronized_syncs_on_its_fenced_batch(conn,
                                                                                  monkeypatch):
    # every other timeline's work is covered by a sync point answered OK: nothing there for
    # CTX_SYNC to wait for or report ([CMD-CTX-SYNC-1], [CMD-CTX-SYNC-2])
    drv = conn.devices[0].driver
    ctx = conn.devices[0].create_context()
    a, b = ctx.zeros(N, np.float32), ctx.zeros(N, np.float32)
    other = ctx.create_stream()
    other.launch("fill", 1, N, (b, 5.0, N))
    other.synchronize()
    sent = _recorded(monkeypatch, drv)
    ctx.launch("burn", 1, 1, (20_000,))  # 20 ms before the fill: the fence must wait for it
    ctx.launch("fill", 1, N, (a, 1.0, N))
    ctx.synchronize()
    assert sent == [(wire.CMD_LAUNCH_BATCH, wire.FLAG_FENCE)]  # no CTX_SYNC
    # a launch on the other stream, then the context's: its batch is the sync point
    sent.clear()
    ctx.launch("fill", 1, N, (b, 6.0, N), stream=other)
    ctx.synchronize()
    assert sent == [(wire.CMD_LAUNCH_BATCH, wire.FLAG_INFO_RING_IDX | wire.FLAG_FENCE)]
    np.testing.assert_array_equal(a.to_host(), np.full(N, 1.0, np.float32))
    np.testing.assert_array_equal(b.to_host(), np.full(N, 6.0, np.float32))
    other.destroy()
    ctx.destroy()


def test_an_error_remembered_on_another_stream_keeps_ctx_sync_which_raises_it(conn,
                                                                               monkeypatch):
    # [CMD-CTX-SYNC-2]: CTX_SYNC reports the remembered errors of every timeline; the
    # other stream was synchronized once, then its last work failed at execution
    drv = conn.devices[0].driver
    ctx = conn.devices[0].create_context()
    a = ctx.zeros(N, np.float32)
    other = ctx.create_stream()
    other.launch("fill", 1, N, (a, 5.0, N))
    other.synchronize()
    other.launch("fill", 1, N, (0x3000_0000_0000, 5.0, N))  # no memory there
    sent = _recorded(monkeypatch, drv)
    ctx.launch("fill", 1, N, (a, 1.0, N))
    with pytest.raises(guest.PageFaultError):
        ctx.synchronize()
    assert sent[-2:] == [(wire.CMD_LAUNCH_BATCH, 0), (wire.CMD_CTX_SYNC, 0)]
    # an error answer cleans nothing in the driver's eyes (timelines.py): one more CTX_SYNC,
    # answered OK, then the fenced batch
    for flags, tail in ((0, [(wire.CMD_CTX_SYNC, 0)]), (wire.FLAG_FENCE, [])):
        sent.clear()
        ctx.launch("fill", 1, N, (a, 2.0, N))
        ctx.synchronize()
        assert sent == [(wire.CMD_LAUNCH_BATCH, flags)] + tail
    np.testing.assert_array_equal(a.to_host(), np.full(N, 2.0, np.float32))
    other.destroy()
    ctx.destroy()


def test_a_stream_that_waits_for_an_event_keeps_ctx_sync(conn, monkeypatch):
    # [FENCE-EVENT-4], [CMD-CTX-SYNC-1]: CTX_SYNC waits for the events a timeline was told
    # to wait for, even with nothing after the wait on it
    drv = conn.devices[0].driver
    ctx, busy = conn.devices[0].create_context(), conn.devices[0].create_context()
    a = ctx.zeros(N, np.float32)
    other = ctx.create_stream()
    other.synchronize()
    busy.launch("burn", 1, 1, (200_000,))  # 200 ms on another context, then its event
    ev = busy.default_stream.record_event()
    other.wait_event(ev)
    sent = _recorded(monkeypatch, drv)
    ctx.launch("fill", 1, N, (a, 1.0, N))
    ctx.synchronize()
    assert sent[-2:] == [(wire.CMD_LAUNCH_BATCH, 0), (wire.CMD_CTX_SYNC, 0)]
    assert ev.query()  # complete: the CTX_SYNC waited for it
    ev.destroy()
    other.destroy()
    busy.destroy()
    ctx.destroy()
