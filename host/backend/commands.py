"""Device commands of one device in one guest session (spec §6 commands, §7 fences, §8 kernels).

This is the compute half of the virtio-gpu device (crosvm's virtio_gpu.rs in spirit):
contexts, resources and timelines of a session on a device, and the mapping from a
decoded command to KMD calls. The virtio half (status, features, queues) lives in
device.py, the wire format in protocol.py; this module never sees the transport.

Commands arrive decoded: a typed `Command` per CMD_* code (protocol.py), dispatched to
the handler registered for its class with `@handles(...)`, with its context resolved
when the command needs one. A handler sees the chain only through the command's
accessors (trailing data) and the `Writer` (the room for GET_STATS and COPY_D2H data).
Every command ends in exactly one of:
  - an immediate `Response`;
  - a `Pending` response: the reply is prepared when the KMD fence signals, and the
    chain is held until then (crosvm holds fenced chains the same way);
  - a `CommandError`, answered with an error response;
  - a KMD `WouldBlock` (host/kmd/wouldblock.py): the KMD would have to wait for the GPU
    (MEM_ALLOC, SHM_GET, MEM_MAP, RESOURCE_IMPORT, a first LAUNCH_CODE; spec
    FENCE-HOLD-3). device.py holds the chain and runs the command again when the fence
    signals, so a handler changes nothing before a KMD call that may raise it.

Timelines (spec §7): `(ctx_id, ring_idx)`; a guest stream is one ring_idx. Jobs of one
timeline are ordered by passing the previous job's fence as a dependency; an execution
error of an unfenced job is kept on the timeline and reported by the next synchronizing
command (a fenced NOP of that timeline, or CTX_SYNC for all of the context's timelines).

Events (spec §7.6, §7.7): EVENT_RECORD snapshots a timeline (its last job, its unreported
jobs and the fences it is still to wait for) into an `EventSnapshot`; EVENT_WAIT makes
the timeline's next job depend on a snapshot's fences, which the KMD scheduler holds the
job for (the `wait=` list of a submission) — neither side ever blocks for it. Events live
in a per-session, per-device namespace of guest-chosen ids; EVENT_EXPORT publishes a
snapshot in the host-global `EventExports` registry so that another session (or the other
device) can EVENT_IMPORT it.

Explicit VA management (spec §6.5.25–§6.5.28, §6.7): VA_RESERVE / VA_RELEASE / MEM_MAP /
MEM_UNMAP call the KMD context's reserve_va / release_va / map_bo_at / unmap_at; a
KMD InvalidAddress is answered RESP_ERR_INVALID_ADDRESS.

Shared device memory (spec §6.5.19–§6.5.24, §6.6): SHM_* commands name segments through
the session's `ShmTable` (host/backend/shm.py) and call the KMD's ShmManager with the
session as the key namespace and client; the segments count against the session's vGPU.
"""

from __future__ import annotations

import collections
import contextlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import msgpack

from pvgpu.spec import wire
from pvgpu.host.backend import code_launch
from pvgpu.host.backend import protocol as p
from pvgpu.host.backend.protocol import Pending, Response
from pvgpu.host.backend.errors import CommandError
from pvgpu.host.backend.events import EventExports, EventSnapshot
from pvgpu.host.backend.inflight import SessionJobs
from pvgpu.host.backend.limits import GUEST_CONTEXT_LIMITS
from pvgpu.host.backend.prime import ResourceExports
from pvgpu.host.backend.shm import ShmTable, shm_error
from pvgpu.host.backend.stats import session_view
from pvgpu.host.kmd import errors as kmd_errors
from pvgpu.host.kmd import sched
from pvgpu.host.kmd.bo import CodeFault
from pvgpu.host.kmd.context import DEFAULT_VGPU
from pvgpu.host.kmd.errors import KmdError, LimitReached, OutOfMemory
from pvgpu.host.kmd.prime import PrimeImport
from pvgpu.spec import isa
from pvgpu.transport.codec import msgpack_plain

_MAX_COPY = wire.VA_USER_LIMIT  # no copy is larger than the user VA space
handles = p.Handlers()


@dataclass
class Timeline:
    last_fence: object = None
    unreported: list = field(default_factory=list)  # fences of unfenced jobs not yet reported
    waits: list = field(default_factory=list)  # EVENT_WAIT fences the next job depends on
    prune_at: int = 64  # prune `unreported` once it is this long (twice what a prune kept)

    def take_error(self) -> Optional[CommandError]:
        """The first error of an earlier unfenced job, if any; clears what is reported."""
        err = None
        for f in self.unreported:
            if f.error is not None and err is None:
                err = fault_to_error(f.error)
        self.unreported = []
        return err

    def prune(self) -> None:
        """Forget the unreported fences that signalled without an error. Amortised O(1)
        per job: with many jobs still queued a prune keeps most of them, so the next one
        waits until the list has doubled."""
        if len(self.unreported) > self.prune_at:
            self.unreported = [f for f in self.unreported if not f.signaled or f.error is not None]
            self.prune_at = max(64, 2 * len(self.unreported))


@dataclass
class ContextState:
    ctx_id: int
    kmd_ctx: object
    resources: dict = field(default_factory=dict)  # resource_id -> BufferObject | PrimeImport
    timelines: dict = field(default_factory=dict)  # ring_idx -> Timeline

    def resource(self, resource_id: int):
        """The context's allocation or import `resource_id`; else INVALID_RESOURCE_ID."""
        obj = self.resources.get(resource_id)
        if obj is None:
            raise CommandError(wire.RESP_ERR_INVALID_RESOURCE_ID,
                               f"resource {resource_id} does not belong to context {self.ctx_id}")
        return obj

    def timeline(self, ring_idx: int) -> Timeline:
        t = self.timelines.get(ring_idx)
        if t is None:
            t = self.timelines[ring_idx] = Timeline()
        return t

    def last_fences(self) -> list:
        return [t.last_fence for t in self.timelines.values() if t.last_fence is not None]


@dataclass
class EventState:
    snapshot: EventSnapshot
    exports: list = field(default_factory=list)  # (handle_id, token) of its live exports


def fault_to_error(err) -> CommandError:
    """Map a KMD fence error (a GPU fault record, a KMD error, or a string) onto a wire error."""
    if isinstance(err, CodeFault):  # spec CMD-LAUNCH-CODE-5
        why = isa.COBJ_ERR_NAMES.get(err.reason, str(err.reason))
        return CommandError(wire.RESP_ERR_ILLEGAL_CODE,
                            f"code fault: the device refused the code ({why}) at VA "
                            f"{err.address:#x}", info0=err.address, info1=err.reason)
    address = getattr(err, "address", None)
    if address is not None:
        access = getattr(err, "access", 0)
        return CommandError(
            wire.RESP_ERR_PAGE_FAULT,
            f"GPU page fault: {wire.ACCESS_NAMES.get(access, 'access')} at VA {address:#x}",
            info0=address, info1=access)
    code = getattr(err, "code", None) if isinstance(err, KmdError) else None
    if code == kmd_errors.JOB_TIMEOUT:
        return CommandError(wire.RESP_ERR_JOB_TIMEOUT,
                            f"job timed out and was stopped; its context is lost: {err}")
    if code == kmd_errors.CONTEXT_LOST:
        return CommandError(wire.RESP_ERR_CONTEXT_LOST,
                            f"context lost after a GPU hang; destroy it: {err}")
    return CommandError(wire.RESP_ERR_UNSPEC, f"GPU error: {err}")


def error_to_event(err):
    """A KMD context error (error_listener) -> (EVTQ type, address, access, vmid, detail) of
    its event-queue entry (spec §5.7), or None for errors that have no event."""
    if isinstance(err, CodeFault):
        return wire.EVTQ_CODE_FAULT, err.address, 0, err.vmid, err.reason
    address = getattr(err, "address", None)
    if address is not None:
        return (wire.EVTQ_PAGE_FAULT, address, getattr(err, "access", 0),
                getattr(err, "vmid", 0), 0)
    if isinstance(err, KmdError) and err.code in (kmd_errors.JOB_TIMEOUT, kmd_errors.CONTEXT_LOST):
        return wire.EVTQ_CONTEXT_LOST, 0, 0, 0, 0
    return None


def kmd_to_error(e: KmdError) -> CommandError:
    shm = shm_error(e)
    if shm is not None:
        return shm
    if isinstance(e, LimitReached):  # DEV-LIMIT-2
        return CommandError(wire.RESP_ERR_LIMIT, f"limit reached: {e}")
    if isinstance(e, OutOfMemory):
        return CommandError(wire.RESP_ERR_OUT_OF_MEMORY, f"out of device memory: {e}")
    code = getattr(e, "code", "")
    if code == kmd_errors.CONTEXT_LOST:
        return CommandError(wire.RESP_ERR_CONTEXT_LOST,
                            f"context lost after a GPU hang; it takes no more work: {e}")
    if code == kmd_errors.JOB_TIMEOUT:
        return CommandError(wire.RESP_ERR_JOB_TIMEOUT, f"job timed out: {e}")
    if code == "no_vmid":
        return CommandError(wire.RESP_ERR_OUT_OF_MEMORY, f"no hardware address space left: {e}")
    if code in ("invalid_argument", "invalid_address"):
        return CommandError(wire.RESP_ERR_INVALID_PARAMETER, str(e))
    return CommandError(wire.RESP_ERR_UNSPEC, f"device error ({code or 'unknown'}): {e}")


class ComputeDevice:
    """Contexts, resources and timelines of one session on one KMD device."""

    def __init__(self, kmd, dma_mapping, mem_size: int, negotiated_features: int = 0, *,
                 exports: EventExports | None = None, owner=None, device_index: int | None = None,
                 vgpu=None, event_sink: Callable | None = None,
                 resource_exports: ResourceExports | None = None, jobs: SessionJobs | None = None):
        """`exports`: the host-global export registry (a private one if None); `owner`:
        the session, whose exports are bounded together and whose queued GPU jobs are
        flow-controlled together; `device_index`: for GET_STATS; `vgpu`: the session's
        vGPU (pvgpu.host.kmd.sched.VgpuShares), None for the device's default one;
        `event_sink(type, ctx_id, ring_idx, address, access, vmid, engine, detail)`: where
        the faults and losses of this session's contexts go (called on engine threads);
        `resource_exports`: the host-global registry of exported buffers; `jobs`: where
        the session's unfinished jobs on this device are counted (host/backend/inflight.py)."""
        self.vgpu = vgpu
        self.event_sink = event_sink
        self.kmd = kmd
        self.dma_mapping = dma_mapping  # the session's guest memory, DMA-mapped for this GPU
        self.mem_size = mem_size
        self.context_init = bool(negotiated_features & (1 << wire.PVGPU_F_CONTEXT_INIT))
        self.compute = bool(negotiated_features & (1 << wire.PVGPU_F_COMPUTE))
        self.launch_batch = bool(negotiated_features & (1 << wire.PVGPU_F_LAUNCH_BATCH))
        self.contexts: dict = {}
        self.resource_owner: dict = {}  # resource_id -> ctx_id
        self.events: dict = {}  # event_id -> EventState
        self.exports = exports if exports is not None else EventExports()
        self.resource_exports = resource_exports if resource_exports is not None \
            else ResourceExports()
        self.owner = owner if owner is not None else self
        self.device_index = device_index if device_index is not None else getattr(kmd, "index", 0)
        self.shm = ShmTable()  # shared segment ids of this session on this device
        self.jobs = jobs
        self.retired_busy_ns = collections.Counter()  # engine -> time of destroyed contexts

    @property
    def vgpu_name(self) -> str:
        return self.vgpu.name if self.vgpu is not None else DEFAULT_VGPU.name

    # ------------------------------------------------------------------ dispatch
    def decode(self, reader: p.Reader) -> p.Command:
        """The request in `reader` -> its Command ([CMD-CHECK-1] steps 1-4); raises
        protocol.MalformedCommand."""
        return p.decode(reader, compute=self.compute, batch=self.launch_batch)

    def execute(self, cmd: p.Command, writer: p.Writer):
        """A decoded command -> Response | Pending; raises CommandError. `writer`: the
        chain's writable part (the room for GET_STATS and COPY_D2H data)."""
        ctx = self._ctx(cmd.hdr) if cmd.NEEDS_CONTEXT else None  # [CMD-CHECK-1] step 5
        return handles.by_type[cmd.TYPE](self, cmd, ctx, writer)

    def timeline_index(self, hdr: p.Header) -> int:
        """ring_idx names a timeline only with CONTEXT_INIT (spec FENCE-TIMELINE-*); the
        response still echoes the request's ring_idx."""
        return hdr.ring_idx if self.context_init else 0

    def _ctx(self, hdr: p.Header) -> ContextState:
        ctx = self.contexts.get(hdr.ctx_id)
        if ctx is None:
            raise CommandError(wire.RESP_ERR_INVALID_CONTEXT_ID, f"no context {hdr.ctx_id}")
        return ctx

    # ------------------------------------------------------------------ commands
    @handles(p.Nop)
    def cmd_nop(self, cmd, _ctx, _out):
        hdr = cmd.hdr
        if not hdr.fenced or hdr.ctx_id not in self.contexts:
            return p.OkNoData()
        t = self._ctx(hdr).timeline(self.timeline_index(hdr))
        return self._sync_point([t], [])

    @handles(p.GetDeviceInfo)
    def cmd_get_device_info(self, cmd, _ctx, _out):
        name = self.kmd.name.encode()[:32]
        free = self.kmd.vram_free()
        return p.OkDeviceInfo(self.kmd.vram_size, free, free, len(self.contexts), name)

    @handles(p.GetStats)
    def cmd_get_stats(self, cmd, _ctx, out):
        stats_fn = getattr(self.kmd, "sched_stats", None)
        try:
            stats = dict(stats_fn()) if stats_fn is not None else {}
            if stats_fn is not None:  # only this session's own entries ([CMD-STATS-4])
                stats = session_view(stats, self.vgpu_name,
                                     [c.kmd_ctx.id for c in self.contexts.values()])
            stats["device"] = self.device_index
            if stats_fn is not None:
                stats["faults"] = self._fault_stats()
            if hasattr(self.owner, "sid"):  # the requesting session: its peer, its CURVE key
                stats["session"] = {"id": self.owner.sid, "name": self.owner.name,  # (CTL-AUTH-5)
                                    "peer": getattr(self.owner, "peer_credentials", None),
                                    "key": getattr(self.owner, "key", None)}
            payload = msgpack.packb(stats, use_bin_type=True, default=msgpack_plain)
        except Exception as e:  # the KMD's statistics are informative: never fatal
            raise CommandError(wire.RESP_ERR_UNSPEC, f"statistics unavailable: {e}") from None
        need = wire.CTRL_HDR_SIZE + wire.RESP_STATS_SIZE + len(payload)
        if out.capacity < need:
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                               f"GET_STATS needs {need} writable bytes, the chain has "
                               f"{out.capacity}", info0=need)
        return p.OkStats(payload)

    def _fault_stats(self) -> dict:
        """GET_STATS `faults`: this session's contexts on this device that took GPU
        faults (marked faulted; they keep working, spec [CMD-FAULT-2]): ctx_id ->
        {count, last: {address, access, vmid, engine}}; other sessions are not shown."""
        out = {}
        for ctx_id, ctx in self.contexts.items():
            faults = [f for f in list(getattr(ctx.kmd_ctx, "faults", ()))
                      if getattr(f, "address", None) is not None]
            if faults:
                last = faults[-1]
                out[ctx_id] = {"count": len(faults), "last": {
                    "address": last.address, "vmid": last.vmid,
                    "engine": getattr(last, "engine", 0), **(
                        {"code": isa.COBJ_ERR_NAMES.get(last.reason, str(last.reason))}
                        if isinstance(last, CodeFault) else
                        {"access": wire.ACCESS_NAMES.get(last.access, str(last.access))})}}
        return out

    @handles(p.CtxCreate)
    def cmd_ctx_create(self, cmd, _ctx, _out):
        ctx_id, flags = cmd.hdr.ctx_id, cmd.flags
        if ctx_id == 0 or ctx_id in self.contexts:
            raise CommandError(wire.RESP_ERR_INVALID_CONTEXT_ID,
                               f"context id {ctx_id} is zero or already in use")
        priority = _PRIORITIES.get(flags)  # CMD-CTX-CREATE-1/3: only priority bits
        if priority is None:
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                               f"CTX_CREATE flags {flags:#x}: only a priority of 0 (normal), "
                               f"1 (low) or 2 (high) is defined")
        if len(self.contexts) >= wire.MAX_CONTEXTS:  # DEV-LIMIT-2
            raise CommandError(wire.RESP_ERR_LIMIT,
                               f"at most {wire.MAX_CONTEXTS} contexts per device and session")
        try:
            kctx = self.kmd.create_context(cmd.debug_name, vgpu=self.vgpu, client=self.owner,
                                           priority=priority, limits=GUEST_CONTEXT_LIMITS)
        except KmdError as e:
            raise kmd_to_error(e) from None
        try:
            kctx.map_system(self.dma_mapping, wire.GUEST_WINDOW_VA, self.mem_size, writable=True)
        except KmdError as e:
            self.kmd.destroy_context(kctx)
            raise kmd_to_error(e) from None
        self.contexts[ctx_id] = ContextState(ctx_id, kctx)
        if self.event_sink is not None:
            kctx.error_listener = self._context_error_listener(ctx_id)
        return p.OkNoData()

    def _context_error_listener(self, ctx_id: int):
        sink = self.event_sink

        def on_error(_kctx, error, timeline: int, engine: int) -> None:  # engine thread
            event = error_to_event(error)
            if event is not None:
                etype, address, access, vmid, detail = event
                sink(etype, ctx_id, timeline, address, access, vmid, engine, detail)
        return on_error

    @handles(p.CtxDestroy)
    def cmd_ctx_destroy(self, cmd, ctx, _out):
        self._destroy(ctx)
        return p.OkNoData()

    @handles(p.CtxSync)
    def cmd_ctx_sync(self, cmd, ctx, _out):
        return self._sync_point([t for _i, t in sorted(ctx.timelines.items())], [])

    @handles(p.MemAlloc)
    def cmd_mem_alloc(self, cmd, ctx, _out):
        resource_id, flags, size = cmd.resource_id, cmd.flags, cmd.size
        if resource_id == 0 or resource_id in self.resource_owner:
            raise CommandError(wire.RESP_ERR_INVALID_RESOURCE_ID,
                               f"resource id {resource_id} is zero or already in use")
        if flags & ~wire.MEM_ALLOC_FLAG_EXEC or size == 0:  # CMD-ALLOC-1
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                               f"MEM_ALLOC needs flags 0 or MEM_ALLOC_FLAG_EXEC and size > 0 "
                               f"(got flags {flags:#x}, size {size})")
        if size > self.kmd.vram_size:
            raise CommandError(wire.RESP_ERR_OUT_OF_MEMORY,
                               f"{size} bytes exceed the device's {self.kmd.vram_size} bytes of VRAM")
        try:
            bo = ctx.kmd_ctx.alloc(size, executable=bool(flags & wire.MEM_ALLOC_FLAG_EXEC))
        except KmdError as e:
            raise kmd_to_error(e) from None
        ctx.resources[resource_id] = bo
        self.resource_owner[resource_id] = ctx.ctx_id
        return p.OkMemAlloc(bo.va, bo.size)

    @handles(p.MemFree)
    def cmd_mem_free(self, cmd, ctx, _out):
        resource_id = cmd.resource_id
        bo = ctx.resource(resource_id)
        mapped = ctx.kmd_ctx.mapped_elsewhere(bo)  # CMD-FREE-3
        if mapped:
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                               f"resource {resource_id} is still mapped at {mapped[0]:#x} "
                               f"(and {len(mapped) - 1} more): MEM_UNMAP first")
        del ctx.resources[resource_id]
        del self.resource_owner[resource_id]
        if isinstance(bo, PrimeImport):
            ctx.kmd_ctx.free_import(bo)  # detached once the context's work is done
            return p.OkNoData()
        if bo.dmabuf is not None:  # freeing the export stops new imports (§12.2)
            self.resource_exports.withdraw_dmabuf(self.owner, bo.dmabuf)
        ctx.kmd_ctx.free(bo)
        return p.OkNoData()

    @handles(p.CopyH2D)
    def cmd_copy_h2d(self, cmd, ctx, _out):
        _check_range("dst_va", cmd.dst_va, cmd.size)
        copies, pos = [], cmd.dst_va
        for gpa, n in cmd.data_extents():
            copies.append((wire.GUEST_WINDOW_VA + gpa, pos, n))
            pos += n
        idx = self.timeline_index(cmd.hdr)
        return self._submit(ctx, cmd.hdr, idx, lambda wait: ctx.kmd_ctx.submit_copies(
            copies, wait=wait, direction="h2d", timeline=idx), hold=True)

    @handles(p.CopyD2H)
    def cmd_copy_d2h(self, cmd, ctx, out):
        src_va, size = cmd.src_va, cmd.size
        _check_range("src_va", src_va, size)
        if out.data_room() < size:
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                               f"COPY_D2H of {size} bytes has room for {out.data_room()}")
        copies, pos = [], src_va
        for gpa, n in out.data_extents(size):
            copies.append((pos, wire.GUEST_WINDOW_VA + gpa, n))
            pos += n
        idx = self.timeline_index(cmd.hdr)
        return self._submit(ctx, cmd.hdr, idx, lambda wait: ctx.kmd_ctx.submit_copies(
            copies, wait=wait, direction="d2h", timeline=idx), hold=True, data_len=size)

    @handles(p.CopyD2D)
    def cmd_copy_d2d(self, cmd, ctx, _out):
        src_va, dst_va, size = cmd.src_va, cmd.dst_va, cmd.size
        _check_range("src_va", src_va, size)
        _check_range("dst_va", dst_va, size)
        idx = self.timeline_index(cmd.hdr)
        return self._submit(ctx, cmd.hdr, idx, lambda wait: ctx.kmd_ctx.submit_copy(
            src_va, dst_va, size, wait=wait, direction="d2d", timeline=idx))

    @handles(p.Launch)
    def cmd_launch(self, cmd, ctx, _out):
        args = cmd.args()  # CMD-LAUNCH-1
        p.check_launch(cmd.kernel_id, cmd.nargs, cmd.grid, cmd.block)
        idx = self.timeline_index(cmd.hdr)
        return self._submit(ctx, cmd.hdr, idx, lambda wait: ctx.kmd_ctx.submit_launch(
            cmd.kernel_id, cmd.grid, cmd.block, args, wait=wait, timeline=idx))

    @handles(p.LaunchBatch)
    def cmd_launch_batch(self, cmd, ctx, _out):
        launches = cmd.launches()  # CMD-LAUNCH-BATCH-1, -2: all checked before any runs
        idx = self.timeline_index(cmd.hdr)
        return self._submit(ctx, cmd.hdr, idx, lambda wait: ctx.kmd_ctx.submit_launches(
            launches, wait=wait, timeline=idx))

    @handles(p.LaunchCode)
    def cmd_launch_code(self, cmd, ctx, _out):
        lc = code_launch.check(cmd)  # CMD-LAUNCH-CODE-1 steps 1-3
        idx = self.timeline_index(cmd.hdr)
        return self._submit(ctx, cmd.hdr, idx, lambda wait: ctx.kmd_ctx.submit_launch_code(
            lc.object_va, lc.entry_va, lc.grid, lc.block, lc.dyn_shared, lc.params,
            wait=wait, timeline=idx))

    # ------------------------------------------------------------------ events
    def _event(self, event_id: int) -> EventState:
        ev = self.events.get(event_id)
        if ev is None:
            raise CommandError(wire.RESP_ERR_INVALID_EVENT,
                               f"no event {event_id} (never recorded or imported, or destroyed)")
        return ev

    def _bind_event(self, event_id: int, snapshot: EventSnapshot) -> None:
        """Create event `event_id` with `snapshot`, or give an existing one the new snapshot
        (its exports keep the snapshots they were made from)."""
        ev = self.events.get(event_id)
        if ev is not None:
            ev.snapshot = snapshot
            return
        if len(self.events) >= wire.MAX_EVENTS:  # DEV-LIMIT-2
            raise CommandError(wire.RESP_ERR_LIMIT,
                               f"at most {wire.MAX_EVENTS} events per device and session")
        self.events[event_id] = EventState(snapshot)

    @staticmethod
    def _check_event_id(event_id: int) -> None:
        if event_id == 0:
            raise CommandError(wire.RESP_ERR_INVALID_EVENT, "event id 0 is not valid")

    @handles(p.EventRecord)
    def cmd_event_record(self, cmd, ctx, _out):
        self._check_event_id(cmd.event_id)
        t = ctx.timeline(self.timeline_index(cmd.hdr))
        self._bind_event(cmd.event_id, EventSnapshot(t.unreported + [t.last_fence], t.waits,
                                                     clock=self.kmd.clock_ns))
        return p.OkNoData()

    @handles(p.EventWait)
    def cmd_event_wait(self, cmd, ctx, _out):
        ev = self._event(cmd.event_id)
        t = ctx.timeline(self.timeline_index(cmd.hdr))
        t.waits = [f for f in dict.fromkeys(t.waits + ev.snapshot.pending()) if not f.signaled]
        return p.OkNoData()

    @handles(p.EventQuery)
    def cmd_event_query(self, cmd, _ctx, _out):
        snapshot = self._event(cmd.event_id).snapshot
        finish = lambda: _event_status(snapshot)  # noqa: E731
        if cmd.hdr.fenced and not snapshot.done:
            return Pending(snapshot.pending(), finish)
        return finish()

    @handles(p.EventDestroy)
    def cmd_event_destroy(self, cmd, _ctx, _out):
        ev = self._event(cmd.event_id)
        del self.events[cmd.event_id]
        self.exports.withdraw(h for h, _t in ev.exports)
        return p.OkNoData()

    @handles(p.EventExport)
    def cmd_event_export(self, cmd, _ctx, _out):
        ev = self._event(cmd.event_id)
        ev.exports = [(h, t) for h, t in ev.exports if self.exports.exists(h)]
        for h, t in ev.exports:  # the same snapshot exported again: the same handle
            if self.exports.live(h, ev.snapshot):
                return p.OkEventHandle(h, t)
        h, t = self.exports.export(self.owner, ev.snapshot)
        ev.exports.append((h, t))
        return p.OkEventHandle(h, t)

    @handles(p.EventImport)
    def cmd_event_import(self, cmd, _ctx, _out):
        self._check_event_id(cmd.event_id)
        snapshot = self.exports.lookup(cmd.handle_id, cmd.token)
        if snapshot is None:
            raise CommandError(wire.RESP_ERR_INVALID_EVENT,
                               f"no exported event with handle {cmd.handle_id} and this token")
        self._bind_event(cmd.event_id, snapshot)
        return p.OkNoData()

    # ------------------------------------------------------------------ shared device memory
    @handles(p.ShmGet)
    def cmd_shm_get(self, cmd, _ctx, _out):
        key, size, flags = cmd.key, cmd.size, cmd.flags
        if flags != 0:
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER, f"SHM_GET flags {flags:#x} must be 0")
        try:
            seg, created = self.kmd.shm.get(None if key == wire.SHM_KEY_PRIVATE else key, size,
                                            namespace=self.owner, vgpu=self.vgpu)
        except KmdError as e:
            raise kmd_to_error(e) from None
        try:
            shm_id = self.shm.bind(seg)
        except CommandError:  # no id left for it: the segment is not made after all
            if created:
                self.kmd.shm.remove(seg, self.owner)
            raise
        return p.OkShm(shm_id, wire.SHM_FLAG_CREATED if created else 0, seg.size)

    @handles(p.ShmAttach)
    def cmd_shm_attach(self, cmd, ctx, _out):
        shm_id, flags = cmd.shm_id, cmd.flags
        if flags & ~wire.SHM_ATTACH_RDONLY:
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                               f"SHM_ATTACH flags {flags:#x}: only SHM_ATTACH_RDONLY is defined")
        seg = self.shm.lookup(shm_id)
        try:
            va = ctx.kmd_ctx.attach_shared(seg, readonly=bool(flags & wire.SHM_ATTACH_RDONLY))
        except KmdError as e:
            raise kmd_to_error(e) from None
        return p.OkShmAttach(va, seg.size)

    @handles(p.ShmDetach)
    def cmd_shm_detach(self, cmd, ctx, _out):
        seg = self.shm.lookup(cmd.shm_id)
        try:
            ctx.kmd_ctx.detach_shared(seg)
        except KmdError as e:
            raise kmd_to_error(e) from None
        return p.OkNoData()

    @handles(p.ShmControl)
    def cmd_shm_control(self, cmd, _ctx, _out):
        shm_id, op = cmd.shm_id, cmd.op
        if op not in (wire.SHM_CTL_RMID, wire.SHM_CTL_STAT):
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                               f"SHM_CONTROL cmd {op}: only RMID (0) and STAT (1) are defined")
        seg = self.shm.lookup(shm_id)
        if op == wire.SHM_CTL_RMID:
            try:
                self.kmd.shm.remove(seg, self.owner)
            except KmdError as e:
                raise kmd_to_error(e) from None
            self.shm.purge()
            return p.OkNoData()
        ctx = self.contexts.get(cmd.hdr.ctx_id)
        va = (ctx.kmd_ctx.shared_va(seg) or 0) if ctx is not None else 0
        flags = ((wire.SHM_STAT_REMOVED if seg.removed else 0)
                 | (wire.SHM_STAT_CREATOR if seg.owner is self.owner else 0))
        return p.OkShmStat(seg.size, va, seg.nattach, flags)

    @handles(p.ShmExport)
    def cmd_shm_export(self, cmd, _ctx, _out):
        seg = self.shm.lookup(cmd.shm_id)
        try:
            handle, token = self.kmd.shm.export(seg, self.owner)
        except KmdError as e:
            raise kmd_to_error(e) from None
        return p.OkShmHandle(handle, token)

    @handles(p.ShmImport)
    def cmd_shm_import(self, cmd, _ctx, _out):
        try:
            seg = self.kmd.shm.import_(cmd.handle_id, cmd.token, self.owner)
        except KmdError as e:
            raise kmd_to_error(e) from None
        shm_id = self.shm.bind(seg)
        return p.OkShm(shm_id, 0, seg.size)

    # ------------------------------------------------------------------ buffer sharing (§12)
    @handles(p.ResourceExport)
    def cmd_resource_export(self, cmd, ctx, _out):
        obj = ctx.resource(cmd.resource_id)
        try:
            # an import re-exports the original dma-buf (PRIME)
            dmabuf = obj.dmabuf.get() if isinstance(obj, PrimeImport) \
                else ctx.kmd_ctx.export_dmabuf(obj)
        except KmdError as e:
            raise kmd_to_error(e) from None
        handle, token = self.resource_exports.export(self.owner, dmabuf)
        return p.OkExport(handle, token, dmabuf.size)

    @handles(p.ResourceImport)
    def cmd_resource_import(self, cmd, ctx, _out):
        handle, token, resource_id, flags = cmd.handle_id, cmd.token, cmd.resource_id, cmd.flags
        if resource_id == 0 or resource_id in self.resource_owner:
            raise CommandError(wire.RESP_ERR_INVALID_RESOURCE_ID,
                               f"resource id {resource_id} is zero or already in use")
        if flags & ~wire.IMPORT_FLAG_PEER2PEER:
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                               f"RESOURCE_IMPORT flags {flags:#x}: only PEER2PEER (1) is defined")
        dmabuf = self.resource_exports.lookup(handle, token)
        if dmabuf is None:
            raise CommandError(wire.RESP_ERR_PERMISSION,
                               f"no live export with handle {handle} and that token")
        try:
            imp = ctx.kmd_ctx.import_dmabuf(dmabuf,
                                            peer2peer=bool(flags & wire.IMPORT_FLAG_PEER2PEER))
        except KmdError as e:
            raise kmd_to_error(e) from None
        ctx.resources[resource_id] = imp
        self.resource_owner[resource_id] = ctx.ctx_id
        placement = {"local": wire.IMPORT_PLACEMENT_LOCAL, "peer": wire.IMPORT_PLACEMENT_PEER,
                     "system": wire.IMPORT_PLACEMENT_SYSTEM}[imp.kind]
        return p.OkImport(imp.va, imp.size, placement)

    @handles(p.ResourceRevoke)
    def cmd_resource_revoke(self, cmd, _ctx, _out):
        if not self.resource_exports.revoke(self.owner, cmd.handle_id):
            raise CommandError(wire.RESP_ERR_PERMISSION,
                               f"this session has no live export with handle {cmd.handle_id}")
        return p.OkNoData()

    # ------------------------------------------------------------------ explicit VA management
    @staticmethod
    @contextlib.contextmanager
    def _va_errors():
        """A KMD error of a VA command as its response: INVALID_ADDRESS for an address the
        context does not have, else as any KMD error."""
        try:
            yield
        except KmdError as e:
            if isinstance(e, kmd_errors.InvalidAddress):
                raise CommandError(wire.RESP_ERR_INVALID_ADDRESS, str(e)) from None
            raise kmd_to_error(e) from None

    @handles(p.VaReserve)
    def cmd_va_reserve(self, cmd, ctx, _out):
        size, alignment = cmd.size, cmd.alignment
        if size == 0 or size > wire.VA_USER_LIMIT - wire.VA_USER_BASE:
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER, f"bad VA_RESERVE size {size:#x}")
        if alignment and (alignment < wire.PAGE_SIZE or alignment & (alignment - 1)
                          or alignment > wire.MAX_VA_ALIGN):
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                               f"VA_RESERVE alignment {alignment:#x} is not 0 or a power of two "
                               f"in [PAGE_SIZE, {wire.MAX_VA_ALIGN:#x}]")
        with self._va_errors():
            va = ctx.kmd_ctx.reserve_va(size, alignment or wire.PAGE_SIZE)
        psize = -(-size // wire.PAGE_SIZE) * wire.PAGE_SIZE
        return p.OkVa(va, psize)

    @handles(p.VaRelease)
    def cmd_va_release(self, cmd, ctx, _out):
        with self._va_errors():
            ctx.kmd_ctx.release_va(cmd.va)
        return p.OkNoData()

    @handles(p.MemMap)
    def cmd_mem_map(self, cmd, ctx, _out):
        va, offset, size, resource_id, flags = (cmd.va, cmd.offset, cmd.size, cmd.resource_id,
                                                cmd.flags)
        bo = ctx.resource(resource_id)
        if isinstance(bo, PrimeImport):
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                               f"resource {resource_id} is an imported buffer: MEM_MAP maps "
                               "only the context's own allocations")
        rw = wire.MEM_MAP_ACCESS_READ | wire.MEM_MAP_ACCESS_WRITE
        if flags not in (wire.MEM_MAP_ACCESS_READ, rw):
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                               f"MEM_MAP flags {flags:#x}: READ (1) or READ|WRITE (3)")
        page = wire.PAGE_SIZE
        if size == 0 or va % page or offset % page or size % page or offset + size > bo.size:
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                               f"MEM_MAP va {va:#x}, offset {offset:#x}, size {size:#x}: page "
                               f"aligned, size > 0, within the {bo.size:#x}-byte allocation")
        with self._va_errors():
            ctx.kmd_ctx.map_bo_at(bo, va, offset, size,
                                  writable=bool(flags & wire.MEM_MAP_ACCESS_WRITE))
        return p.OkNoData()

    @handles(p.MemUnmap)
    def cmd_mem_unmap(self, cmd, ctx, _out):
        with self._va_errors():
            ctx.kmd_ctx.unmap_at(cmd.va)
        return p.OkNoData()

    # ------------------------------------------------------------------ timelines
    def _submit(self, ctx: ContextState, hdr: p.Header, idx: int, submit, *, hold=False,
                data_len=0):
        """Submit a job on timeline `idx` of `ctx`: `submit(wait)` -> its fence."""
        t = ctx.timeline(idx)
        # the previous job of the timeline and the events it was told to wait for
        last = t.last_fence
        if t.waits:
            wait = [f for f in dict.fromkeys([last, *t.waits]) if f is not None and not f.signaled]
        else:
            wait = [] if last is None or last.signaled else [last]
        try:
            fence = submit(wait)
        except KmdError as e:
            raise kmd_to_error(e) from None  # not submitted: the waits stay for the next job
        if self.jobs is not None:
            self.jobs.track(fence)
        t.last_fence = fence
        t.waits = []
        if not (hold or hdr.fenced):
            t.unreported.append(fence)
            t.prune()
            return p.OkNoData()
        return self._sync_point([t], [fence], data_len=data_len)

    def _sync_point(self, timelines: list, own: list, data_len: int = 0):
        """Answer once everything on the timelines so far has completed, including the
        events they wait for (spec §7); report the first remembered error."""
        earlier = []
        fences = []
        for t in timelines:
            if t.unreported:
                earlier += t.unreported
                t.unreported = []
            if t.last_fence is not None:
                fences.append(t.last_fence)
            if t.waits:
                t.waits = [f for f in t.waits if not f.signaled]
                fences += t.waits

        def finish() -> Response:
            for f in earlier + own:
                if f.error is not None:
                    raise fault_to_error(f.error)
            return p.OkNoData(copied=data_len)

        # own fence is usually also the timeline's last one: wait on each fence once
        fences = [f for f in dict.fromkeys(earlier + own + fences) if not f.signaled]
        return Pending(fences, finish) if fences else finish()

    # ------------------------------------------------------------------ teardown
    def _destroy(self, ctx: ContextState, cancel: bool = False) -> None:
        for rid in ctx.resources:
            self.resource_owner.pop(rid, None)
        ctx.resources.clear()
        del self.contexts[ctx.ctx_id]
        self.retired_busy_ns.update(dict(enumerate(getattr(ctx.kmd_ctx, "busy_ns", ()))))
        ctx.kmd_ctx.error_listener = None  # EVTQ-EVENT-3: no events of destroyed contexts
        # frees are deferred until its work is done; on reset its queued work is dropped
        self.kmd.destroy_context(ctx.kmd_ctx, cancel=cancel)

    def last_fences(self) -> list:
        out = []
        for ctx in self.contexts.values():
            out += ctx.last_fences()
        return out

    def reset(self) -> list:
        """Destroy every context and event (withdrawing the events' exports); -> the fences
        still in flight (the caller waits on them before it unmaps guest memory the engines
        may still be touching)."""
        kmd_ctxs = [ctx.kmd_ctx for ctx in self.contexts.values()]
        pending = self.last_fences()
        for ctx in list(self.contexts.values()):
            self._destroy(ctx, cancel=True)  # queued jobs fail at once...
        # ... and what is on the hardware must finish before guest memory is reused
        pending = [f for f in pending + [f for k in kmd_ctxs for f in k.pending_fences()]
                   if not f.signaled]
        for ev in self.events.values():
            self.exports.withdraw(h for h, _t in ev.exports)
        self.events.clear()
        self.resource_exports.withdraw_device(self.owner, self.kmd)
        # shared segments: the contexts' attachments went with them; the segments this
        # session created are removed (freed once other sessions detach), its imports revoked
        shm = getattr(self.kmd, "shm", None)
        if shm is not None:
            shm.release_client(self.owner)
        self.shm.clear()
        return pending


def _event_status(snapshot: EventSnapshot) -> p.OkEvent:
    """The RESP_OK_EVENT describing `snapshot` now."""
    if not snapshot.done:
        return p.OkEvent(wire.EVENT_STATUS_PENDING, 0, 0, 0, 0)
    ts = snapshot.timestamp_ns()
    err = snapshot.error()
    if err is None:
        return p.OkEvent(wire.EVENT_STATUS_COMPLETE, 0, ts, 0, 0)
    e = fault_to_error(err)
    return p.OkEvent(wire.EVENT_STATUS_ERROR, e.resp, ts, e.info0 & (2**64 - 1),
                     e.info1 & 0xFFFFFFFF)


_PRIORITIES = {wire.CTX_PRIORITY_NORMAL: sched.PRIORITY_NORMAL,
               wire.CTX_PRIORITY_LOW: sched.PRIORITY_LOW,
               wire.CTX_PRIORITY_HIGH: sched.PRIORITY_HIGH}


def _check_range(name: str, va: int, size: int) -> None:
    if size == 0 or size > _MAX_COPY or va + size > (1 << 64):
        raise CommandError(wire.RESP_ERR_INVALID_PARAMETER, f"bad {name} range {va:#x}+{size}")


assert not handles.missing(), f"commands without a handler: {handles.missing()}"
