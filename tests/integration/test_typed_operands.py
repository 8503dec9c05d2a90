"""Typed operands against a real host (guest/api/operands.py, spec [KRN-ARGS-2]): a launch
refuses DeviceArrays whose dtype is not the element type of the kernel's pointer argument
(float32), and DeviceArray copies refuse host arrays of another dtype (TypeError) or shape
(ValueError), on every array class and with pinned memory, before anything reaches the
host. Bare device addresses and the byte-address copies of a Context stay untyped."""

import numpy as np
import pytest

from pvgpu import guest
from pvgpu.spec import wire

N = 1024
F32 = np.float32


@pytest.fixture
def ctx(conn):
    with conn.devices[0].create_context() as c:
        yield c


@pytest.fixture
def submits(ctx, monkeypatch):
    """The commands the context's driver submits, as a list of command types (but the
    MEM_FREEs of arrays that became garbage, which any call may send first)."""
    drv = ctx.device.driver
    sent = []
    submit = drv.submit

    def counting(command, *args, **kwargs):
        kind = int.from_bytes(command[:4], "little")
        if kind != wire.CMD_MEM_FREE:
            sent.append(kind)
        return submit(command, *args, **kwargs)
    monkeypatch.setattr(drv, "submit", counting)
    return sent


def _args(sig, arrays, n):
    """Arguments of `sig`: the pointer arguments from `arrays` in order, n for u32, 2 for f32."""
    it = iter(arrays)
    return tuple(next(it) if kind == wire.ARG_PTR else (n if kind == wire.ARG_U32 else 2.0)
                 for _name, kind in sig.args)


# ------------------------------------------------------------------ launches
def test_vector_add_on_other_dtypes_is_refused_before_submitting(ctx, submits):
    # [KRN-ARGS-2] a typed array of another element type is refused before submitting
    for dtype in (np.float64, np.int32, np.float16, np.dtype(">f4")):
        a = ctx.to_device(np.array([1, 2, 3, 4], dtype))
        submits.clear()
        with pytest.raises(TypeError, match=r"vector_add: argument 'a' must point at float32"):
            ctx.launch("vector_add", 1, 4, (a, a, a, 4))
        assert submits == []
    a64 = ctx.to_device(np.array([1, 2, 3, 4], np.float64))
    a32 = ctx.to_device(np.array([1, 2, 3, 4], F32))
    c32 = ctx.empty(4, F32)
    submits.clear()
    for args, bad in [((a32, a64, c32), "b"), ((a32, a32, a64), "c")]:
        with pytest.raises(TypeError, match=f"argument '{bad}'"):
            ctx.launch("vector_add", 1, 4, (*args, 4))
    assert submits == []
    ctx.launch("vector_add", 1, 4, (a32, a32, c32, 4))
    np.testing.assert_array_equal(c32.to_host(), [2, 4, 6, 8])


@pytest.mark.parametrize("sig", [s for s in wire.BUILTIN_KERNELS.values()
                                 if any(k == wire.ARG_PTR for _n, k in s.args)],
                         ids=lambda s: s.name)
def test_every_pointer_argument_of_every_kernel_is_checked(ctx, submits, sig):
    good = ctx.empty(64, F32)
    bad = ctx.empty(64, np.int32)
    ptrs = [n for n, k in sig.args if k == wire.ARG_PTR]
    assert all(sig.elem_type(n) == wire.ELEM_F32 for n in ptrs)
    submits.clear()
    for i, name in enumerate(ptrs):
        arrays = [bad if j == i else good for j in range(len(ptrs))]
        with pytest.raises(TypeError, match=f"{sig.name}: argument '{name}'"):
            ctx.launch(sig.name, 1, 1, _args(sig, arrays, 8))
    assert submits == []
    ctx.launch(sig.name, 1, 1, _args(sig, [good] * len(ptrs), 8))
    ctx.synchronize()


def test_bare_addresses_stay_untyped_and_arrays_of_other_contexts_are_refused(conn, ctx):
    # [KRN-ARGS-2] an untyped VA is passed as is
    a = ctx.to_device(np.arange(N, dtype=F32))
    ints = ctx.to_device(np.zeros(N, np.int32))
    ctx.launch("scale", N // 256, 256, (ints.ptr, a.ptr, 1.0, N))  # raw VAs: no check
    np.testing.assert_array_equal(ints.to_host().view(F32), np.arange(N, dtype=F32))
    with conn.devices[0].create_context() as other:
        b = other.empty(N, F32)
        with pytest.raises(ValueError, match="belongs to context"):
            ctx.launch("scale", N // 256, 256, (b, a, 1.0, N))
    with pytest.raises(TypeError, match="DeviceArray or a device address"):
        ctx.launch("scale", N // 256, 256, (np.zeros(N, F32), a, 1.0, N))


# ------------------------------------------------------------------ copies
def _refusals(arr, pinned_of):
    """(call, exception, message) of every copy of `arr` that must be refused."""
    shape, dtype = arr.shape, arr.dtype
    other = np.float64 if dtype != np.float64 else F32
    flat = (arr.size,) if len(shape) != 1 else (1, arr.size)
    return [
        (lambda: arr.copy_from_host(np.ones(shape, other)), TypeError, "dtype"),
        (lambda: arr.copy_from_host(np.ones(flat, dtype)), ValueError, "shape"),
        (lambda: arr.copy_from_host_async(np.ones(shape, other)), TypeError, "dtype"),
        (lambda: arr.copy_from_host_async(np.ones(flat, dtype)), ValueError, "shape"),
        (lambda: arr.copy_from_host(np.full(shape, 1 + 1j).tolist()), TypeError, "cast"),
        (lambda: arr.copy_from_host([[1.0, "x"]]), TypeError, "cast"),
        (lambda: arr.copy_from_host([1] * (arr.size + 1)), ValueError, "shape"),
        (lambda: arr.copy_from_host(1), ValueError, "shape"),
        (lambda: arr.copy_from_host(other(1)), TypeError, "dtype"),
        (lambda: arr.to_host(out=np.empty(shape, other)), TypeError, "dtype"),
        (lambda: arr.to_host(out=np.empty(flat, dtype)), ValueError, "shape"),
        (lambda: arr.to_host_async(np.empty(shape, other)), TypeError, "dtype"),
        (lambda: arr.to_host_async(np.empty(flat, dtype)), ValueError, "shape"),
        (lambda: arr.to_host(out=np.empty(shape[::-1] + (2,), dtype)[..., 0].T), ValueError,
         "contiguous"),
        (lambda: arr.to_host(out=[0.0] * arr.size), TypeError, "ndarray"),
        (lambda: arr.copy_from_host(pinned_of(shape, other)), TypeError, "dtype"),
        (lambda: arr.to_host(out=pinned_of(shape, other)), TypeError, "dtype"),
        (lambda: arr.to_host_async(pinned_of(flat, dtype)), ValueError, "shape"),
    ]


def _check_array(arr, conn, submits):
    data = np.arange(arr.size, dtype=arr.dtype).reshape(arr.shape)
    arr.copy_from_host(data)
    pins = []

    def pinned_of(shape, dtype):
        pins.append(conn.pinned_zeros(shape, dtype))
        return pins[-1]
    submits.clear()
    for call, exc, what in _refusals(arr, pinned_of):
        with pytest.raises(exc, match=what):
            call()
    assert submits == []  # nothing reached the host
    np.testing.assert_array_equal(arr.to_host(), data)
    # Python data takes the array's dtype
    arr.copy_from_host((data + 2).tolist())
    np.testing.assert_array_equal(arr.to_host(), data + 2)
    if arr.dtype.kind == "i":
        with pytest.raises(TypeError, match="cast"):
            arr.copy_from_host(np.full(arr.shape, 0.5).tolist())
        with pytest.raises(OverflowError):
            arr.copy_from_host(np.full(arr.shape, 1 << 40, dtype=np.int64).tolist())
    # matching arrays work: pageable, non-contiguous source, pinned both ways
    arr.copy_from_host(np.asfortranarray(data + 1))
    p = pinned_of(arr.shape, arr.dtype)
    assert arr.to_host(out=p) is p
    np.testing.assert_array_equal(p, data + 1)
    arr.copy_from_host(p * 0 + 5)
    arr.copy_from_host_async(p)
    out = arr.to_host_async(np.empty(arr.shape, arr.dtype))
    arr.context.synchronize()
    np.testing.assert_array_equal(out, p)
    for q in pins:
        q.free()


def test_device_array_copies_are_typed(conn, ctx, submits):
    _check_array(ctx.empty((16, 32), F32), conn, submits)
    _check_array(ctx.empty(N, np.int32), conn, submits)


def test_mapped_shared_and_imported_arrays_copy_typed_too(conn, ctx, submits):
    a = ctx.empty(N, F32)
    r = ctx.reserve_va(4 * N)
    m = ctx.map(a, r, shape=(32, 32))
    _check_array(m, conn, submits)
    m.unmap()
    r.release()
    seg = ctx.shm_get("typed-copies", 4 * N)
    s = seg.attach(ctx, (N,), np.int32)
    _check_array(s, conn, submits)
    s.detach()
    seg.remove()
    with conn.devices[1].create_context() as ctx1:
        imp = ctx1.import_array(a.export(), (N // 2, 2), F32)
        _check_array(imp, conn, submits)
        imp.free()


def test_byte_address_copies_stay_untyped(ctx):
    a = ctx.empty(N, F32)
    ctx.copy_h2d(a.ptr, np.arange(N // 2, dtype=np.float64))  # the same bytes
    raw = np.empty(N * 4, np.uint8)
    ctx.copy_d2h(a.ptr, raw)
    np.testing.assert_array_equal(raw.view(np.float64), np.arange(N // 2, dtype=np.float64))
    with pytest.raises(ValueError, match="writable C-contiguous"):  # it would receive nothing
        ctx.copy_d2h(a.ptr, np.empty((N, 2), F32)[:, :1])
