"""Contexts: the per-client object through which memory is allocated and work submitted
(amdgpu_ctx + its amdgpu_vm).

Shared device memory (host/kmd/shm.py, Gdev's gshm*): `dev.shm` names segments of VRAM
that no context owns; Context.attach_shared(seg) maps the same physical pages into that
context's VM, detach_shared(seg) unmaps them behind the context's pending work (a
deferred free), and the VRAM goes back once the segment is removed and detached by all.
Segments count against their creator's vGPU memory share like buffer objects.

VA management (map_system, reserve_va, map_bo_at, ...) is in va.py, submission
(submit_*) in job.py; both are mixed into Context.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from pvgpu.host.hw import regs
from pvgpu.host.kmd.bo import BufferObject
from pvgpu.host.kmd.buddy import round_up
from pvgpu.host.kmd.counters import Counters
from pvgpu.host.kmd.errors import InvalidArgument, InvalidContext, OutOfMemory
from pvgpu.host.kmd.job import ContextSubmitMixin
from pvgpu.host.kmd.sched import PRIORITY_NORMAL, GpuScheduler, VgpuShares
from pvgpu.host.kmd.shm import SharedSegment
from pvgpu.host.kmd.va import ContextVaMixin
from pvgpu.host.kmd.vm import VA_MAX_ALIGN, GpuVm

if TYPE_CHECKING:
    from pvgpu.host.kmd.device import KmdDevice

log = logging.getLogger("pvgpu.kmd")

PAGE_SIZE = regs.PAGE_SIZE
DEFAULT_VGPU = VgpuShares("default")


class Context(ContextVaMixin, ContextSubmitMixin):
    """A client's GPU context: a VMID, its address space, its buffer objects and its work."""

    def __init__(self, device: KmdDevice, ctx_id: int, vmid: int, vm: GpuVm, name: str = ""):
        self.device = device
        self.id = ctx_id
        self.vmid = vmid
        self.vm = vm
        self.name = name
        self.destroyed = False
        self._bos = {}  # va -> BufferObject
        self._sys_maps = {}  # va -> (DmaMapping, size)
        self._shm = {}  # SharedSegment -> va of its attachment
        self._va_reserved = {}  # va -> size of each reserve_va range
        self._va_maps = {}  # va -> (bo, offset, size, writable) of map_bo_at
        self._imports = {}  # va -> PrimeImport (dma-bufs mapped here)
        self.kernargs = None  # KernargArea: parameter buffers of code launches (kernarg.py)
        self.shared = 0  # exported BOs + imports: whether jobs need implicit sync
        self.stale_imports = False  # an exporter moved an imported buffer
        self._entities = {}  # (engine, timeline) -> SchedEntity
        self._timeline_of = {}  # SchedEntity -> timeline
        # error_listener(context, error, timeline, engine): told of each fault attached to
        # one of its jobs and of its loss to a hang (TDR), on the thread that found it,
        # with no lock held. The backend turns these into event-queue entries.
        self.error_listener = None
        self.last_fence = None  # finished fence of the most recent job
        self.faults = []  # every error attached to one of this context's jobs
        self.stats = Counters()
        self.busy_ns = [0] * len(regs.ENGINE_NAMES)  # device time of its finished jobs, per engine
        self.vgpu = DEFAULT_VGPU
        self.limits = device.limits
        self.priority = PRIORITY_NORMAL
        self.client = None
        self.lost = False  # guilty of a GPU hang (TDR): no more work is accepted
        self.lost_reason = ""
        self.last_use_ns = device.clock_ns()  # LRU key of eviction: its last job's time
        self.evicted_bos = 0  # how many of its BOs are evicted to host memory
        self.moves = []  # fences of its BOs' moves (evict.py): its later jobs wait for them

    def _entity(self, sched: GpuScheduler, timeline: int):
        """The scheduler entity of one timeline on one ring (created on first use)."""
        key = (sched.engine, timeline)
        ent = self._entities.get(key)
        if ent is None:
            ent = sched.entity(f"ctx{self.id}.t{timeline}", self.vgpu, self.priority, owner=self,
                               now=self.device.clock_ns())
            self._entities[key] = ent
            self._timeline_of[ent] = timeline
        return ent

    def report_error(self, error, timeline: int, engine: int) -> None:
        """Tell the error listener (no lock held); its failures are logged, not raised."""
        listener = self.error_listener
        if listener is None or self.destroyed:
            return
        try:
            listener(self, error, timeline, engine)
        except Exception:
            log.exception("gpu%d: error listener of context %d failed", self.device.index, self.id)

    def __repr__(self) -> str:
        return f"Context(id={self.id}, vmid={self.vmid}, name={self.name!r})"

    def _check(self) -> None:
        if self.destroyed:
            raise InvalidContext(f"context {self.id} was destroyed")

    def pending_fences(self) -> list:
        """Finished fences of this context's jobs that may still be queued or running
        (the last job of each entity: an entity's jobs finish in order), and of its
        buffer objects' moves in flight."""
        fences = [e.last_finished for e in self._entities.values()
                  if e.last_finished is not None and not e.last_finished.signaled]
        if self.moves:
            fences += self.move_fences()
        return fences

    def move_fences(self) -> list:
        """The fences of this context's buffer moves still in flight (evict.py)."""
        self.moves = [f for f in self.moves if not f.signaled]
        return list(self.moves)

    def idle(self) -> bool:
        return not self.pending_fences()

    def wait_idle(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        for f in self.pending_fences():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not f.wait(left):
                return False
        return True

    @property
    def buffer_objects(self) -> list:
        return list(self._bos.values())

    # ------------------------------------------------------------------ memory
    def alloc(self, size: int, executable: bool = False) -> BufferObject:
        """Allocate VRAM and map it READ|WRITE (and EXEC if `executable`: a code object,
        spec [CMD-ALLOC-3]) at a fresh VA (bo.va); raises OutOfMemory.

        The memory reads as zero: the driver clears VRAM when it is freed (see
        KmdDevice._release_vram), so one guest never sees another's data."""
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size <= 0:
            raise InvalidArgument(f"bad allocation size {size!r}")
        size = int(size)
        dev = self.device
        if size > dev.vram_size:
            raise OutOfMemory(f"{size} bytes is more than the device's VRAM")
        psize = round_up(size, PAGE_SIZE)
        flags = regs.PTE_READ | regs.PTE_WRITE | (regs.PTE_EXEC if executable else 0)
        with dev.lock:
            self._check()
            dev._reclaim_locked()
            used, limit = dev._vgpu_mem[self.vgpu.name], dev.vgpu_mem_limit(self.vgpu)
            if used + psize > limit:
                raise OutOfMemory(f"vGPU {self.vgpu.name!r} memory share exhausted: {used} of "
                                  f"{limit} bytes in use, {psize} more requested")
            dev._vgpu_mem[self.vgpu.name] += psize  # reserved: _alloc_vram may wait
            try:
                blocks = dev._alloc_vram(psize, self)
                try:
                    align = min(VA_MAX_ALIGN, 1 << (psize.bit_length() - 1))
                    va = self.vm.va.alloc(psize, align)
                    bo = BufferObject(psize, blocks, self, va)
                    try:
                        try:
                            self.vm.map(va, bo.extents, flags)
                        except OutOfMemory:  # page tables: make room, once
                            dev._make_room(dev.mm.avail + 8 * PAGE_SIZE, self)
                            self.vm.map(va, bo.extents, flags)
                    except BaseException:
                        self.vm.va.free(va)
                        raise
                except BaseException:
                    dev.mm.free_blocks(blocks)
                    raise
            except BaseException:
                dev._vgpu_mem[self.vgpu.name] -= psize
                raise
            self._bos[va] = bo
            self.stats["bytes_allocated"] += psize
            self.stats["bos_allocated"] += 1
            return bo

    def free(self, bo: BufferObject) -> None:
        """Free a buffer object; the memory returns once this context's pending work is done."""
        dev = self.device
        with dev.lock:
            self._check()
            if not isinstance(bo, BufferObject) or self._bos.get(bo.va) is not bo:
                raise InvalidArgument(f"{bo!r} is not a live buffer object of this context")
            del self._bos[bo.va]
            bo.freed = True
            dev._vgpu_mem[self.vgpu.name] -= bo.size
            self.stats["bytes_allocated"] -= bo.size
            self.stats["bos_freed"] += 1
            if bo.dmabuf is not None:  # exported: no new imports; importers keep it alive
                bo.dmabuf.revoke()
                self.shared -= 1
            last = bo.put()
            dev._defer(self.pending_fences(), lambda: self._release_bo(bo, last))
            dev._restore_evicted()

    def _release_bo(self, bo: BufferObject, memory: bool = True) -> None:
        if not self.vm.freed:
            self.vm.unmap(bo.va)
            self.vm.va.free(bo.va)
        if memory:
            self.device._release_bo_memory(bo)

    def export_dmabuf(self, bo: BufferObject):
        """drm_gem_prime_export: the BO's dma-buf (one per BO; each call adds a reference
        the caller drops with put())."""
        return self.device.prime.export(self, bo)

    def import_dmabuf(self, dmabuf, peer2peer: bool = True):
        """drm_gem_prime_import: attach `dmabuf` (of this or another device) and map it at
        a fresh VA; -> PrimeImport (va, size, kind). Without `peer2peer`, or when the
        fabric cannot route it, another device's buffer is migrated to system memory."""
        return self.device.prime.import_(self, dmabuf, peer2peer)

    def free_import(self, imp) -> None:
        """Unmap an import (after this context's pending work) and detach it."""
        self.device.prime.free_import(self, imp)

    def attach_shared(self, seg: SharedSegment, readonly: bool = False) -> int:
        """Map shared segment `seg` (dev.shm.get / import_) at a fresh VA, READ|WRITE (or
        READ only); -> the VA. Once per context; raises PermissionDenied if this context's
        client neither created nor imported it, InvalidSegment if it was removed."""
        return self.device.shm.attach(self, seg, readonly)

    def detach_shared(self, seg: SharedSegment) -> None:
        """End this context's attachment of `seg`; the pages stay mapped until this
        context's pending work is done (then unmapped, TLB flushed)."""
        self.device.shm.detach(self, seg)

    def shared_va(self, seg: SharedSegment) -> int | None:
        """The VA `seg` is attached at in this context, or None."""
        with self.device.lock:
            return self._shm.get(seg)

    def lookup(self, va: int) -> BufferObject | None:
        """The live buffer object that contains va, or None."""
        with self.device.lock:
            m = self.vm.mapping_at(va)
            if m is None:
                return None
            bo = self._bos.get(m[0])
            return bo if bo is not None and bo.contains(va) else None
