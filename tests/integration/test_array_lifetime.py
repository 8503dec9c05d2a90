"""The lifetime of arrays against a real host (guest/api/lifetime.py): a DeviceArray or
PinnedArray that becomes garbage gives its memory back at the next API call, however its
finalizer ran (at once, in a reference cycle, in another thread, inside another call);
nothing is freed twice after a destroy, a reset or a close; views own nothing; a freed
array says so when used; bad shapes are refused at allocation."""

import gc
import subprocess
import sys
import threading
import weakref

import numpy as np
import pytest

from pvgpu import guest
from pvgpu.spec import wire

MiB = 1 << 20
N = 4096


@pytest.fixture
def ctx(conn):
    with conn.devices[0].create_context() as c:
        yield c


@pytest.fixture
def gc_off():
    """Cyclic garbage stays until a gc.collect (the API's own, or the test's)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def spy_commands(monkeypatch, drv) -> list:
    """-> the list the command types `drv` submits from now on are appended to."""
    sent = []
    submit = drv.submit

    def spy(command, *args, **kwargs):
        sent.append(int.from_bytes(command[:4], "little"))
        return submit(command, *args, **kwargs)
    monkeypatch.setattr(drv, "submit", spy)
    return sent


# ------------------------------------------------------------------ dropped arrays free their memory
def test_dropping_arrays_in_a_loop_never_runs_out_of_device_memory(conn, ctx):
    """The 256 MiB device holds three 64 MiB arrays; each loop allocates six times that."""
    for _ in range(24):
        a = ctx.empty(64 * MiB, np.uint8)
        del a
        gc.collect()
    for i in range(24):  # rebinding drops the previous array at once
        a = ctx.empty(64 * MiB, np.uint8)
    a.copy_from_host(np.full(64 * MiB, 7, np.uint8))
    assert np.all(a.to_host() == 7)
    del a
    ctx.device.nop()  # the next API call frees it
    assert conn._releases.pending == 0 and conn._releases.freed >= 48


def test_arrays_in_reference_cycles_are_collected_when_memory_runs_out(conn, ctx, gc_off):
    for _ in range(24):  # an allocation that runs out collects the cycles and tries again
        a = ctx.empty(64 * MiB, np.uint8)
        a.me = a  # only the cyclic garbage collector can drop it
        del a
    assert conn._releases.freed > 0


def test_a_finalizer_inside_another_call_only_queues_the_free(conn, ctx, gc_off, monkeypatch):
    data = np.arange(N, dtype=np.float32)
    d = ctx.to_device(data)
    junk = ctx.empty(MiB, np.uint8)
    junk.me = junk
    ref = weakref.ref(junk)
    del junk
    drv = ctx.device.driver
    sent = spy_commands(monkeypatch, drv)
    submit = drv.submit

    def collect_then_submit(command, *args, **kwargs):
        gc.collect()  # the finalizer runs here, in the middle of a copy holding the lock
        return submit(command, *args, **kwargs)
    monkeypatch.setattr(drv, "submit", collect_then_submit)
    ctx.device.staging_chunk = 4096  # the copy is four requests
    d.copy_from_host(2 * data)
    assert ref() is None and conn._releases.pending == 1
    assert wire.CMD_MEM_FREE not in sent and sent.count(wire.CMD_COPY_H2D) == 4
    monkeypatch.setattr(drv, "submit", submit)
    np.testing.assert_array_equal(d.to_host(), 2 * data)
    assert sent[-5] == wire.CMD_MEM_FREE and conn._releases.pending == 0  # first, then 4 D2H


def test_a_finalizer_in_another_thread_never_waits_for_the_lock(conn, ctx):
    box = [ctx.empty(MiB, np.uint8)]
    freed = conn._releases.freed
    with conn._conn_lock:  # as if another thread's call were running
        t = threading.Thread(target=box.clear)  # the last reference goes in that thread
        t.start()
        t.join(60)
        assert not t.is_alive() and conn._releases.pending == 1
    ctx.synchronize()
    assert conn._releases.pending == 0 and conn._releases.freed == freed + 1


def test_work_still_using_a_dropped_array_completes(ctx):
    data = np.arange(N, dtype=np.float32)
    src = ctx.to_device(data)
    out = ctx.empty(N, np.float32)
    with ctx.create_stream() as s:
        s.launch("burn", 1, 1, (20_000,))
        s.launch("scale", N // 256, 256, (out, src, 3.0, N))
        del src  # MEM_FREE waits for the stream's work (spec CMD-FREE-2)
        ctx.device.nop()
        s.synchronize()
    np.testing.assert_array_equal(out.to_host(), 3 * data)


def test_dropped_pinned_arrays_come_back_at_the_next_call(conn):
    for _ in range(16):  # 128 MiB through a 32 MiB guest memory
        p = conn.pinned_empty(8 * MiB, np.uint8)
        p[:] = 1
        del p
    conn.devices[0].nop()
    live = conn._pinned.live
    assert live == 0 and conn._pinned.live_bytes == 0
    p = conn.pinned_empty(MiB, np.uint8)
    view = p[10:]
    del p
    conn.devices[0].nop()
    assert conn._pinned.live == live + 1  # a view keeps it
    del view
    conn.devices[1].nop()  # any call gives it back
    assert conn._pinned.live == live


# ------------------------------------------------------------------ nothing is freed twice
def test_after_destroy_reset_and_close_dropping_frees_nothing(shared_host, monkeypatch):
    with guest.connect(shared_host.endpoint, mem_size=32 * MiB) as conn:
        _destroy_reset_close(conn, monkeypatch)


def _destroy_reset_close(conn, monkeypatch):
    dev = conn.devices[0]
    sent = spy_commands(monkeypatch, dev.driver)
    ctx = dev.create_context()
    a, b = ctx.empty(N), ctx.empty(N)
    ctx.destroy()
    del a
    b.free()  # a no-op: the context freed it
    dev.nop()
    ctx = dev.create_context()
    c = ctx.empty(N)
    dev.reset()
    del c
    dev.nop()
    assert wire.CMD_MEM_FREE not in sent
    ctx = dev.create_context()
    d, e = ctx.empty(N), ctx.empty(N)
    d.me = d
    conn.close()
    del d
    gc.collect()
    e.free()
    assert e.freed and conn._releases.freed == 0 and wire.CMD_MEM_FREE not in sent


EXIT_SCRIPT = """
import sys, numpy as np, pvgpu.guest as guest
conn = guest.connect(sys.argv[1], mem_size=32 << 20)
ctx = conn.devices[0].create_context()
kept = [ctx.empty(1 << 20, np.uint8) for _ in range(3)]
cycle = ctx.empty(1 << 20, np.uint8)
cycle.me = cycle
pinned = conn.pinned_empty(1 << 20, np.uint8)
if sys.argv[2] == "close":
    conn.close()
print("done")
"""


@pytest.mark.parametrize("how", ["open", "close"])
def test_interpreter_exit_with_live_arrays_is_quiet(shared_host, how):
    proc = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, shared_host.endpoint, how],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr


# ------------------------------------------------------------------ views, free(), use after free
def test_dropped_views_keep_their_mapping_and_attachment(conn, ctx):
    data = np.arange(N, dtype=np.float32)
    a = ctx.to_device(data)
    rid = a.resource_id
    r = ctx.reserve_va(4 * N)
    m = ctx.map(a, r)
    va = m.ptr
    del m
    gc.collect()
    out = ctx.empty(N, np.float32)
    ctx.launch("scale", N // 256, 256, (out, va, 1.0, N))  # the mapping lives on
    np.testing.assert_array_equal(out.to_host(), data)
    freed = conn._releases.freed
    del a  # still mapped: its MEM_FREE is refused, and retried after the unmap
    ctx.synchronize()
    assert ctx._mapped_frees == [rid] and conn._releases.freed == freed
    ctx.launch("scale", N // 256, 256, (out, va, 2.0, N))
    np.testing.assert_array_equal(out.to_host(), 2 * data)
    ctx.unmap(va)
    ctx.synchronize()
    assert ctx._mapped_frees == [] and conn._releases.freed == freed + 1
    r.release()
    # a dropped SharedArray leaves the attachment
    seg = ctx.shm_get("lifetime", 4 * N)
    s = seg.attach(ctx, (N,), np.float32)
    s_va = s.ptr
    del s
    gc.collect()
    assert seg.info(ctx)["va"] == s_va and seg.info()["nattach"] == 1
    ctx.shm_detach(seg)
    seg.remove()
    # a dropped ImportedArray ends its import; the exporter's array is untouched
    with conn.devices[1].create_context() as ctx1:
        b = ctx.to_device(data)
        imp = ctx1.import_array(b.export(), (N,), np.float32)
        np.testing.assert_array_equal(imp.to_host(), data)
        del imp
        ctx1.synchronize()
        assert conn._releases.freed == freed + 2
        np.testing.assert_array_equal(b.to_host(), data)


def test_a_freed_array_says_so_when_used(conn, ctx):
    x = np.ones(N, np.float32)
    a = ctx.to_device(x)
    b = ctx.empty(N, np.float32)
    r = ctx.reserve_va(4 * N)
    a.free()
    a.free()  # a second free() does nothing
    assert a.freed
    uses = [lambda: a.to_host(), lambda: a.to_host_async(), lambda: a.copy_from_host(x),
            lambda: a.copy_from_host_async(x), lambda: a.export(), lambda: ctx.map(a, r),
            lambda: ctx.launch("fill", 1, 1, (a, 1.0, 1)), lambda: ctx.memcpy_peer(b, a),
            lambda: ctx.memcpy_peer(a, b)]
    for use in uses:
        with pytest.raises(guest.InvalidResourceError, match=r"DeviceArray .* was freed"):
            use()
    m = ctx.map(b, r)
    m.unmap()
    m.free()
    with pytest.raises(guest.InvalidResourceError, match=r"MappedArray .* was unmapped"):
        m.to_host()
    seg = ctx.shm_get("freed", 4 * N)
    s = seg.attach(ctx, (N,), np.float32)
    s.detach()
    s.detach()
    with pytest.raises(guest.InvalidResourceError, match=r"SharedArray .* was detached"):
        ctx.launch("fill", 1, 1, (s, 1.0, 1))
    seg.remove()
    with conn.devices[1].create_context() as ctx1:
        imp = ctx1.import_array(b.export(), (N,), np.float32)
        imp.free()
        with pytest.raises(guest.InvalidResourceError, match=r"ImportedArray .* was freed"):
            imp.to_host()
    ctx.destroy()
    with pytest.raises(guest.InvalidContextError):
        b.to_host()
    b.free()  # the context freed it: nothing to do


# ------------------------------------------------------------------ shapes at allocation
@pytest.mark.parametrize("shape, dtype, exc", [
    (-5, np.float32, ValueError), ((3, -1), np.float32, ValueError),
    ((2**32, 2**32), np.float32, ValueError), (1 << 62, np.float32, ValueError),
    ("10", np.float32, TypeError), (2.5, np.float32, TypeError), ((2, 2.0), np.float32, TypeError),
    (True, np.float32, TypeError), (None, np.float32, TypeError), (4, object, TypeError),
    (1 << 61, np.float32, guest.OutOfMemoryError),  # the wire carries it, the device cannot
])
def test_bad_shapes_are_refused_at_allocation(conn, ctx, shape, dtype, exc):
    for alloc in (ctx.empty, ctx.zeros):
        with pytest.raises(exc):
            alloc(shape, dtype)
    # pinned memory comes from guest memory, which runs out first
    pinned_exc = MemoryError if exc is guest.OutOfMemoryError else exc
    for alloc in (conn.pinned_empty, conn.pinned_zeros):
        with pytest.raises(pinned_exc):
            alloc(shape, dtype)
    ctx.synchronize()  # the context carries on


def test_good_shapes(ctx):
    for shape, want in [(5, (5,)), (np.int64(5), (5,)), ((2, 3), (2, 3)), ([2, np.uint8(3)], (2, 3)),
                        ((), ()), (0, (0,)), ((4, 0), (4, 0))]:
        a = ctx.zeros(shape, np.float32)
        assert a.shape == want and all(type(d) is int for d in a.shape)
        assert a.nbytes == 4 * int(np.prod(want)) and a.to_host().shape == want
