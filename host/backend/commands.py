"""Device commands of one device in one guest session (spec §6 commands, §7 fences, §8 kernels).

This is the compute half of the virtio-gpu device (crosvm's virtio_gpu.rs in spirit):
contexts, resources and timelines of a session on a device, and the mapping from a
decoded command to KMD calls. The virtio half (status, features, queues) lives in
device.py; this module never sees the transport beyond a DescriptorChain and the
guest-memory object.

Every command ends in exactly one of:
  - an immediate `Response`;
  - a `Pending` response: the reply is prepared when the KMD fence signals, and the
    chain is held until then (crosvm holds fenced chains the same way);
  - a `CommandError`, answered with an error response.

Timelines (spec §7): `(ctx_id, ring_idx)`. Jobs of one timeline are ordered by passing
the previous job's fence as a dependency; an execution error of an unfenced job is
kept on the timeline and reported by the next synchronizing command.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Callable, Optional

from spec import wire
from host.backend.errors import CommandError
from host.kmd.errors import KmdError, OutOfMemory

_BODY = {k: struct.Struct(v) for k, v in wire.CMD_BODY_FORMATS.items()}
_ARG = struct.Struct("<Q")
_MAX_COPY = wire.VA_USER_LIMIT  # no copy is larger than the user VA space


@dataclass
class Request:
    type: int
    flags: int
    fence_id: int
    ctx_id: int
    ring_idx: int

    @property
    def fenced(self) -> bool:
        return bool(self.flags & wire.FLAG_FENCE)


@dataclass
class Response:
    type: int = wire.RESP_OK_NODATA
    body: bytes = b""
    data_len: int = 0  # device-written bytes that follow the response (COPY_D2H)


@dataclass
class Pending:
    fences: list  # KMD fences this command waits for
    finish: Callable[[], Response]  # runs on the backend thread once all fences signalled


@dataclass
class Timeline:
    last_fence: object = None
    unreported: list = field(default_factory=list)  # fences of unfenced jobs not yet reported

    def take_error(self) -> Optional[CommandError]:
        """The first error of an earlier unfenced job, if any; clears what is reported."""
        err = None
        for f in self.unreported:
            if f.error is not None and err is None:
                err = fault_to_error(f.error)
        self.unreported = []
        return err

    def prune(self) -> None:
        if len(self.unreported) > 64:
            self.unreported = [f for f in self.unreported if not f.signaled or f.error is not None]


@dataclass
class ContextState:
    ctx_id: int
    kmd_ctx: object
    resources: dict = field(default_factory=dict)  # resource_id -> BufferObject
    timelines: dict = field(default_factory=dict)  # ring_idx -> Timeline

    def timeline(self, ring_idx: int) -> Timeline:
        t = self.timelines.get(ring_idx)
        if t is None:
            t = self.timelines[ring_idx] = Timeline()
        return t

    def last_fences(self) -> list:
        return [t.last_fence for t in self.timelines.values() if t.last_fence is not None]


def fault_to_error(err) -> CommandError:
    """Map a KMD fence error (a GPU fault record or a string) onto a wire error."""
    address = getattr(err, "address", None)
    if address is not None:
        access = getattr(err, "access", 0)
        return CommandError(
            wire.RESP_ERR_PAGE_FAULT,
            f"GPU page fault: {wire.ACCESS_NAMES.get(access, 'access')} at VA {address:#x}",
            info0=address, info1=access)
    return CommandError(wire.RESP_ERR_UNSPEC, f"GPU error: {err}")


def kmd_to_error(e: KmdError) -> CommandError:
    if isinstance(e, OutOfMemory):
        return CommandError(wire.RESP_ERR_OUT_OF_MEMORY, f"out of device memory: {e}")
    code = getattr(e, "code", "")
    if code == "no_vmid":
        return CommandError(wire.RESP_ERR_OUT_OF_MEMORY, f"no hardware address space left: {e}")
    if code in ("invalid_argument", "invalid_address"):
        return CommandError(wire.RESP_ERR_INVALID_PARAMETER, str(e))
    return CommandError(wire.RESP_ERR_UNSPEC, f"device error ({code or 'unknown'}): {e}")


class ComputeDevice:
    """Contexts, resources and timelines of one session on one KMD device."""

    MAX_CONTEXTS = 32

    def __init__(self, kmd, dma_mapping, mem_size: int, negotiated_features: int = 0):
        self.kmd = kmd
        self.dma_mapping = dma_mapping  # the session's guest memory, DMA-mapped for this GPU
        self.mem_size = mem_size
        self.context_init = bool(negotiated_features & (1 << wire.PVGPU_F_CONTEXT_INIT))
        self.compute = bool(negotiated_features & (1 << wire.PVGPU_F_COMPUTE))
        self.contexts: dict = {}
        self.resource_owner: dict = {}  # resource_id -> ctx_id

    # ------------------------------------------------------------------ dispatch
    def execute(self, req: Request, body: bytes, chain, mem):
        """-> Response | Pending; raises CommandError."""
        handler = _HANDLERS.get(req.type)
        if handler is None:
            raise CommandError(wire.RESP_ERR_UNKNOWN_COMMAND, f"unknown command type {req.type:#06x}")
        if req.ring_idx > wire.MAX_RING_IDX:
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                               f"ring_idx {req.ring_idx} > {wire.MAX_RING_IDX}")
        if req.type == wire.CMD_LAUNCH and not self.compute:
            raise CommandError(wire.RESP_ERR_UNKNOWN_COMMAND,
                               "LAUNCH needs PVGPU_F_COMPUTE, which was not negotiated")
        return handler(self, req, _BODY[req.type].unpack(body), chain, mem)

    def timeline_index(self, req: Request) -> int:
        """ring_idx names a timeline only with CONTEXT_INIT (spec FENCE-TIMELINE-*); the
        response still echoes the request's ring_idx."""
        return req.ring_idx if self.context_init else 0

    def _ctx(self, req: Request) -> ContextState:
        ctx = self.contexts.get(req.ctx_id)
        if ctx is None:
            raise CommandError(wire.RESP_ERR_INVALID_CONTEXT_ID, f"no context {req.ctx_id}")
        return ctx

    # ------------------------------------------------------------------ commands
    def cmd_nop(self, req, body, chain, mem):
        if not req.fenced or req.ctx_id not in self.contexts:
            return Response()
        t = self._ctx(req).timeline(self.timeline_index(req))
        return self._sync_point(t, [])

    def cmd_get_device_info(self, req, body, chain, mem):
        name = self.kmd.name.encode()[:32]
        free = self.kmd.vram_free()
        return Response(wire.RESP_OK_DEVICE_INFO, struct.pack(
            wire.RESP_DEVICE_INFO_FORMAT, self.kmd.vram_size, free, free, len(self.contexts), name))

    def cmd_ctx_create(self, req, body, chain, mem):
        flags, _name = body
        if req.ctx_id == 0 or req.ctx_id in self.contexts:
            raise CommandError(wire.RESP_ERR_INVALID_CONTEXT_ID,
                               f"context id {req.ctx_id} is zero or already in use")
        if flags != 0:
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER, f"CTX_CREATE flags {flags:#x} must be 0")
        if len(self.contexts) >= self.MAX_CONTEXTS:
            raise CommandError(wire.RESP_ERR_OUT_OF_MEMORY,
                               f"at most {self.MAX_CONTEXTS} contexts per device and session")
        name = _name.split(b"\0", 1)[0].decode("utf-8", "replace")
        try:
            kctx = self.kmd.create_context(name)
        except KmdError as e:
            raise kmd_to_error(e) from None
        try:
            kctx.map_system(self.dma_mapping, wire.GUEST_WINDOW_VA, self.mem_size, writable=True)
        except KmdError as e:
            self.kmd.destroy_context(kctx)
            raise kmd_to_error(e) from None
        self.contexts[req.ctx_id] = ContextState(req.ctx_id, kctx)
        return Response()

    def cmd_ctx_destroy(self, req, body, chain, mem):
        ctx = self._ctx(req)
        self._destroy(ctx)
        return Response()

    def cmd_mem_alloc(self, req, body, chain, mem):
        resource_id, flags, size = body
        ctx = self._ctx(req)
        if resource_id == 0 or resource_id in self.resource_owner:
            raise CommandError(wire.RESP_ERR_INVALID_RESOURCE_ID,
                               f"resource id {resource_id} is zero or already in use")
        if flags != 0 or size == 0:
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                               f"MEM_ALLOC needs flags 0 and size > 0 (got flags {flags:#x}, size {size})")
        if size > self.kmd.vram_size:
            raise CommandError(wire.RESP_ERR_OUT_OF_MEMORY,
                               f"{size} bytes exceed the device's {self.kmd.vram_size} bytes of VRAM")
        try:
            bo = ctx.kmd_ctx.alloc(size)
        except KmdError as e:
            raise kmd_to_error(e) from None
        ctx.resources[resource_id] = bo
        self.resource_owner[resource_id] = ctx.ctx_id
        return Response(wire.RESP_OK_MEM_ALLOC, struct.pack(wire.RESP_MEM_ALLOC_FORMAT, bo.va, bo.size))

    def cmd_mem_free(self, req, body, chain, mem):
        (resource_id,) = body
        ctx = self._ctx(req)
        bo = ctx.resources.pop(resource_id, None)
        if bo is None:
            raise CommandError(wire.RESP_ERR_INVALID_RESOURCE_ID,
                               f"resource {resource_id} does not belong to context {req.ctx_id}")
        del self.resource_owner[resource_id]
        ctx.kmd_ctx.free(bo)
        return Response()

    def cmd_copy_h2d(self, req, body, chain, mem):
        dst_va, size = body
        ctx = self._ctx(req)
        _check_range("dst_va", dst_va, size)
        off = wire.CTRL_HDR_SIZE + _BODY[req.type].size
        if chain.readable_len - off < size:
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                               f"COPY_H2D of {size} bytes carries only {chain.readable_len - off}")
        copies, pos = [], dst_va
        for gpa, n in chain.readable_extents(off, size):
            copies.append((wire.GUEST_WINDOW_VA + gpa, pos, n))
            pos += n
        return self._submit(ctx, req, lambda wait: ctx.kmd_ctx.submit_copies(copies, wait=wait),
                            hold=True)

    def cmd_copy_d2h(self, req, body, chain, mem):
        src_va, size = body
        ctx = self._ctx(req)
        _check_range("src_va", src_va, size)
        off = wire.CTRL_HDR_SIZE
        if chain.writable_len - off < size:
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                               f"COPY_D2H of {size} bytes has room for {chain.writable_len - off}")
        copies, pos = [], src_va
        for gpa, n in chain.writable_extents(off, size):
            copies.append((pos, wire.GUEST_WINDOW_VA + gpa, n))
            pos += n
        return self._submit(ctx, req, lambda wait: ctx.kmd_ctx.submit_copies(copies, wait=wait),
                            hold=True, data_len=size)

    def cmd_copy_d2d(self, req, body, chain, mem):
        src_va, dst_va, size = body
        ctx = self._ctx(req)
        _check_range("src_va", src_va, size)
        _check_range("dst_va", dst_va, size)
        return self._submit(ctx, req, lambda wait: ctx.kmd_ctx.submit_copy(src_va, dst_va, size, wait=wait))

    def cmd_launch(self, req, body, chain, mem):
        kernel_id, gx, gy, gz, bx, by, bz, nargs = body
        ctx = self._ctx(req)
        sig = wire.BUILTIN_KERNELS.get(kernel_id)
        if sig is None:
            raise CommandError(wire.RESP_ERR_INVALID_KERNEL, f"no kernel with id {kernel_id}")
        if nargs != len(sig.args) or nargs > wire.MAX_KERNEL_ARGS:
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                               f"kernel {sig.name} takes {len(sig.args)} arguments, got {nargs}")
        if min(gx, gy, gz) == 0 or max(gx, gy, gz) >= wire.MAX_GRID_DIM:
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER, f"bad grid ({gx}, {gy}, {gz})")
        threads = bx * by * bz
        if threads == 0 or threads > wire.MAX_BLOCK_THREADS:
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                               f"block ({bx}, {by}, {bz}) must have 1..{wire.MAX_BLOCK_THREADS} threads")
        off = wire.CTRL_HDR_SIZE + _BODY[req.type].size
        if chain.readable_len - off < nargs * wire.LAUNCH_ARG_SIZE:
            raise CommandError(wire.RESP_ERR_SHORT_COMMAND,
                               f"LAUNCH announces {nargs} arguments but carries fewer")
        raw = chain.read(mem, off, nargs * wire.LAUNCH_ARG_SIZE)
        args = [_ARG.unpack_from(raw, 8 * i)[0] for i in range(nargs)]
        grid, block = (gx, gy, gz), (bx, by, bz)
        return self._submit(ctx, req,
                            lambda wait: ctx.kmd_ctx.submit_launch(kernel_id, grid, block, args, wait=wait))

    # ------------------------------------------------------------------ timelines
    def _submit(self, ctx: ContextState, req: Request, submit, *, hold=False, data_len=0):
        t = ctx.timeline(self.timeline_index(req))
        wait = [t.last_fence] if t.last_fence is not None and not t.last_fence.signaled else []
        try:
            fence = submit(wait)
        except KmdError as e:
            raise kmd_to_error(e) from None
        t.last_fence = fence
        if not (hold or req.fenced):
            t.unreported.append(fence)
            t.prune()
            return Response()
        return self._sync_point(t, [fence], data_len=data_len)

    def _sync_point(self, t: Timeline, own: list, data_len: int = 0):
        """Answer once everything on the timeline so far has completed (spec §7)."""
        earlier = t.unreported
        t.unreported = []
        # own fence is usually also the timeline's last one: wait on each fence once
        fences = list(dict.fromkeys(
            f for f in earlier + own + [t.last_fence] if f is not None))

        def finish() -> Response:
            for f in earlier + own:
                if f.error is not None:
                    raise fault_to_error(f.error)
            return Response(data_len=data_len)

        if all(f.signaled for f in fences):
            return finish()
        return Pending(fences, finish)

    # ------------------------------------------------------------------ teardown
    def _destroy(self, ctx: ContextState) -> None:
        for rid in ctx.resources:
            self.resource_owner.pop(rid, None)
        ctx.resources.clear()
        del self.contexts[ctx.ctx_id]
        self.kmd.destroy_context(ctx.kmd_ctx)  # frees are deferred until its work is done

    def last_fences(self) -> list:
        out = []
        for ctx in self.contexts.values():
            out += ctx.last_fences()
        return out

    def reset(self) -> list:
        """Destroy every context; -> the fences still in flight (the caller waits on them
        before it unmaps guest memory the engines may still be touching)."""
        pending = [f for f in self.last_fences() if not f.signaled]
        for ctx in list(self.contexts.values()):
            self._destroy(ctx)
        return pending


def _check_range(name: str, va: int, size: int) -> None:
    if size == 0 or size > _MAX_COPY or va + size > (1 << 64):
        raise CommandError(wire.RESP_ERR_INVALID_PARAMETER, f"bad {name} range {va:#x}+{size}")


_HANDLERS = {
    wire.CMD_NOP: ComputeDevice.cmd_nop,
    wire.CMD_GET_DEVICE_INFO: ComputeDevice.cmd_get_device_info,
    wire.CMD_CTX_CREATE: ComputeDevice.cmd_ctx_create,
    wire.CMD_CTX_DESTROY: ComputeDevice.cmd_ctx_destroy,
    wire.CMD_MEM_ALLOC: ComputeDevice.cmd_mem_alloc,
    wire.CMD_MEM_FREE: ComputeDevice.cmd_mem_free,
    wire.CMD_COPY_H2D: ComputeDevice.cmd_copy_h2d,
    wire.CMD_COPY_D2H: ComputeDevice.cmd_copy_d2h,
    wire.CMD_COPY_D2D: ComputeDevice.cmd_copy_d2d,
    wire.CMD_LAUNCH: ComputeDevice.cmd_launch,
}
assert set(_HANDLERS) == set(wire.CMD_BODY_FORMATS)
