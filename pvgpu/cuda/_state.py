"""The process-wide state behind pvgpu.cuda: one guest connection, the devices, the contexts
(each a guest Context) with their streams, events, modules and functions, the handles the
application holds for them, and each thread's current context.

The connection is made on first need (cuInit, or the first runtime call): endpoint from
PVGPU_ENDPOINT (default: the local endpoint), memory model from PVGPU_MEMORY ("shared",
the default, or "inline"), guest memory size from PVGPU_MEM_SIZE (e.g. 512M; pinned,
mapped and managed host memory come out of it). `pvgpu.cuda.connect()` sets them
explicitly, `pvgpu.cuda.shutdown()` ends the connection and forgets every handle.

Contexts: cuCtxCreate makes a new guest context; each device has one primary context
(cuDevicePrimaryCtxRetain, and the runtime's context for that device), made on first use.
Each thread has a stack of current contexts (cuCtxPush/PopCurrent, cuCtxSetCurrent
replaces its top); a runtime call with no current context makes the primary context of the
thread's device (cudaSetDevice, default 0) current, as CUDA's runtime does.

Unified addressing: every context of the process gets its own slot of the device address
space (SLOT_SIZE bytes; pvgpu/cuda/_memory.py explains why), by reserving the range below
the slot with VA_RESERVE in the new context: the device then places the context's
allocations in its slot. The same range of the process's own address space is reserved too
(PROT_NONE), so that no host memory can have the address of a device allocation.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import sys
import threading

from pvgpu.cuda import _errors, handles
from pvgpu.cuda._errors import CudaError, check
from pvgpu.cuda.enums import CUresult as R
from pvgpu.spec import wire

SLOT_SIZE = 1 << 41  # device VA per context (2 TiB)
SLOT_COUNT = (wire.VA_USER_LIMIT - wire.VA_USER_BASE) // SLOT_SIZE


def slot_range(slot: int) -> tuple:
    start = wire.VA_USER_BASE + slot * SLOT_SIZE
    return start, start + SLOT_SIZE


class _HostRanges:
    """Reserves ranges of this process's address space (mmap PROT_NONE, never replacing a
    mapping): where that fails, something of the process lives there."""

    _MAP_PRIVATE, _MAP_ANONYMOUS, _MAP_NORESERVE, _MAP_FIXED_NOREPLACE = 0x2, 0x20, 0x4000, 0x100000

    def __init__(self):
        self.held = set()
        self._libc = None
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                libc.mmap.restype = ctypes.c_void_p
                libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                      ctypes.c_int, ctypes.c_int, ctypes.c_long]
                libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
                self._libc = libc
            except (OSError, AttributeError):
                self._libc = None

    def reserve(self, start: int, size: int) -> bool:
        if start in self.held:
            return True
        if self._libc is None:  # no way to check: the slot's device range still works
            return True
        flags = self._MAP_PRIVATE | self._MAP_ANONYMOUS | self._MAP_NORESERVE | self._MAP_FIXED_NOREPLACE
        got = self._libc.mmap(start, size, 0, flags, -1, 0)
        if got is None or got == ctypes.c_void_p(-1).value:
            return False
        if got != start:  # a kernel without MAP_FIXED_NOREPLACE took it as a hint
            self._libc.munmap(got, size)
            return False
        self.held.add(start)
        return True


_HOST_RANGES = _HostRanges()  # for the whole process: kept across shutdown()


class DeviceState:
    def __init__(self, index: int, guest_device, mappable: bool):
        self.index = index
        self.guest = guest_device
        self.mappable = mappable
        self.primary = None  # the primary Ctx, once made
        self.primary_refs = 0
        self.flags = 0  # cudaSetDeviceFlags

    @property
    def handle(self) -> handles.CUdevice:
        return handles.CUdevice(self.index)

    def info(self) -> dict:
        return {"index": self.index, "name": self.guest.name, "vram": self.guest.vram_size,
                "mappable": self.mappable}


class Ctx:
    def __init__(self, ident: int, device: DeviceState, guest_ctx, slot: int, primary: bool,
                 flags: int):
        self.id = ident
        self.device = device
        self.guest = guest_ctx
        self.slot = slot
        self.primary = primary
        self.flags = flags
        self.peers = set()  # device indices this context may reach peer-to-peer
        self.streams = {}  # id -> Strm
        self.events = {}  # id -> Ev
        self.modules = {}  # id -> Mod
        self.destroyed = False
        self.filler = None  # the VaRange below the context's slot

    @property
    def handle(self) -> handles.CUcontext:
        return handles.CUcontext(self.id)


class Strm:
    def __init__(self, ident: int, ctx: Ctx, guest_stream, flags: int, priority: int = 0):
        self.id, self.ctx, self.guest, self.flags, self.priority = ident, ctx, guest_stream, flags, priority

    @property
    def handle(self) -> handles.CUstream:
        return handles.CUstream(self.id)


class Ev:
    def __init__(self, ident: int, ctx: Ctx, guest_event, flags: int):
        self.id, self.ctx, self.guest, self.flags = ident, ctx, guest_event, flags

    @property
    def handle(self) -> handles.CUevent:
        return handles.CUevent(self.id)


class Mod:
    def __init__(self, ident: int, ctx: Ctx, guest_module, cobj, ptx_version: int):
        self.id, self.ctx, self.guest, self.cobj = ident, ctx, guest_module, cobj
        self.ptx_version = ptx_version
        self.functions = {}  # name -> Fn
        self.globals = {}  # name -> Span

    @property
    def handle(self) -> handles.CUmodule:
        return handles.CUmodule(self.id)


class Fn:
    def __init__(self, ident: int, mod: Mod, guest_function):
        self.id, self.mod, self.guest = ident, mod, guest_function

    @property
    def handle(self) -> handles.CUfunction:
        return handles.CUfunction(self.id)


class Facade:
    """Everything pvgpu.cuda knows in this process (see the module docstring)."""

    def __init__(self, endpoint=None, memory=None, mem_size=None):
        from pvgpu.cuda._memory import Memory

        self.endpoint = endpoint
        self.memory_model = memory
        self.mem_size = mem_size
        self.conn = None
        self.devices = []
        self.objects = {}  # handle value -> Ctx / Strm / Ev / Mod / Fn
        self._ids = itertools.count(0x1000)
        self.slots = {}  # slot -> Ctx
        self.memory = Memory(self)
        self.tls = threading.local()
        self.initialized = False  # cuInit was called (or the runtime connected)

    # ------------------------------------------------------------------ connection
    def connect(self) -> None:
        if self.conn is not None:
            return
        from pvgpu import guest
        from pvgpu.cli import parse_size
        from pvgpu.transport.channel import ChannelError

        endpoint = self.endpoint or os.environ.get("PVGPU_ENDPOINT") or None
        memory = self.memory_model or os.environ.get("PVGPU_MEMORY") or wire.MEMORY_SHARED
        check(memory in wire.MEMORY_MODELS, R.CUDA_ERROR_INVALID_VALUE,
              f"PVGPU_MEMORY={memory!r}: expected one of {', '.join(wire.MEMORY_MODELS)}")
        mem_size = self.mem_size
        if mem_size is None and os.environ.get("PVGPU_MEM_SIZE"):
            try:
                mem_size = parse_size(os.environ["PVGPU_MEM_SIZE"])
            except Exception:
                raise CudaError(R.CUDA_ERROR_INVALID_VALUE,
                                f"PVGPU_MEM_SIZE={os.environ['PVGPU_MEM_SIZE']!r} is not a size") from None
        kw = {"memory": memory}
        if mem_size:
            kw["mem_size"] = int(mem_size)
        try:
            conn = guest.connect(endpoint, **kw)
        except (guest.PvgpuError, ChannelError, OSError) as e:
            raise CudaError(R.CUDA_ERROR_NO_DEVICE,
                            f"no pvgpu host at {endpoint or 'the default endpoint'}: {e}") from None
        self.conn = conn
        mappable = conn.memory_model == wire.MEMORY_SHARED
        self.devices = [DeviceState(i, d, mappable) for i, d in enumerate(conn.devices)]
        check(self.devices, R.CUDA_ERROR_NO_DEVICE, "the pvgpu host has no devices")

    @property
    def mappable(self) -> bool:
        return self.conn is not None and self.conn.memory_model == wire.MEMORY_SHARED

    def require_init(self) -> None:
        """Driver API functions other than cuInit need it first."""
        check(self.initialized and self.conn is not None, R.CUDA_ERROR_NOT_INITIALIZED,
              "cuInit has not been called")

    def runtime_init(self) -> None:
        if self.conn is None:
            self.connect()
        self.initialized = True

    def close(self) -> None:
        conn, self.conn = self.conn, None
        self.objects.clear()
        self.slots.clear()
        if conn is not None:
            conn.close()

    # ------------------------------------------------------------------ lookups
    def new_id(self) -> int:
        return next(self._ids)

    def device(self, dev) -> DeviceState:
        index = handles.value_of(dev)
        check(0 <= index < len(self.devices), R.CUDA_ERROR_INVALID_DEVICE,
              f"no device {index}: this host has {len(self.devices)}")
        return self.devices[index]

    def lookup(self, handle, cls, code=R.CUDA_ERROR_INVALID_HANDLE):
        value = handles.value_of(handle)
        obj = self.objects.get(value)
        check(isinstance(obj, cls), code, f"{handle!r} is not a live {cls.__name__} handle")
        return obj

    def context(self, handle) -> Ctx:
        ctx = self.lookup(handle, Ctx, R.CUDA_ERROR_INVALID_CONTEXT)
        check(not ctx.destroyed, R.CUDA_ERROR_CONTEXT_IS_DESTROYED, f"context {ctx.id:#x} was destroyed")
        return ctx

    # ------------------------------------------------------------------ current context
    def _stack(self) -> list:
        stack = getattr(self.tls, "stack", None)
        if stack is None:
            stack = self.tls.stack = []
        return stack

    def current(self, required: bool = True) -> Ctx | None:
        stack = self._stack()
        while stack and stack[-1].destroyed:
            stack.pop()
        ctx = stack[-1] if stack else None
        check(ctx is not None or not required, R.CUDA_ERROR_INVALID_CONTEXT,
              "no current context: cuCtxCreate, cuCtxSetCurrent or cuDevicePrimaryCtxRetain first")
        return ctx

    def set_current(self, ctx: Ctx | None) -> None:
        stack = self._stack()
        if stack:
            stack.pop()
        if ctx is not None:
            stack.append(ctx)

    def push(self, ctx: Ctx) -> None:
        self._stack().append(ctx)

    def pop(self) -> Ctx:
        stack = self._stack()
        check(stack, R.CUDA_ERROR_INVALID_CONTEXT, "the context stack is empty")
        return stack.pop()

    # runtime: the thread's device and its primary context
    @property
    def runtime_device(self) -> int:
        return getattr(self.tls, "device", 0)

    def runtime_context(self) -> Ctx:
        """The context runtime calls use: the current one, else the primary context of the
        thread's device, made current."""
        self.runtime_init()
        ctx = self.current(required=False)
        if ctx is None:
            ctx = self.primary(self.device(self.runtime_device))
            self.set_current(ctx)
        return ctx

    def set_runtime_device(self, index: int) -> None:
        dev = self.device(index)
        self.tls.device = dev.index
        self.set_current(self.primary(dev))

    # ------------------------------------------------------------------ contexts
    def primary(self, dev: DeviceState) -> Ctx:
        if dev.primary is None or dev.primary.destroyed:
            dev.primary = self.create_context(dev, 0, primary=True)
        return dev.primary

    def create_context(self, dev: DeviceState, flags: int, primary: bool = False) -> Ctx:
        slot = self._free_slot()
        ident = self.new_id()
        gctx = dev.guest.create_context(f"cuda{'-primary' if primary else ''}-{ident:#x}")
        ctx = Ctx(ident, dev, gctx, slot, primary, flags)
        try:
            start, _end = slot_range(slot)
            if start > wire.VA_USER_BASE:
                ctx.filler = gctx.reserve_va(start - wire.VA_USER_BASE)
        except BaseException:
            gctx.destroy()
            raise
        self.slots[slot] = ctx
        self.objects[ident] = ctx
        return ctx

    def _free_slot(self) -> int:
        for slot in range(SLOT_COUNT):
            if slot in self.slots:
                continue
            start, end = slot_range(slot)
            if _HOST_RANGES.reserve(start, end - start):
                return slot
        raise CudaError(R.CUDA_ERROR_OUT_OF_MEMORY,
                        f"{len(self.slots)} contexts are live: no room for another in the "
                        "unified address space")

    def destroy_context(self, ctx: Ctx) -> None:
        if ctx.destroyed:
            return
        self.memory.drop_context(ctx)
        for table in (ctx.streams, ctx.events, ctx.modules):
            for obj in table.values():
                self.objects.pop(obj.id, None)
                for fn in getattr(obj, "functions", {}).values():
                    self.objects.pop(fn.id, None)
            table.clear()
        ctx.destroyed = True
        self.objects.pop(ctx.id, None)
        self.slots.pop(ctx.slot, None)
        if ctx.device.primary is ctx:
            ctx.device.primary = None
            ctx.device.primary_refs = 0
        try:
            ctx.guest.destroy()
        finally:
            stack = self._stack()
            stack[:] = [c for c in stack if c is not ctx]

    def contexts(self) -> list:
        return [c for c in self.objects.values() if isinstance(c, Ctx)]

    # ------------------------------------------------------------------ streams
    def stream(self, handle, ctx: Ctx | None):
        """The guest Stream of a stream handle: 0, None, CU_STREAM_LEGACY and
        CU_STREAM_PER_THREAD are the NULL stream of `ctx` (default: the current context)."""
        value = handles.value_of(handle)
        if value in (0, 1, 2):
            ctx = ctx or self.current()
            return ctx.guest.default_stream
        s = self.lookup(handle, Strm)
        check(ctx is None or s.ctx is ctx, R.CUDA_ERROR_INVALID_HANDLE,
              f"stream {value:#x} belongs to context {s.ctx.id:#x}, not {ctx.id:#x}"
              if ctx is not None else "")
        return s.guest

    def stream_ctx(self, handle) -> Ctx | None:
        """The context of a created stream (None for the NULL stream)."""
        value = handles.value_of(handle)
        if value in (0, 1, 2):
            return None
        return self.lookup(handle, Strm).ctx


_lock = threading.RLock()
_facade = None


def get() -> Facade:
    global _facade
    with _lock:
        if _facade is None:
            _facade = Facade()
        return _facade


def configure(endpoint=None, memory=None, mem_size=None) -> Facade:
    """Start over with a connection to `endpoint` (pvgpu.cuda.connect)."""
    global _facade
    with _lock:
        shutdown()
        _facade = Facade(endpoint, memory, mem_size)
        _facade.connect()
        return _facade


def shutdown() -> None:
    global _facade
    with _lock:
        _errors.reset_thread()
        f, _facade = _facade, None
        if f is not None:
            f.close()
