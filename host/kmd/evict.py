"""Placement and moves of buffer objects: VRAM allocation with eviction, restore, release.

Oversubscription (Gdev's swapping, amdgpu's VRAM -> GTT eviction): a context may
allocate more than the free VRAM. Context.alloc -> _alloc_vram evicts buffer objects of
OTHER contexts to host memory until the request fits. Victim order: lowest context
priority first, then least recently used *context* (Context.last_use_ns, the time its
last job was submitted or handed to the hardware — LRU is per context, not per BO), then
its largest BOs first. Only contexts with no job on the hardware (none in a scheduler's
in_flight; queued jobs touch no memory yet) are victims; when the only candidates are
busy, the allocation waits for them (lock released, up to `timeout`) and then fails
with OutOfMemory; in non-blocking mode (the backend's I/O thread, host/kmd/wouldblock.py)
it raises WouldBlock on their jobs' fences instead. Evicting a BO (_evict_bo): copy its
VRAM into a numpy buffer on the CPU (through the VRAM BAR), dma_map it, rewrite the BO's
PTEs at the same VA to PTE_SYSTEM pages pointing at that copy, invalidate the VMID's TLB,
free the VRAM (cleared). The GPU keeps reaching the BO through the SYSTEM PTEs (slower), so kernels
and copies stay correct. Restoring (_restore_bo) is the reverse, into free VRAM only
(never evicting): opportunistically after Context.free, destroy_context and reclaim(),
and in run_job before a job of the owning context runs — only if that context has no
other job on the hardware (run_job never waits; otherwise the job simply runs against
the SYSTEM pages). Never evicted: shared segments (host/kmd/shm.py; no context owns
them), KMD-internal memory (rings, fences, IB pool, page tables), BOs that map_bo_at
also maps at another VA (code that needs a BO's VRAM extents calls _make_resident(bo)
first), and BOs already freed (deferred). A shared segment's allocation may itself evict
BOs (ShmManager.get -> _alloc_vram). Limits: the host copies of
one device may total at most `max_evicted_bytes` (default 2x VRAM; beyond: OutOfMemory,
never a host crash), and a vGPU's memory share applies to its resident + evicted bytes
together: share% of (usable VRAM + max_evicted_bytes), see vgpu_mem_limit. Counters
and per-context resident/evicted bytes: mem_stats() (also sched_stats()["mem"]).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from host.hw import regs
from host.kmd import wouldblock
from host.kmd.bo import BufferObject, blocks_to_extents
from host.kmd.errors import InvalidArgument, InvalidContext, OutOfMemory

if TYPE_CHECKING:
    from host.kmd.context import Context


class EvictMixin:
    """KmdDevice's memory placement: allocation, eviction to host memory, restore."""

    def _release_vram(self, blocks) -> None:
        """Give VRAM back to the allocator, cleared: free VRAM always reads as zero. The
        clear hands whole pages back to the OS (Vram.clear), so it is cheap for the I/O
        thread, which runs it, even for large buffers nobody wrote."""
        for b in blocks:
            self.vram.clear(b.offset, b.size)
        self.mm.free_blocks(blocks)

    def _release_bo_memory(self, bo: BufferObject) -> None:
        """The memory of a BO whose last reference went: its VRAM, or its host copy."""
        if bo.sysmem is not None:
            self._drop_sysmem(bo)
        else:
            self._release_vram(bo.blocks)
        bo.blocks, bo.extents = [], []

    def _drop_sysmem(self, bo: BufferObject) -> None:
        try:
            self.dma_unmap(bo.sysmem)
        except InvalidArgument:
            pass
        self.evicted_bytes -= bo.size
        bo.sysmem = None
        if bo.context is not None:
            bo.context.evicted_bos -= 1

    def _ctx_on_gpu(self, ctx: "Context") -> bool:
        """Whether a job of ctx was handed to the hardware and has not completed (queued
        jobs do not count: they touch no memory until run_job)."""
        return any(j.entity.owner is ctx for s in self.schedulers for j in s.in_flight)

    def _evictable(self, ctx: "Context"):
        """ctx's buffer objects that may be evicted: resident, mapped only at bo.va."""
        aliased = {id(m[0]) for m in getattr(ctx, "_va_maps", {}).values()}
        for bo in ctx._bos.values():
            if bo.sysmem is None and bo.extents and id(bo) not in aliased:
                m = ctx.vm.mapping_at(bo.va)
                if m is not None and m[0] == bo.va and m[1] == bo.size:
                    yield bo

    def _evict_for(self, need: int, requester=None):
        """Evict buffer objects of contexts other than `requester` until `need` bytes of
        VRAM are free (at least one if any is possible). Victims: lowest context priority
        first, then the least recently used context (its last job), its larger BOs first.
        A context with work on the GPU is skipped. -> (evicted, skipped_busy)."""
        evicted = busy = 0
        victims = [c for c in self.contexts.values()
                   if c is not requester and not c.destroyed and not c.vm.freed]
        victims.sort(key=lambda c: (-c.priority, c.last_use_ns, c.id))
        for ctx in victims:
            if evicted and self.mm.avail >= need:
                break
            bos = sorted(self._evictable(ctx), key=lambda b: (-b.size, b.va))
            if not bos:
                continue
            if self._ctx_on_gpu(ctx):
                busy += 1
                self.mem_counters["evict_skipped_busy"] += 1
                continue
            for bo in bos:
                if evicted and self.mm.avail >= need:
                    return evicted, busy
                if self.evicted_bytes + bo.size > self.max_evicted_bytes:
                    self.mem_counters["evict_skipped_limit"] += 1
                    continue
                if self._evict_bo(bo):
                    evicted += 1
        return evicted, busy

    def _evict_bo(self, bo: BufferObject) -> bool:
        """Move an idle context's BO to host memory: copy it out through the VRAM BAR,
        dma_map the copy, rewrite its PTEs to PTE_SYSTEM pages there (same VA, TLB
        flushed), free its VRAM. The lock is held and the context has nothing on the GPU.
        A shared BO moves only when no job uses it (host/kmd/prime.py); -> moved."""
        move = self.prime.begin_move(bo)
        if move is None:
            return False
        try:
            ctx = bo.context
            buf = np.empty(bo.size, dtype=np.uint8)
            off = 0
            for phys, size in bo.extents:
                buf[off:off + size] = self.vram.view(phys, size)
                off += size
            mapping = self.dma_map(buf)
            mapped = ctx is not None and not ctx.vm.freed and ctx._bos.get(bo.va) is bo
            if mapped:
                flags = ctx.vm.mapping_at(bo.va)[2]
                ctx.vm.unmap(bo.va)  # PTEs cleared, TLB of the VMID invalidated
                ctx.vm.map(bo.va, [(mapping.bus_addr, bo.size)], flags | regs.PTE_SYSTEM)
                self.mmio.write(regs.REG_VM_INVALIDATE, ctx.vmid)
            self._release_vram(bo.blocks)
            bo.blocks, bo.extents, bo.sysmem = [], [], mapping
        finally:
            move.signal()
        if ctx is not None:
            ctx.evicted_bos += 1
            ctx.stats["bos_evicted"] += 1
        self.evicted_bytes += bo.size
        self.mem_counters["evictions"] += 1
        self.mem_counters["bytes_evicted"] += bo.size
        return True

    def _restore_bo(self, bo: BufferObject) -> bool:
        """Bring an evicted BO back into free VRAM (never evicts); -> False if it does not
        fit, is pinned in system memory for an importer, or is shared and busy."""
        if bo.size > self.mm.avail or bo.sys_pins:
            return False
        try:
            blocks = self.mm.alloc_blocks(bo.size)
        except OutOfMemory:
            return False
        move = self.prime.begin_move(bo)
        if move is None:
            self.mm.free_blocks(blocks)
            return False
        try:
            ctx = bo.context
            extents = blocks_to_extents(blocks)
            src = bo.sysmem.buf
            off = 0
            for phys, size in extents:
                self.vram.view(phys, size)[:] = src[off:off + size]
                off += size
            flags = ctx.vm.mapping_at(bo.va)[2] & ~regs.PTE_SYSTEM
            ctx.vm.unmap(bo.va)
            ctx.vm.map(bo.va, extents, flags)
            self.mmio.write(regs.REG_VM_INVALIDATE, ctx.vmid)
            self._drop_sysmem(bo)
            bo.blocks, bo.extents = blocks, extents
        finally:
            move.signal()
        self.mem_counters["restores"] += 1
        self.mem_counters["bytes_restored"] += bo.size
        ctx.stats["bos_restored"] += 1
        return True

    def _restore_evicted(self, ctx: "Context | None" = None) -> int:
        """Migrate evicted BOs back into free VRAM (of `ctx`, or of every context: higher
        priority and more recently used first), skipping contexts with work on the GPU;
        -> how many."""
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

    def _alloc_vram(self, size: int, requester: "Context | None"):
        """Buddy blocks for a BO of `requester` (None: a shared segment), evicting other
        contexts' BOs to host memory when VRAM is full. When the only victims are busy on
        the GPU it waits for them (host/kmd/wouldblock.py: up to `timeout`, lock released;
        in non-blocking mode WouldBlock on their jobs' fences). Raises OutOfMemory."""
        deadline = None
        while True:
            try:
                return self.mm.alloc_blocks(size)
            except OutOfMemory as e:
                err = e
            evicted, busy = self._evict_for(size, requester)
            if evicted:
                continue
            if not busy:
                raise OutOfMemory(f"{size} bytes of VRAM requested, {self.mm.avail} free, and "
                                  f"nothing more can be evicted ({self.evicted_bytes} of "
                                  f"{self.max_evicted_bytes} evicted bytes in use): {err}")
            if deadline is None:
                deadline = time.monotonic() + self.timeout
                self.mem_counters["evict_waits"] += 1
            fences = [f for c in self.contexts.values() if c is not requester
                      for f in self._busy_fences(c)]
            wouldblock.wait(self, fences, deadline, OutOfMemory(
                f"{size} bytes of VRAM requested, {self.mm.avail} free; the contexts that "
                "could be evicted stayed busy"))
            if requester is not None and requester.destroyed:
                raise InvalidContext(f"context {requester.id} was destroyed")
            self._reclaim_locked()

    def _make_resident(self, bo: BufferObject) -> None:
        """Bring an evicted BO back into VRAM now, evicting other contexts' BOs if needed
        and waiting (wouldblock.wait: up to `timeout`) until its own context has no job on
        the hardware. For code that needs bo.extents to be VRAM (e.g. map_bo_at, which
        maps the same pages at another VA). Raises OutOfMemory."""
        deadline = time.monotonic() + self.timeout
        while bo.sysmem is not None:
            ctx = bo.context
            if bo.freed or ctx is None or ctx.destroyed:
                raise InvalidContext("buffer object was freed or its context destroyed")
            if not self._ctx_on_gpu(ctx):
                if self._restore_bo(bo):
                    return
                evicted, busy = self._evict_for(bo.size, ctx)
                if evicted:
                    continue
                if not busy:
                    raise OutOfMemory(f"no room in VRAM for the {bo.size}-byte evicted "
                                      "buffer object")
            fences = [f for c in self.contexts.values() for f in self._busy_fences(c)]
            wouldblock.wait(self, fences, deadline, OutOfMemory(
                "the evicted buffer object could not be made resident (contexts stayed busy)"))
            self._reclaim_locked()

    def mem_stats(self) -> dict:
        """Memory placement (msgpack-able): VRAM, evicted bytes, eviction counters and,
        per context (keyed by str(id)), resident and evicted bytes."""
        with self.lock:
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
