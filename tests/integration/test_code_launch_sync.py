"""A code launch held back by the driver until its stream synchronizes, through a host
process (guest/frontend/driver.py `hold`, `send_fenced`; spec note under
[CMD-LAUNCH-BATCH-5]): the synchronize sends it with FLAG_FENCE as its sync point, one
LAUNCH_CODE chain instead of the launch and a NOP or CTX_SYNC; a context's only while its
other streams are known clean (guest/frontend/timelines.py: not with unsynchronized work, a
remembered error or an event wait there); its fault surfaces there once; large parameters
still travel in a buffer given back when answered; anything else the API does sends it
first, in order."""

import numpy as np
import pytest

from pvgpu import guest
from pvgpu.spec import wire

from test_launch_batch import _recorded
from test_modules import PTX

N = 4096
BURN_US = 20_000  # a built-in kernel before the code launch: the fence must wait for it


@pytest.fixture
def ctx(conn):
    with conn.devices[0].create_context("held") as c:
        yield c


def _saxpy(ctx):
    return ctx.load_module(PTX).get_function("saxpy")


def test_a_streams_synchronize_sends_its_held_code_launch_fenced(conn, ctx, monkeypatch):
    # [FENCE-SIGNAL-1]: answered when it and everything before it on its timeline completed
    drv = conn.devices[0].driver
    saxpy = _saxpy(ctx)
    x = np.arange(N, dtype=np.float32)
    dx, dy = ctx.to_device(x), ctx.zeros(N, np.float32)
    st = ctx.create_stream()
    st.launch("burn", 1, 1, (BURN_US,))
    saxpy.launch(4, 256, (np.float32(2.0), dx, dy, N), stream=st)
    sent = _recorded(monkeypatch, drv)
    st.synchronize()
    assert sent == [(wire.CMD_LAUNCH_CODE, wire.FLAG_INFO_RING_IDX | wire.FLAG_FENCE)]
    # read on the default stream, which is not ordered behind `st`: done because of the fence
    np.testing.assert_array_equal(dy.to_host(), 2.0 * x)
    sent.clear()
    st.synchronize()  # nothing held: the fenced NOP
    assert sent == [(wire.CMD_NOP, wire.FLAG_INFO_RING_IDX | wire.FLAG_FENCE)]
    st.destroy()


def test_a_context_of_one_stream_synchronizes_on_its_fenced_code_launch(conn, ctx, monkeypatch):
    drv = conn.devices[0].driver
    saxpy = _saxpy(ctx)
    x = np.ones(N, np.float32)
    dx, dy = ctx.to_device(x), ctx.zeros(N, np.float32)
    ctx.launch("burn", 1, 1, (BURN_US,))
    for _ in range(3):  # the first two go out as the next one comes
        saxpy.launch(4, 256, (np.float32(1.5), dx, dy, N))
    sent = _recorded(monkeypatch, drv)
    ctx.synchronize()
    assert sent == [(wire.CMD_LAUNCH_CODE, wire.FLAG_FENCE)]  # no CTX_SYNC
    np.testing.assert_array_equal(dy.to_host(), np.full(N, 4.5, np.float32))


def test_a_context_with_another_stream_keeps_ctx_sync(conn, ctx, monkeypatch):
    # [CMD-CTX-SYNC-1]: the other stream's work is waited for too
    drv = conn.devices[0].driver
    saxpy = _saxpy(ctx)
    a, b = ctx.zeros(N, np.float32), ctx.zeros(N, np.float32)
    ones = ctx.to_device(np.ones(N, np.float32))
    other = ctx.create_stream()
    other.launch("burn", 1, 1, (200_000,))  # 200 ms, then a fill on that stream
    other.launch("fill", N // 256, 256, (b, 5.0, N))
    sent = _recorded(monkeypatch, drv)
    saxpy.launch(4, 256, (np.float32(2.0), ones, a, N))
    ctx.synchronize()
    assert sent[-2:] == [(wire.CMD_LAUNCH_CODE, 0), (wire.CMD_CTX_SYNC, 0)]
    np.testing.assert_array_equal(a.to_host(), np.full(N, 2.0, np.float32))
    np.testing.assert_array_equal(b.to_host(), np.full(N, 5.0, np.float32))
    other.destroy()


def test_a_fault_of_the_held_code_launch_raises_at_the_synchronize_once(conn, ctx, monkeypatch):
    # [FENCE-ERROR-2]: the fenced launch reports the timeline's first error
    drv = conn.devices[0].driver
    mod = ctx.load_module(PTX)
    bad = 0x7E00_0000_0000  # in the user range, never mapped
    mod.get_function("store_at").launch(1, 1, (bad, 7))
    sent = _recorded(monkeypatch, drv)
    with pytest.raises(guest.PageFaultError) as e:
        ctx.synchronize()
    assert sent == [(wire.CMD_LAUNCH_CODE, wire.FLAG_FENCE)]
    assert e.value.address == bad
    ctx.synchronize()  # reported once: the next sync point is clean
    out = ctx.zeros(64, np.int32)
    mod.get_function("small_block").launch(1, 64, (out,))
    ctx.synchronize()
    np.testing.assert_array_equal(out.to_host(), np.arange(64))


def test_large_parameters_of_a_held_launch_are_sent_fenced_and_given_back(conn, ctx,
                                                                          monkeypatch):
    """A 256-byte struct by value travels in a buffer of its own (heap), held with it."""
    drv = conn.devices[0].driver
    mod = ctx.load_module(PTX)
    w = np.linspace(-1, 1, 64, dtype=np.float32)
    x = np.arange(64, dtype=np.float32)
    out, dx = ctx.empty(32, np.float32), ctx.to_device(x)
    heap = ctx.device.connection.session.heap
    free_before = heap.free_bytes
    sent = _recorded(monkeypatch, drv)
    for _ in range(3):
        mod.get_function("dot_big").launch(1, 32, (w.tobytes(), dx, out))
    ctx.synchronize()
    assert sent == [(wire.CMD_LAUNCH_CODE, 0)] * 2 + [(wire.CMD_LAUNCH_CODE, wire.FLAG_FENCE)]
    np.testing.assert_allclose(out.to_host(), np.full(32, np.dot(w, x)), rtol=1e-5)
    assert heap.free_bytes == free_before  # given back


def test_a_held_launch_keeps_its_place_among_built_in_launches_and_copies(conn, ctx,
                                                                          monkeypatch):
    # [CMD-LAUNCH-BATCH-5] / §7.1: the device sees the requests in the API's order
    drv = conn.devices[0].driver
    saxpy = _saxpy(ctx)
    x = np.arange(N, dtype=np.float32)
    dx, dy = ctx.to_device(x), ctx.zeros(N, np.float32)
    sent = _recorded(monkeypatch, drv)
    ctx.launch("fill", N // 256, 256, (dy, 1.0, N))
    saxpy.launch(4, 256, (np.float32(2.0), dx, dy, N))  # y = 2x + 1
    ctx.launch("fill", N // 256, 256, (dx, 3.0, N))  # then x = 3
    saxpy.launch(4, 256, (np.float32(1.0), dx, dy, N))  # y = 2x + 4
    got = dy.to_host()  # a copy: the held launch goes first
    np.testing.assert_array_equal(got, 2.0 * x + 4.0)
    assert [t for t, _f in sent][:4] == [wire.CMD_LAUNCH_BATCH, wire.CMD_LAUNCH_CODE,
                                         wire.CMD_LAUNCH_BATCH, wire.CMD_LAUNCH_CODE]
    assert all(f & wire.FLAG_FENCE == 0 for _t, f in sent[:4])


# ------------------- a context whose other timelines are known clean (guest/frontend/timelines.py)
def test_a_context_whose_other_stream_was_synchronized_syncs_on_its_held_launch(conn, ctx,
                                                                                monkeypatch):
    drv = conn.devices[0].driver
    saxpy = _saxpy(ctx)
    x = np.ones(N, np.float32)
    dx, dy, b = ctx.to_device(x), ctx.zeros(N, np.float32), ctx.zeros(N, np.float32)
    other = ctx.create_stream()
    saxpy.launch(4, 256, (np.float32(3.0), dx, b, N), stream=other)
    other.synchronize()
    sent = _recorded(monkeypatch, drv)
    ctx.launch("burn", 1, 1, (BURN_US,))
    saxpy.launch(4, 256, (np.float32(2.0), dx, dy, N))
    ctx.synchronize()
    assert sent == [(wire.CMD_LAUNCH_BATCH, 0), (wire.CMD_LAUNCH_CODE, wire.FLAG_FENCE)]
    np.testing.assert_array_equal(dy.to_host(), np.full(N, 2.0, np.float32))
    np.testing.assert_array_equal(b.to_host(), np.full(N, 3.0, np.float32))
    other.destroy()


def test_an_error_remembered_on_another_stream_keeps_ctx_sync_for_a_held_launch(conn, ctx,
                                                                              monkeypatch):
    drv = conn.devices[0].driver
    mod = ctx.load_module(PTX)
    saxpy = mod.get_function("saxpy")
    x = np.ones(N, np.float32)
    dx, dy = ctx.to_device(x), ctx.zeros(N, np.float32)
    other = ctx.create_stream()
    other.synchronize()
    bad = 0x7E00_0000_0000  # in the user range, never mapped
    mod.get_function("store_at").launch(1, 1, (bad, 7), stream=other)
    sent = _recorded(monkeypatch, drv)
    saxpy.launch(4, 256, (np.float32(2.0), dx, dy, N))
    with pytest.raises(guest.PageFaultError) as e:
        ctx.synchronize()
    assert e.value.address == bad
    assert sent[-2:] == [(wire.CMD_LAUNCH_CODE, 0), (wire.CMD_CTX_SYNC, 0)]
    np.testing.assert_array_equal(dy.to_host(), np.full(N, 2.0, np.float32))
    other.destroy()


def test_a_stream_that_waits_for_an_event_keeps_ctx_sync_for_a_held_launch(conn, ctx,
                                                                         monkeypatch):
    drv = conn.devices[0].driver
    saxpy = _saxpy(ctx)
    x = np.ones(N, np.float32)
    dx, dy = ctx.to_device(x), ctx.zeros(N, np.float32)
    other = ctx.create_stream()
    with conn.devices[0].create_context("busy") as busy:
        busy.launch("burn", 1, 1, (200_000,))  # 200 ms on another context, then its event
        ev = busy.default_stream.record_event()
        other.wait_event(ev)
        sent = _recorded(monkeypatch, drv)
        saxpy.launch(4, 256, (np.float32(2.0), dx, dy, N))
        ctx.synchronize()
        assert sent[-2:] == [(wire.CMD_LAUNCH_CODE, 0), (wire.CMD_CTX_SYNC, 0)]
        assert ev.query()  # complete: the CTX_SYNC waited for it
        ev.destroy()
    other.destroy()
