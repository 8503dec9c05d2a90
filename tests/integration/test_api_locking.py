"""Every public method of the guest API runs under the connection lock.

The API's objects share one connection whose frontend (rings, request slots, guest memory
heap, bounce chunks) is not thread-safe, so each public method must hold the connection
lock (`conn._conn_lock`, an RLock) whenever it reaches the frontend. The lock is taken by
construction (guest/api/locking.py): the API's classes derive from `ApiObject`, which wraps
every public method and property they define with `api`, unless the member is marked
`@unlocked(reason)`.

Static half: every public method and property of every API class is wrapped, or marked
unlocked with its reason; every ApiObject class is checked; a class that adds a method
gets it wrapped without doing anything, and the check sees a method that bypassed the
construction. Dynamic half: the driver's entry points and the guest memory heap are
instrumented to record any use without the lock held by the calling thread, and every
public method is called from outside the API (not only through another wrapped method)
against a real host, in both memory models; the test also checks that it called all of
them.
"""

import inspect
import sys
import threading
import traceback
import weakref

import numpy as np
import pytest

from pvgpu import guest
from pvgpu.guest.api import array, connection, context, device, event, locking, module, pinned, prime
from pvgpu.guest.api import shm, stream
from pvgpu.guest.frontend.driver import DeviceNeedsReset as FrontendNeedsReset
from pvgpu.guest.frontend.driver import VirtioGpuDriver, command
from pvgpu.guest.frontend.heap import GuestHeap
from pvgpu.guest.frontend.session import FrontendSession
from pvgpu.spec import wire

CLASSES = (connection.Connection, device.Device, context.Context, stream.Stream, event.Event,
           array.DeviceArray, array.MappedArray, array.VaRange, shm.SharedSegment,
           shm.SharedArray, prime.ImportedArray, pinned.PinnedArray, module.Module,
           module.Function, module.ModuleGlobal)
N = 4096  # float32 elements of the arrays the dynamic test uses
SCALE_PTX = """
.version 8.0
.target sm_80
.address_size 64
.global .align 4 .f32 factor = 1.0;
.visible .entry scale(.param .u64 p_x, .param .u32 p_n)
{
    .reg .pred %p<2>; .reg .b32 %r<6>; .reg .f32 %f<3>; .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [p_x]; ld.param.u32 %r1, [p_n];
    mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd2, %rd1, %rd3;
    ld.global.f32 %f2, [%rd2];
    ld.global.f32 %f1, [factor];
    mul.f32 %f2, %f2, %f1;
    st.global.f32 [%rd2], %f2;
DONE:
    ret;
}
"""


def _own_bases(cls):
    """The classes of cls's MRO that belong to the API (not object, not numpy.ndarray)."""
    return [c for c in cls.__mro__ if c.__module__.startswith("pvgpu.guest.")]


def public_members(cls) -> dict:
    """-> {name: (defining class, function or property)} of cls's public methods and
    properties (dunder methods are not part of the check)."""
    out = {}
    for base in reversed(_own_bases(cls)):
        for name, attr in vars(base).items():
            if name.startswith("_"):
                continue
            if isinstance(attr, (staticmethod, classmethod)):
                attr = attr.__func__
            if isinstance(attr, property) or inspect.isfunction(attr):
                out[name] = (base, attr)
    return out


def all_members() -> dict:
    """-> {(defining class name, name): function or property} over CLASSES."""
    return {(b.__name__, n): a for cls in CLASSES for n, (b, a) in public_members(cls).items()}


def locked(fn) -> bool:
    return bool(getattr(fn, "api_locked", False))


def covered(fn) -> bool:
    """Wrapped by `api`, or marked unlocked with a reason."""
    return locked(fn) or bool(getattr(fn, "unlocked_reason", ""))


def uncovered(members: dict) -> list:
    """-> the members (of all_members' form) that run without the lock and do not say why."""
    out = []
    for (cls, name), attr in members.items():
        accessors = [attr.fget, attr.fset, attr.fdel] if isinstance(attr, property) else [attr]
        if not all(fn is None or covered(fn) for fn in accessors):
            out.append(f"{cls}.{name}")
    return out


def api_classes() -> set:
    """Every ApiObject class the API defines (guest.* modules), however deep."""
    found, todo = set(), [locking.ApiObject]
    while todo:
        for sub in todo.pop().__subclasses__():
            home = sys.modules.get(sub.__module__)  # (not the probes the tests below make)
            if sub not in found and getattr(home, sub.__name__, None) is sub \
                    and sub.__module__.startswith("pvgpu.guest."):
                found.add(sub)
                todo.append(sub)
    return found


# ------------------------------------------------------------------------ static half
def test_every_public_method_is_wrapped_or_marked_unlocked():
    bad = uncovered(all_members())
    assert not bad, ("public API members that run without the connection lock and do not "
                     f"say why (derive the class from ApiObject, or mark @unlocked): {bad}")


def test_unlocked_members_give_their_reason_and_are_not_wrapped():
    for key, attr in all_members().items():
        fn = attr.fget if isinstance(attr, property) else attr
        if hasattr(fn, "unlocked_reason"):
            assert fn.unlocked_reason.strip(), key
            assert not locked(fn), f"{key} is marked unlocked and wrapped"
        if isinstance(attr, property) and attr.fset is not None:
            assert locked(attr.fset), f"{key}: a setter changes state: it takes the lock"


def test_every_api_class_is_checked_and_built_on_the_lock():
    assert api_classes() == set(CLASSES), api_classes() ^ set(CLASSES)
    exported = {getattr(guest, n) for n in guest.__all__ if inspect.isclass(getattr(guest, n))}
    with_state = {c for c in exported if not issubclass(c, Exception)
                  and c not in (guest.EventHandle, guest.BufferHandle, guest.ShmHandle)}
    assert with_state <= set(CLASSES), with_state - set(CLASSES)
    assert all(issubclass(c, locking.ApiObject) for c in CLASSES)


def test_a_new_method_is_locked_by_construction():
    def new_method(self):
        return "new"

    def getter(self):
        return 1

    probe = type("Probe", (array.DeviceArray,), {"new_method": new_method,
                                                 "new_property": property(getter),
                                                 "__module__": "pvgpu.guest.api.probe"})
    members = public_members(probe)
    assert locked(members["new_method"][1]) and locked(members["new_property"][1].fget)
    assert locked(members["to_host"][1]) and not locked(members["nbytes"][1].fget)
    assert members["new_method"][1].__wrapped__ is new_method
    assert "view" not in public_members(pinned.PinnedArray)  # numpy's methods are not ours


def test_the_check_sees_a_method_that_bypassed_the_construction():
    probe = type("Probe", (array.DeviceArray,), {"__module__": "pvgpu.guest.api.probe"})
    probe.late = lambda self: None  # set after the class was made: never wrapped
    members = {("Probe", n): a for n, (_b, a) in public_members(probe).items()}
    assert uncovered(members) == ["Probe.late"]


def test_a_public_static_or_class_method_must_say_it_is_unlocked():
    with pytest.raises(TypeError, match="unlocked"):
        type("Probe", (locking.ApiObject,), {"make": classmethod(lambda cls: cls())})
    with pytest.raises(ValueError):
        locking.unlocked("")
    marked = type("Probe", (locking.ApiObject,),
                  {"make": staticmethod(locking.unlocked("no state")(lambda: 1))})
    assert marked.make() == 1


# ------------------------------------------------------------------------ dynamic half
ENTRY_POINTS = [(VirtioGpuDriver, n) for n in ("submit", "call", "wait", "reap", "kick",
                                               "fail_all", "initialize")] + \
               [(GuestHeap, "alloc"), (GuestHeap, "free"),
                (FrontendSession, "wait_for"), (FrontendSession, "kick")]


class LockProbe:
    """Instruments the frontend to record uses without the connection lock, and the API's
    public members to record which ones the test called from outside the API."""

    def __init__(self, monkeypatch):
        self.locks = weakref.WeakKeyDictionary()  # frontend object -> its connection's lock
        self.violations = []
        self.called = set()
        self._depth = threading.local()
        self._instrument_frontend(monkeypatch)
        self._instrument_api(monkeypatch)

    def _instrument_frontend(self, monkeypatch):
        probe = self
        init = connection.Connection.__init__

        def connection_init(conn, session):
            init(conn, session)
            for obj in (session, session.heap, *session.devices):
                probe.locks[obj] = conn._conn_lock
        monkeypatch.setattr(connection.Connection, "__init__", connection_init)
        for cls, name in ENTRY_POINTS:
            monkeypatch.setattr(cls, name, self._checked(cls, name, getattr(cls, name)))

    def _checked(self, cls, name, fn):
        probe = self

        def entry(obj, *args, **kwargs):
            lock = probe.locks.get(obj)
            if lock is not None and not lock._is_owned():
                probe.violations.append(f"{cls.__name__}.{name} without the connection lock:\n"
                                        + "".join(traceback.format_stack(limit=10)[:-1]))
            return fn(obj, *args, **kwargs)
        return entry

    def _instrument_api(self, monkeypatch):
        for (cls_name, name), attr in all_members().items():
            cls = next(c for c in CLASSES for c in c.__mro__ if c.__name__ == cls_name)
            if isinstance(attr, property):
                fset = attr.fset and self._recorded((cls_name, name + "="), attr.fset)
                new = property(self._recorded((cls_name, name), attr.fget), fset, None, attr.__doc__)
            else:
                new = self._recorded((cls_name, name), attr)
            monkeypatch.setattr(cls, name, new)

    def _recorded(self, key, fn):
        probe = self

        def call(*args, **kwargs):
            depth = getattr(probe._depth, "n", 0)
            if depth == 0:
                probe.called.add(key)
            probe._depth.n = depth + 1
            try:
                return fn(*args, **kwargs)
            finally:
                probe._depth.n = depth
        return call

    def expected(self) -> set:
        out = set()
        for key, attr in all_members().items():
            out.add(key)
            if isinstance(attr, property) and attr.fset is not None:
                out.add((key[0], key[1] + "="))
        return out


def exercise(conn) -> None:
    """Call every public member of the API's classes directly."""
    d0, d1 = conn.devices
    host = np.arange(N, dtype=np.float32)
    out = np.empty(N, np.float32)
    assert conn.memory_model in wire.MEMORY_MODELS and conn.endpoint
    conn.vgpu
    p = conn.pinned_empty(N, np.float32)
    conn.pinned_zeros(8).free()
    conn.pinned_array(host).free()
    d0.pinned_empty(8).free()
    d0.pinned_zeros(8).free()
    d0.pinned_array([1.0, 2.0]).free()
    assert p.pinned and not p.freed and p.gpa > 0
    d0.name, d0.vram_size, d0.features, d0.memory_model, d0.events
    d0.staging_chunk = 64 << 10  # several bounce chunks per copy
    assert d0.staging_chunk == 64 << 10
    d0.can_access_peer(d1)
    d0.peer_info(d1)
    d0.info()
    d0.stats()
    d0.nop()
    d0.call_raw(command(wire.CMD_NOP))

    ctx = d0.create_context("locking")
    ctx1 = d1.create_context("peer")
    assert ctx in d0.contexts and ctx.default_stream in ctx.streams
    assert not ctx.faulted and ctx.faults == []
    s = ctx.create_stream()
    assert s.device is d0 and not s.is_default
    a = ctx.to_device(host)
    b = ctx.zeros(N)
    c = ctx.empty(N)
    assert (a.va, a.size, a.nbytes) == (a.ptr, N, 4 * N)
    assert (a.ndim, a.itemsize, a.strides) == (1, 4, (4,))
    a.reshape(N // 4, 4)[1].copy().set(a.get()[4:8])
    ctx.empty(8).fill(1.0)
    ctx.launch("vector_add", N // 256, 256, (a, a, c, N))
    s.launch("scale", N // 256, 256, (b, a, 2.0, N))
    ev = s.record_event()
    ctx.default_stream.wait_event(ev)
    ev.synchronize()
    ev.query()
    e2 = ctx.create_event()
    e2.record()
    e2.synchronize()
    ev.timestamp_ns
    ev.elapsed_time(e2)
    handle = e2.export()
    ctx.import_event(handle).destroy()
    d0.import_event(handle).destroy()
    ev.destroy()
    e2.destroy()
    s.synchronize()
    ctx.synchronize()
    d0.synchronize()

    # copies: pageable and pinned, synchronous and asynchronous, through arrays and raw
    np.testing.assert_array_equal(c.to_host(), 2 * host)
    assert c.to_host(out=p) is p
    c.to_host_async(out, stream=s)
    b.to_host_async(p, stream=s)
    s.synchronize()
    np.testing.assert_array_equal(out, 2 * host)
    np.testing.assert_array_equal(p, 2 * host)
    c.copy_from_host(host)
    c.copy_from_host(p)
    c.copy_from_host_async(host, s)
    c.copy_from_host_async(p, s)
    ctx.copy_h2d(c.ptr, host)
    ctx.copy_h2d_async(c.ptr, p, s)
    ctx.copy_d2h(c.ptr, out)
    ctx.copy_d2h_async(c.ptr, out, s)
    ctx.copy_d2h_async(c.ptr, p, s)
    ctx.copy_d2d(b.ptr, a.ptr, 4 * N)
    s.synchronize()
    np.testing.assert_array_equal(b.to_host(), host)

    # explicit VA management
    r = ctx.reserve_va(4 * 4 * N)
    assert r.end == r.va + r.size
    m = ctx.map(a, r)
    np.testing.assert_array_equal(m.to_host(), host)
    m.unmap()
    ctx.map(a, r).free()
    ctx.unmap(ctx.map(a, r))
    r.release()
    ctx.release_va(ctx.reserve_va(4096))
    rid, _va, _size = ctx.alloc(4096)
    array.DeviceArray(ctx, rid, _va, (1024,), np.float32).free()

    # shared device memory
    seg = d0.shm_get("locking", 4 * N)
    assert seg.size >= 4 * N and seg is ctx.shm_get("locking")
    sa = seg.attach(ctx, (N,), np.float32)
    sa.copy_from_host(host)
    seg.detach(ctx)
    ctx.shm_attach(seg, (N,)).detach()
    ctx.shm_attach(seg, (N,)).free()
    ctx.shm_attach(seg, (N,))
    ctx.shm_detach(seg)
    seg.info(ctx)
    shm_handle = seg.export()
    assert ctx.shm_import(shm_handle) is seg
    with pytest.raises(guest.DeviceError):  # a segment of the other device
        d1.shm_import(shm_handle)
    seg.remove()

    # buffers shared between devices
    bh = a.export()
    imp = ctx1.import_array(bh, (N,), np.float32)
    np.testing.assert_array_equal(imp.to_host(), host)
    imp.free()
    d0.revoke(bh)
    if d1.can_access_peer(d0):
        ctx1.enable_peer_access(d0)
    ctx1.disable_peer_access(d0)
    dst = ctx1.empty(N)
    ctx1.memcpy_peer(dst, a)
    np.testing.assert_array_equal(dst.to_host(), host)

    # modules: kernels of one's own
    mod = ctx.load_module(SCALE_PTX)
    assert mod.function_names == ["scale"] and mod.global_names == ["factor"] and mod.va
    fn = mod.get_function("scale")
    assert fn.num_regs and fn.max_threads_per_block == 1024 and fn.param_size == 12
    assert (fn.shared_size_bytes, fn.local_size_bytes, len(fn.params)) == (0, 0, 2)
    factor = mod.get_global("factor", np.float32)
    factor.copy_from_host(np.array([3.0], np.float32))
    fn.launch(N // 256, 256, (b, N))
    fn[N // 256, 256](b, N)
    np.testing.assert_array_equal(b.to_host(), 9 * host)
    factor.free()
    mod.unload()

    s.destroy()
    a.free()
    p.free()
    assert p.freed
    ctx.destroy()
    ctx1.destroy()
    d1.reset()
    conn.close()


@pytest.mark.parametrize("memory", ["shared", "inline"])
def test_every_public_method_holds_the_lock_at_the_frontend(shared_host, monkeypatch, memory):
    probe = LockProbe(monkeypatch)
    with guest.connect(shared_host.endpoint, memory=memory, mem_size=32 << 20) as conn:
        exercise(conn)
    assert not probe.violations, "\n".join(probe.violations[:3])
    missing = probe.expected() - probe.called
    assert not missing, f"public API members the test did not call: {sorted(missing)}"


def test_the_probe_sees_a_call_without_the_lock(shared_host, monkeypatch):
    probe = LockProbe(monkeypatch)
    with guest.connect(shared_host.endpoint, mem_size=32 << 20) as conn:
        conn.devices[0].nop()
        assert not probe.violations
        conn.devices[0].driver.call(command(wire.CMD_NOP))  # the raw driver, no lock
        assert probe.violations and "VirtioGpuDriver.call" in probe.violations[0]


def test_asynchronous_copy_errors_are_translated(conn):
    """copy_d2h_async and to_host_async, pinned and pageable: a frontend error becomes the
    API's exception (DeviceNeedsReset, not the frontend's)."""
    dev = conn.devices[0]
    ctx = dev.create_context()
    d = ctx.to_device(np.arange(N, dtype=np.float32))
    p = conn.pinned_empty(N, np.float32)
    dev.driver.fail_all(FrontendNeedsReset("the test failed the device"))
    for call in (lambda: d.to_host_async(p), lambda: d.to_host_async(),
                 lambda: ctx.copy_d2h_async(d.ptr, p), lambda: ctx.copy_d2h_async(d.ptr, out)):
        out = np.empty(N, np.float32)
        with pytest.raises(guest.DeviceNeedsReset):
            call()
    dev.reset()
    with dev.create_context() as ctx2:
        np.testing.assert_array_equal(ctx2.to_device(np.ones(4, np.float32)).to_host(), 1)
    p.free()
