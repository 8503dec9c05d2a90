"""The CUDA driver API over pvgpu, shaped like cuda-python's `cuda.bindings.driver`: a
program written for it runs with its import changed to `from pvgpu.cuda import driver as
cuda`. Every function returns a tuple `(CUresult, outputs...)` (`(CUresult,)` when it has
none; None for each output on failure) and never raises for a CUDA error; the enums are
cuda-bindings' own when it is installed (pvgpu/cuda/enums.py).

    err, = cuda.cuInit(0)
    err, dev = cuda.cuDeviceGet(0)
    err, ctx = cuda.cuCtxCreate(None, 0, dev)      # CUDA 13's form; (flags, dev) also works
    err, mod = cuda.cuModuleLoadData(ptx)          # PTX text or bytes (pvgpu compiles it)
    err, fn = cuda.cuModuleGetFunction(mod, b"saxpy")
    err, d_x = cuda.cuMemAlloc(n * 4)
    err, = cuda.cuMemcpyHtoD(d_x, host_array, n * 4)
    err, = cuda.cuLaunchKernel(fn, blocks, 1, 1, 256, 1, 1, 0, 0,
                               ((a, d_x, d_y, n), (ctypes.c_float, None, None, ctypes.c_int)), 0)
    err, = cuda.cuCtxSynchronize()

Modules are PTX (text or bytes; `cuModuleLoadDataEx`'s CU_JIT_ERROR_LOG_BUFFER receives the
compiler's message for PTX that does not compile) or pvgpu code objects; a cubin or fatbin
is CUDA_ERROR_NO_BINARY_FOR_GPU (pvgpu's SMs run their own ISA). Memory, unified
addressing, mapped and managed memory: pvgpu/cuda/_memory.py. Contexts, the connection and
threads: pvgpu/cuda/_state.py. Error codes: pvgpu/cuda/_errors.py.

The NULL stream (0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD) is the context's default
stream; it does not wait for the context's other streams (use events or synchronize), as
in CUDA's per-thread default stream mode.
"""

from __future__ import annotations

import ctypes
import functools
import re
from pathlib import Path

import numpy as np

from pvgpu.cuda import _attributes, _errors, _launch, _state, enums, handles
from pvgpu.cuda._errors import CudaError, check
from pvgpu.cuda._memory import MANAGED, PINNED
from pvgpu.cuda.enums import CUresult as R
from pvgpu.cuda.handles import (CUcontext, CUdevice, CUdeviceptr, CUevent, CUfunction,  # noqa: F401
                                CUmodule, CUstream, value_of)
from pvgpu.spec import isa

# the driver's enums and constants, as cuda-python has them (CUresult, CU_STREAM_LEGACY, ...)
globals().update({k: v for k, v in vars(enums).items() if k.startswith("CU")})

DRIVER_VERSION = 13000
_FATBIN_MAGIC = b"\x50\xed\x55\xba"


def _api(outputs: int, *, init: bool = True):
    """A driver function: under the facade's lock, after cuInit, errors as codes."""
    def deco(fn):
        @functools.wraps(fn)
        def locked(*args, **kwargs):
            with _state._lock:
                if init:
                    _state.get().require_init()
                return fn(*args, **kwargs)
        wrapped = _errors.driver_api(outputs)(locked)
        wrapped.__wrapped__ = fn  # the bare implementation (the runtime calls it)
        return wrapped
    return deco


def _f() -> _state.Facade:
    return _state.get()


def _uint(value, what: str) -> int:
    """An unsigned argument: an int, a handle, or a float (truncated, as cuda-python's
    Cython signatures do)."""
    v = value_of(value)
    if not 0 <= v < 1 << 64:
        raise OverflowError(f"{what} = {v} is out of range")
    return v


# ---------------------------------------------------------------------- init and devices
@_api(0, init=False)
def cuInit(Flags):
    check(_uint(Flags, "Flags") == 0, R.CUDA_ERROR_INVALID_VALUE, "cuInit takes Flags 0")
    f = _f()
    f.connect()
    f.initialized = True


@_api(1, init=False)
def cuDriverGetVersion():
    return DRIVER_VERSION


@_api(1)
def cuDeviceGet(ordinal):
    return _f().device(ordinal).handle


@_api(1)
def cuDeviceGetCount():
    return len(_f().devices)


@_api(1)
def cuDeviceGetName(length, dev):
    length = int(length)
    check(length > 0, R.CUDA_ERROR_INVALID_VALUE, "length must be positive")
    name = _f().device(dev).guest.name.encode()[:length - 1] + b"\0"
    return name + b" " * (length - len(name))  # the whole buffer, as cuda-python returns it


@_api(1)
def cuDeviceGetAttribute(attrib, dev):
    info = _f().device(dev).info()
    try:
        return _attributes.get(info, attrib)
    except KeyError:
        raise CudaError(R.CUDA_ERROR_INVALID_VALUE, f"no device attribute {int(attrib)}") from None


@_api(1)
def cuDeviceTotalMem(dev):
    return _f().device(dev).guest.vram_size


@_api(2)
def cuDeviceComputeCapability(dev):
    _f().device(dev)
    return _attributes.COMPUTE_CAPABILITY


@_api(1)
def cuDeviceCanAccessPeer(dev, peerDev):
    f = _f()
    a, b = f.device(dev), f.device(peerDev)
    if a is b:  # a device is not its own peer
        return 0
    return int(a.guest.can_access_peer(b.guest))


@_api(1)
def cuDevicePrimaryCtxRetain(dev):
    f = _f()
    d = f.device(dev)
    ctx = f.primary(d)
    d.primary_refs += 1
    return ctx.handle


@_api(0)
def cuDevicePrimaryCtxRelease(dev):
    d = _f().device(dev)
    check(d.primary is not None and d.primary_refs > 0, R.CUDA_ERROR_INVALID_CONTEXT,
          f"device {d.index}'s primary context is not retained")
    d.primary_refs -= 1  # it lives on (the runtime may use it); cuDevicePrimaryCtxReset ends it


@_api(0)
def cuDevicePrimaryCtxReset(dev):
    f = _f()
    d = f.device(dev)
    if d.primary is not None:
        f.destroy_context(d.primary)


# ---------------------------------------------------------------------- contexts
@_api(1)
def cuCtxCreate(*args):
    """cuCtxCreate(ctxCreateParams, flags, dev) (CUDA 13) or cuCtxCreate(flags, dev)."""
    if len(args) == 3:
        params, flags, dev = args
        check(params is None, R.CUDA_ERROR_NOT_SUPPORTED,
              "context creation parameters (execution affinity, CIG) are not supported")
    elif len(args) == 2:
        flags, dev = args
    else:
        raise TypeError("cuCtxCreate(ctxCreateParams, flags, dev) or cuCtxCreate(flags, dev)")
    f = _f()
    d = f.device(dev)
    ctx = f.create_context(d, _uint(flags, "flags"))
    f.push(ctx)
    return ctx.handle


@_api(0)
def cuCtxDestroy(ctx):
    f = _f()
    c = f.context(ctx)
    f.destroy_context(c)


@_api(1)
def cuCtxGetCurrent():
    ctx = _f().current(required=False)
    return ctx.handle if ctx is not None else CUcontext(0)


@_api(0)
def cuCtxSetCurrent(ctx):
    f = _f()
    f.set_current(f.context(ctx) if value_of(ctx) else None)


@_api(0)
def cuCtxPushCurrent(ctx):
    f = _f()
    f.push(f.context(ctx))


@_api(1)
def cuCtxPopCurrent():
    return _f().pop().handle


@_api(1)
def cuCtxGetDevice():
    return _f().current().device.handle


@_api(1)
def cuCtxGetApiVersion(ctx):
    _f().context(ctx)
    return 3020  # the context API version of every CUDA since 3.2


@_api(0)
def cuCtxSynchronize():
    _f().current().guest.synchronize()


@_api(0)
def cuCtxEnablePeerAccess(peerContext, Flags):
    f = _f()
    ctx, peer = f.current(), f.context(peerContext)
    check(_uint(Flags, "Flags") == 0, R.CUDA_ERROR_INVALID_VALUE, "Flags must be 0")
    enable_peer(ctx, peer.device)


@_api(0)
def cuCtxDisablePeerAccess(peerContext):
    f = _f()
    disable_peer(f.current(), f.context(peerContext).device)


def enable_peer(ctx, dev) -> None:
    check(dev is not ctx.device, R.CUDA_ERROR_INVALID_DEVICE, "a device is not its own peer")
    check(dev.index not in ctx.peers, R.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
          f"peer access to device {dev.index} is enabled already")
    check(ctx.device.guest.can_access_peer(dev.guest), R.CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
          f"device {ctx.device.index} cannot reach device {dev.index} peer-to-peer")
    ctx.guest.enable_peer_access(dev.guest)
    ctx.peers.add(dev.index)


def disable_peer(ctx, dev) -> None:
    check(dev.index in ctx.peers, R.CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,
          f"peer access to device {dev.index} is not enabled")
    ctx.guest.disable_peer_access(dev.guest)
    ctx.peers.discard(dev.index)


# ---------------------------------------------------------------------- modules
_PTX_VERSION = re.compile(rb"^\s*\.version\s+(\d+)\.(\d+)", re.M)


def _image_bytes(image) -> bytes:
    if isinstance(image, str):
        return image.encode()
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    if isinstance(image, np.ndarray):
        return image.tobytes()
    address = value_of(image)
    check(address, R.CUDA_ERROR_INVALID_VALUE, "a NULL image")
    head = ctypes.string_at(address, 4)
    if head == isa.COBJ_MAGIC:  # a code object: its header gives its size
        size = int.from_bytes(ctypes.string_at(address + 8, 4), "little")
        return ctypes.string_at(address, size)
    return ctypes.string_at(address)  # PTX: NUL-terminated text


def load_module(ctx, image, log=None) -> _state.Mod:
    """Compile (PTX) and load `image` into ctx; `log(text, error)` gets the JIT's message."""
    from pvgpu.guest.api import module as gmod
    from pvgpu.guest.api.errors import PtxCompileError

    raw = _image_bytes(image)
    ptx_version = 0
    if raw.startswith(isa.COBJ_MAGIC):
        cobj = raw
    elif raw.startswith((b"\x7fELF", _FATBIN_MAGIC)):
        raise CudaError(R.CUDA_ERROR_NO_BINARY_FOR_GPU,
                        "a cubin or fatbin: pvgpu runs PTX (compile to PTX, e.g. NVRTC "
                        "--gpu-architecture=compute_80)")
    else:
        text = raw.split(b"\0", 1)[0]
        m = _PTX_VERSION.search(text)
        check(m is not None or b".entry" in text, R.CUDA_ERROR_INVALID_IMAGE,
              "the image is neither PTX nor a pvgpu code object")
        if m:
            ptx_version = int(m.group(1)) * 10 + int(m.group(2))
        try:
            cobj = gmod.compile_ptx(text.decode("utf-8", "replace"))
        except PtxCompileError as e:
            if log is not None:
                log(str(e), True)
            raise
        if log is not None:
            log(f"pvgpu: compiled PTX for sm_{''.join(map(str, _attributes.COMPUTE_CAPABILITY))} "
                f"({len(cobj)} bytes of code object)", False)
    info = gmod.CodeObject(cobj)
    gm = ctx.guest.load_module(cobj)
    f = _f()
    mod = _state.Mod(f.new_id(), ctx, gm, info, ptx_version)
    f.objects[mod.id] = mod
    ctx.modules[mod.id] = mod
    return mod


def _jit_logs(options, values):
    """The log buffers among JIT options: -> {"error"|"info": (target, size)}."""
    J = enums.CUjit_option
    opts = {}
    for opt, val in zip(options, values):
        opts[int(opt)] = val
    logs = {}
    for kind, buf, size in (("error", J.CU_JIT_ERROR_LOG_BUFFER, J.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES),
                            ("info", J.CU_JIT_INFO_LOG_BUFFER, J.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES)):
        if int(buf) in opts and opts[int(buf)] is not None:
            logs[kind] = (opts[int(buf)], int(opts.get(int(size), 0) or 0))
    return logs


def _write_log(target, size: int, text: str) -> None:
    """Write `text`, NUL-terminated, into at most `size` bytes of a log buffer: a bytearray,
    a writable buffer (numpy, ctypes), bytes (written in place, as cuda-python does) or an
    address."""
    data = text.encode()[:max(size - 1, 0)] + b"\0"
    if size <= 0:
        return
    if isinstance(target, bytes):
        if len(target) < 2:
            return
        n = min(len(data), len(target))
        ctypes.memmove(ctypes.cast(ctypes.c_char_p(target), ctypes.c_void_p).value, data, n)
        return
    if isinstance(target, (bytearray, memoryview, np.ndarray)) or hasattr(target, "_type_"):
        view = memoryview(target).cast("B")
        n = min(len(data), len(view))
        view[:n] = data[:n]
        return
    address = value_of(target)
    if address:
        ctypes.memmove(address, data, len(data))


@_api(1)
def cuModuleLoadData(image):
    return load_module(_f().current(), image).handle


@_api(1)
def cuModuleLoadDataEx(image, numOptions, options, optionValues):
    options = list(options or ())
    values = list(optionValues or ())
    check(int(numOptions) == len(options) == len(values), R.CUDA_ERROR_INVALID_VALUE,
          f"numOptions {numOptions}, {len(options)} options and {len(values)} values")
    for opt in options:
        enums.CUjit_option(int(opt))  # ValueError for an unknown option
    logs = _jit_logs(options, values)

    def log(text, error):
        kind = "error" if error else "info"
        if kind in logs:
            _write_log(*logs[kind], text)
    return load_module(_f().current(), image, log).handle


@_api(1)
def cuModuleLoad(fname):
    path = Path(fname.decode() if isinstance(fname, bytes) else fname)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CudaError(R.CUDA_ERROR_FILE_NOT_FOUND, f"cannot read {path}: {e}") from None
    return load_module(_f().current(), data).handle


def _name(name) -> str:
    if isinstance(name, bytes):
        return name.decode()
    if isinstance(name, str):
        return name
    raise TypeError(f"a name must be bytes or str, not {type(name).__name__}")


def _module(hmod) -> _state.Mod:
    mod = _f().lookup(hmod, _state.Mod)
    check(not mod.ctx.destroyed, R.CUDA_ERROR_CONTEXT_IS_DESTROYED, "the module's context was destroyed")
    return mod


@_api(1)
def cuModuleGetFunction(hmod, name):
    mod, name = _module(hmod), _name(name)
    fn = mod.functions.get(name)
    if fn is None:
        f = _f()
        fn = _state.Fn(f.new_id(), mod, mod.guest.get_function(name))
        mod.functions[name] = fn
        f.objects[fn.id] = fn
    return fn.handle


@_api(2)
def cuModuleGetGlobal(hmod, name):
    mod, name = _module(hmod), _name(name)
    span = mod.globals.get(name)
    if span is None:
        arr = mod.guest.get_global(name, np.uint8)
        span = mod.globals[name] = _f().memory.add_global(mod.ctx, arr)
    return CUdeviceptr(span.base), span.size


@_api(0)
def cuModuleUnload(hmod):
    f = _f()
    mod = _module(hmod)
    for span in mod.globals.values():
        f.memory.drop_global(span)
    for fn in mod.functions.values():
        f.objects.pop(fn.id, None)
    f.objects.pop(mod.id, None)
    mod.ctx.modules.pop(mod.id, None)
    mod.guest.unload()


def _function(hfunc) -> _state.Fn:
    fn = _f().lookup(hfunc, _state.Fn)
    check(not fn.mod.ctx.destroyed, R.CUDA_ERROR_CONTEXT_IS_DESTROYED, "the function's context was destroyed")
    return fn


@_api(1)
def cuFuncGetAttribute(attrib, hfunc):
    fn = _function(hfunc)
    g = fn.guest
    A = enums.CUfunction_attribute
    values = {
        A.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: g.max_threads_per_block,
        A.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: g.shared_size_bytes,
        A.CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: fn.mod.cobj.h["const_size"],
        A.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: g.local_size_bytes,
        A.CU_FUNC_ATTRIBUTE_NUM_REGS: g.num_regs,
        A.CU_FUNC_ATTRIBUTE_PTX_VERSION: fn.mod.ptx_version,
        A.CU_FUNC_ATTRIBUTE_BINARY_VERSION: 10 * _attributes.COMPUTE_CAPABILITY[0]
        + _attributes.COMPUTE_CAPABILITY[1],
        A.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: isa.MAX_DYNAMIC_SHARED - g.shared_size_bytes,
    }
    valid = {int(m) for m in A if m.name != "CU_FUNC_ATTRIBUTE_MAX"}
    check(int(attrib) in valid, R.CUDA_ERROR_INVALID_VALUE, f"no function attribute {int(attrib)}")
    return int(values.get(int(attrib), 0))


# ---------------------------------------------------------------------- memory
@_api(1)
def cuMemAlloc(bytesize):
    f = _f()
    return CUdeviceptr(f.memory.alloc_device(f.current(), _uint(bytesize, "bytesize")).base)


@_api(0)
def cuMemFree(dptr):
    _f().memory.free_device(dptr)


def host_alloc(nbytes, mapped: bool, kind: str = PINNED) -> int:
    f = _f()
    f.current()
    if (mapped or kind == MANAGED) and not f.mappable:
        raise CudaError(R.CUDA_ERROR_NOT_SUPPORTED,
                        "mapped and managed host memory need the shared memory model (the "
                        "device's writes to guest memory do not reach an inline guest)")
    return f.memory.alloc_host(_uint(nbytes, "bytesize"), kind).base


@_api(1)
def cuMemAllocHost(bytesize):
    return host_alloc(bytesize, False)


@_api(1)
def cuMemHostAlloc(bytesize, Flags):
    flags = _uint(Flags, "Flags")
    check(not flags & ~7, R.CUDA_ERROR_INVALID_VALUE, f"unknown cuMemHostAlloc flags {flags:#x}")
    return host_alloc(bytesize, bool(flags & enums.CU_MEMHOSTALLOC_DEVICEMAP))


@_api(0)
def cuMemFreeHost(p):
    _f().memory.free_host(p)


@_api(1)
def cuMemAllocManaged(bytesize, flags):
    fl = _uint(flags, "flags")
    check(fl in (enums.cudaMemAttachGlobal, enums.cudaMemAttachHost), R.CUDA_ERROR_INVALID_VALUE,
          f"flags must be CU_MEM_ATTACH_GLOBAL or CU_MEM_ATTACH_HOST, not {fl}")
    return CUdeviceptr(host_alloc(bytesize, True, MANAGED))


def host_device_pointer(p, flags) -> int:
    f = _f()
    check(_uint(flags, "Flags") == 0, R.CUDA_ERROR_INVALID_VALUE, "Flags must be 0")
    span, off = f.memory.host_span(p)
    check(span is not None, R.CUDA_ERROR_INVALID_VALUE, "not pinned host memory of the facade")
    check(f.mappable, R.CUDA_ERROR_NOT_SUPPORTED,
          "the device cannot map host memory in the inline memory model")
    return span.window_va + off


@_api(1)
def cuMemHostGetDevicePointer(p, Flags):
    return CUdeviceptr(host_device_pointer(p, Flags))


@_api(2)
def cuMemGetInfo():
    info = _f().current().device.guest.info()
    return info["vram_free"], info["vram_size"]


@_api(2)
def cuMemGetAddressRange(dptr):
    f = _f()
    span, _off = f.memory.device.find(value_of(dptr))
    check(span is not None, R.CUDA_ERROR_NOT_FOUND, f"{value_of(dptr):#x} is in no allocation")
    return CUdeviceptr(span.base), span.size


def _mem(ptr, device=None, writable=False):
    return _f().memory.where(ptr, device=device, writable=writable)


def _copy(dst, src, n, stream=0, async_=False):
    _f().memory.copy(dst, src, _uint(n, "ByteCount"), stream, async_)


@_api(0)
def cuMemcpy(dst, src, ByteCount):
    _copy(_mem(dst, writable=True), _mem(src), ByteCount)


@_api(0)
def cuMemcpyAsync(dst, src, ByteCount, hStream):
    _copy(_mem(dst, writable=True), _mem(src), ByteCount, hStream, True)


@_api(0)
def cuMemcpyHtoD(dstDevice, srcHost, ByteCount):
    _copy(_mem(dstDevice, True), _mem(srcHost, False), ByteCount)


@_api(0)
def cuMemcpyDtoH(dstHost, srcDevice, ByteCount):
    _copy(_mem(dstHost, False, True), _mem(srcDevice, True), ByteCount)


@_api(0)
def cuMemcpyDtoD(dstDevice, srcDevice, ByteCount):
    _copy(_mem(dstDevice, True), _mem(srcDevice, True), ByteCount)


@_api(0)
def cuMemcpyHtoDAsync(dstDevice, srcHost, ByteCount, hStream):
    _copy(_mem(dstDevice, True), _mem(srcHost, False), ByteCount, hStream, True)


@_api(0)
def cuMemcpyDtoHAsync(dstHost, srcDevice, ByteCount, hStream):
    _copy(_mem(dstHost, False, True), _mem(srcDevice, True), ByteCount, hStream, True)


@_api(0)
def cuMemcpyDtoDAsync(dstDevice, srcDevice, ByteCount, hStream):
    _copy(_mem(dstDevice, True), _mem(srcDevice, True), ByteCount, hStream, True)


def _peer_where(ptr, ctx_handle):
    f = _f()
    ctx = f.context(ctx_handle)
    return f.memory.where(ptr, device=True, ctx=ctx)


@_api(0)
def cuMemcpyPeer(dstDevice, dstContext, srcDevice, srcContext, ByteCount):
    _copy(_peer_where(dstDevice, dstContext), _peer_where(srcDevice, srcContext), ByteCount)


@_api(0)
def cuMemcpyPeerAsync(dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream):
    _copy(_peer_where(dstDevice, dstContext), _peer_where(srcDevice, srcContext), ByteCount,
          hStream, True)


def _memset(dst, value: int, width: int, count, stream=0, async_=False):
    pattern = (int(value) & ((1 << 8 * width) - 1)).to_bytes(width, "little")
    _f().memory.memset(_mem(dst, True), pattern, _uint(count, "N"), stream, async_)


@_api(0)
def cuMemsetD8(dstDevice, uc, N):
    _memset(dstDevice, uc, 1, N)


@_api(0)
def cuMemsetD16(dstDevice, us, N):
    _memset(dstDevice, us, 2, N)


@_api(0)
def cuMemsetD32(dstDevice, ui, N):
    _memset(dstDevice, ui, 4, N)


@_api(0)
def cuMemsetD8Async(dstDevice, uc, N, hStream):
    _memset(dstDevice, uc, 1, N, hStream, True)


@_api(0)
def cuMemsetD16Async(dstDevice, us, N, hStream):
    _memset(dstDevice, us, 2, N, hStream, True)


@_api(0)
def cuMemsetD32Async(dstDevice, ui, N, hStream):
    _memset(dstDevice, ui, 4, N, hStream, True)


# ---------------------------------------------------------------------- launches
def launch(fn: _state.Fn, grid, block, shared, hStream, kernelParams, extra) -> None:
    from pvgpu.guest.api.params import ParamBuffer

    f = _f()
    ctx = fn.mod.ctx
    g = tuple(_uint(x, "gridDim") for x in grid)
    b = tuple(_uint(x, "blockDim") for x in block)
    buf = _launch.parameter_buffer(fn.guest, kernelParams, extra)
    _launch.translate_pointers(f.memory, ctx, fn.guest, buf)
    stream = f.stream(hStream, ctx)
    try:
        fn.guest.launch(g, b, ParamBuffer(buf), shared_mem=_uint(shared, "sharedMemBytes"),
                        stream=stream)
    except (TypeError, ValueError, OverflowError) as e:  # refused before anything was sent
        raise CudaError(R.CUDA_ERROR_INVALID_VALUE, str(e)) from None


@_api(0)
def cuLaunchKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                   sharedMemBytes, hStream, kernelParams, extra):
    launch(_function(f), (gridDimX, gridDimY, gridDimZ), (blockDimX, blockDimY, blockDimZ),
           sharedMemBytes, hStream, kernelParams, extra)


# ---------------------------------------------------------------------- streams
def stream_create(flags: int, priority: int = 0) -> CUstream:
    f = _f()
    check(flags in (0, 1), R.CUDA_ERROR_INVALID_VALUE, f"unknown stream flags {flags:#x}")
    ctx = f.current()
    s = _state.Strm(f.new_id(), ctx, ctx.guest.create_stream(), flags, priority)
    ctx.streams[s.id] = s
    f.objects[s.id] = s
    return s.handle


def stream_query(hStream) -> None:
    f = _f()
    ctx = f.stream_ctx(hStream) or f.current()
    gs = f.stream(hStream, ctx)
    probe = ctx.guest.create_event()
    try:
        probe.record(gs)
        done = probe.query()
    finally:
        probe.destroy()
    check(done, R.CUDA_ERROR_NOT_READY, "the stream has work in progress")


def stream_destroy(hStream) -> None:
    f = _f()
    s = f.lookup(hStream, _state.Strm)
    f.objects.pop(s.id, None)
    s.ctx.streams.pop(s.id, None)
    if not s.ctx.destroyed:
        s.guest.destroy()


def stream_wait(hStream, hEvent, flags) -> None:
    f = _f()
    ev = f.lookup(hEvent, _state.Ev)
    ctx = f.stream_ctx(hStream) or f.current()
    f.stream(hStream, ctx).wait_event(ev.guest)


@_api(1)
def cuStreamCreate(Flags):
    return stream_create(_uint(Flags, "Flags"))


@_api(0)
def cuStreamSynchronize(hStream):
    f = _f()
    f.stream(hStream, f.stream_ctx(hStream)).synchronize()


@_api(0)
def cuStreamWaitEvent(hStream, hEvent, Flags):
    check(_uint(Flags, "Flags") in (0, 1), R.CUDA_ERROR_INVALID_VALUE, "unknown Flags")
    stream_wait(hStream, hEvent, Flags)


@_api(0)
def cuStreamDestroy(hStream):
    stream_destroy(hStream)


@_api(0)
def cuStreamQuery(hStream):
    stream_query(hStream)


# ---------------------------------------------------------------------- events
def event_create(flags: int) -> CUevent:
    f = _f()
    check(not flags & ~7, R.CUDA_ERROR_INVALID_VALUE, f"unknown event flags {flags:#x}")
    ctx = f.current()
    ev = _state.Ev(f.new_id(), ctx, ctx.guest.create_event(), flags)
    ctx.events[ev.id] = ev
    f.objects[ev.id] = ev
    return ev.handle


def _event(hEvent) -> _state.Ev:
    ev = _f().lookup(hEvent, _state.Ev)
    check(not ev.ctx.destroyed, R.CUDA_ERROR_CONTEXT_IS_DESTROYED, "the event's context was destroyed")
    return ev


def event_record(hEvent, hStream) -> None:
    f = _f()
    ev = _event(hEvent)
    sctx = f.stream_ctx(hStream)
    check(sctx is None or sctx is ev.ctx, R.CUDA_ERROR_INVALID_HANDLE,
          "the event and the stream belong to different contexts")
    ev.guest.record(f.stream(hStream, ev.ctx))


def event_elapsed(hStart, hEnd) -> float:
    a, b = _event(hStart), _event(hEnd)
    disabled = enums.cudaEventDisableTiming
    check(not (a.flags | b.flags) & disabled, R.CUDA_ERROR_INVALID_HANDLE,
          "an event created with CU_EVENT_DISABLE_TIMING has no time")
    check(a.ctx.device is b.ctx.device, R.CUDA_ERROR_INVALID_HANDLE,
          "events of different devices have different clocks")
    return float(a.guest.elapsed_time(b.guest))


def event_query(hEvent) -> None:
    check(_event(hEvent).guest.query(), R.CUDA_ERROR_NOT_READY, "the event has not completed")


def event_destroy(hEvent) -> None:
    f = _f()
    ev = f.lookup(hEvent, _state.Ev)
    f.objects.pop(ev.id, None)
    ev.ctx.events.pop(ev.id, None)
    if not ev.ctx.destroyed:
        ev.guest.destroy()


@_api(1)
def cuEventCreate(Flags):
    return event_create(_uint(Flags, "Flags"))


@_api(0)
def cuEventRecord(hEvent, hStream):
    event_record(hEvent, hStream)


@_api(0)
def cuEventSynchronize(hEvent):
    _event(hEvent).guest.synchronize()


@_api(1)
def cuEventElapsedTime(hStart, hEnd):
    return event_elapsed(hStart, hEnd)


@_api(0)
def cuEventQuery(hEvent):
    event_query(hEvent)


@_api(0)
def cuEventDestroy(hEvent):
    event_destroy(hEvent)


# ---------------------------------------------------------------------- errors
@_api(1, init=False)
def cuGetErrorName(error):
    try:
        return R(int(error)).name.encode()
    except ValueError:
        raise CudaError(R.CUDA_ERROR_INVALID_VALUE, f"no CUresult {int(error)}") from None


@_api(1, init=False)
def cuGetErrorString(error):
    try:
        R(int(error))
    except ValueError:
        raise CudaError(R.CUDA_ERROR_INVALID_VALUE, f"no CUresult {int(error)}") from None
    return enums.error_string(error)
