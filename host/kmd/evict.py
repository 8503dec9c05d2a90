"""Placement and moves of buffer objects: VRAM allocation with eviction, restore, release.

Oversubscription (Gdev's swapping, amdgpu's VRAM -> GTT eviction): a context may
allocate more than the free VRAM. Context.alloc -> _alloc_vram evicts buffer objects of
OTHER contexts to host memory until the request fits. Victim order: lowest context
priority first, then least recently used *context* (Context.last_use_ns, the time its
last job was submitted or handed to the hardware — LRU is per context, not per BO), then
its largest BOs first. Only contexts with no job on the hardware (none in a scheduler's
in_flight; queued jobs touch no memory yet) are victims.

Moves (TTM's moves with the DMA engine). Evicting a BO (_evict_bo) dma_maps a host buffer
and submits a COPY job, VRAM -> those host pages, in the kernel VMID (physical VRAM and
system bus addresses) on a copy engine, from the device's move context (kernel priority,
in no registry). Restoring (_restore_bo) is the reverse, into free VRAM only (never
evicting). The BO's fields (blocks, extents, sysmem) describe the new placement at once;
its move fence (prime.begin_move: in its reservation object at KERNEL usage) signals
once the copy has signalled and the submission context (submit.py) has pointed the BO's
PTEs at the new placement (PTE_SYSTEM pages at the same VA, or VRAM; TLB flushed) and
freed the old one (_complete_move). Nothing uses the new placement before: the owner has
no job on the hardware when a move starts (the victim rule above; a restore starts only
then), its queued jobs and those it submits later wait for the move fence (Context.moves,
_placement_deps), and a shared BO's importers wait for it through the reservation object.
No buffer's data is copied by the CPU.

An allocation that evicts (_alloc_vram, _make_room) gets its VRAM once the evictions'
copies are done; until then, and when the only candidates are busy, it waits for them
(lock released, up to `timeout`) and then fails with OutOfMemory; in non-blocking mode
(the backend's I/O thread, host/kmd/wouldblock.py) it raises WouldBlock on their fences
instead, and the re-driven call finds the VRAM free. Restores happen opportunistically
after Context.free, destroy_context and reclaim(), and when a context with evicted BOs
submits a job and has nothing on the hardware (the job waits for them). Never evicted: shared
segments (host/kmd/shm.py; no context owns them), KMD-internal memory (rings, fences, IB
pool, page tables), BOs that map_bo_at also maps at another VA (code that needs a BO's
VRAM extents calls _make_resident(bo) first), BOs being moved, and BOs already freed
(deferred). A shared segment's allocation may itself evict BOs (ShmManager.get ->
_alloc_vram). Limits: the host copies of
one device may total at most `max_evicted_bytes` (default 2x VRAM; beyond: OutOfMemory,
never a host crash), and a vGPU's memory share applies to its resident + evicted bytes
together: share% of (usable VRAM + max_evicted_bytes), see vgpu_mem_limit. Counters
and per-context resident/evicted bytes: mem_stats() (also sched_stats()["mem"]).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from pvgpu.host.hw import regs
from pvgpu.host.kmd import wouldblock
from pvgpu.host.kmd.bo import BufferObject, blocks_to_extents
from pvgpu.host.kmd.errors import InvalidArgument, InvalidContext, KmdError, OutOfMemory

if TYPE_CHECKING:
    from pvgpu.host.kmd.context import Context

log = logging.getLogger("pvgpu.kmd")


class EvictMixin:
    """KmdDevice's memory placement: allocation, eviction to host memory, restore."""

    def _release_vram(self, blocks) -> None:
        """Give VRAM back to the allocator, cleared: free VRAM always reads as zero. The
        clear hands whole pages back to the OS (Vram.clear), so it is cheap for the I/O
        thread, which runs it, even for large buffers nobody wrote."""
        for b in blocks:
            self.vram.clear(b.offset, b.size)
        self.mm.free_blocks(blocks)
        if self.trace is not None:
            self.trace.vram(self)

    def _release_bo_memory(self, bo: BufferObject) -> None:
        """The memory of a BO whose last reference went: its VRAM, or its host copy."""
        if bo.sysmem is not None:
            self._drop_sysmem(bo)
        else:
            self._release_vram(bo.blocks)
        bo.blocks, bo.extents = [], []

    def _drop_sysmem(self, bo: BufferObject) -> None:
        self._release_host_copy(bo.sysmem, bo.size)
        bo.sysmem = None
        if bo.context is not None:
            bo.context.evicted_bos -= 1

    def _release_host_copy(self, mapping, size: int) -> None:
        try:
            self.dma_unmap(mapping)
        except InvalidArgument:
            pass
        self.evicted_bytes -= size

    def _ctx_on_gpu(self, ctx: "Context") -> bool:
        """Whether a job of ctx was handed to the hardware and has not completed (queued
        jobs do not count: they touch no memory until run_job)."""
        return any(j.entity.owner is ctx for s in self.schedulers for j in s.in_flight)

    @staticmethod
    def _bo_moving(bo: BufferObject) -> bool:
        return bo.moving is not None and not bo.moving.signaled

    def _evictable(self, ctx: "Context"):
        """ctx's buffer objects that may be evicted: resident, mapped only at bo.va, not
        being moved."""
        aliased = {id(m[0]) for m in getattr(ctx, "_va_maps", {}).values()}
        for bo in ctx._bos.values():
            if bo.sysmem is None and bo.extents and id(bo) not in aliased \
                    and not self._bo_moving(bo):
                m = ctx.vm.mapping_at(bo.va)
                if m is not None and m[0] == bo.va and m[1] == bo.size:
                    yield bo

    def _evict_for(self, need: int, requester=None):
        """Evict buffer objects of contexts other than `requester` until `need` bytes of
        VRAM are free or being freed by evictions in flight (at least one if any is
        possible). Victims: lowest context priority first, then the least recently used
        context (its last job), its larger BOs first. A context with work on the GPU is
        skipped. -> (evicted, skipped_busy)."""
        evicted = busy = 0
        victims = [c for c in self.contexts.values()
                   if c is not requester and not c.destroyed and not c.vm.freed]
        victims.sort(key=lambda c: (-c.priority, c.last_use_ns, c.id))

        def enough():  # evictions in flight count: their VRAM is freed once they are done
            return (evicted or self._evictions) and \
                self.mm.avail + self._vram_moving_out() >= need
        for ctx in victims:
            if enough():
                break
            bos = sorted(self._evictable(ctx), key=lambda b: (-b.size, b.va))
            if not bos:
                continue
            if self._ctx_on_gpu(ctx):
                busy += 1
                self.mem_counters["evict_skipped_busy"] += 1
                continue
            for bo in bos:
                if enough():
                    return evicted, busy
                if self.evicted_bytes + bo.size > self.max_evicted_bytes:
                    self.mem_counters["evict_skipped_limit"] += 1
                    continue
                if self._evict_bo(bo):
                    evicted += 1
        return evicted, busy

    # ------------------------------------------------------------------ moves
    def _start_move(self, copies, direction: str):
        """The copy of a move (lock held): one COPY job in the kernel VMID (VRAM physical
        and system bus addresses) on the copy engine of `direction`, queued on the move
        context's kernel-priority entity; -> its finished fence, or None when the move
        context takes no work (device stopped, or lost to a hang)."""
        try:
            return self._move_ctx.submit_copies(copies, direction=direction)
        except KmdError as e:
            log.warning("gpu%d: buffer move not started: %s", self.index, e)
            return None

    def _track_move(self, bo: BufferObject, copy, move, switch, release, abort) -> None:
        """A move of `bo` is in flight, its copy's fence is `copy`; `move` is the fence
        begin_move put into the BO's reservation object. The owner's jobs still queued and
        those it submits later wait for `move` (implicit sync), and so do the importers.
        Once the copy has signalled, the submission context switches the PTEs to the new
        placement (`switch`), frees the old one (`release`) and then signals `move`; if
        the copy failed (a fault, an engine reset), the new placement holds no valid data:
        `abort` gives it back and the BO stays where it was."""
        ctx = bo.context
        bo.moving = move
        self._moves[move] = (bo, copy, switch, release, abort)
        if ctx is not None:
            ctx.moves.append(move)
            woken = set()
            for ent in ctx._entities.values():
                for job in ent.jobs:
                    job.deps.append(move)
                if ent.jobs and ent.sched not in woken:
                    woken.add(ent.sched)
                    move.add_done_callback(ent.sched._dependency_signalled)
        copy.add_done_callback(lambda _f: self.submit_wq.call(self._complete_move, move))

    def _complete_move(self, move) -> None:
        """The copy of a move has signalled (in the submission context, or at stop)."""
        with self.lock:
            entry = self._moves.pop(move, None)
            if entry is None:
                return
            bo, copy, switch, release, abort = entry
            if copy.error is not None:
                log.warning("gpu%d: the move of %r failed, it stays where it was: %s",
                            self.index, bo, copy.error)
                self.mem_counters["moves_failed"] += 1
                abort()
            else:
                switch()
                release()
            if bo.moving is move:
                bo.moving = None
        move.signal()

    def _switch_ptes(self, bo: BufferObject, extents, flags_on: int, flags_off: int) -> None:
        """Point the PTEs of bo.va (if the owner's VM still maps it there) at `extents`,
        with the same permissions plus `flags_on` minus `flags_off`; TLB invalidated."""
        ctx = bo.context
        if ctx is None or ctx.vm.freed:
            return
        m = ctx.vm.mapping_at(bo.va)
        if m is None or m[0] != bo.va:
            return
        flags = (m[2] | flags_on) & ~flags_off
        ctx.vm.unmap(bo.va)  # PTEs cleared, TLB of the VMID invalidated
        ctx.vm.map(bo.va, extents, flags)
        self.mmio.write(regs.REG_VM_INVALIDATE, ctx.vmid)

    def _vram_moving_out(self) -> int:
        """Bytes of VRAM that evictions in flight will free."""
        return sum(size for _f, size in self._evictions)

    def _placement_deps(self, ctx: "Context") -> list:
        """For a job ctx submits (lock held): bring its evicted BOs back first if it has
        nothing on the hardware (restores into free VRAM only); -> the fences of its
        moves in flight, which the job must wait for."""
        if ctx.evicted_bos and not self._ctx_on_gpu(ctx):
            self._restore_evicted(ctx)
        return ctx.move_fences() if ctx.moves else []

    def _evict_bo(self, bo: BufferObject) -> bool:
        """Start moving an idle context's BO to host memory (lock held; the context has
        nothing on the GPU): dma_map a host buffer and submit the copy VRAM -> host pages
        on a copy engine; once it has signalled, its PTEs point at PTE_SYSTEM pages there
        (same VA, TLB flushed) and the VRAM is freed (_complete_move). A shared BO moves
        only when no job uses it (host/kmd/prime.py); -> started."""
        move = self.prime.begin_move(bo)
        if move is None:
            return False
        ctx = bo.context
        mapping = self.dma_map(np.empty(bo.size, dtype=np.uint8))
        copies, off = [], 0
        for phys, size in bo.extents:
            copies.append((phys, mapping.bus_addr + off, size))
            off += size
        copy = self._start_move(copies, "d2h")
        if copy is None:
            self.dma_unmap(mapping)
            move.signal()
            return False
        old = bo.blocks
        bo.blocks, bo.extents, bo.sysmem = [], [], mapping
        entry = (move, bo.size)
        self._evictions.append(entry)

        def release():
            self._evictions.remove(entry)
            self._release_vram(old)

        def abort():  # the BO keeps its VRAM (and its PTEs, never switched)
            self._evictions.remove(entry)
            bo.blocks, bo.extents, bo.sysmem = old, blocks_to_extents(old), None
            self.dma_unmap(mapping)
            self.evicted_bytes -= bo.size
            if ctx is not None and not ctx.destroyed:
                ctx.evicted_bos -= 1
        self._track_move(bo, copy, move, lambda: self._switch_ptes(
            bo, [(mapping.bus_addr, bo.size)], regs.PTE_SYSTEM, 0), release, abort)
        if ctx is not None:
            ctx.evicted_bos += 1
            ctx.stats["bos_evicted"] += 1
        self.evicted_bytes += bo.size
        self.mem_counters["evictions"] += 1
        self.mem_counters["bytes_evicted"] += bo.size
        return True

    def _restore_bo(self, bo: BufferObject) -> bool:
        """Start bringing an evicted BO back into free VRAM (never evicts; lock held, its
        context has nothing on the GPU): submit the copy host pages -> VRAM on a copy
        engine; once it has signalled, its PTEs point at the VRAM and the host copy goes
        (_complete_move). -> False if it does not fit, is pinned in system memory for an
        importer, is being moved, or is shared and busy."""
        if bo.size > self.mm.avail or bo.sys_pins or self._bo_moving(bo):
            return False
        try:
            blocks = self.mm.alloc_blocks(bo.size)
        except OutOfMemory:
            return False
        move = self.prime.begin_move(bo)
        if move is None:
            self.mm.free_blocks(blocks)
            return False
        ctx = bo.context
        extents = blocks_to_extents(blocks)
        mapping = bo.sysmem
        copies, off = [], 0
        for phys, size in extents:
            copies.append((mapping.bus_addr + off, phys, size))
            off += size
        copy = self._start_move(copies, "h2d")
        if copy is None:
            self.mm.free_blocks(blocks)
            move.signal()
            return False
        bo.sysmem = None
        bo.blocks, bo.extents = blocks, extents
        ctx.evicted_bos -= 1
        def abort():  # the BO stays in host memory (its PTEs were never switched)
            bo.sysmem = mapping
            bo.blocks, bo.extents = [], []
            self.mm.free_blocks(blocks)
            if not ctx.destroyed:
                ctx.evicted_bos += 1
        self._track_move(bo, copy, move,
                         lambda: self._switch_ptes(bo, extents, 0, regs.PTE_SYSTEM),
                         lambda: self._release_host_copy(mapping, bo.size), abort)
        self.mem_counters["restores"] += 1
        self.mem_counters["bytes_restored"] += bo.size
        ctx.stats["bos_restored"] += 1
        return True

    def _restore_evicted(self, ctx: "Context | None" = None) -> int:
        """Start migrating evicted BOs back into free VRAM (of `ctx`, or of every context:
        higher priority and more recently used first), skipping contexts with work on
        the GPU; -> how many."""
        if not self.evicted_bytes:
            return 0
        ctxs = [ctx] if ctx is not None else sorted(
            self.contexts.values(), key=lambda c: (c.priority, -c.last_use_ns, c.id))
        done = 0
        for c in ctxs:
            if not c.evicted_bos or c.destroyed or c.vm.freed or self._ctx_on_gpu(c):
                continue
            for bo in sorted((b for b in c._bos.values() if b.sysmem is not None),
                             key=lambda b: b.size):
                if self._restore_bo(bo):
                    done += 1
        return done

    def _busy_fences(self, ctx: "Context") -> list:
        """Finished fences of ctx's jobs on the hardware: ctx is evictable once they signal."""
        return [j.finished for s in self.schedulers for j in s.in_flight
                if j.entity.owner is ctx and j.finished is not None]

    def _vram_wait_fences(self, busy: int, requester) -> list:
        """What an allocation that found no room waits for: the evictions in flight (their
        VRAM is freed once they signal), else the jobs of busy victims."""
        if self._evictions:
            return [f for f, _size in self._evictions]
        if not busy:
            return []
        self.mem_counters["evict_waits"] += 1
        return [f for c in self.contexts.values() if c is not requester
                for f in self._busy_fences(c)]

    def _alloc_vram(self, size: int, requester: "Context | None"):
        """Buddy blocks for a BO of `requester` (None: a shared segment), evicting other
        contexts' BOs to host memory when VRAM is full (_make_room). Raises OutOfMemory."""
        try:
            blocks = self.mm.alloc_blocks(size)
        except OutOfMemory:
            self._make_room(size, requester)
            blocks = self.mm.alloc_blocks(size)
        if self.trace is not None:
            self.trace.vram(self)
        return blocks

    def _make_room(self, need: int, requester: "Context | None") -> None:
        """Have `need` bytes of VRAM free, evicting BOs of contexts other than `requester`.
        Until the evictions' copies are done, and when the only victims are busy on the
        GPU, it waits for them (host/kmd/wouldblock.py: up to `timeout`, lock released;
        in non-blocking mode WouldBlock on their fences). Raises OutOfMemory."""
        deadline = time.monotonic() + self.timeout
        while self.mm.avail < need:
            evicted, busy = self._evict_for(need, requester)
            self._reclaim_locked()  # evictions already done give their VRAM back
            if self.mm.avail >= need:
                return
            fences = self._vram_wait_fences(busy, requester)
            if not fences:
                if evicted:
                    continue
                raise OutOfMemory(f"{need} bytes of VRAM needed, {self.mm.avail} free, and "
                                  f"nothing more can be evicted ({self.evicted_bytes} of "
                                  f"{self.max_evicted_bytes} evicted bytes in use)")
            wouldblock.wait(self, fences, deadline, OutOfMemory(
                f"{need} bytes of VRAM needed, {self.mm.avail} free; the contexts that "
                "could be evicted stayed busy"))
            if requester is not None and requester.destroyed:
                raise InvalidContext(f"context {requester.id} was destroyed")
            self._reclaim_locked()

    def _make_resident(self, bo: BufferObject) -> None:
        """Have an evicted BO moved back into VRAM now (its PTEs then point there, and its
        context's jobs wait for the copy), evicting other contexts' BOs if needed and
        waiting (wouldblock.wait: up to `timeout`) until its own context has no job on
        the hardware. For code that needs bo.extents to be VRAM (e.g. map_bo_at, which
        maps the same pages at another VA). Raises OutOfMemory."""
        deadline = time.monotonic() + self.timeout
        while bo.sysmem is not None:
            ctx = bo.context
            if bo.freed or ctx is None or ctx.destroyed:
                raise InvalidContext("buffer object was freed or its context destroyed")
            if self._bo_moving(bo):  # its eviction: wait for it to be done
                fences = [bo.moving]
            elif not self._ctx_on_gpu(ctx):
                if self._restore_bo(bo):
                    return
                if self.mm.avail < bo.size:
                    self._make_room(bo.size, ctx)
                    continue
                fences = bo.resv.fences() if bo.resv is not None else []  # shared, busy
                if not fences:
                    raise OutOfMemory(f"{bo!r} is pinned in system memory")
            else:
                fences = [f for c in self.contexts.values() for f in self._busy_fences(c)]
            wouldblock.wait(self, fences, deadline, OutOfMemory(
                "the evicted buffer object could not be made resident (contexts stayed busy)"))
            self._reclaim_locked()

    def mem_stats(self) -> dict:
        """Memory placement (msgpack-able): VRAM, evicted bytes, eviction counters and,
        per context (keyed by str(id)), resident and evicted bytes. Frees deferred until
        work that has finished now are done first, as vram_free() does."""
        with self.lock:
            self._reclaim_locked()
            ctxs = {}
            for c in self.contexts.values():
                ev = sum(b.size for b in c._bos.values() if b.sysmem is not None)
                total = sum(b.size for b in c._bos.values())
                ctxs[str(c.id)] = {"name": c.name, "priority": c.priority, "vgpu": c.vgpu.name,
                                   "resident_bytes": total - ev, "evicted_bytes": ev,
                                   "last_use_ns": c.last_use_ns}
            out = {k: self.mem_counters[k] for k in (
                "evictions", "restores", "bytes_evicted", "bytes_restored",
                "evict_skipped_busy", "evict_skipped_limit", "evict_waits")}
            out.update({"vram_size": self.vram_size, "vram_free": self.mm.avail,
                        "kernel_vram": self.kernel_vram, "evicted_bytes": self.evicted_bytes,
                        "max_evicted_bytes": self.max_evicted_bytes, "contexts": ctxs})
            return out
