"""Memory of pvgpu.cuda: allocations, unified addressing, copies and memsets.

Unified addressing. A CUDA program passes bare addresses around and expects the API to know
what they are. The facade keeps registries of its live allocations, by address:
  - device memory (cuMemAlloc, cudaMalloc) and module variables (cuModuleGetGlobal), by
    device VA. Each context has its own slot of the device address space
    (pvgpu/cuda/_state.py), so the VAs of all contexts of the process are distinct, and
    the slot's range of the process's own address space is reserved, so no host memory
    has such an address;
  - pinned host memory (cuMemAllocHost, cudaMallocHost, cudaHostAlloc) and managed memory
    (cudaMallocManaged), by host address: they are guest-API pinned memory, i.e. blocks of
    the session's guest memory, at real addresses of this process (ctypes.from_address
    works on them);
  - the same blocks by their guest-window VA (GUEST_WINDOW_VA + gpa): the device address
    at which every context reaches guest memory (spec/pvgpu.md §3.4).
Any other address is pageable host memory. cudaMemcpyDefault and cuMemcpy infer their
direction from that, and copies between contexts or devices go through an import of the
source (or destination) buffer when the contexts may reach each other (same device, or
peer access enabled), else through pinned host memory.

Mapped and managed memory (shared memory model only: in the inline model the device's
writes to guest memory do not reach the guest, spec [MEM-WINDOW-5]). The device reaches
pinned memory through the guest window: cuMemHostGetDevicePointer and
cudaHostGetDevicePointer give its window VA, and a kernel that reads or writes there works
on the host's bytes directly (zero copy). cudaMallocManaged returns the host address (so
that the host uses it as is) and kernels get it translated: a 64-bit kernel argument
holding an address inside a pinned or managed block is replaced by the block's window VA
(cuLaunchKernel, pvgpu/cuda/_launch.py). Likewise an argument holding a device address of
another context whose device this context has peer access to becomes the address of an
import of that buffer here. Addresses stored inside device memory or structs are not
translated.
"""

from __future__ import annotations

import bisect
import ctypes
import itertools

import numpy as np

from pvgpu.cuda import handles
from pvgpu.cuda._errors import CudaError, check
from pvgpu.cuda.enums import CUresult as R
from pvgpu.spec import wire

DEVICE, GLOBAL, PINNED, MANAGED = "device", "global", "pinned", "managed"
MEMSET_CHUNK = 4 << 20  # bytes of pattern uploaded per copy of a device memset
STAGE_CHUNK = 8 << 20  # bytes per pinned bounce buffer of a copy between unrelated devices


class Span:
    """One live allocation: `base` is the address the application sees (a device VA, or a
    host address for pinned and managed memory), `array` the guest API object that owns
    (or, for a module variable, views) the memory."""

    _ids = itertools.count(1)
    __slots__ = ("id", "kind", "base", "size", "ctx", "array", "gpa", "flags")

    def __init__(self, kind, base, size, ctx=None, array=None, gpa=None, flags=0):
        self.id = next(Span._ids)
        self.kind, self.base, self.size, self.ctx = kind, base, size, ctx
        self.array, self.gpa, self.flags = array, gpa, flags

    @property
    def on_device(self) -> bool:
        return self.kind in (DEVICE, GLOBAL)

    @property
    def window_va(self) -> int:
        return wire.GUEST_WINDOW_VA + self.gpa

    def __repr__(self) -> str:
        return f"<Span {self.kind} {self.base:#x}+{self.size:#x}>"


class IntervalMap:
    """Disjoint [start, start + size) ranges -> Span, found by any address inside."""

    def __init__(self):
        self._starts = []
        self._spans = []

    def add(self, start: int, span: Span) -> None:
        i = bisect.bisect_right(self._starts, start)
        end = start + max(span.size, 1)
        if (i > 0 and self._starts[i - 1] + max(self._spans[i - 1].size, 1) > start) or \
                (i < len(self._starts) and self._starts[i] < end):
            raise CudaError(R.CUDA_ERROR_UNKNOWN, f"{span!r} overlaps a live allocation")
        self._starts.insert(i, start)
        self._spans.insert(i, span)

    def remove(self, start: int) -> None:
        i = bisect.bisect_left(self._starts, start)
        if i < len(self._starts) and self._starts[i] == start:
            del self._starts[i], self._spans[i]

    def find(self, addr: int):
        """-> (span, offset) of the range holding `addr`, or (None, 0)."""
        i = bisect.bisect_right(self._starts, addr) - 1
        if i >= 0:
            off = addr - self._starts[i]
            if off < max(self._spans[i].size, 1):
                return self._spans[i], off
        return None, 0

    def spans(self) -> list:
        return list(self._spans)

    def __len__(self) -> int:
        return len(self._spans)


class Where:
    """A resolved address: on the device (`ctx`, device VA `address`) or in host memory
    (host `address`, `view`: a uint8 array over it when known)."""

    __slots__ = ("on_device", "span", "offset", "address", "ctx", "view", "limit")

    def __init__(self, on_device, address, span=None, offset=0, ctx=None, view=None, limit=None):
        self.on_device, self.address, self.span, self.offset = on_device, address, span, offset
        self.ctx, self.view, self.limit = ctx, view, limit


def host_buffer(obj, writable: bool):
    """-> (address, nbytes, uint8 view) of a host object given as a pointer: a buffer
    (numpy array, ctypes object, bytearray, bytes) or an int address (nbytes/view None).
    TypeError for anything else."""
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise CudaError(R.CUDA_ERROR_INVALID_VALUE, "a host array must be C-contiguous")
        if writable and not obj.flags.writeable:
            raise CudaError(R.CUDA_ERROR_INVALID_VALUE, "the destination array is read-only")
        view = obj.reshape(-1).view(np.uint8)
        return obj.__array_interface__["data"][0], obj.nbytes, view
    if isinstance(obj, (ctypes._SimpleCData, ctypes.Structure, ctypes.Union, ctypes.Array)) \
            and not isinstance(obj, ctypes.c_void_p):
        n = ctypes.sizeof(obj)
        view = np.frombuffer((ctypes.c_uint8 * n).from_buffer(obj), np.uint8) if n else np.empty(0, np.uint8)
        return ctypes.addressof(obj), n, view
    if isinstance(obj, ctypes.c_void_p):
        return obj.value or 0, None, None
    if isinstance(obj, (bytes, bytearray, memoryview)):
        view = np.frombuffer(obj, np.uint8)
        if writable and not isinstance(obj, bytearray) and view.flags.writeable is False:
            raise CudaError(R.CUDA_ERROR_INVALID_VALUE, "the destination buffer is read-only")
        addr = view.__array_interface__["data"][0] if view.size else 0
        return addr, view.nbytes, view
    return handles.value_of(obj), None, None


def raw_view(address: int, n: int) -> np.ndarray:
    """A writable uint8 array over n bytes of this process's memory at `address`."""
    if n == 0:
        return np.empty(0, np.uint8)
    check(address, R.CUDA_ERROR_INVALID_VALUE, "a NULL host pointer")
    return np.frombuffer((ctypes.c_uint8 * n).from_address(address), np.uint8)


class Memory:
    def __init__(self, facade):
        self.f = facade
        self.device = IntervalMap()  # device VA -> DEVICE / GLOBAL span
        self.host = IntervalMap()  # host address -> PINNED / MANAGED span
        self.window = IntervalMap()  # window VA -> PINNED / MANAGED span
        self._imports = {}  # (span id, ctx id, p2p) -> ImportedArray

    # ------------------------------------------------------------------ allocations
    def alloc_device(self, ctx, nbytes: int) -> Span:
        check(nbytes > 0, R.CUDA_ERROR_INVALID_VALUE, "an allocation of 0 bytes")
        arr = ctx.guest.empty((nbytes,), np.uint8)
        span = Span(DEVICE, arr.ptr, nbytes, ctx, arr)
        try:
            self.device.add(arr.ptr, span)
        except CudaError:
            arr.free()
            raise
        return span

    def add_global(self, ctx, arr) -> Span:
        span = Span(GLOBAL, arr.ptr, arr.nbytes, ctx, arr)
        self.device.add(arr.ptr, span)
        return span

    def drop_global(self, span: Span) -> None:
        self._forget_imports(span)
        self.device.remove(span.base)

    def free_device(self, ptr) -> None:
        """cuMemFree / cudaFree: device memory, or managed memory (by its address)."""
        value = handles.value_of(ptr)
        mspan, moff = self.host.find(value)
        if mspan is not None and mspan.kind == MANAGED and moff == 0:
            return self.free_host(value, kinds=(MANAGED,))
        span, off = self.device.find(value)
        check(span is not None and off == 0 and span.kind == DEVICE, R.CUDA_ERROR_INVALID_VALUE,
              f"{value:#x} is not the start of a live device allocation")
        self._forget_imports(span)
        self.device.remove(span.base)
        if not span.ctx.destroyed:
            span.array.free()

    def alloc_host(self, nbytes: int, kind: str = PINNED, flags: int = 0) -> Span:
        check(nbytes > 0, R.CUDA_ERROR_INVALID_VALUE, "an allocation of 0 bytes")
        arr = self.f.conn.pinned_empty((nbytes,), np.uint8)
        addr = arr.__array_interface__["data"][0]
        span = Span(kind, addr, nbytes, None, arr, arr.gpa, flags)
        self.host.add(addr, span)
        self.window.add(span.window_va, span)
        return span

    def free_host(self, ptr, kinds=(PINNED,)) -> None:
        addr = host_buffer(ptr, False)[0]
        span, off = self.host.find(addr)
        if span is None:
            span, off = self.window.find(addr)
        check(span is not None and off == 0 and span.kind in kinds, R.CUDA_ERROR_INVALID_VALUE,
              f"{addr:#x} is not the start of a live {' or '.join(kinds)} host allocation")
        self.host.remove(span.base)
        self.window.remove(span.window_va)
        span.array.free()

    def host_span(self, ptr):
        """-> (span, offset) of the pinned or managed block holding host pointer `ptr` (a
        host address, its window VA, or a buffer over it); (None, 0) otherwise."""
        addr = host_buffer(ptr, False)[0]
        span, off = self.host.find(addr)
        if span is None:
            span, off = self.window.find(addr)
        return span, off

    def drop_context(self, ctx) -> None:
        """Forget what dies with `ctx`: its allocations and the imports made into it."""
        for span in self.device.spans():
            if span.ctx is ctx:
                self._forget_imports(span)
                self.device.remove(span.base)
        for key in [k for k in self._imports if k[1] == ctx.id]:
            del self._imports[key]

    # ------------------------------------------------------------------ imports
    def imported(self, span: Span, ctx):
        """`span`'s buffer imported into `ctx` (once per peer-access state), peer-to-peer
        when ctx has peer access to its device; freed with the buffer (_forget_imports)."""
        p2p = span.ctx.device.index in ctx.peers
        key = (span.id, ctx.id, p2p)
        imp = self._imports.get(key)
        if imp is None:
            check(span.kind == DEVICE, R.CUDA_ERROR_INVALID_VALUE,
                  "module variables cannot be reached from another context")
            src = span.array
            handle = src.export()
            try:
                imp = ctx.guest.import_array(handle, (span.size,), np.uint8, peer2peer=p2p)
            finally:
                span.ctx.device.guest.revoke(handle)
            self._imports[key] = imp
        return imp

    def _forget_imports(self, span: Span) -> None:
        for key in [k for k in self._imports if k[0] == span.id]:
            imp = self._imports.pop(key)
            ctx = self.f.objects.get(key[1])
            if ctx is not None and not ctx.destroyed:
                imp.free()

    # ------------------------------------------------------------------ addresses
    def where(self, ptr, *, device: bool | None = None, writable: bool = False,
              ctx=None) -> Where:
        """Resolve a pointer argument. device=True: it must be a device address (an unknown
        one is taken as a VA of `ctx`, default the current context); device=False: host
        memory; None: whatever the registries say (unified addressing)."""
        if device is not True:
            addr, limit, view = host_buffer(ptr, writable)
            if view is not None and device is None:
                device = False
        else:
            addr, limit, view = handles.value_of(ptr), None, None
        span, off = self.device.find(addr)
        if span is not None and device is not False:
            return Where(True, addr, span, off, span.ctx)
        hspan, hoff = self.host.find(addr)
        if hspan is None:
            hspan, hoff = self.window.find(addr)
        if hspan is not None:
            if device is True and not self.f.mappable:
                raise CudaError(R.CUDA_ERROR_INVALID_VALUE,
                                f"{addr:#x} is host memory, which the device cannot reach in "
                                "the inline memory model")
            return Where(False, hspan.base + hoff, hspan, hoff, None)
        if device is True:
            return Where(True, addr, None, 0, ctx or self.f.current())
        check(span is None, R.CUDA_ERROR_INVALID_VALUE, f"{addr:#x} is device memory")
        return Where(False, addr, None, 0, None, view, limit)

    def kernel_pointer(self, ctx, value: int) -> int:
        """The address a kernel of `ctx` must get for 64-bit argument `value`."""
        span, off = self.device.find(value)
        if span is not None:
            if span.ctx is not ctx and span.ctx.device is not ctx.device \
                    and span.ctx.device.index in ctx.peers and span.kind == DEVICE:
                return self.imported(span, ctx).ptr + off
            return value
        span, off = self.host.find(value)
        if span is not None and self.f.mappable:
            return span.window_va + off
        return value

    def _host_view(self, w: Where, n: int) -> np.ndarray:
        if w.span is not None:
            return w.span.array[w.offset:w.offset + n]
        if w.view is not None:
            return w.view[:n]
        return raw_view(w.address, n)

    def _check_room(self, w: Where, n: int) -> None:
        if w.span is not None:
            check(w.offset + n <= w.span.size, R.CUDA_ERROR_INVALID_VALUE,
                  f"{n} bytes at {w.address:#x} run past the end of its allocation {w.span!r}")
        elif w.limit is not None:
            check(n <= w.limit, R.CUDA_ERROR_INVALID_VALUE,
                  f"{n} bytes do not fit the host buffer of {w.limit}")

    # ------------------------------------------------------------------ copies
    def copy(self, dst: Where, src: Where, n: int, stream=None, async_: bool = False) -> None:
        """Copy n bytes; `stream` is a stream handle (None/0: the NULL stream)."""
        n = int(n)
        check(n >= 0, R.CUDA_ERROR_INVALID_VALUE, "a negative byte count")
        self._check_room(dst, n)
        self._check_room(src, n)
        if n == 0:
            return
        if not dst.on_device and not src.on_device:
            self._sync_stream(stream)
            self._host_view(dst, n)[:] = self._host_view(src, n)
        elif dst.on_device and not src.on_device:
            ctx, s = self._issuer(dst.ctx, stream)
            hv = self._host_view(src, n)
            (ctx.guest.copy_h2d_async if async_ else ctx.guest.copy_h2d)(dst.address, hv, s)
        elif src.on_device and not dst.on_device:
            ctx, s = self._issuer(src.ctx, stream)
            hv = self._host_view(dst, n)
            (ctx.guest.copy_d2h_async if async_ else ctx.guest.copy_d2h)(src.address, hv, s)
        else:
            self._d2d(dst, src, n, stream)

    def _sync_stream(self, stream) -> None:
        """Host-side work in stream order: wait for the stream's earlier work first."""
        if handles.value_of(stream) not in (0, 1, 2):
            self.f.stream(stream, None).synchronize()
        elif self.f.current(required=False) is not None:
            self.f.current().guest.default_stream.synchronize()

    def _issuer(self, ctx, stream):
        """(context, guest Stream) for work on `ctx`'s memory: a stream handle of `ctx`, or
        the NULL stream of ctx."""
        sctx = self.f.stream_ctx(stream)
        check(sctx is None or sctx is ctx, R.CUDA_ERROR_INVALID_VALUE,
              "the stream belongs to another context than the memory")
        return ctx, self.f.stream(stream, ctx)

    def _d2d(self, dst: Where, src: Where, n: int, stream) -> None:
        dctx, sctx = dst.ctx, src.ctx
        if dctx is sctx:
            ctx, s = self._issuer(dctx, stream)
            ctx.guest.copy_d2d(dst.address, src.address, n, s)
            return
        check(dst.span is not None and src.span is not None, R.CUDA_ERROR_INVALID_VALUE,
              "a copy between contexts needs allocations of the facade on both sides")
        if dctx.device is sctx.device or sctx.device.index in dctx.peers:
            imp = self.imported(src.span, dctx)
            ctx, s = self._issuer(dctx, self._stream_in(stream, dctx))
            ctx.guest.copy_d2d(dst.address, imp.ptr + src.offset, n, s)
        elif dctx.device.index in sctx.peers:
            imp = self.imported(dst.span, sctx)
            ctx, s = self._issuer(sctx, self._stream_in(stream, sctx))
            ctx.guest.copy_d2d(imp.ptr + dst.offset, src.address, n, s)
        else:  # devices that do not reach each other: through pinned host memory
            self._staged(dst, src, n)

    def _stream_in(self, stream, ctx):
        """`stream` if it belongs to ctx, else the NULL stream."""
        return stream if self.f.stream_ctx(stream) is ctx else 0

    def _staged(self, dst: Where, src: Where, n: int) -> None:
        chunk = min(n, STAGE_CHUNK)
        buf = self.f.conn.pinned_empty((chunk,), np.uint8)
        try:
            for off in range(0, n, chunk):
                size = min(chunk, n - off)
                src.ctx.guest.copy_d2h(src.address + off, buf[:size])
                dst.ctx.guest.copy_h2d(dst.address + off, buf[:size])
        finally:
            buf.free()

    # ------------------------------------------------------------------ memset
    def memset(self, dst: Where, pattern: bytes, count: int, stream=None,
               async_: bool = False) -> None:
        """Fill `count` elements of len(pattern) bytes at dst with `pattern`."""
        count = int(count)
        width = len(pattern)
        check(count >= 0, R.CUDA_ERROR_INVALID_VALUE, "a negative element count")
        check(dst.address % width == 0, R.CUDA_ERROR_INVALID_VALUE,
              f"{dst.address:#x} is not aligned to the {width}-byte elements")
        n = count * width
        self._check_room(dst, n)
        if n == 0:
            return
        if not dst.on_device:  # managed or pinned memory: after the stream's earlier work
            self._sync_stream(stream)
            view = self._host_view(dst, n)
            view[:] = np.frombuffer(pattern * count, np.uint8)
            return
        ctx, s = self._issuer(dst.ctx, stream)
        chunk = min(n, MEMSET_CHUNK // width * width)
        src = np.frombuffer(pattern * (chunk // width), np.uint8)
        copy = ctx.guest.copy_h2d_async if async_ else ctx.guest.copy_h2d
        for off in range(0, n, chunk):
            copy(dst.address + off, src[:min(chunk, n - off)], s)

