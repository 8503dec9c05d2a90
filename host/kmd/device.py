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
which memory is allocated and work submitted (amdgpu_ctx + its amdgpu_vm).

Submission (Context.submit_*): the job's packets (COPY or LAUNCH, addresses in the
context's VA space) are written into an indirect buffer taken from the IB pool; then, in
one ring transaction on the engine for that job type (COPY -> ENGINE_COPY, LAUNCH ->
ENGINE_COMPUTE): a WAIT packet for each other engine whose fences the job depends on and
that have not signalled yet (one WAIT per engine on the highest such sequence number —
same-engine dependencies are already ordered by the ring), INDIRECT_BUFFER(ib, length,
vmid), and a FENCE with FENCE_IRQ. Dependencies on fences of another device (or software
fences) are waited for on the CPU before submitting; the GPU scheduler will replace that.

Interrupts arrive on the engine threads. IRQ_FENCE retires the jobs whose fences the
write-back slot covers (their IB space goes back to the pool) and then signals the
fences. IRQ_PAGE_FAULT becomes a GpuFault attached to the oldest unsignalled job of that
VMID on that engine (the engine is in order, so that is the job that was executing);
IRQ_ILLEGAL_PACKET attaches a string. The job's fence then signals with `error` set,
because the command processor skips the rest of a faulting IB and carries on with the
FENCE behind it.

Deferred frees (like DRM's delayed free of BOs and VMs): memory the GPU may still be
using is not freed at once. Context.free(bo), unmap_system() and destroy_context() queue
the release behind the context's fences that are pending at that moment; the queue is
worked off (unmap, TLB flush, buddy free, VMID release) at the next driver entry or by
reclaim(), never on an interrupt thread, so the interrupt handler stays short.
Released VRAM is cleared before it goes back to the buddy allocator, so free VRAM always
reads as zero (VRAM comes out of reset zeroed) and a new buffer object needs no clearing:
no guest ever sees another's data, and allocating never touches the memory.

Shared device memory (host/kmd/shm.py, Gdev's gshm*): `dev.shm` names segments of VRAM
that no context owns; Context.attach_shared(seg) maps the same physical pages into that
context's VM, detach_shared(seg) unmaps them behind the context's pending work (a
deferred free), and the VRAM goes back once the segment is removed and detached by all.
Segments count against their creator's vGPU memory share like buffer objects.

Oversubscription (Gdev's swapping, amdgpu's VRAM -> GTT eviction): a context may
allocate more than the free VRAM. Context.alloc -> _alloc_vram evicts buffer objects of
OTHER contexts to host memory until the request fits. Victim order: lowest context
priority first, then least recently used *context* (Context.last_use_ns, the time its
last job was submitted or handed to the hardware — LRU is per context, not per BO), then
its largest BOs first. Only contexts with no job on the hardware (none in a scheduler's
in_flight; queued jobs touch no memory yet) are victims; when the only candidates are
busy, the allocation waits for them (Condition wait, lock released, up to `timeout`)
and then fails with OutOfMemory. Evicting a BO (_evict_bo): copy its VRAM into a numpy
buffer on the CPU (through the VRAM BAR), dma_map it, rewrite the BO's PTEs at the same
VA to PTE_SYSTEM pages pointing at that copy, invalidate the VMID's TLB, free the VRAM
(cleared). The GPU keeps reaching the BO through the SYSTEM PTEs (slower), so kernels
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

Locking: one RLock per device guards all driver state. Submissions come from any host
thread; interrupts from the engine threads take the same lock for a few statements.
Waiting for ring or IB-pool space happens in a Condition wait that releases the lock, so
a full ring never blocks the interrupt handler that would drain it. No fence callback is
ever called with the lock held.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from host.hw import packets, regs
from host.kmd import errors
from host.kmd import fence as fence_mod
from host.kmd.bo import BufferObject, CodeFault, GpuFault, blocks_to_extents
from host.kmd.buddy import CONTIGUOUS, TOPDOWN, BuddyAllocator
from host.kmd.errors import (ContextLost, DeviceLost, InvalidAddress, InvalidArgument,
                             InvalidContext, KmdError, NoVmid, OutOfMemory)
from host.kmd.fence import Fence, FenceDriver
from host.hw.pcie import P2PDMA_MAP_NAMES
from host.kmd.kernarg import CodeLaunch, KernargArea
from host.kmd.limits import ContextLimits
from host.kmd.prime import ALL_SHARED, PrimeExporter
from host.kmd.resv import RESV_LOCK
from host.kmd.ring import DEFAULT_RING_SIZE, Ring
from host.kmd.shm import SharedSegment, ShmManager
from host.kmd.sched import (DEFAULT_HW_LIMIT, DEFAULT_PERIOD_NS, DEFAULT_TIME_BUFFER_NS,
                            DEFAULT_TIMEOUT_NS, PRIORITY_NORMAL, GpuScheduler, SchedJob,
                            VgpuShares)
from host.kmd.vm import VA_MAX_ALIGN, GpuVm
from spec import isa, kernels

log = logging.getLogger("pvgpu.kmd")

PAGE_SIZE = regs.PAGE_SIZE
# host->device copies on copy engine 0, device->host on copy engine 1, so both directions
# overlap each other and compute
ENGINE_FOR_COPY = {"h2d": regs.ENGINE_COPY0, "d2h": regs.ENGINE_COPY1, "d2d": regs.ENGINE_COPY0}
DEFAULT_VGPU = VgpuShares("default")
MAX_QUEUED_JOBS = 8192  # jobs queued in the schedulers of one device
MAX_CLIENT_QUEUED_JOBS = 1024  # ... of one client (a guest session)
DEFAULT_IB_POOL_SIZE = 1 << 20
IB_ALIGN = 256
FENCE_SLOT_STRIDE = 64  # one write-back slot per engine, a cache line apart
DEFAULT_TIMEOUT = 5.0  # seconds to wait for ring / IB-pool space or a foreign fence
DEVICE_STOPPED = "device stopped"  # the error of fences still pending at stop()
_U64 = (1 << 64) - 1
_U32 = (1 << 32) - 1


def _round_up(x: int, a: int) -> int:
    return -(-x // a) * a


@dataclass(frozen=True, eq=False)
class DmaMapping:
    """A host buffer made reachable by the device (dma_map_single): `size` bytes at `bus_addr`."""

    bus_addr: int
    size: int
    buf: np.ndarray = field(repr=False)
    device: "KmdDevice" = field(repr=False, default=None)


class IbPool:
    """Sub-allocator of indirect-buffer space in one KMD-owned VRAM range (amdgpu_sa).

    Allocation is circular (a FIFO of live IBs); IBs may be released in any order, and
    space is reused once every older IB is released too. alloc() -> phys or None."""

    def __init__(self, base: int, size: int, align: int = IB_ALIGN):
        self.base, self.size, self.align = base, size, align
        self._live = collections.deque()  # [start, end, done] in allocation order
        self._by_start = {}
        self._tail = 0  # next free offset

    @property
    def in_use(self) -> int:
        return len(self._live)

    def free_bytes(self) -> int:
        """Contiguous room the next alloc() could use (a lower bound of all free space)."""
        if not self._live:
            return self.size
        head, tail = self._live[0][0], self._tail
        if tail > head:
            return max(self.size - tail, head)
        return head - tail

    def alloc(self, nbytes: int) -> int | None:
        n = _round_up(max(nbytes, 1), self.align)
        if n >= self.size:
            return None
        if not self._live:
            start = 0
        else:
            head, tail = self._live[0][0], self._tail
            # tail == head never happens with live IBs (strict comparisons below), so
            # tail > head means the live range [head, tail) has not wrapped.
            if tail > head:
                start = tail if tail + n <= self.size else (0 if n < head else None)
            else:  # wrapped: the free space is [tail, head)
                start = tail if tail + n < head else None
            if start is None:
                return None
        entry = [start, start + n, False]
        self._live.append(entry)
        self._by_start[start] = entry
        self._tail = start + n
        return self.base + start

    def free(self, phys: int) -> None:
        entry = self._by_start.pop(phys - self.base)
        entry[2] = True
        while self._live and self._live[0][2]:
            self._live.popleft()
        if not self._live:
            self._tail = 0


class _Job:
    __slots__ = ("fence", "context", "kind", "ib", "ib_block", "submitted", "timeline",
                 "kernarg")

    def __init__(self, fence, context, kind, ib, ib_block, timeline: int = 0, kernarg=None):
        self.fence = fence
        self.context = context
        self.kind = kind  # the engine
        self.ib = ib
        self.ib_block = ib_block
        self.timeline = timeline
        self.kernarg = kernarg  # the parameter-buffer slot of a code launch (kernarg.py)
        self.submitted = time.monotonic()


class KmdDevice:
    """The driver bound to one host.hw.gpu.Gpu."""

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
        self.timeout = timeout
        self.lock = threading.RLock()
        self._cond = threading.Condition(self.lock)

        device_id = self.mmio.read(regs.REG_DEVICE_ID)
        expected = getattr(regs, "DEVICE_ID_PVGPU_EMU", None)
        if expected is not None and device_id != expected:
            raise KmdError(f"unknown device id {device_id:#x}", code=errors.NO_DEVICE)
        vram_size = self.mmio.read(regs.REG_VRAM_SIZE) or gpu.vram.size
        self.mm = BuddyAllocator(vram_size, PAGE_SIZE)
        if ib_pool_size is None:
            ib_pool_size = min(DEFAULT_IB_POOL_SIZE, max(64 << 10, vram_size // 64))
        ib_pool_size = _round_up(ib_pool_size, PAGE_SIZE)

        # Driver-owned VRAM: page 0 (never a page table), fence page, rings, IB pool.
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
            self.fences.append(FenceDriver(e, self.vram, self.fence_page + FENCE_SLOT_STRIDE * e,
                                           lock=self.lock, device=self))
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

        self._jobs = {}  # Fence -> _Job
        self._vmids = list(range(1, regs.NUM_VMIDS))  # free VMIDs, sorted
        self.contexts = {}  # ctx id -> Context
        self._next_ctx_id = 1
        self._deferred = collections.deque()  # (fences, fn) in queue order
        self.unclaimed_errors = []  # faults that matched no pending job
        self.stats = collections.Counter()
        self.running = False
        self.stopped = False

        for ring in self.rings:
            ring.init()

        # the GPU scheduler: one per ring, and the worker that runs its timers
        now = self.clock_ns()
        self.policy = policy
        self.max_queued_jobs = max_queued_jobs
        self.max_client_queued_jobs = max_client_queued_jobs
        self.schedulers = [
            GpuScheduler(f"gpu{gpu.index}.{regs.ENGINE_NAMES.get(e, e)}", self, engine=e,
                         policy=policy,
                         share_kind="compute" if e == regs.ENGINE_COMPUTE else "copy",
                         hw_limit=hw_limit, timeout_ns=job_timeout_ns, period_ns=period_ns,
                         time_buffer_ns=time_buffer_ns, now=now)
            for e in range(regs.NUM_ENGINES)]
        self.vgpus = {}
        self._vgpu_mem = collections.Counter()  # vGPU name -> bytes allocated
        for v in (DEFAULT_VGPU, *vgpus):
            self.add_vgpu(v)
        self.shm = ShmManager(self, DEFAULT_VGPU)  # shared device memory segments
        self.prime = PrimeExporter(self)  # dma-buf export and import (host/kmd/prime.py)
        self._timer_cond = threading.Condition()
        self._timer_target = None
        self._timer_idle_since = 0  # when the worker last went to sleep without a target
        self._timer_thread = None
        self._timer_stop = False
        self.mmio.write(regs.REG_VM_INVALIDATE, regs.VM_INVALIDATE_ALL)
        gpu.irq.set_handler(self._irq)
        self.mmio.write(regs.REG_IRQ_ENABLE, 1)

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

    def clock_ns(self) -> int:
        """The device clock (ns, REG_TIMESTAMP), the time base of fence timestamps."""
        return self.mmio.read(regs.REG_TIMESTAMP)

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
            self._timer_thread = threading.Thread(target=self._timer_worker, daemon=True,
                                                  name=f"gpu{self.index}.sched")
            self._timer_thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop the engines; every fence still pending signals with an error."""
        if self.stopped:
            return
        self.stopped = True
        self.running = False
        with self._timer_cond:
            self._timer_stop = True
            self._timer_cond.notify_all()
        if self._timer_thread is not None and self._timer_thread is not threading.current_thread():
            self._timer_thread.join(timeout)
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

    # ------------------------------------------------------------------ system memory
    # ------------------------------------------------------------------ flow control
    def has_headroom(self, client=None) -> bool:
        """Whether the schedulers take more jobs now: fewer than max_queued_jobs queued on
        this device and fewer than max_client_queued_jobs of `client` (a context's
        `client` tag, e.g. a guest session). Callers that must not block (the host's I/O
        loop) hold back new work until it is true — one client's flood holds back only
        that client."""
        with self.lock:
            if sum(s.n_queued for s in self.schedulers) >= self.max_queued_jobs:
                return False
            if client is None:
                return True
            return self._client_queued(client) < self.max_client_queued_jobs

    def _client_queued(self, client) -> int:
        return sum(s.queued(ctx) for ctx in self.contexts.values() if ctx.client is client
                   for s in self.schedulers)

    def oldest_pending_fence(self, client=None) -> Fence | None:
        """The finished fence of the oldest unfinished job (of `client`), None when idle."""
        with self.lock:
            best = None
            for s in self.schedulers:
                cands = list(s.in_flight) + [e.jobs[0] for e in s.entities if e.jobs]
                for job in cands:
                    owner = job.entity.owner
                    if client is not None and (owner is None or owner.client is not client):
                        continue
                    if best is None or job.arrival_ns < best.arrival_ns or (
                            job.arrival_ns == best.arrival_ns and job.seq < best.seq):
                        best = job
            return best.finished if best is not None else None

    def dma_map(self, buf) -> DmaMapping:
        """Make a host buffer reachable by the GPU; -> DmaMapping(bus_addr, size)."""
        if not isinstance(buf, np.ndarray):
            raise InvalidArgument("dma_map needs a numpy array")
        if not buf.flags.c_contiguous:
            raise InvalidArgument("dma_map needs a C-contiguous buffer")
        raw = buf.reshape(-1).view(np.uint8)
        if raw.size == 0:
            raise InvalidArgument("dma_map of an empty buffer")
        bus = self.gpu.sysmem.dma_map(raw)
        return DmaMapping(bus, int(raw.size), raw, self)

    def dma_unmap(self, mapping: DmaMapping) -> None:
        try:
            self.gpu.sysmem.dma_unmap(mapping.bus_addr)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None

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
        with ContextLost and only what is on the hardware completes."""
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
        self._signal(signals)

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

    def _release_vram(self, blocks) -> None:
        """Give VRAM back to the allocator, cleared: free VRAM always reads as zero. The
        clear hands whole pages back to the OS (Vram.clear), so it is cheap for the I/O
        thread, which runs it, even for large buffers nobody wrote."""
        for b in blocks:
            self.vram.clear(b.offset, b.size)
        self.mm.free_blocks(blocks)

    # ------------------------------------------------------------------ eviction (oversubscription)
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

    def _alloc_vram(self, size: int, requester: "Context | None"):
        """Buddy blocks for a BO of `requester` (None: a shared segment), evicting other
        contexts' BOs to host memory when VRAM is full; waits (up to `timeout`, lock
        released) for victims that are busy on the GPU. Raises OutOfMemory."""
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
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.timeout
                self.mem_counters["evict_waits"] += 1
            if now >= deadline:
                raise OutOfMemory(f"{size} bytes of VRAM requested, {self.mm.avail} free; "
                                  f"the contexts that could be evicted stayed busy")
            self._cond.wait(min(0.05, deadline - now))
            if requester is not None and requester.destroyed:
                raise InvalidContext(f"context {requester.id} was destroyed")
            self._reclaim_locked()

    def _make_resident(self, bo: BufferObject) -> None:
        """Bring an evicted BO back into VRAM now, evicting other contexts' BOs if needed
        and waiting (lock released, up to `timeout`) until its own context has no job on
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
            left = deadline - time.monotonic()
            if left <= 0:
                raise OutOfMemory("the evicted buffer object could not be made resident "
                                  "(contexts stayed busy)")
            self._cond.wait(min(0.05, left))
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

    # ------------------------------------------------------------------ submission
    def _ib_free(self, phys: int, blocks) -> None:
        if blocks is not None:
            self._release_vram(blocks)
        else:
            self.ib_pool.free(phys)

    def _submit(self, ctx: "Context", engine: int, ib: bytes, wait, timeline: int = 0,
                touches=()) -> Fence:
        """Queue a job (its IB's packets) on the scheduler of `engine`, on the entity of
        timeline `timeline` of ctx; -> the job's finished fence. Never waits: the job runs
        when its dependencies have signalled and the scheduler picks it. `touches`: the
        (va, size, write) ranges it accesses, for implicit sync of shared buffers."""
        deps = []
        for f in wait or ():
            if f is None:
                continue
            if not isinstance(f, Fence):
                raise InvalidArgument(f"not a fence: {f!r}")
            if not f.signaled:
                deps.append(f)
        with self.lock:
            if ctx.device is not self or ctx.destroyed:
                raise InvalidContext("context was destroyed or belongs to another device")
            if self.stopped:
                raise DeviceLost("device stopped")
            if ctx.lost:
                raise ContextLost(f"context {ctx.id} was lost after a GPU hang "
                                  f"({ctx.lost_reason}); destroy it")
            self._reclaim_locked()
            sched = self.schedulers[engine]
            ent = ctx._entity(sched, timeline)
            now = self.clock_ns()
            if not (ctx.shared and touches):
                resvs = ()
            elif touches is ALL_SHARED:  # a code launch (spec PRIME-SYNC-2)
                resvs = self.prime.shared_resvs(ctx)
            else:
                resvs = self.prime.touched(ctx, touches)
            if resvs:
                with RESV_LOCK:  # deps, push and fence as one step (see resv.py)
                    deps += self.prime.implicit_deps(resvs)
                    job = sched.push(SchedJob(ent, ib, deps), now)
                    self.prime.add_job_fence(resvs, job.finished)
            else:
                job = sched.push(SchedJob(ent, ib, deps), now)
            ent.last_finished = job.finished
            ctx.last_fence = job.finished
            ctx.last_use_ns = now
            ctx.stats["jobs_submitted"] += 1
            self.stats["jobs_submitted"] += 1
            sched.schedule(now)
            signals = self._take_signals()
            self._arm_timer(sched)
        self._signal(signals)
        return job.finished

    # ------------------------------------------------------------------ scheduler ops
    def run_job(self, job: SchedJob) -> Fence:
        """drm_sched backend op (lock held): write the job's IB, then INDIRECT_BUFFER and
        a FENCE into its ring; -> the hardware fence."""
        engine = job.entity.sched.engine
        ctx = job.entity.owner
        ib = job.payload
        ctx.last_use_ns = self.clock_ns()
        if ctx.evicted_bos and not self._ctx_on_gpu(ctx):
            self._restore_evicted(ctx)  # only into free VRAM; never waits
        if ctx.stale_imports:
            self.prime.remap_stale(ctx)  # the exporter moved a buffer this job may use
        slot = None
        if isinstance(ib, CodeLaunch):  # its parameters go into a slot of the kernarg area
            slot = ctx.kernargs.take(ib.params)
            if slot is None:  # cannot happen (slots >= hw_limit): the launch faults instead
                log.error("gpu%d: no parameter buffer free for %r", self.index, job)
            ib = ib.ib(ctx.kernargs.slot_va(slot) if slot is not None else 0)
        phys, ib_blocks = self._ib_alloc_nowait(len(ib))
        self.vram.write(phys, ib)
        ring = self.rings[engine]
        ring.alloc(5 + fence_mod.FENCE_DW)  # never waits: hw_limit jobs fit many times over
        ring.write(packets.indirect_buffer(phys, len(ib) // 4, ctx.vmid))
        fence = self.fences[engine].emit(ring)
        self._jobs[fence] = _Job(fence, ctx, engine, phys, ib_blocks,
                                 ctx._timeline_of.get(job.entity, 0), slot)
        ring.commit()
        fence.add_done_callback(lambda f, job=job: self._hw_done(job, f))
        return fence

    def _ib_alloc_nowait(self, nbytes: int):
        if nbytes <= self.ib_pool.size // 2:
            phys = self.ib_pool.alloc(nbytes)
            if phys is not None:
                return phys, None
            self.stats["ib_pool_full"] += 1
        blocks = self.mm.alloc_blocks(_round_up(nbytes, PAGE_SIZE), flags=CONTIGUOUS | TOPDOWN)
        return min(b.offset for b in blocks), blocks

    def _hw_done(self, job: SchedJob, hw_fence: Fence) -> None:
        """The hardware fence of a job signalled (on an interrupt thread, no lock held)."""
        with self.lock:
            sched = job.entity.sched
            now = self.clock_ns()
            end = hw_fence.timestamp if hw_fence.timestamp is not None else now
            if sched.job_done(job, hw_fence, end, now):
                sched.schedule(now)
                self._arm_timer(sched)
            signals = self._take_signals()
        self._signal(signals)

    def wake(self, sched: GpuScheduler) -> None:
        """A dependency of a queued job signalled (any thread, no lock held)."""
        with self.lock:
            if self.stopped:
                return
            sched.schedule(self.clock_ns())
            self._arm_timer(sched)
            signals = self._take_signals()
        self._signal(signals)

    def _take_signals(self) -> list:
        out = []
        for sched in self.schedulers:
            out += sched.take_signals()
        return out

    @staticmethod
    def _signal(signals) -> None:
        for fence, error in signals:
            fence.signal(error)

    # ------------------------------------------------------------------ timers and TDR
    TIMER_TICK_NS = 20_000_000  # the timer worker never sleeps longer than this

    def _arm_timer(self, sched: GpuScheduler) -> None:
        """Wake the timer worker if `sched` now has a deadline before the worker's next
        wakeup. Job timeouts are far off and wait for the next tick (at most 20 ms late),
        so an ordinary submission does not wake a thread; time buffers are short and do."""
        deadline = sched.next_deadline()
        if deadline is None:
            return
        target = self._timer_target
        if target is None:
            target = self._timer_idle_since + self.TIMER_TICK_NS
        if deadline < target:
            with self._timer_cond:
                self._timer_target = deadline
                self._timer_cond.notify()

    def _timer_worker(self) -> None:
        """drm_sched's timeout work and the BAND time-buffer timer, for every ring."""
        while True:
            timed_out = None
            with self.lock:
                now = self.clock_ns()
                deadlines = []
                for sched in self.schedulers:
                    job = sched.timed_out(now)
                    if job is not None:
                        timed_out = (sched, job)
                        break
                    if sched.hold_until is not None and now >= sched.hold_until:
                        sched.schedule(now)
                    d = sched.next_deadline()
                    if d is not None:
                        deadlines.append(d)
                signals = self._take_signals()
            self._signal(signals)
            if timed_out is not None:
                try:
                    self.recover(*timed_out)
                except Exception:  # noqa: BLE001 - the timer must survive anything
                    log.exception("gpu%d: recovery failed", self.index)
                continue
            with self._timer_cond:
                if self._timer_stop:
                    return
                target = min(deadlines) if deadlines else None
                if self._timer_target is not None and (target is None or self._timer_target < target):
                    target = self._timer_target
                now = self.clock_ns()
                self._timer_target = target
                if target is None or target > now + self.TIMER_TICK_NS:
                    self._timer_target = None  # sleep one tick; _arm_timer knows until when
                    self._timer_idle_since = now
                    target = now + self.TIMER_TICK_NS
                wait = max(0.0, (target - now) / 1e9)
                if wait > 0:
                    self._timer_cond.wait(wait)
                self._timer_target = None
                if self._timer_stop:
                    return

    def recover(self, sched: GpuScheduler, job: SchedJob) -> bool:
        """TDR: `job` ran past its timeout on `sched`'s ring. Stop that ring's scheduler,
        reset the engine, force-complete its hardware fences, mark the job's context lost
        (its queued work on every ring fails with ContextLost), hand the innocent jobs
        that were in the ring to the hardware again, and restart. -> False if the job
        completed in the meantime."""
        engine = sched.engine
        with self.lock:
            now = self.clock_ns()
            if sched.timed_out(now) is not job:
                return False
            sched.stopped = True
            for j in sched.in_flight:
                j.hw_fence = None  # what the reset abandons must not complete the jobs
            ctx = job.entity.owner
            ctx.lost = True
            ctx.lost_reason = (f"a job on {sched.name} ran past the "
                               f"{sched.timeout_ns / 1e9:g} s timeout")
            timeline = ctx._timeline_of.get(job.entity, 0)
            self.stats["timeouts"] += 1
            self.stats["engine_resets"] += 1
            log.warning("gpu%d: %s timed out (context %d); resetting %s", self.index, job,
                        ctx.id, sched.name)
        try:
            self.mmio.write(regs.REG_ENGINE(engine, regs.RB_RESET), 1)  # waits for the engine
        finally:
            with self.lock:
                ring = self.rings[engine]
                ring.after_reset()
                fd = self.fences[engine]
                stale = fd.force_completion()
        self._retire(fd, stale, error="engine reset")
        with self.lock:
            now = self.clock_ns()
            sched.stopped = False
            sched.recover(job, now, lost_owners=[ctx])
            for other in self.schedulers:
                if other is not sched:
                    other.mark_lost([ctx], now)
            for s in self.schedulers:
                s.schedule(now)
                self._arm_timer(s)
            signals = self._take_signals()
        ctx.report_error(errors.JobTimedOut(ctx.lost_reason), timeline, engine)
        self._signal(signals)
        return True

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

    def _retire(self, fd: FenceDriver, done: list, error=None, timestamp=None) -> None:
        """Bookkeeping for completed fences, then signal them (outside the lock)."""
        if not done:
            return
        if timestamp is None:
            timestamp = self.clock_ns()
        for f in done:
            if f.timestamp is None:
                f.timestamp = timestamp
        with self.lock:
            if error is not None:
                for f in done:
                    if fd.pending and fd.pending[0] is f:
                        fd.pending.popleft()
                    elif f in fd.pending:
                        fd.pending.remove(f)
            for f in done:
                job = self._jobs.pop(f, None)
                if job is None:
                    continue
                self._ib_free(job.ib, job.ib_block)
                if job.kernarg is not None:
                    job.context.kernargs.give_back(job.kernarg)
                job.context.stats["jobs_completed"] += 1
                if f.error is not None or error is not None:
                    job.context.stats["jobs_failed"] += 1
            self._cond.notify_all()
        fence_mod.signal_all(done, error)

    # ------------------------------------------------------------------ interrupts
    def _irq(self, irq) -> None:
        """Top half, on the engine thread that raised the interrupt."""
        if not 0 <= irq.engine < len(self.fences):
            log.warning("gpu%d: interrupt from unknown engine: %s", self.index, irq)
            return
        fd = self.fences[irq.engine]
        if irq.source == regs.IRQ_FENCE:
            self.stats["irq_fence"] += 1
            self._retire(fd, fd.retire(irq.data), timestamp=getattr(irq, "timestamp", None) or None)
        elif irq.source == regs.IRQ_PAGE_FAULT:
            self.stats["irq_page_fault"] += 1
            self._job_error(fd, irq.vmid, GpuFault(irq.vmid, irq.address, irq.access, irq.engine))
        elif irq.source == regs.IRQ_ILLEGAL_PACKET:
            self.stats["irq_illegal_packet"] += 1
            self._job_error(fd, irq.vmid,
                            f"illegal packet {irq.data:#010x} at offset {irq.address:#x} "
                            f"(vmid {irq.vmid}, engine {regs.ENGINE_NAMES.get(irq.engine)})")
        elif irq.source == regs.IRQ_CODE_FAULT:  # the SMs refused a code object, or a trap
            self.stats["irq_code_fault"] += 1
            self._job_error(fd, irq.vmid, CodeFault(irq.vmid, irq.address, irq.data, irq.engine))
        else:
            log.warning("gpu%d: unknown interrupt %s", self.index, irq)

    def _job_error(self, fd: FenceDriver, vmid: int, error) -> None:
        self._retire(fd, fd.retire())  # jobs already done cannot be the culprit
        with self.lock:
            target = None
            for f in fd.pending:
                job = self._jobs.get(f)
                if vmid == regs.VMID_KERNEL or job is None or job.context.vmid == vmid:
                    target = f
                    break
            if target is None:
                self.unclaimed_errors.append(error)
                log.warning("gpu%d: %s matches no pending job", self.index, error)
                return
            job = self._jobs.get(target)
            if job is not None:
                job.context.stats["faults"] += 1
                job.context.faults.append(error)
        if job is not None:
            job.context.report_error(error, job.timeline, job.kind)
        if not target.set_error(error):
            log.info("gpu%d: second error for %r: %s", self.index, target, error)



def _slice_extents(extents, offset: int, size: int) -> list:
    """[(phys, size)] of bytes [offset, offset + size) of a BO with `extents`."""
    out, pos = [], 0
    for phys, n in extents:
        lo, hi = max(offset, pos), min(offset + size, pos + n)
        if lo < hi:
            out.append((phys + lo - pos, hi - lo))
        pos += n
    return out


class Context:
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
        self.stats = collections.Counter()
        self.vgpu = DEFAULT_VGPU
        self.limits = device.limits
        self.priority = PRIORITY_NORMAL
        self.client = None
        self.lost = False  # guilty of a GPU hang (TDR): no more work is accepted
        self.lost_reason = ""
        self.last_use_ns = device.clock_ns()  # LRU key of eviction: its last job's time
        self.evicted_bos = 0  # how many of its BOs are evicted to host memory

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
        (the last job of each entity: an entity's jobs finish in order)."""
        return [e.last_finished for e in self._entities.values()
                if e.last_finished is not None and not e.last_finished.signaled]

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
        psize = _round_up(size, PAGE_SIZE)
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
                            dev._evict_for(dev.mm.avail + 8 * PAGE_SIZE, self)
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

    def map_system(self, mapping: DmaMapping, va: int, size: int | None = None,
                   writable: bool = True) -> None:
        """Map a dma-mapped host buffer at `va` (PTE_SYSTEM), e.g. the guest-memory window."""
        if not isinstance(mapping, DmaMapping):
            raise InvalidArgument("map_system needs a DmaMapping")
        if mapping.device is not None and mapping.device is not self.device:
            raise InvalidArgument("DMA mapping of another device")
        if size is None:
            size = mapping.size
        if not isinstance(va, int) or not isinstance(size, int) or size <= 0 \
                or size > _round_up(mapping.size, PAGE_SIZE) or va % PAGE_SIZE:
            raise InvalidArgument(f"bad system mapping va={va!r} size={size!r}")
        psize = _round_up(size, PAGE_SIZE)
        flags = regs.PTE_SYSTEM | regs.PTE_READ | (regs.PTE_WRITE if writable else 0)
        dev = self.device
        with dev.lock:
            self._check()
            dev._reclaim_locked()
            in_user = va < self.limits.va_limit and va + psize > self.limits.va_base
            if in_user:
                self.vm.va.reserve(va, psize)
            try:
                self.vm.map(va, [(mapping.bus_addr, psize)], flags)
            except BaseException:
                if in_user:
                    self.vm.va.free(va)
                raise
            self._sys_maps[va] = (mapping, psize, in_user)
            self.stats["system_bytes_mapped"] += psize

    def unmap_system(self, va: int) -> None:
        """Remove a system mapping; the PTEs go once this context's pending work is done."""
        dev = self.device
        with dev.lock:
            self._check()
            entry = self._sys_maps.pop(va, None)
            if entry is None:
                raise InvalidAddress(f"no system mapping at {va:#x}")
            self.stats["system_bytes_mapped"] -= entry[1]

            def release():
                if not self.vm.freed:
                    self.vm.unmap(va)
                    if entry[2]:
                        self.vm.va.free(va)
            dev._defer(self.pending_fences(), release)

    # ------------------------------------------------------------------ explicit VA management
    # cuMemAddressReserve / cuMemMap / cuMemSetAccess / cuMemUnmap / cuMemAddressFree (spec
    # §6.7): a reservation is a range of this context's VA space that nothing is mapped in
    # until map_bo_at puts (a page-aligned slice of) a buffer object there, READ or
    # READ|WRITE; the BO's own mapping at bo.va stays. unmap_at clears the PTEs and
    # invalidates the TLB (GpuVm.unmap -> REG_VM_INVALIDATE) behind this context's pending
    # work, like every other unmap. A BO must not be freed while it is mapped elsewhere
    # (mapped_elsewhere(); the backend refuses such a MEM_FREE).
    def reserve_va(self, size: int, align: int = PAGE_SIZE) -> int:
        """Reserve an unmapped, `align`-aligned range of `size` bytes (page rounded) in the
        user VA space; -> its VA. Raises InvalidArgument, OutOfMemory."""
        for what, v in (("size", size), ("alignment", align)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise InvalidArgument(f"bad VA reservation {what} {v!r}")
        size, align = int(size), int(align) or PAGE_SIZE
        lim = self.limits
        if not 0 < size <= lim.va_limit - lim.va_base:
            raise InvalidArgument(f"bad VA reservation size {size:#x}")
        if align < PAGE_SIZE or align & (align - 1) or align > lim.max_va_align:
            raise InvalidArgument(f"VA alignment {align:#x} is not a power of two in "
                                  f"[{PAGE_SIZE:#x}, {lim.max_va_align:#x}]")
        psize = _round_up(size, PAGE_SIZE)
        with self.device.lock:
            self._check()
            self.device._reclaim_locked()
            if len(self._va_reserved) >= lim.max_va_reservations:
                raise OutOfMemory(f"{lim.max_va_reservations} VA reservations in use")
            va = self.vm.va.alloc(psize, align)
            self._va_reserved[va] = psize
            self.stats["va_reserved"] += psize
            return va

    def va_reservations(self) -> dict:
        """{va: size} of the live reservations."""
        with self.device.lock:
            return dict(self._va_reserved)

    def va_mappings(self) -> dict:
        """{va: (bo, offset, size, writable)} of the live map_bo_at mappings."""
        with self.device.lock:
            return dict(self._va_maps)

    def mapped_elsewhere(self, bo: BufferObject) -> list:
        """VAs at which map_bo_at mapped `bo` (besides bo.va)."""
        with self.device.lock:
            return [va for va, m in self._va_maps.items() if m[0] is bo]

    def release_va(self, va: int) -> None:
        """End reservation `va` (no mapping may be left in it: InvalidArgument); the range
        returns to the allocator once this context's pending work is done (so that it is
        not reused before earlier unmaps in it took effect)."""
        dev = self.device
        with dev.lock:
            self._check()
            size = self._va_reserved.get(va)
            if size is None:
                raise InvalidAddress(f"no VA reservation starts at {va:#x}")
            inside = [m for m in self._va_maps if va <= m < va + size]
            if inside:
                raise InvalidArgument(f"VA reservation {va:#x} still has {len(inside)} "
                                      f"mapping(s), first at {min(inside):#x}: unmap first")
            del self._va_reserved[va]
            self.stats["va_reserved"] -= size

            def release():
                if not self.vm.freed:
                    self.vm.va.free(va)
            dev._defer(self.pending_fences(), release)

    def _reservation_of(self, va: int, size: int):
        for start, rsize in self._va_reserved.items():
            if start <= va and va + size <= start + rsize:
                return start
        return None

    def map_bo_at(self, bo: BufferObject, va: int, offset: int = 0, size: int | None = None,
                  writable: bool = True) -> None:
        """Map [offset, offset + size) of `bo` (this context's) at `va`, inside a
        reservation, READ (+WRITE): the same physical pages become reachable there.
        Raises InvalidArgument (alignment, range, bo), InvalidAddress (outside a
        reservation, or overlapping another mapping), OutOfMemory (page tables)."""
        if size is None:
            size = bo.size - offset if isinstance(bo, BufferObject) else 0
        for what, v in (("va", va), ("offset", offset), ("size", size)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v <= _U64:
                raise InvalidArgument(f"bad mapping {what} {v!r}")
        va, offset, size = int(va), int(offset), int(size)
        if va % PAGE_SIZE or offset % PAGE_SIZE or size % PAGE_SIZE or size == 0:
            raise InvalidArgument(f"mapping va {va:#x}, offset {offset:#x} and size {size:#x} "
                                  "must be page aligned, size > 0")
        dev = self.device
        for _attempt in range(3):
            with dev.lock:
                self._check()
                dev._reclaim_locked()
                if not isinstance(bo, BufferObject) or self._bos.get(bo.va) is not bo:
                    raise InvalidArgument(f"{bo!r} is not a live buffer object of this context")
                if offset + size > bo.size:
                    raise InvalidArgument(f"[{offset:#x}, {offset + size:#x}) is outside the "
                                          f"{bo.size:#x}-byte buffer")
                if self._reservation_of(va, size) is None:
                    raise InvalidAddress(f"[{va:#x}, {va + size:#x}) is not inside one VA "
                                         "reservation of this context")
                for m, (_b, _o, msize, _w) in self._va_maps.items():
                    if m < va + size and va < m + msize:
                        raise InvalidAddress(f"[{va:#x}, {va + size:#x}) overlaps the mapping "
                                             f"at {m:#x}")
                if len(self._va_maps) >= self.limits.max_va_mappings:
                    raise OutOfMemory(f"{self.limits.max_va_mappings} mappings in use")
                pending = any(s < va + size and va < s + n for s, n, _f in self.vm.mappings())
                if getattr(bo, "sysmem", None) is not None:  # evicted: back into VRAM first
                    if dev._ctx_on_gpu(self):
                        pending = True  # its jobs may be using the host copy: wait
                    elif not dev._restore_bo(bo):
                        raise OutOfMemory(f"{bo!r} is evicted to host memory and does not "
                                          "fit back into VRAM to be mapped")
                if not pending:
                    flags = regs.PTE_READ | (regs.PTE_WRITE if writable else 0)
                    self.vm.map(va, _slice_extents(bo.extents, offset, size), flags)
                    self._va_maps[va] = (bo, offset, size, bool(writable))
                    self.stats["va_mapped"] += size
                    return
                # an earlier unmap of this range (or a restore) waits for this context's work
                fences = self.pending_fences()
            for f in fences:
                f.wait(dev.timeout)
        raise InvalidAddress(f"[{va:#x}, {va + size:#x}) is still being unmapped")

    def unmap_at(self, va: int) -> None:
        """Remove the map_bo_at mapping that starts at `va`: at once for new work; the PTEs
        are cleared and the TLB invalidated once this context's pending work is done."""
        dev = self.device
        with dev.lock:
            self._check()
            entry = self._va_maps.pop(va, None)
            if entry is None:
                raise InvalidAddress(f"no mapping starts at {va:#x}")
            self.stats["va_mapped"] -= entry[2]

            def release():
                if not self.vm.freed:
                    self.vm.unmap(va)  # clears the PTEs, REG_VM_INVALIDATE(vmid)
            dev._defer(self.pending_fences(), release)

    # ------------------------------------------------------------------ submission
    @staticmethod
    def _check_u64(*values) -> None:
        for v in values:
            if not isinstance(v, (int, np.integer)) or not 0 <= v <= _U64:
                raise InvalidArgument(f"bad address or size {v!r}")

    def submit_copy(self, src_va: int, dst_va: int, size: int, wait=(), *,
                    direction: str = "d2d", timeline: int = 0) -> Fence:
        """Copy `size` bytes from src_va to dst_va (this context's VAs) on a copy engine."""
        return self.submit_copies([(src_va, dst_va, size)], wait, direction=direction,
                                  timeline=timeline)

    def submit_copies(self, copies, wait=(), *, direction: str = "h2d", timeline: int = 0) -> Fence:
        """Several copies in one job (one IB of COPY packets, one fence)."""
        copies = list(copies)
        if not copies:
            raise InvalidArgument("no copies")
        parts = []
        total = 0
        for item in copies:
            try:
                src, dst, size = item
            except (TypeError, ValueError):
                raise InvalidArgument(f"bad copy {item!r}") from None
            self._check_u64(src, dst, size)
            if size == 0:
                continue
            parts.append(packets.copy(int(src), int(dst), int(size)))
            total += int(size)
        if not parts:
            parts.append(packets.nop(1))
        engine = ENGINE_FOR_COPY.get(direction)
        if engine is None:
            raise InvalidArgument(f"bad copy direction {direction!r}")
        touches = [t for src, dst, size in copies if size
                   for t in ((int(src), int(size), False), (int(dst), int(size), True))] \
            if self.shared else ()
        fence = self.device._submit(self, engine, b"".join(parts), wait, timeline, touches)
        self.stats["copies"] += len(copies)
        self.stats["copy_bytes"] += total
        return fence

    def submit_launch(self, kernel_id: int, grid, block, args, wait=(), *,
                      timeline: int = 0) -> Fence:
        """Run built-in kernel `kernel_id` on the compute engine; pointer args are VAs."""
        grid = self._dim3(grid, "grid")
        block = self._dim3(block, "block")
        args = list(args)
        if len(args) > self.limits.max_kernel_args:
            raise InvalidArgument(f"{len(args)} kernel arguments "
                                  f"(max {self.limits.max_kernel_args})")
        if not isinstance(kernel_id, (int, np.integer)) or not 0 <= kernel_id <= _U32:
            raise InvalidArgument(f"bad kernel id {kernel_id!r}")
        for a in args:
            if not isinstance(a, (int, np.integer)) or not -(1 << 63) <= a <= _U64:
                raise InvalidArgument(f"bad kernel argument {a!r}")
        ib = packets.launch(int(kernel_id), grid, block, [int(a) for a in args])
        touches = ()
        sig = kernels.BUILTIN_KERNELS.get(int(kernel_id))
        if self.shared and sig is not None:
            touches = [(int(a), 1, name in kernels.KERNEL_WRITTEN_ARGS)
                       for (name, kind), a in zip(sig.args, args) if kind == kernels.ARG_PTR]
        fence = self.device._submit(self, regs.ENGINE_COMPUTE, ib, wait, timeline, touches)
        self.stats["launches"] += 1
        return fence

    def submit_launch_code(self, object_va: int, entry_va: int, grid, block, dyn_shared: int,
                           params: bytes, wait=(), *, timeline: int = 0) -> Fence:
        """Launch the entry whose record is at `entry_va` of the code object at `object_va`
        (this context's VAs) on the compute engine, with `params` as its parameter buffer
        (written into this context's kernarg area when the job runs, kernarg.py). The KMD
        never reads the object: the SMs validate it (a CodeFault otherwise). The launch
        may touch any buffer: it waits for, and is waited for by, every job using a
        shared buffer of this context (spec PRIME-SYNC-2)."""
        self._check_u64(object_va, entry_va)
        grid = self._dim3(grid, "grid")
        block = self._dim3(block, "block")
        if isinstance(dyn_shared, bool) or not isinstance(dyn_shared, (int, np.integer)) \
                or not 0 <= dyn_shared <= _U32:
            raise InvalidArgument(f"bad dynamic shared memory size {dyn_shared!r}")
        if not isinstance(params, (bytes, bytearray, memoryview)):
            raise InvalidArgument("parameters must be bytes")
        params = bytes(params)
        if len(params) > isa.MAX_PARAM_SIZE:
            raise InvalidArgument(f"{len(params)} parameter bytes (at most {isa.MAX_PARAM_SIZE})")
        dev = self.device
        with dev.lock:
            self._check()
            if self.lost:  # before anything is allocated for it (spec CMD-LAUNCH-CODE-1)
                raise ContextLost(f"context {self.id} was lost after a GPU hang "
                                  f"({self.lost_reason}); destroy it")
            if self.kernargs is None:
                dev._reclaim_locked()
                self.kernargs = KernargArea(dev, self, dev.schedulers[regs.ENGINE_COMPUTE].hw_limit)
        job = CodeLaunch(int(object_va), int(entry_va), grid, block, int(dyn_shared), params)
        fence = dev._submit(self, regs.ENGINE_COMPUTE, job, wait, timeline, ALL_SHARED)
        self.stats["launches"] += 1
        self.stats["code_launches"] += 1
        return fence

    @staticmethod
    def _dim3(dim, what) -> tuple:
        if isinstance(dim, (int, np.integer)):
            dim = (dim,)
        dim = tuple(int(d) for d in dim)
        if not 1 <= len(dim) <= 3 or any(not 0 <= d <= _U32 for d in dim):
            raise InvalidArgument(f"bad {what} {dim!r}")
        return dim + (1,) * (3 - len(dim))
