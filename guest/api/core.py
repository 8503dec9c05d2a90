"""The compute API (the user-mode driver): connections, devices, contexts, device arrays,
launches and copies — numpy in, numpy out, in the manner of CuPy / cuda-python.

    import guest
    with guest.connect() as conn:
        ctx = conn.devices[0].create_context()
        a = ctx.to_device(np.arange(n, dtype=np.float32))
        c = ctx.empty(n, np.float32)
        ctx.launch("vector_add", grid=..., block=256, args=(a, b, c, n))
        out = c.to_host()

Copies between numpy arrays and the device go through guest memory and the host's copy
engine: host->device fills bounce chunks and submits one COPY_H2D per chunk, so the
guest's memcpy of chunk N+1 overlaps the device's DMA of chunk N (split transaction);
device->host submits the chunks ahead and copies each out as it completes. Launches are
asynchronous (the default stream); their errors surface at the next synchronizing call
(a copy, synchronize()), as in CUDA.
"""

from __future__ import annotations

import collections
import functools
import itertools
import struct
import threading

import numpy as np

from spec import wire
from guest.api import errors
from guest.frontend.driver import command
from guest.frontend.session import FrontendSession

STAGING_CHUNK = 8 << 20
STAGING_DEPTH = 4
_F32 = struct.Struct("<f")


def _api(fn):
    """One API call: serialized per connection (the frontend's rings and guest memory are
    not thread-safe; several threads may share a connection), with frontend/transport
    errors re-raised as the API's exceptions."""
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        with self._conn_lock:
            try:
                return fn(self, *args, **kwargs)
            except errors.PvgpuError:
                raise
            except Exception as e:
                mapped = errors.translate(e)
                if mapped is e:
                    raise
                raise mapped from None
    return wrapper


def connect(endpoint: str | None = None, *, memory: str = wire.MEMORY_SHARED,
            mem_size: int = wire.DEFAULT_GUEST_MEM_SIZE, name: str | None = None,
            heartbeat_ms: int | None = None, timeout: float = 10.0,
            features: int | None = None) -> "Connection":
    """Open a guest session with the host at `endpoint` (default: the local ipc endpoint).

    memory: "shared" (zero-copy POSIX shared memory, same machine) or "inline" (guest
    memory mirrored through the messages; works across machines). features: the virtio
    feature bits the driver accepts (default: all it knows); VIRTIO_F_VERSION_1 is
    required."""
    try:
        return Connection(FrontendSession(endpoint, memory=memory, mem_size=mem_size, name=name,
                                          heartbeat_ms=heartbeat_ms, timeout=timeout,
                                          features=features))
    except Exception as e:
        mapped = errors.translate(e)
        if mapped is e:
            raise
        raise mapped from None


class Connection:
    def __init__(self, session: FrontendSession):
        self.session = session
        self._conn_lock = threading.RLock()
        self.devices = [Device(self, drv) for drv in session.devices]

    @property
    def memory_model(self) -> str:
        return self.session.memory

    @property
    def endpoint(self) -> str:
        return self.session.endpoint

    def close(self) -> None:
        with self._conn_lock:
            self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<pvgpu.Connection {self.endpoint} {self.memory_model} devices={len(self.devices)}>"


class Device:
    def __init__(self, conn: Connection, driver):
        self.connection = conn
        self._conn_lock = conn._conn_lock
        self.driver = driver
        self.index = driver.index
        self._ctx_ids = itertools.count(1)
        self._resource_ids = itertools.count(1)
        self._staging = []  # free bounce chunks (gpa)
        self._quarantine = []  # chunks of failed requests, reusable after reset()
        # Every device may hold STAGING_DEPTH chunks; keep them to half of the heap.
        heap = conn.session.heap
        share = heap.size // (2 * STAGING_DEPTH * max(1, len(conn.session.devices)))
        self.staging_chunk = max(64 << 10, min(STAGING_CHUNK, share // 4096 * 4096))

    @property
    def name(self) -> str:
        return self.driver.name

    @property
    def vram_size(self) -> int:
        return self.driver.vram_size

    @property
    def features(self) -> list:
        return [n for bit, n in sorted(wire.FEATURE_NAMES.items()) if self.driver.has(bit)]

    @property
    def memory_model(self) -> str:
        return self.connection.memory_model

    @_api
    def info(self) -> dict:
        _t, body = self.driver.call(command(wire.CMD_GET_DEVICE_INFO))
        vram, free, max_alloc, nctx, name = struct.unpack_from(wire.RESP_DEVICE_INFO_FORMAT, body)
        return {"vram_size": vram, "vram_free": free, "max_alloc": max_alloc,
                "contexts": nctx, "name": name.split(b"\0", 1)[0].decode()}

    @_api
    def create_context(self, name: str = "") -> "Context":
        ctx_id = next(self._ctx_ids)
        self.driver.call(command(wire.CMD_CTX_CREATE, (0, name.encode()[:32]), ctx_id=ctx_id))
        return Context(self, ctx_id)

    @_api
    def nop(self) -> None:
        """One synchronous no-op round trip through the virtqueue (for measurements)."""
        self.driver.call(command(wire.CMD_NOP))

    @_api
    def call_raw(self, command_bytes: bytes, readable=(), writable=()) -> tuple:
        """Send an already-encoded device command and wait: -> (resp_type, body). For tools
        and conformance tests that need to speak the wire directly."""
        return self.driver.call(command_bytes, readable, writable)

    @_api
    def reset(self) -> None:
        """Reset the device after DEVICE_NEEDS_RESET; every context on it is gone."""
        self.driver.initialize()  # its set_status 0 returns once no DMA is in flight
        heap = self.connection.session.heap
        for gpa in self._staging + self._quarantine:
            heap.free(gpa)
        self._staging, self._quarantine = [], []

    # bounce chunks of guest memory for copies
    def _take_staging(self) -> int:
        if self._staging:
            return self._staging.pop()
        return self.connection.session.heap.alloc(self.staging_chunk)

    def _give_staging(self, gpa: int) -> None:
        self._staging.append(gpa)

    def _quarantine_staging(self, gpas) -> None:
        """Bounce chunks of requests that failed without coming back: the device may still
        DMA into them until it is reset, so they are reused only after reset()."""
        self._quarantine.extend(gpas)

    def __repr__(self):
        return f"<pvgpu.Device {self.index} {self.name!r} {self.vram_size >> 20} MiB>"


class Context:
    def __init__(self, device: Device, ctx_id: int):
        self.device = device
        self._conn_lock = device._conn_lock
        self.ctx_id = ctx_id
        self._driver = device.driver
        self.destroyed = False
        self._async_error = None

    # ------------------------------------------------------------------ memory
    @_api
    def alloc(self, nbytes: int) -> tuple:
        """Raw device memory; -> (resource_id, va, size)."""
        rid = next(self.device._resource_ids)
        _t, body = self._driver.call(command(wire.CMD_MEM_ALLOC, (rid, 0, int(nbytes)), ctx_id=self.ctx_id))
        va, size = struct.unpack_from(wire.RESP_MEM_ALLOC_FORMAT, body)
        return rid, va, size

    def empty(self, shape, dtype=np.float32) -> "DeviceArray":
        shape = (shape,) if np.isscalar(shape) else tuple(shape)
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        rid, va, _size = self.alloc(max(nbytes, 1))
        return DeviceArray(self, rid, va, shape, dtype)

    def zeros(self, shape, dtype=np.float32) -> "DeviceArray":
        arr = self.empty(shape, dtype)
        arr.copy_from_host(np.zeros(arr.shape, arr.dtype))
        return arr

    def to_device(self, array) -> "DeviceArray":
        array = np.ascontiguousarray(array)
        out = self.empty(array.shape, array.dtype)
        out.copy_from_host(array)
        return out

    @_api
    def _free(self, rid: int) -> None:
        self._driver.call(command(wire.CMD_MEM_FREE, (rid,), ctx_id=self.ctx_id))

    # ------------------------------------------------------------------ copies
    @_api
    def copy_h2d(self, va: int, src: np.ndarray) -> None:
        src = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
        n = src.nbytes
        if n == 0:
            return
        dev, drv, mem = self.device, self._driver, self._driver.mem
        inline = drv.session.inline
        inflight = collections.deque()
        first_error = None

        def settle(req):
            nonlocal first_error
            dev._give_staging(req.bounce)
            try:
                req.response()
            except Exception as e:
                first_error = first_error or e

        chunk = dev.staging_chunk
        try:
            for off in range(0, n, chunk):
                size = min(chunk, n - off)
                if len(inflight) >= STAGING_DEPTH:
                    old = inflight[0]
                    drv.session.wait_for(lambda: old.done)
                    settle(inflight.popleft())
                gpa = dev._take_staging()
                try:
                    mem.view(gpa, size)[:] = src[off:off + size]
                    if inline:
                        mem.mark_dirty(gpa, size)
                    req = drv.submit(command(wire.CMD_COPY_H2D, (va + off, size), ctx_id=self.ctx_id),
                                     readable=[(gpa, size)])
                except BaseException:
                    dev._give_staging(gpa)  # never reached the device
                    raise
                req.bounce = gpa
                inflight.append(req)
            while inflight:
                old = inflight[0]
                drv.session.wait_for(lambda: old.done)
                settle(inflight.popleft())
        except BaseException:
            dev._quarantine_staging(r.bounce for r in inflight)
            raise
        if first_error is not None:
            raise first_error
        self._raise_async_error()

    @_api
    def copy_d2h(self, va: int, dst: np.ndarray) -> np.ndarray:
        out = dst.reshape(-1).view(np.uint8)
        n = out.nbytes
        if n == 0:
            return dst
        dev, drv, mem = self.device, self._driver, self._driver.mem
        pending = collections.deque()
        chunk = dev.staging_chunk
        offsets = iter(range(0, n, chunk))
        first_error = None

        def submit_next() -> bool:
            off = next(offsets, None)
            if off is None:
                return False
            size = min(chunk, n - off)
            gpa = dev._take_staging()
            try:
                req = drv.submit(command(wire.CMD_COPY_D2H, (va + off, size), ctx_id=self.ctx_id),
                                 writable=[(gpa, size)])
            except BaseException:
                dev._give_staging(gpa)  # never reached the device
                raise
            req.bounce = gpa
            pending.append((req, off, size))
            return True

        try:
            for _ in range(STAGING_DEPTH):
                if not submit_next():
                    break
            while pending:
                req, off, size = pending[0]
                drv.session.wait_for(lambda: req.done)
                pending.popleft()
                try:
                    req.response()
                    out[off:off + size] = mem.view(req.bounce, size)
                except Exception as e:
                    first_error = first_error or e
                dev._give_staging(req.bounce)
                submit_next()
        except BaseException:
            dev._quarantine_staging(r.bounce for r, _o, _s in pending)
            raise
        if first_error is not None:
            raise first_error
        self._raise_async_error()
        return dst

    @_api
    def copy_d2d(self, dst_va: int, src_va: int, nbytes: int) -> None:
        self._driver.call(command(wire.CMD_COPY_D2D, (src_va, dst_va, nbytes), ctx_id=self.ctx_id))

    # ------------------------------------------------------------------ launches
    @_api
    def launch(self, kernel: str, grid, block, args) -> None:
        """Launch a built-in kernel asynchronously on the default stream."""
        sig = wire.KERNELS_BY_NAME.get(kernel) if isinstance(kernel, str) else wire.BUILTIN_KERNELS.get(kernel)
        if sig is None:
            raise errors.InvalidKernelError(
                f"no built-in kernel {kernel!r}; available: {', '.join(sorted(wire.KERNELS_BY_NAME))}",
                code=wire.RESP_ERR_INVALID_KERNEL)
        if len(args) != len(sig.args):
            raise TypeError(f"{sig.name}({', '.join(n for n, _ in sig.args)}) takes "
                            f"{len(sig.args)} arguments, got {len(args)}")
        slots = b"".join(_encode_arg(sig.name, name, kind, value)
                         for (name, kind), value in zip(sig.args, args))
        g, b = _dim3(grid), _dim3(block)
        self._raise_async_error()
        req = self._driver.submit(command(wire.CMD_LAUNCH, (sig.kernel_id, *g, *b, len(args)),
                                          ctx_id=self.ctx_id, extra=slots))
        req.on_done = self._async_done

    def _async_done(self, req) -> None:
        """An asynchronous request came back; keep its error for the next sync point."""
        try:
            req.response()
        except Exception as e:
            if self._async_error is None:
                self._async_error = e

    def _raise_async_error(self) -> None:
        err, self._async_error = self._async_error, None
        if err is not None:
            raise err

    @_api
    def synchronize(self) -> None:
        """Wait for all work of this context; raises the first error of earlier async work."""
        self._driver.call(command(wire.CMD_NOP, ctx_id=self.ctx_id, fence_id=1))
        self._raise_async_error()

    @_api
    def destroy(self) -> None:
        if not self.destroyed:
            self.destroyed = True
            self._driver.call(command(wire.CMD_CTX_DESTROY, ctx_id=self.ctx_id))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self.destroyed and not self._driver.needs_reset:
            self.destroy()

    def __repr__(self):
        return f"<pvgpu.Context {self.ctx_id} on device {self.device.index}>"


class DeviceArray:
    """A buffer in device memory that knows its shape, dtype and device VA (`ptr`)."""

    def __init__(self, ctx: Context, resource_id: int, va: int, shape, dtype):
        self.context = ctx
        self.resource_id = resource_id
        self.ptr = va
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.freed = False

    @property
    def va(self) -> int:
        return self.ptr

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __len__(self):
        return self.shape[0] if self.shape else 1

    def to_host(self, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            out = np.empty(self.shape, self.dtype)
        elif out.nbytes != self.nbytes or not out.flags.c_contiguous:
            raise ValueError(f"out must be a contiguous array of {self.nbytes} bytes")
        return self.context.copy_d2h(self.ptr, out)

    def copy_from_host(self, array) -> None:
        array = np.ascontiguousarray(array, dtype=self.dtype)
        if array.nbytes != self.nbytes:
            raise ValueError(f"array of {array.nbytes} bytes does not fit {self.nbytes} bytes")
        self.context.copy_h2d(self.ptr, array)

    def free(self) -> None:
        if not self.freed:
            self.freed = True
            self.context._free(self.resource_id)

    def __repr__(self):
        return f"<pvgpu.DeviceArray shape={self.shape} dtype={self.dtype} ptr={self.ptr:#x}>"


def _dim3(v) -> tuple:
    if np.isscalar(v):
        v = (int(v),)
    v = tuple(int(x) for x in v) + (1, 1, 1)
    return v[:3]


def _encode_arg(kernel: str, name: str, kind: str, value) -> bytes:
    if kind == wire.ARG_PTR:
        if isinstance(value, DeviceArray):
            return struct.pack("<Q", value.ptr)
        if isinstance(value, (int, np.integer)) and 0 <= int(value) < 1 << 64:
            return struct.pack("<Q", int(value))
        raise TypeError(f"{kernel}: argument {name!r} must be a DeviceArray or a device address")
    if kind == wire.ARG_U32:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
                or not 0 <= int(value) < 1 << 32:
            raise TypeError(f"{kernel}: argument {name!r} must be an int in [0, 2**32)")
        return struct.pack("<Q", int(value))
    if kind == wire.ARG_F32:
        return _F32.pack(float(value)) + b"\0\0\0\0"
    raise AssertionError(kind)
