"""The driver's kick policy through a host process (spec VQ-NOTIFY-6): asynchronous
launches and copies on a stream share kicks, and every API call that can observe their
completion (a synchronize, an event query or synchronize, a synchronous copy) kicks them
first. Kicks are counted where the session sends them; in the inline model every kick the
driver decides is sent (it carries the memory), so the counts do not depend on timing.
Launches are one chain each on a device without PVGPU_F_LAUNCH_BATCH (the `unbatched`
connection); with it, a run of them is one chain (tests/integration/test_launch_batch.py)."""

import math

import numpy as np
import pytest

from pvgpu import guest
from pvgpu.spec import wire


@pytest.fixture(params=["shared", "inline"])
def unbatched(request, shared_host):
    """A guest session whose devices do not negotiate PVGPU_F_LAUNCH_BATCH."""
    features = wire.DEVICE_FEATURES & ~(1 << wire.PVGPU_F_LAUNCH_BATCH)
    with guest.connect(shared_host.endpoint, memory=request.param, mem_size=32 << 20,
                       features=features) as c:
        yield c


@pytest.fixture
def kicks(request):
    """The control-queue kicks the session of the test's connection sends, counted."""
    conn = request.getfixturevalue("unbatched" if "unbatched" in request.fixturenames else "conn")
    session = conn.session
    sent = []
    real = session.kick

    def kick(dev, queue=wire.CONTROLQ):
        if queue == wire.CONTROLQ:
            sent.append(dev)
        real(dev, queue)
    session.kick = kick
    try:
        yield sent
    finally:
        session.kick = real


def test_async_launches_share_kicks_and_synchronize_kicks_the_rest(unbatched, kicks):
    conn = unbatched
    ctx = conn.devices[0].create_context()
    drv = conn.devices[0].driver
    drv.kick_batch = 8
    arr = ctx.zeros(256, np.float32)
    st = ctx.create_stream()
    kicks.clear()
    n = 21
    for i in range(n):
        st.launch("fill", 1, 256, (arr, float(i), 256))
    assert drv.deferred == n % 8
    if conn.memory_model == "inline":
        assert len(kicks) == n // 8
    st.synchronize()  # its NOP goes out in the same kick as the deferred launches
    assert drv.deferred == 0
    if conn.memory_model == "inline":
        assert len(kicks) == math.ceil((n + 1) / 8)
    np.testing.assert_array_equal(arr.to_host(), np.full(256, n - 1, np.float32))
    ctx.destroy()


def test_event_query_and_synchronize_kick_what_the_event_waits_behind(conn, kicks):
    ctx = conn.devices[0].create_context()
    drv = conn.devices[0].driver
    arr = ctx.zeros(256, np.float32)
    st = ctx.create_stream()
    ev = ctx.create_event()
    st.launch("fill", 1, 256, (arr, 2.0, 256))
    ev.record(st)  # a call: kicks the launch with it
    assert drv.deferred == 0
    for value in (3.0, 4.0):
        st.launch("fill", 1, 256, (arr, value, 256))
    assert drv.deferred == 1  # one open LAUNCH_BATCH holds both
    while not ev.query():  # the query kicks the two launches before it asks
        assert drv.deferred == 0
    assert drv.deferred == 0
    ev.record(st)
    st.launch("fill", 1, 256, (arr, 5.0, 256))
    ev.synchronize()
    assert drv.deferred == 0
    st.synchronize()
    np.testing.assert_array_equal(arr.to_host(), np.full(256, 5.0, np.float32))
    ctx.destroy()


def test_async_copies_are_deferred_and_a_synchronous_copy_kicks_them(conn, kicks):
    ctx = conn.devices[0].create_context()
    drv = conn.devices[0].driver
    a = ctx.zeros(64, np.float32)
    b = ctx.zeros(4096, np.float32)
    st = ctx.create_stream()
    small = np.arange(64, dtype=np.float32)
    big = np.arange(4096, dtype=np.float32)
    a.copy_from_host_async(small, stream=st)  # in its command's descriptor
    b.copy_from_host_async(big, stream=st)  # through a bounce chunk
    assert drv.deferred == 2
    out = b.to_host(stream=st)  # synchronous: kicks the copies before its own
    assert drv.deferred == 0
    np.testing.assert_array_equal(out, big)
    np.testing.assert_array_equal(a.to_host(stream=st), small)
    ctx.destroy()


def test_many_async_launches_complete_in_order_on_every_stream(conn):
    ctx = conn.devices[0].create_context()
    streams = [ctx.create_stream() for _ in range(3)]
    arrs = [ctx.zeros(256, np.float32) for _ in streams]
    for i in range(100):
        for s, arr in zip(streams, arrs):
            s.launch("fill", 1, 256, (arr, float(i + s.ring_idx), 256))
    ctx.synchronize()
    assert conn.devices[0].driver.deferred == 0
    for s, arr in zip(streams, arrs):
        np.testing.assert_array_equal(arr.to_host(), np.full(256, 99 + s.ring_idx, np.float32))
    ctx.destroy()
