"""guest/api/lifetime.py without a host: the queue of resources whose arrays became
garbage, drained at safe points; what a drain does with each outcome of MEM_FREE."""

import gc
import struct
import threading
from types import SimpleNamespace

import pytest

from pvgpu.guest.api import lifetime
from pvgpu.guest.frontend.driver import DeviceNeedsReset, DeviceResponseError
from pvgpu.spec import wire


class FakeDriver:
    def __init__(self, answer=None):
        self.needs_reset = False
        self.freed = []  # resource ids of MEM_FREEs
        self.answer = answer  # an exception to raise, or None

    def call(self, cmd):
        hdr = struct.unpack_from(wire.CTRL_HDR_FORMAT, cmd)
        assert hdr[0] == wire.CMD_MEM_FREE
        rid = struct.unpack_from("<I", cmd, wire.CTRL_HDR_SIZE)[0]
        if self.answer is not None:
            raise self.answer
        self.freed.append((hdr[3], rid))
        return wire.RESP_OK_NODATA, b""


def setup(answer=None):
    session = SimpleNamespace(closed=False, host_lost=False)
    conn = SimpleNamespace(session=session,
                           _pinned=SimpleNamespace(drain=lambda: None, garbage=[]))
    releases = lifetime.Releases(conn)
    drv = FakeDriver(answer)
    ctx = SimpleNamespace(ctx_id=3, destroyed=False, _driver=drv, _mapped_frees=[])
    return releases, ctx, drv


class Owner:
    def __init__(self, ctx, rid):
        self.context, self.resource_id = ctx, rid



def test_a_dropped_owner_is_freed_at_the_next_drain_only():
    rel, ctx, drv = setup()
    a = Owner(ctx, 7)
    fin = rel.track(a)
    assert not fin.atexit  # the session's end frees everything
    del a
    assert rel.pending == 1 and drv.freed == []  # the finalizer only queued it
    rel.drain()
    assert drv.freed == [(3, 7)] and rel.pending == 0 and rel.freed == 1
    b = Owner(ctx, 8)
    rel.track(b).detach()  # freed explicitly: the finalizer is gone
    del b
    rel.drain()
    assert drv.freed == [(3, 7)]


def test_finalizers_of_other_threads_and_cycles_only_queue():
    rel, ctx, drv = setup()
    objs = [Owner(ctx, i) for i in range(1, 5)]
    for o in objs:
        rel.track(o)
    del o
    objs[0].me = objs[0]
    t = threading.Thread(target=objs.clear)
    t.start()
    t.join(60)
    gc.collect()
    assert rel.pending == 4 and drv.freed == []
    rel.drain()
    assert sorted(rid for _c, rid in drv.freed) == [1, 2, 3, 4]


@pytest.mark.parametrize("gone", ["destroyed", "closed", "host_lost", "needs_reset"])
def test_nothing_is_freed_when_the_context_device_or_session_freed_it(gone):
    rel, ctx, drv = setup()
    if gone == "destroyed":
        ctx.destroyed = True
    elif gone == "needs_reset":
        drv.needs_reset = True
    else:
        setattr(rel.connection.session, gone, True)
    a = Owner(ctx, 7)
    rel.track(a)
    del a
    rel.drain()
    assert drv.freed == [] and rel.pending == 0 and rel.freed == 0


def test_a_free_refused_while_mapped_is_retried_after_an_unmap():
    rel, ctx, drv = setup(DeviceResponseError(wire.RESP_ERR_INVALID_PARAMETER, "still mapped"))
    a = Owner(ctx, 7)
    rel.track(a)
    del a
    rel.drain()
    assert ctx._mapped_frees == [7] and rel.pending == 0
    drv.answer = None
    rel.retry_mapped(ctx)
    assert ctx._mapped_frees == [] and rel.pending == 1
    rel.drain()
    assert drv.freed == [(3, 7)]


@pytest.mark.parametrize("answer", [
    DeviceResponseError(wire.RESP_ERR_CONTEXT_LOST, "lost"),
    DeviceResponseError(wire.RESP_ERR_INVALID_CONTEXT_ID, "gone"),
    DeviceNeedsReset("reset"),
])
def test_a_free_the_device_cannot_do_is_dropped(answer):
    rel, ctx, drv = setup(answer)
    a, b = Owner(ctx, 7), Owner(ctx, 8)
    rel.track(a)
    rel.track(b)
    del a, b
    rel.drain()  # raises nothing into the unrelated call that drains
    assert rel.pending == 0 and ctx._mapped_frees == [] and rel.freed == 0


def test_an_interrupted_drain_keeps_the_entry_and_drains_are_not_nested():
    rel, ctx, drv = setup(KeyboardInterrupt())
    a = Owner(ctx, 7)
    rel.track(a)
    del a
    with pytest.raises(KeyboardInterrupt):
        rel.drain()
    assert rel.pending == 1  # not lost
    drv.answer = None
    nested = []
    call = drv.call

    def call_and_drain(cmd):
        rel.drain()  # a nested API call while draining: does nothing
        nested.append(rel.pending)
        return call(cmd)
    drv.call = call_and_drain
    b = Owner(ctx, 8)
    rel.track(b)
    del b
    rel.drain()
    assert sorted(rid for _c, rid in drv.freed) == [7, 8] and nested == [1, 0]
