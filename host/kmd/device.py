"""The kernel-mode driver instance of one emulated GPU (amdgpu_device + amdgpu_ctx + GEM).

Probe (KmdDevice.__init__): check REG_DEVICE_ID, read REG_VRAM_SIZE, put a BuddyAllocator
over the whole VRAM and take what the driver itself needs, top-down: a fence page (one
u64 write-back slot per engine), one ring per engine, and an IB pool. VRAM page 0 is
reserved so that no page table ever sits at physical address 0 (REG_VM_PT_BASE == 0 means
"no page table"). Then the rings are programmed (RB_RESET, RB_BASE, RB_SIZE), the
interrupt handler installed and REG_IRQ_ENABLE set. start()/stop() start and stop the
GPU's engines; stop() fails every fence still pending so that nobody waits forever.

Contexts. create_context() takes a free VMID (1..NUM_VMIDS-1), builds a GpuVm whose root
goes into REG_VM_PT_BASE(vmid), and returns a Context: the per-client object through
which memory is allocated and work submitted (amdgpu_ctx + its amdgpu_vm). The context
registry (create_context, destroy_context) is here; the Context class is in context.py.

Deferred frees (like DRM's delayed free of BOs and VMs): memory the GPU may still be
using is not freed at once. Context.free(bo), unmap_system() and destroy_context() queue
the release behind the context's fences that are pending at that moment; the queue is
worked off (unmap, TLB flush, buddy free, VMID release) at the next driver entry or by
reclaim(), never on an interrupt thread, so the interrupt handler stays short.
Released VRAM is cleared before it goes back to the buddy allocator, so free VRAM always
reads as zero (VRAM comes out of reset zeroed) and a new buffer object needs no clearing:
no guest ever sees another's data, and allocating never touches the memory.

The rest of the driver is mixed into KmdDevice from modules named after their parts:
ib_pool.py (the IB pool), dma.py (DMA mappings), evict.py (placement and moves),
job.py (submission, run_job, completion), submit.py (the submission context: where
run_job happens, and its worker thread), tdr.py (timers and recovery), irq.py
(interrupts); context.py and va.py hold Context.

Locking: one DeviceLock (re-entrant, host/kmd/lock.py) per device guards all driver
state; it is also the submission lock (submit.py). Submissions come from any host
thread; interrupts from the engine threads take the same lock for a few statements. Waiting for ring or IB-pool space happens in a
Condition wait that releases the lock, so a full ring never blocks the interrupt handler
that would drain it. No fence callback ever runs with a device lock held: a thread that
signals a fence, or adds a callback to one that has signalled, while it holds one runs
the callbacks after releasing it. So a callback that takes another device's lock (a
scheduler woken by a dependency on a fence of this device) never nests that lock inside
this one, and two devices with dependencies on each other's fences cannot deadlock.
"""

from __future__ import annotations

import collections
import logging
import time

from pvgpu.host.hw import regs
from pvgpu.host.kmd import errors
from pvgpu.host.kmd.buddy import CONTIGUOUS, TOPDOWN, BuddyAllocator, round_up
from pvgpu.host.kmd.context import DEFAULT_VGPU, Context
from pvgpu.host.kmd.counters import Counters
from pvgpu.host.kmd.dma import DmaMixin
from pvgpu.host.kmd.errors import (ContextLost, DeviceLost, InvalidArgument, InvalidContext, KmdError,
                             NoVmid)
from pvgpu.host.kmd.evict import EvictMixin
from pvgpu.host.kmd.fence import FenceDriver
from pvgpu.host.hw.pcie import P2PDMA_MAP_NAMES
from pvgpu.host.kmd.ib_pool import DEFAULT_IB_POOL_SIZE, IbPool, IbPoolMixin
from pvgpu.host.kmd.irq import IrqMixin
from pvgpu.host.kmd.job import MAX_CLIENT_QUEUED_JOBS, MAX_QUEUED_JOBS, JobMixin
from pvgpu.host.kmd.limits import ContextLimits
from pvgpu.host.kmd.lock import DeviceCondition, DeviceLock
from pvgpu.host.kmd.prime import PrimeExporter
from pvgpu.host.kmd.ring import DEFAULT_RING_SIZE, Ring
from pvgpu.host.kmd.shm import ShmManager
from pvgpu.host.kmd.submit import SubmitQueue
from pvgpu.host.kmd.sched import (DEFAULT_HW_LIMIT, DEFAULT_PERIOD_NS, DEFAULT_TIME_BUFFER_NS,
                            DEFAULT_TIMEOUT_NS, PRIORITY_KERNEL, PRIORITY_NORMAL, GpuScheduler,
                            VgpuShares)
from pvgpu.host.kmd.tdr import TdrMixin
from pvgpu.host.kmd.vm import GpuVm

log = logging.getLogger("pvgpu.kmd")

PAGE_SIZE = regs.PAGE_SIZE
FENCE_SLOT_STRIDE = 64  # one write-back slot per engine, a cache line apart
DEFAULT_TIMEOUT = 5.0  # seconds to wait for ring / IB-pool space or a foreign fence
DEVICE_STOPPED = "device stopped"  # the error of fences still pending at stop()


class KmdDevice(JobMixin, IbPoolMixin, EvictMixin, TdrMixin, IrqMixin, DmaMixin):
    """The driver bound to one pvgpu.host.hw.gpu.Gpu."""

    def __init__(self, gpu, *, ring_size: int = DEFAULT_RING_SIZE, ib_pool_size: int | None = None,
                 timeout: float = DEFAULT_TIMEOUT, policy: str = "fifo",
                 hw_limit: int = DEFAULT_HW_LIMIT, job_timeout_ns: int = DEFAULT_TIMEOUT_NS,
                 period_ns: int = DEFAULT_PERIOD_NS,
                 time_buffer_ns: int = DEFAULT_TIME_BUFFER_NS, vgpus=(),
                 max_queued_jobs: int = MAX_QUEUED_JOBS,
                 max_client_queued_jobs: int = MAX_CLIENT_QUEUED_JOBS,
                 max_evicted_bytes: int | None = None, limits: ContextLimits | None = None):
        self.gpu = gpu
        self.limits = limits or ContextLimits()  # of contexts created without their own
        self.vram = gpu.vram
        self.mmio = gpu.mmio
        # clock_ns() -> the device clock (ns, REG_TIMESTAMP), the time base of fence
        # timestamps; read on every submission, so through the register's own reader
        self.clock_ns = self.mmio.reader(regs.REG_TIMESTAMP)
        self.timeout = timeout
        self.lock = DeviceLock()  # fence callbacks run after its release (lock.py)
        self._cond = DeviceCondition(self.lock)

        device_id = self.mmio.read(regs.REG_DEVICE_ID)
        expected = getattr(regs, "DEVICE_ID_PVGPU_EMU", None)
        if expected is not None and device_id != expected:
            raise KmdError(f"unknown device id {device_id:#x}", code=errors.NO_DEVICE)
        vram_size = self.mmio.read(regs.REG_VRAM_SIZE) or gpu.vram.size
        self.mm = BuddyAllocator(vram_size, PAGE_SIZE)
        if ib_pool_size is None:
            ib_pool_size = min(DEFAULT_IB_POOL_SIZE, max(64 << 10, vram_size // 64))
        ib_pool_size = round_up(ib_pool_size, PAGE_SIZE)

        # Driver-owned VRAM: page 0 (never a page table), fence page, rings and their fence
        # timestamp pages, IB pool.
        self._kernel_blocks = self.mm.alloc_blocks(PAGE_SIZE, start=0, end=PAGE_SIZE)
        fence_block = self._kernel_alloc(PAGE_SIZE)
        self.vram.fill(fence_block.offset, PAGE_SIZE, 0)
        self.fence_page = fence_block.offset
        self.rings = []
        self.fences = []
        for e in range(regs.NUM_ENGINES):
            ring_block = self._kernel_alloc(ring_size)
            self.vram.fill(ring_block.offset, ring_size, 0)
            self.rings.append(Ring(self.mmio, self.vram, e, ring_block.offset, ring_size,
                                   timeout=timeout, sleep=self._cond.wait))
            stamps = self._kernel_alloc(PAGE_SIZE)  # the ring's fence timestamp slots
            self.fences.append(FenceDriver(e, self.vram, self.fence_page + FENCE_SLOT_STRIDE * e,
                                           lock=self.lock, device=self, stamps=stamps.offset))
        ib_block = self._kernel_alloc(ib_pool_size)
        self.ib_pool = IbPool(ib_block.offset, ib_pool_size)
        self.kernel_vram = sum(b.size for b in self._kernel_blocks)
        # oversubscription: host memory that evicted buffer objects may occupy
        if max_evicted_bytes is None:
            max_evicted_bytes = 2 * vram_size
        if isinstance(max_evicted_bytes, bool) or not isinstance(max_evicted_bytes, int) \
                or max_evicted_bytes < 0:
            raise InvalidArgument(f"bad max_evicted_bytes {max_evicted_bytes!r}")
        self.max_evicted_bytes = max_evicted_bytes // PAGE_SIZE * PAGE_SIZE
        self.evicted_bytes = 0  # bytes of BOs currently held in host memory
        self.mem_counters = collections.Counter()  # evictions, restores, bytes moved, ...

        self._jobs = {}  # hardware Fence -> the _Job it completes (job.py)
        self._vmids = list(range(1, regs.NUM_VMIDS))  # free VMIDs, sorted
        self.contexts = {}  # ctx id -> Context
        self._next_ctx_id = 1
        self._deferred = collections.deque()  # (fences, fn) in queue order
        self.unclaimed_errors = []  # faults that matched no pending job
        self.stats = Counters()
        self.running = False
        self.stopped = False

        for ring in self.rings:
            ring.init()
        # per engine: publish a WPTR and run the ring on this thread (RB_KICK_SYNC_WPTR),
        # written for every short job, so through the register's own writer
        self.kick_sync_wptr = [self.mmio.writer(ring.kick_sync_wptr_reg) for ring in self.rings]

        # the GPU scheduler: one per ring, and the device's submission context (submit.py)
        now = self.clock_ns()
        self.policy = policy
        self.max_queued_jobs = max_queued_jobs
        self.max_client_queued_jobs = max_client_queued_jobs
        self._signals = []  # every scheduler's queued (fence, error) signals (_take_signals)
        self.schedulers = [
            GpuScheduler(f"gpu{gpu.index}.{regs.ENGINE_NAMES.get(e, e)}", self, engine=e,
                         policy=policy,
                         share_kind="compute" if e == regs.ENGINE_COMPUTE else "copy",
                         hw_limit=hw_limit, timeout_ns=job_timeout_ns, period_ns=period_ns,
                         time_buffer_ns=time_buffer_ns, now=now, signals=self._signals)
            for e in range(regs.NUM_ENGINES)]
        self.vgpus = {}
        self._vgpu_mem = collections.Counter()  # vGPU name -> bytes allocated
        for v in (DEFAULT_VGPU, *vgpus):
            self.add_vgpu(v)
        self.shm = ShmManager(self, DEFAULT_VGPU)  # shared device memory segments
        self.prime = PrimeExporter(self)  # dma-buf export and import (host/kmd/prime.py)
        # the context of buffer moves (evict.py): kernel VMID, kernel priority, in no registry
        self._move_ctx = self._new_move_context()
        self._moves = {}  # move fence -> (bo, copy fence, switch, release, abort) in flight
        self._evictions = []  # (move fence, bytes) of evictions whose VRAM is not yet freed
        self.submit_wq = SubmitQueue(self, self.TIMER_TICK_NS)  # the submission context
        self.mmio.write(regs.REG_VM_INVALIDATE, regs.VM_INVALIDATE_ALL)
        gpu.irq.set_handler(self._irq)
        self.mmio.write(regs.REG_IRQ_ENABLE, 1)

    def _new_move_context(self) -> Context:
        """The context of buffer moves (evict.py): kernel VMID, kernel priority, in no
        registry. A hang in one of its copies loses it like any context (TDR), so recovery
        gives the device a fresh one (tdr.py): later moves still run."""
        ctx = Context(self, 0, regs.VMID_KERNEL, None, "kmd-moves")
        ctx.priority = PRIORITY_KERNEL
        return ctx

    def _kernel_alloc(self, size: int):
        blocks = self.mm.alloc_blocks(size, flags=TOPDOWN | CONTIGUOUS)
        self._kernel_blocks.extend(blocks)
        return min(blocks, key=lambda b: b.offset)

    # ------------------------------------------------------------------ properties
    @property
    def index(self) -> int:
        return self.gpu.index

    @property
    def name(self) -> str:
        return self.gpu.name

    @property
    def vram_size(self) -> int:
        return self.mm.size

    def p2p_distance(self, peer: "KmdDevice") -> tuple:
        """pci_p2pdma_distance with this device's BAR as the provider and `peer` as the
        client: -> (map type name, distance); "NOT_SUPPORTED" when the fabric cannot
        route peer-to-peer traffic between them."""
        map_type, distance = self.gpu.pci.p2pdma_distance(peer.gpu.pci)
        return P2PDMA_MAP_NAMES[map_type], distance

    def vram_free(self) -> int:
        self.reclaim()
        return self.mm.avail

    def largest_free_block(self) -> int:
        self.reclaim()
        return self.mm.largest_free_block()

    @property
    def num_contexts(self) -> int:
        return len(self.contexts)

    def __repr__(self) -> str:
        return f"KmdDevice({self.index}, {self.name!r}, vram={self.vram_size:#x})"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self.stopped:
            raise DeviceLost("device was stopped")
        if not self.running:
            self.gpu.start()
            self.running = True
            self.submit_wq.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop the engines; every fence still pending signals with an error."""
        if self.stopped:
            return
        self.stopped = True
        self.running = False
        self.submit_wq.stop(timeout)
        self.gpu.stop(timeout)
        for fd in self.fences:
            self._retire(fd, fd.retire())  # whatever did complete, completes normally
            with self.lock:
                pending = list(fd.pending)
            self._retire(fd, pending, error=DEVICE_STOPPED)
        with self.lock:
            now = self.clock_ns()
            for sched in self.schedulers:
                sched.fail_all(DEVICE_STOPPED, now)
            signals = self._take_signals()
        self._signal(signals)
        for move in list(self._moves):  # their copies failed: the worker is gone
            self._complete_move(move)
        self.reclaim()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every job submitted so far has finished."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            fences = [f for ctx in self.contexts.values() for f in ctx.pending_fences()]
            fences += [fd.last_emitted() for fd in self.fences]
        for f in fences:
            if f is not None:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not f.wait(left):
                    return False
        return True

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    # ------------------------------------------------------------------ contexts
    def create_context(self, name: str = "", *, vgpu: VgpuShares | None = None,
                       priority: int = PRIORITY_NORMAL, client=None,
                       limits: ContextLimits | None = None) -> "Context":
        """A new context (VMID + VM) scheduled as part of `vgpu` (default: the device's
        "default" vGPU) at `priority`; `client` tags the contexts of one submitter (a
        guest session) for per-client flow control; `limits` bound it (default: the
        device's)."""
        limits = limits or self.limits
        if vgpu is None:
            vgpu = DEFAULT_VGPU
        self.add_vgpu(vgpu)
        with self.lock:
            self._reclaim_locked()
            if not self._vmids:
                raise NoVmid("every VMID is in use")
            vmid = self._vmids.pop(0)
            try:
                vm = GpuVm(self.vram, self.mm,
                           invalidate=lambda: self.mmio.write(regs.REG_VM_INVALIDATE, vmid),
                           va_base=limits.va_base, va_limit=limits.va_limit)
            except KmdError:
                self._vmids.insert(0, vmid)
                raise
            ctx = Context(self, self._next_ctx_id, vmid, vm, name)
            ctx.vgpu, ctx.priority, ctx.client = self.vgpus[vgpu.name], priority, client
            ctx.limits = limits
            self._next_ctx_id += 1
            self.contexts[ctx.id] = ctx
            self.mmio.write(regs.REG_VM_PT_BASE(vmid), vm.root)
            self.mmio.write(regs.REG_VM_INVALIDATE, vmid)
            return ctx

    def destroy_context(self, ctx: "Context", cancel: bool = False) -> None:
        """Tear a context down; memory is released once its work has finished. Work it
        queued still runs, unless `cancel` (its owner is gone): then queued jobs fail
        with ContextLost, and a job of it running on an engine is stopped by a reset of
        that engine (tdr.py preempt), so the memory is released at once."""
        with self.lock:
            if ctx.device is not self:
                raise InvalidContext("context belongs to another device")
            if ctx.destroyed:
                return
            ctx.destroyed = True
            self.contexts.pop(ctx.id, None)
            for ent in ctx._entities.values():
                ent.sched.close_entity(
                    ent, ContextLost(f"context {ctx.id} was destroyed") if cancel else None)
            signals = self._take_signals()
            bos = [bo for bo in ctx._bos.values()]
            ctx._bos.clear()
            self._vgpu_mem[ctx.vgpu.name] -= sum(bo.size for bo in bos)
            for bo in bos:
                bo.freed = True
                if bo.dmabuf is not None:
                    bo.dmabuf.revoke()
            ctx._sys_maps.clear()
            shared = self.shm.detach_all_locked(ctx)
            imports = list(ctx._imports.values())
            ctx._imports.clear()
            self._defer(ctx.pending_fences(),
                        lambda: self._release_context(ctx, bos, shared, imports))
            self._reclaim_locked()
            self._restore_evicted()
            running = cancel and any(s.in_flight and s.in_flight[0].entity.owner is ctx
                                     for s in self.schedulers)
        self._signal(signals)
        if running:
            self.submit_wq.call(self.preempt, ctx)

    def _release_context(self, ctx: "Context", bos: list, shared=(), imports=()) -> None:
        self.mmio.write(regs.REG_VM_PT_BASE(ctx.vmid), 0)
        self.mmio.write(regs.REG_VM_INVALIDATE, ctx.vmid)
        for bo in bos:
            if bo.put():
                self._release_bo_memory(bo)
        ctx.vm.free()
        if ctx.kernargs is not None:
            ctx.kernargs.release()
        self.shm.drop_mappings(shared)  # the VM and its PTEs are gone
        for imp in imports:
            imp.freed = True
            imp.attachment.detach()
        self._vmids.append(ctx.vmid)
        self._vmids.sort()
        self.stats["contexts_released"] += 1

    # ------------------------------------------------------------------ deferred frees
    def _defer(self, fences, fn) -> None:
        fences = [f for f in fences if not f.signaled]
        if fences:
            self._deferred.append((fences, fn))
        else:
            fn()

    def _reclaim_locked(self) -> int:
        if self.prime._released:
            self.prime.reap()
        if not self._deferred:
            return 0
        done = 0
        keep = collections.deque()
        for fences, fn in self._deferred:
            if all(f.signaled for f in fences):
                fn()
                done += 1
            else:
                keep.append((fences, fn))
        self._deferred = keep
        return done

    def reclaim(self) -> int:
        """Release memory whose deferred free has become safe; -> number of releases."""
        with self.lock:
            done = self._reclaim_locked()
            self._restore_evicted()
            return done

    @property
    def deferred_frees(self) -> int:
        return len(self._deferred)

    # ------------------------------------------------------------------ vGPUs and statistics
    def add_vgpu(self, shares: VgpuShares) -> VgpuShares:
        """Make a vGPU known to every ring's scheduler (idempotent for equal shares)."""
        if not isinstance(shares, VgpuShares):
            raise InvalidArgument("add_vgpu needs VgpuShares")
        with self.lock:
            old = self.vgpus.get(shares.name)
            if old is not None:
                if old != shares:
                    raise InvalidArgument(f"vGPU {shares.name!r} already exists with other shares")
                return old
            self.vgpus[shares.name] = shares
            now = self.clock_ns()
            for sched in self.schedulers:
                sched.add_vgpu(shares, now)
            return shares

    def vgpu_mem_limit(self, shares: VgpuShares) -> int:
        """Bytes a vGPU may hold on this device, resident and evicted together (its memory
        share of the device's capacity: usable VRAM + max_evicted_bytes)."""
        capacity = self.vram_size - self.kernel_vram + self.max_evicted_bytes
        return capacity * shares.mem // 100 // PAGE_SIZE * PAGE_SIZE

    def sched_stats(self) -> dict:
        """Per engine and per vGPU accounting (msgpack-able)."""
        with self.lock:
            now = self.clock_ns()
            engines = {regs.ENGINE_NAMES.get(s.engine, str(s.engine)): s.snapshot(now)
                       for s in self.schedulers}
            vgpus = {}
            for name, shares in self.vgpus.items():
                entry = {"shares": {"compute": shares.compute, "copy": shares.copy,
                                    "mem": shares.mem},
                         "mem_bytes": self._vgpu_mem[name],
                         "mem_limit": self.vgpu_mem_limit(shares),
                         "contexts": sum(1 for c in self.contexts.values() if c.vgpu is shares)}
                for ename, snap in engines.items():
                    v = snap["vgpus"].get(name)
                    if v is not None:
                        entry[ename] = {"utilisation": v["utilisation"], "busy_ns": v["busy_ns"],
                                        "jobs": v["jobs"], "credit_us": v["credit_us"]}
                vgpus[name] = entry
            return {"device": self.index, "policy": self.policy, "now_ns": now,
                    "engines": engines, "vgpus": vgpus,
                    "timeouts": self.stats["timeouts"], "shm": self.shm.stats(),
                    "mem": self.mem_stats(), "prime": self.prime.snapshot(),
                    "contexts_lost": sum(1 for c in self.contexts.values() if c.lost)}
