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
from host.kmd.bo import BufferObject, GpuFault
from host.kmd.buddy import CONTIGUOUS, TOPDOWN, BuddyAllocator
from host.kmd.errors import (Busy, DeviceLost, InvalidAddress, InvalidArgument, InvalidContext,
                             KmdError, NoVmid, OutOfMemory)
from host.kmd.fence import Fence, FenceDriver
from host.kmd.ring import DEFAULT_RING_SIZE, Ring
from host.kmd.vm import VA_MAX_ALIGN, GpuVm
from spec import wire

log = logging.getLogger("pvgpu.kmd")

PAGE_SIZE = regs.PAGE_SIZE
ENGINE_FOR_JOB = {"copy": regs.ENGINE_COPY, "launch": regs.ENGINE_COMPUTE}
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
    __slots__ = ("fence", "context", "kind", "ib", "ib_block", "submitted")

    def __init__(self, fence, context, kind, ib, ib_block):
        self.fence = fence
        self.context = context
        self.kind = kind
        self.ib = ib
        self.ib_block = ib_block
        self.submitted = time.monotonic()


class KmdDevice:
    """The driver bound to one host.hw.gpu.Gpu."""

    def __init__(self, gpu, *, ring_size: int = DEFAULT_RING_SIZE, ib_pool_size: int | None = None,
                 timeout: float = DEFAULT_TIMEOUT):
        self.gpu = gpu
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

    def stop(self, timeout: float = 1.0) -> None:
        """Stop the engines; every fence still pending signals with an error."""
        if self.stopped:
            return
        self.stopped = True
        self.running = False
        self.gpu.stop(timeout)
        for fd in self.fences:
            self._retire(fd, fd.retire())  # whatever did complete, completes normally
            with self.lock:
                pending = list(fd.pending)
            self._retire(fd, pending, error=DEVICE_STOPPED)
        self.reclaim()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every fence emitted so far has signalled."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for fd in self.fences:
            last = fd.last_emitted()
            if last is not None:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not last.wait(left):
                    return False
        return True

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    # ------------------------------------------------------------------ system memory
    # ------------------------------------------------------------------ flow control
    RING_HEADROOM = 4096  # bytes: room for dozens of jobs' ring packets
    IB_HEADROOM = 64 << 10  # bytes of IB pool

    def has_headroom(self) -> bool:
        """Whether a submission now would find ring and IB space without waiting. Callers
        that must not block (the host's I/O loop) hold back new work until it is true."""
        with self.lock:
            return (all(r.free_bytes() >= min(self.RING_HEADROOM, r.size // 4) for r in self.rings)
                    and self.ib_pool.free_bytes() >= min(self.IB_HEADROOM, self.ib_pool.size // 4))

    def oldest_pending_fence(self) -> Fence | None:
        """The fence whose signal frees ring and IB space first (None when idle)."""
        with self.lock:
            pending = [fd.oldest_pending() for fd in self.fences]
        pending = [f for f in pending if f is not None]
        return min(pending, key=lambda f: f.seq) if pending else None

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
    def create_context(self, name: str = "") -> "Context":
        with self.lock:
            self._reclaim_locked()
            if not self._vmids:
                raise NoVmid("every VMID is in use")
            vmid = self._vmids.pop(0)
            try:
                vm = GpuVm(self.vram, self.mm,
                           invalidate=lambda: self.mmio.write(regs.REG_VM_INVALIDATE, vmid))
            except KmdError:
                self._vmids.insert(0, vmid)
                raise
            ctx = Context(self, self._next_ctx_id, vmid, vm, name)
            self._next_ctx_id += 1
            self.contexts[ctx.id] = ctx
            self.mmio.write(regs.REG_VM_PT_BASE(vmid), vm.root)
            self.mmio.write(regs.REG_VM_INVALIDATE, vmid)
            return ctx

    def destroy_context(self, ctx: "Context") -> None:
        """Tear a context down; memory is released once its in-flight work has signalled."""
        with self.lock:
            if ctx.device is not self:
                raise InvalidContext("context belongs to another device")
            if ctx.destroyed:
                return
            ctx.destroyed = True
            self.contexts.pop(ctx.id, None)
            bos = [bo for bo in ctx._bos.values()]
            ctx._bos.clear()
            for bo in bos:
                bo.freed = True
            ctx._sys_maps.clear()
            self._defer(ctx.pending_fences(), lambda: self._release_context(ctx, bos))
            self._reclaim_locked()

    def _release_context(self, ctx: "Context", bos: list) -> None:
        self.mmio.write(regs.REG_VM_PT_BASE(ctx.vmid), 0)
        self.mmio.write(regs.REG_VM_INVALIDATE, ctx.vmid)
        for bo in bos:
            if bo.put():
                self._release_vram(bo.blocks)
        ctx.vm.free()
        self._vmids.append(ctx.vmid)
        self._vmids.sort()
        self.stats["contexts_released"] += 1

    def _release_vram(self, blocks) -> None:
        """Give VRAM back to the allocator, cleared: free VRAM always reads as zero."""
        for b in blocks:
            self.vram.fill(b.offset, b.size, 0)
        self.mm.free_blocks(blocks)

    # ------------------------------------------------------------------ deferred frees
    def _defer(self, fences, fn) -> None:
        fences = [f for f in fences if not f.signaled]
        if fences:
            self._deferred.append((fences, fn))
        else:
            fn()

    def _reclaim_locked(self) -> int:
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
            return self._reclaim_locked()

    @property
    def deferred_frees(self) -> int:
        return len(self._deferred)

    # ------------------------------------------------------------------ submission
    def _ib_alloc(self, nbytes: int):
        """-> (phys, dedicated buddy block or None); waits for space while the lock is released."""
        if nbytes > self.ib_pool.size // 2:
            blocks = self.mm.alloc_blocks(_round_up(nbytes, PAGE_SIZE), flags=CONTIGUOUS | TOPDOWN)
            return min(b.offset for b in blocks), blocks
        deadline = time.monotonic() + self.timeout
        while True:
            phys = self.ib_pool.alloc(nbytes)
            if phys is not None:
                return phys, None
            if time.monotonic() >= deadline:
                raise Busy("indirect-buffer pool exhausted")
            self.stats["ib_pool_waits"] += 1
            self._cond.wait(0.001)

    def _ib_free(self, phys: int, blocks) -> None:
        if blocks is not None:
            self._release_vram(blocks)
        else:
            self.ib_pool.free(phys)

    def _submit(self, ctx: "Context", kind: str, ib: bytes, wait) -> Fence:
        engine = ENGINE_FOR_JOB[kind]
        # dependencies this device cannot express as a WAIT packet: wait on the CPU
        local = []
        for f in wait or ():
            if f is None:
                continue
            if not isinstance(f, Fence):
                raise InvalidArgument(f"not a fence: {f!r}")
            if f.signaled:
                continue
            if f.driver is None or f.driver.device is not self:
                if not f.wait(self.timeout):
                    raise Busy(f"timed out waiting for {f!r}")
                continue
            local.append(f)
        with self.lock:
            if ctx.device is not self or ctx.destroyed:
                raise InvalidContext("context was destroyed or belongs to another device")
            if self.stopped:
                raise DeviceLost("device stopped")
            self._reclaim_locked()
            phys, ib_blocks = self._ib_alloc(len(ib))
            try:
                self.vram.write(phys, ib)
                waits = {}
                for f in local:
                    if f.engine != engine and not f.signaled and f.seq > waits.get(f.driver, 0):
                        waits[f.driver] = f.seq
                ring = self.rings[engine]
                ring.alloc(5 * len(waits) + 5 + fence_mod.FENCE_DW)
                # the waits above released the lock: the context may be gone by now
                if ctx.destroyed or self.stopped:
                    ring.undo()
                    raise InvalidContext("context destroyed during submission")
            except BaseException:
                self._ib_free(phys, ib_blocks)
                raise
            for drv, seq in waits.items():
                ring.write(packets.wait(drv.wb_addr, seq))
            ring.write(packets.indirect_buffer(phys, len(ib) // 4, ctx.vmid))
            fence = self.fences[engine].emit(ring)
            self._jobs[fence] = _Job(fence, ctx, kind, phys, ib_blocks)
            ring.commit()
            ctx._last[engine] = fence
            ctx.last_fence = fence
            ctx.stats["jobs_submitted"] += 1
            self.stats["jobs_submitted"] += 1
            if waits:
                self.stats["cross_engine_waits"] += len(waits)
            return fence

    def _retire(self, fd: FenceDriver, done: list, error=None) -> None:
        """Bookkeeping for completed fences, then signal them (outside the lock)."""
        if not done:
            return
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
            self._retire(fd, fd.retire(irq.data))
        elif irq.source == regs.IRQ_PAGE_FAULT:
            self.stats["irq_page_fault"] += 1
            self._job_error(fd, irq.vmid, GpuFault(irq.vmid, irq.address, irq.access, irq.engine))
        elif irq.source == regs.IRQ_ILLEGAL_PACKET:
            self.stats["irq_illegal_packet"] += 1
            self._job_error(fd, irq.vmid,
                            f"illegal packet {irq.data:#010x} at offset {irq.address:#x} "
                            f"(vmid {irq.vmid}, engine {regs.ENGINE_NAMES.get(irq.engine)})")
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
        if not target.set_error(error):
            log.info("gpu%d: second error for %r: %s", self.index, target, error)


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
        self._last = [None] * regs.NUM_ENGINES  # last fence submitted per engine
        self.last_fence = None  # the most recent fence of any engine
        self.faults = []  # every error attached to one of this context's jobs
        self.stats = collections.Counter()

    def __repr__(self) -> str:
        return f"Context(id={self.id}, vmid={self.vmid}, name={self.name!r})"

    def _check(self) -> None:
        if self.destroyed:
            raise InvalidContext(f"context {self.id} was destroyed")

    def pending_fences(self) -> list:
        """This context's fences that may still be running (the last one of each engine)."""
        return [f for f in self._last if f is not None and not f.signaled]

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
    def alloc(self, size: int) -> BufferObject:
        """Allocate VRAM and map it READ|WRITE at a fresh VA (bo.va); raises OutOfMemory.

        The memory reads as zero: the driver clears VRAM when it is freed (see
        KmdDevice._release_vram), so one guest never sees another's data."""
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size <= 0:
            raise InvalidArgument(f"bad allocation size {size!r}")
        size = int(size)
        dev = self.device
        if size > dev.vram_size:
            raise OutOfMemory(f"{size} bytes is more than the device's VRAM")
        psize = _round_up(size, PAGE_SIZE)
        with dev.lock:
            self._check()
            dev._reclaim_locked()
            blocks = dev.mm.alloc_blocks(psize)
            try:
                align = min(VA_MAX_ALIGN, 1 << (psize.bit_length() - 1))
                va = self.vm.va.alloc(psize, align)
                bo = BufferObject(psize, blocks, self, va)
                try:
                    self.vm.map(va, bo.extents, regs.PTE_READ | regs.PTE_WRITE)
                except BaseException:
                    self.vm.va.free(va)
                    raise
            except BaseException:
                dev.mm.free_blocks(blocks)
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
            self.stats["bytes_allocated"] -= bo.size
            self.stats["bos_freed"] += 1
            if bo.put():
                dev._defer(self.pending_fences(), lambda: self._release_bo(bo))

    def _release_bo(self, bo: BufferObject) -> None:
        if not self.vm.freed:
            self.vm.unmap(bo.va)
            self.vm.va.free(bo.va)
        self.device._release_vram(bo.blocks)

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
            in_user = va < wire.VA_USER_LIMIT and va + psize > wire.VA_USER_BASE
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

    # ------------------------------------------------------------------ submission
    @staticmethod
    def _check_u64(*values) -> None:
        for v in values:
            if not isinstance(v, (int, np.integer)) or not 0 <= v <= _U64:
                raise InvalidArgument(f"bad address or size {v!r}")

    def submit_copy(self, src_va: int, dst_va: int, size: int, wait=()) -> Fence:
        """Copy `size` bytes from src_va to dst_va (this context's VAs) on the copy engine."""
        return self.submit_copies([(src_va, dst_va, size)], wait)

    def submit_copies(self, copies, wait=()) -> Fence:
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
        fence = self.device._submit(self, "copy", b"".join(parts), wait)
        self.stats["copies"] += len(copies)
        self.stats["copy_bytes"] += total
        return fence

    def submit_launch(self, kernel_id: int, grid, block, args, wait=()) -> Fence:
        """Run built-in kernel `kernel_id` on the compute engine; pointer args are VAs."""
        grid = self._dim3(grid, "grid")
        block = self._dim3(block, "block")
        args = list(args)
        if len(args) > wire.MAX_KERNEL_ARGS:
            raise InvalidArgument(f"{len(args)} kernel arguments (max {wire.MAX_KERNEL_ARGS})")
        if not isinstance(kernel_id, (int, np.integer)) or not 0 <= kernel_id <= _U32:
            raise InvalidArgument(f"bad kernel id {kernel_id!r}")
        for a in args:
            if not isinstance(a, (int, np.integer)) or not -(1 << 63) <= a <= _U64:
                raise InvalidArgument(f"bad kernel argument {a!r}")
        ib = packets.launch(int(kernel_id), grid, block, [int(a) for a in args])
        fence = self.device._submit(self, "launch", ib, wait)
        self.stats["launches"] += 1
        return fence

    @staticmethod
    def _dim3(dim, what) -> tuple:
        if isinstance(dim, (int, np.integer)):
            dim = (dim,)
        dim = tuple(int(d) for d in dim)
        if not 1 <= len(dim) <= 3 or any(not 0 <= d <= _U32 for d in dim):
            raise InvalidArgument(f"bad {what} {dim!r}")
        return dim + (1,) * (3 - len(dim))
