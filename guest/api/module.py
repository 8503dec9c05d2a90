"""Modules: kernels of one's own, compiled from PTX (or CUDA C through NVRTC) into the
device's code objects (spec/isa.md), loaded into a context and launched — the
cuModuleLoadData / cuModuleGetFunction / cuModuleGetGlobal / cuLaunchKernel of this API,
shaped like CuPy's RawModule and numba's `kernel[grid, block](...)`.

    mod = ctx.load_module(ptx_text)            # or b"...", a .ptx/.cu path, CUDA C source
    fn = mod.get_function("saxpy")
    fn.launch(grid, block, (a, x, y, n))       # or fn[grid, block](a, x, y, n)
    table = mod.get_global("table", np.float32)  # a __constant__ or __device__ array

Loading (spec [COBJ-LOAD-1]): the source is compiled by guest/jit into a code object; the
object goes into device memory allocated with MEM_ALLOC_FLAG_EXEC, its `.global` and
`.const` segments into ordinary allocations of the same context, initialised (initial
bytes, then zeros); the segments' VAs are patched into the object's header before it is
uploaded. Bytes that already are a code object (they start with COBJ_MAGIC) are loaded as
they are: the device validates every object it runs, and refuses a malformed one with
IllegalCodeError at the launch's synchronizing call.

A launch (CMD_LAUNCH_CODE, spec §6.5.32) names the entry by the VA of its record and
carries the parameter bytes, marshalled by the entry's parameter table (guest/api/params.py).
The block size and the shared memory are checked against the entry and the device first
(InvalidParameterError), so a bad configuration fails at the call, not at the next
synchronize. Launches are asynchronous, like built-in ones: the driver holds the latest
back until anything else goes out, and a synchronize of its stream sends it fenced as its
sync point, one chain (VirtioGpuDriver.hold, guest/frontend/launch_batch.py).

Lifetime: a Module owns its three allocations; `unload()` frees them, and so does dropping
the last reference to the module (its Functions and global arrays hold it), through the
DeviceArrays that own them (guest/api/lifetime.py). Work submitted before still completes
(the device frees memory behind the context's earlier work).
"""

from __future__ import annotations

import os
import struct
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pvgpu.guest.api import errors, params
from pvgpu.guest.api.array import DeviceArray
from pvgpu.guest.api.locking import ApiObject, unlocked
from pvgpu.guest.frontend.driver import SLOT_CMD
from pvgpu.spec import isa, wire

if TYPE_CHECKING:
    from pvgpu.guest.api.context import Context
    from pvgpu.guest.api.stream import Stream

# a LAUNCH_CODE command without its parameters: header and body in one struct
_LAUNCH_CODE = struct.Struct(wire.CTRL_HDR_FORMAT
                             + wire.CMD_BODY_FORMATS[wire.CMD_LAUNCH_CODE].lstrip("<"))
_VAS = struct.Struct("<QQ")  # data_va, const_va at COBJ_DATA_VA_OFFSET
NVRTC_ARCH = "compute_80"  # the virtual architecture CUDA C is compiled for (sm_80 limits)


# ---------------------------------------------------------------------- code objects
class CodeObject:
    """What the driver needs of a code object, by name: its entries (guest/jit's EntryInfo:
    parameter tables, register counts, shared and local sizes, max threads) and its module
    variables (SymbolInfo), read and checked by guest/jit's reader. The device checks
    everything again when it runs the object."""

    def __init__(self, data: bytes):
        from pvgpu.guest.jit import CodeObjectError, read_code_object
        self.data = bytes(data)
        try:
            self._obj = read_code_object(self.data)
        except CodeObjectError as e:
            raise errors.ModuleLoadError(f"not a valid code object: {e}") from None
        self.h = self._obj.header
        self.entries = {e.name: e for e in self._obj.entries}
        self.symbols = {s.name: s for s in self._obj.symbols}

    def segment_init(self, seg: str) -> bytes:
        """The whole initial contents of segment "data" or "const": its initial bytes,
        then zeros."""
        init = self._obj.data_init if seg == "data" else self._obj.const_init
        return init + bytes(self.h[f"{seg}_size"] - len(init))

    def entry_offset(self, entry) -> int:
        return self._obj.entry_offset(entry)

    def with_segment_vas(self, data_va: int, const_va: int) -> bytes:
        """The object with the segments' VAs in its header ([COBJ-LOAD-1])."""
        out = bytearray(self.data)
        _VAS.pack_into(out, isa.COBJ_DATA_VA_OFFSET, data_va, const_va)
        return bytes(out)


# ---------------------------------------------------------------------- sources
def _looks_like_cuda_c(text: str) -> bool:
    return "__global__" in text or "#include" in text


def _looks_like_ptx(text: str) -> bool:
    for line in text.splitlines():
        s = line.strip()
        if s.startswith((".version", ".target", ".entry", ".visible", ".address_size")):
            return True
    return False


def code_object_of(src) -> bytes:
    """-> the code object of `src`: PTX text (str or bytes), a path to a .ptx or .cu file,
    CUDA C source (with NVRTC installed), or the bytes of a code object."""
    if isinstance(src, (bytes, bytearray, memoryview)):
        raw = bytes(src)
        if raw.startswith(isa.COBJ_MAGIC):
            return raw
        try:
            src = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise errors.ModuleLoadError("bytes that are neither a code object nor UTF-8 "
                                         "PTX text") from None
    if isinstance(src, os.PathLike) or (isinstance(src, str) and "\n" not in src
                                        and src.strip().endswith((".ptx", ".cu"))):
        path = Path(src)
        try:
            text = path.read_text()
        except OSError as e:
            raise errors.ModuleLoadError(f"cannot read {path}: {e}") from None
        if path.suffix == ".cu":
            return compile_ptx(compile_cuda(text, path.name), str(path))
        return compile_ptx(text, str(path))
    if not isinstance(src, str):
        raise TypeError("load_module takes PTX text or bytes, a path to a .ptx or .cu file, "
                        f"CUDA C source or a code object, not {type(src).__name__}")
    if _looks_like_cuda_c(src) and not _looks_like_ptx(src):
        return compile_ptx(compile_cuda(src))
    return compile_ptx(src)


def compile_ptx(text: str, name: str = "<ptx>") -> bytes:
    """PTX text -> code object bytes (guest/jit); PtxCompileError names the line."""
    from pvgpu.guest import jit
    from pvgpu.guest.jit.errors import PtxError
    try:
        return jit.compile_ptx(text)
    except PtxError as e:
        raise errors.PtxCompileError(f"{name}: {e}", line=e.line or None,
                                     instruction=e.text or None,
                                     section=e.section or None) from None


def compile_cuda(source: str, name: str = "kernel.cu", options=()) -> str:
    """CUDA C source -> PTX text with NVRTC (the `pvgpu[cuda]` extra)."""
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        raise errors.CudaCompileError(
            "compiling CUDA C needs NVRTC, which is not installed: pip install 'pvgpu[cuda]' "
            "(cuda-bindings and nvidia-cuda-nvrtc), or pass PTX (nvcc --ptx) instead") from None
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS

    def check(result, what):
        err = result[0] if isinstance(result, tuple) else result
        if err != ok:
            raise errors.CudaCompileError(f"{name}: NVRTC {what} failed: {err.name}")
        return result[1:] if isinstance(result, tuple) else ()

    (prog,) = check(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []),
                    "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={NVRTC_ARCH}".encode(), *(o.encode() for o in options)]
        result = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if result[0] != ok:
            (n,) = check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            log = b" " * n
            check(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
            text = log.decode(errors="replace").rstrip("\0 \n")
            raise errors.CudaCompileError(f"{name} does not compile:\n{text}", log=text)
        (n,) = check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
        ptx = b" " * n
        check(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        return ptx.decode().rstrip("\0")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


# ---------------------------------------------------------------------- the API
class Module(ApiObject):
    """A code object loaded into a context (Context.load_module)."""

    def __init__(self, ctx: "Context", cobj: CodeObject):
        self.context = ctx
        self._conn_lock = ctx._conn_lock
        self._releases = ctx._releases
        self._cobj = cobj
        self._arrays: list[DeviceArray] = []  # owners of its memory: object, .global, .const
        # weak: a Function or a global array holds its module, not the other way round, so
        # that dropping them all frees the module without waiting for the cycle collector
        self._functions: weakref.WeakValueDictionary[str, Function] = weakref.WeakValueDictionary()
        self._globals: weakref.WeakSet[ModuleGlobal] = weakref.WeakSet()  # views handed out
        self.loaded = False
        self._load()

    def _own(self, nbytes: int, executable: bool = False) -> DeviceArray:
        rid, va, _size = self.context.alloc(max(nbytes, 1), executable=executable)
        arr = DeviceArray(self.context, rid, va, (nbytes,), np.uint8)
        self._arrays.append(arr)
        return arr

    def _load(self) -> None:
        ctx, cobj = self.context, self._cobj
        try:
            vas = {}
            for seg in ("data", "const"):
                init = cobj.segment_init(seg)
                if init:
                    arr = self._own(len(init))
                    ctx.copy_h2d(arr.ptr, np.frombuffer(init, np.uint8))
                    vas[seg] = arr.ptr
            image = cobj.with_segment_vas(vas.get("data", 0), vas.get("const", 0))
            self._object = self._own(len(image), executable=True)
            ctx.copy_h2d(self._object.ptr, np.frombuffer(image, np.uint8))
            self._segment_va = vas
        except BaseException:
            for arr in self._arrays:
                if not ctx.destroyed:
                    arr.free()
            raise
        self.loaded = True

    def _check(self) -> None:
        if not self.loaded:
            raise errors.InvalidResourceError(f"{self!r} was unloaded",
                                              code=wire.RESP_ERR_INVALID_RESOURCE_ID)
        self.context._check_live()

    @property
    @unlocked("a field fixed at load")
    def va(self) -> int:
        """The device address of the code object (its header)."""
        return self._object.ptr

    @property
    @unlocked("read from the code object, fixed at load")
    def function_names(self) -> list:
        """The names of the module's kernels (`.entry`), sorted."""
        return sorted(self._cobj.entries)

    @property
    @unlocked("read from the code object, fixed at load")
    def global_names(self) -> list:
        """The names of the module's global variables (`__device__`, `__constant__`), sorted."""
        return sorted(self._cobj.symbols)

    def get_function(self, name: str) -> "Function":
        """The kernel (`.entry`) called `name` (the PTX name: mangled for C++ kernels,
        plain for `extern "C"` ones); NotFoundError lists the module's kernels."""
        self._check()
        fn = self._functions.get(name)
        if fn is None:
            entry = self._cobj.entries.get(name)
            if entry is None:
                raise errors.NotFoundError(f"no kernel {name!r} in the module; it has: "
                                           f"{', '.join(self.function_names) or 'none'}")
            fn = Function(self, entry)
            self._functions[name] = fn
        return fn

    def get_global(self, name: str, dtype=np.uint8, shape=None) -> "ModuleGlobal":
        """A DeviceArray over module variable `name` (`.global`/__device__ or
        `.const`/__constant__), of `dtype` and `shape` (default: as many elements as fit);
        copy_from_host on it is cudaMemcpyToSymbol."""
        self._check()
        sym = self._cobj.symbols.get(name)
        if sym is None:
            raise errors.NotFoundError(f"no module variable {name!r}; the module has: "
                                       f"{', '.join(self.global_names) or 'none'}")
        dtype = np.dtype(dtype)
        if shape is None:
            if sym.size % dtype.itemsize:
                raise ValueError(f"{name} is {sym.size} bytes, not a whole number of {dtype}")
            shape = (sym.size // dtype.itemsize,)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != sym.size:
            raise ValueError(f"{name} is {sym.size} bytes; shape {shape} of {dtype} is not")
        seg = "data" if sym.space == isa.SPACE_GLOBAL else "const"
        arr = ModuleGlobal(self, self._segment_va[seg] + sym.offset, shape, dtype, name)
        self._globals.add(arr)
        return arr

    def unload(self) -> None:
        """Free the module's memory (work submitted before still completes). Its Functions
        and global arrays are unusable afterwards; unload() twice does nothing."""
        if not self.loaded:
            return
        self.loaded = False
        for g in self._globals:
            g.freed = True
        for arr in self._arrays:
            arr.free()

    def __repr__(self) -> str:
        state = "" if self.loaded else " unloaded"
        return (f"<pvgpu.Module of context {self.context.ctx_id}: "
                f"{len(self._cobj.entries)} kernel(s){state}>")


class ModuleGlobal(DeviceArray):
    """A module variable as a DeviceArray (Module.get_global). It owns nothing: the module
    does, and lives as long as this array does; free() does nothing."""

    _ended = "unloaded with its module"

    def __init__(self, module: Module, va: int, shape, dtype, name: str):
        super().__init__(module.context, 0, va, shape, dtype)
        self.module = module
        self.name = name

    def free(self) -> None:
        """The module's memory goes with Module.unload(); nothing to free here."""

    def __repr__(self) -> str:
        return (f"<pvgpu.ModuleGlobal {self.name} shape={self.shape} dtype={self.dtype} "
                f"ptr={self.ptr:#x}>")


class Function(ApiObject):
    """A kernel of a loaded module (Module.get_function): its attributes (cuFuncGetAttribute)
    and its launches."""

    def __init__(self, module: Module, entry):
        self.module = module
        self._conn_lock = module._conn_lock
        self._releases = module._releases
        self._entry = entry
        self.name = entry.name
        self._params = params.ParamLayout(entry)
        self._object_va = module.va  # fixed while the module is loaded
        self._entry_va = module.va + module._cobj.entry_offset(entry)

    @property
    @unlocked("read from the code object, fixed at load")
    def num_regs(self) -> int:
        """32-bit registers per thread (a 64-bit register counts as two)."""
        return self._entry.n_r32 + 2 * self._entry.n_r64

    @property
    @unlocked("read from the code object, fixed at load")
    def shared_size_bytes(self) -> int:
        """Static shared memory per block."""
        return self._entry.shared_size

    @property
    @unlocked("read from the code object, fixed at load")
    def local_size_bytes(self) -> int:
        """Local memory per thread."""
        return self._entry.local_size

    @property
    @unlocked("read from the code object, fixed at load")
    def max_threads_per_block(self) -> int:
        """The largest block this kernel may be launched with (its `__launch_bounds__`, else
        the device's limit)."""
        return self._entry.max_threads or isa.MAX_BLOCK_THREADS

    @property
    @unlocked("read from the code object, fixed at load")
    def params(self) -> tuple:
        """The parameter table: ParamInfo(offset, size, align, type), in declaration order."""
        return self._entry.params

    @property
    @unlocked("read from the code object, fixed at load")
    def param_size(self) -> int:
        """Bytes of the kernel's parameter buffer (its `.param` list, laid out as in PTX)."""
        return self._entry.param_size

    def launch(self, grid, block, args=(), shared_mem: int = 0,
               stream: "Stream | None" = None) -> None:
        """Launch asynchronously on `stream` (default: the context's default stream);
        grid and block are an int or a 1- to 3-tuple, shared_mem the bytes of dynamic
        shared memory per block. Errors of the run surface at the next synchronizing call."""
        module = self.module
        module._check()
        ctx = module.context
        s = ctx.default_stream if stream is None else ctx._stream(stream)
        g, b = _launch_dims(grid, "grid"), _launch_dims(block, "block")
        threads = b[0] * b[1] * b[2]
        entry = self._entry
        limit = entry.max_threads or isa.MAX_BLOCK_THREADS
        if threads > limit:
            raise errors.InvalidParameterError(
                f"{self.name}: a block of {b} is {threads} threads, the kernel allows at most "
                f"{limit}", code=wire.RESP_ERR_INVALID_PARAMETER)
        if type(shared_mem) is not int and (isinstance(shared_mem, bool) or not isinstance(
                shared_mem, (int, np.integer))) or shared_mem < 0:
            raise TypeError(f"shared_mem must be a non-negative int, not {shared_mem!r}")
        if entry.shared_size + shared_mem > isa.MAX_DYNAMIC_SHARED:
            raise errors.InvalidParameterError(
                f"{self.name}: {entry.shared_size} bytes of static and {shared_mem} of "
                f"dynamic shared memory exceed the device's {isa.MAX_DYNAMIC_SHARED} per block",
                code=wire.RESP_ERR_INVALID_PARAMETER)
        raw = self._params.marshal(ctx, args)
        if s._async_error is not None:
            s._raise_async_error()
        ring_idx = s.ring_idx
        head = _LAUNCH_CODE.pack(wire.CMD_LAUNCH_CODE, wire.FLAG_INFO_RING_IDX if ring_idx else 0,
                                 0, ctx.ctx_id, ring_idx, self._object_va, self._entry_va, *g, *b,
                                 int(shared_mem), len(raw))
        driver = ctx._driver
        # held back by the driver until something else goes out, or sent fenced as the
        # sync point of a synchronize that comes first (VirtioGpuDriver.hold)
        if len(head) + len(raw) <= SLOT_CMD:  # small parameters travel in the command
            driver.hold(head + raw, (), ctx.ctx_id, ring_idx, s._async_done)
            return
        # larger ones in a buffer of guest memory, free again once the device answered
        # (it copied them when it took the command, spec CMD-LAUNCH-CODE-3)
        device = ctx.device
        heap = device.connection.session.heap
        gpa = heap.alloc(len(raw))

        def done(r) -> None:
            if r.failed is None:
                heap.free(gpa)
            else:  # never answered: the device may read it until reset (Device.reset)
                device._staging.quarantine([gpa])
            s._async_done(r)
        try:
            driver.mem.write(gpa, raw)
            driver.hold(head, ((gpa, len(raw)),), ctx.ctx_id, ring_idx, done)
        except BaseException:
            heap.free(gpa)
            raise

    def __getitem__(self, config) -> "_Configured":
        """fn[grid, block], fn[grid, block, stream] or fn[grid, block, stream, shared_mem]
        -> a callable that launches with its arguments."""
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise TypeError("launch configuration is [grid, block], [grid, block, stream] or "
                            "[grid, block, stream, shared_mem]")
        return _Configured(self, *config)

    def __repr__(self) -> str:
        return f"<pvgpu.Function {self.name} of {self.module!r}>"


@dataclass(frozen=True)
class _Configured:
    fn: Function
    grid: object
    block: object
    stream: Stream | None = None
    shared_mem: int = 0

    def __call__(self, *args) -> None:
        self.fn.launch(self.grid, self.block, args, shared_mem=self.shared_mem,
                       stream=self.stream)


def _launch_dims(v, what: str) -> tuple:
    """An int or a 1- to 3-tuple of positive ints -> (x, y, z)."""
    limit = wire.MAX_GRID_DIM - 1 if what == "grid" else wire.MAX_BLOCK_THREADS
    if type(v) is int and 1 <= v <= limit:  # the common case
        return v, 1, 1
    dims = (v,) if isinstance(v, (int, np.integer)) else v
    try:
        dims = tuple(dims)
    except TypeError:
        raise TypeError(f"{what} must be an int or a 1- to 3-tuple of ints, not {v!r}") from None
    if not 1 <= len(dims) <= 3 or any(isinstance(d, (bool, np.bool_))
                                      or not isinstance(d, (int, np.integer)) for d in dims):
        raise TypeError(f"{what} must be an int or a 1- to 3-tuple of ints, not {v!r}")
    dims = tuple(int(d) for d in dims) + (1,) * (3 - len(dims))
    if any(d < 1 for d in dims):
        raise errors.InvalidParameterError(f"{what} {dims} has a dimension below 1",
                                           code=wire.RESP_ERR_INVALID_PARAMETER)
    if any(d > limit for d in dims) or (what == "block" and
                                        dims[0] * dims[1] * dims[2] > wire.MAX_BLOCK_THREADS):
        raise errors.InvalidParameterError(f"{what} {dims} exceeds the device's limits",
                                           code=wire.RESP_ERR_INVALID_PARAMETER)
    return dims


def load(ctx: "Context", src) -> Module:
    """Context.load_module: compile (if needed), allocate, initialise and upload."""
    ctx._check_live()
    return Module(ctx, CodeObject(code_object_of(src)))
