"""DRM PRIME in the KMD: buffer objects shared as dma-bufs between devices and clients.

Exporter (PrimeExporter, one per KmdDevice; the dma_buf_ops of its buffer objects):
  export(ctx, bo)       drm_gem_prime_export: one DmaBuf per BO (DmaBufCache), holding a
                        BO reference; the BO gets its reservation object (bo.resv) now.
  attach                decides how the importer reaches the memory: its own VRAM (the
                        exporter imports its own dma-buf), peer-to-peer through the
                        exporter's PCIe BAR (the importer allows it and pci_p2pdma_distance
                        says the fabric routes it), or else system memory: the BO is
                        migrated there and pinned while such an attachment lives, and both
                        devices use it there (the bounce path).
  map                   where the memory is now: VRAM extents, BAR bus addresses (bar0 +
                        VRAM address) or the system copy's bus address. It takes no lock:
                        a move is announced first (below), so a map that races with one
                        is retried by DmaBufAttachment.map().
  release               drops the BO reference (its memory goes with the last one).

Moves of a shared BO (eviction, restore, migration to system memory) follow the dynamic
dma-buf protocol: under RESV_LOCK the BO must be idle (no unsignalled fence in its
reservation object), and a move fence is added at KERNEL usage; the importers are told
(move_notify: their mapping is stale); the memory is copied and the exporter's own PTEs
rewritten; then the move fence signals. A job submitted meanwhile depends on the move
fence, and an importer re-maps stale attachments in run_job, after its dependencies
signalled and before the hardware sees the job (amdgpu re-validates in its CS ioctl).

Importer (PrimeImport, one per dma-buf mapped into a context; drm_gem_prime_import):
the attachment's pages are mapped at a fresh VA of the context, READ|WRITE, with
PTE_PEER for BAR addresses and PTE_SYSTEM for system memory.

Implicit synchronisation: a job names what it touches as (va, size, write) ranges (the
copy's source and destination, a kernel's pointer arguments, pvgpu.spec.kernels.KERNEL_WRITTEN_ARGS
written). For every range inside a shared BO or an import, the job waits for the
reservation object's implicit dependencies and adds its finished fence (WRITE or READ),
all under RESV_LOCK, so a reader on one device waits for the writers on the other. A
code launch can touch anything its context maps, so it names ALL_SHARED instead: it reads
and writes every shared buffer of its context (spec PRIME-SYNC-2), like a DRM submission
whose BO list names all of them.
"""

from __future__ import annotations

import collections
import threading
import time

from pvgpu.host.hw import regs
from pvgpu.host.hw.pcie import P2PDMA_MAP_BUS_ADDR, P2PDMA_MAP_THRU_HOST_BRIDGE
from pvgpu.host.kmd import wouldblock
from pvgpu.host.kmd.dmabuf import SG_LOCAL, SG_PEER, SG_SYSTEM, DmaBuf, DmaBufCache, SgTable
from pvgpu.host.kmd.errors import InvalidArgument, InvalidContext, LimitReached, OutOfMemory
from pvgpu.host.kmd.fence import Fence
from pvgpu.host.kmd.resv import (DMA_RESV_USAGE_KERNEL, DMA_RESV_USAGE_READ, DMA_RESV_USAGE_WRITE,
                           RESV_LOCK, DmaResv)

P2P_ALLOWED = (P2PDMA_MAP_BUS_ADDR, P2PDMA_MAP_THRU_HOST_BRIDGE)
ALL_SHARED = "every shared buffer of the context"  # the `touches` of a code launch
_PAGE = regs.PAGE_SIZE


def _round_up(n: int, a: int) -> int:
    return -(-n // a) * a


class PrimeImport:
    """A dma-buf mapped into an importing context at `va` (`size` bytes)."""

    __slots__ = ("ctx", "attachment", "va", "size", "kind", "stale", "freed")

    def __init__(self, ctx, attachment, va: int, size: int, kind: str):
        self.ctx = ctx
        self.attachment = attachment
        self.va = va
        self.size = size
        self.kind = kind  # SG_LOCAL / SG_PEER / SG_SYSTEM of the current mapping
        self.stale = False  # the exporter moved the buffer: map again before the next job
        self.freed = False

    @property
    def dmabuf(self) -> DmaBuf:
        return self.attachment.dmabuf

    @property
    def resv(self) -> DmaResv:
        return self.attachment.dmabuf.resv

    def contains(self, va: int, size: int = 1) -> bool:
        return self.va <= va and va + size <= self.va + self.size

    def __repr__(self) -> str:
        return (f"PrimeImport(ctx={self.ctx.id}, va={self.va:#x}, size={self.size:#x}, "
                f"{self.kind}{', stale' if self.stale else ''})")


class PrimeExporter:
    """The dma_buf_ops of one device's buffer objects, and its import side."""

    def __init__(self, device):
        self.dev = device
        self.cache = DmaBufCache()
        # detach and release come from importers, often under the importer's device lock:
        # they never take this device's lock (two devices importing from each other would
        # deadlock). Pins change under _pins; released BOs wait in _released for reap().
        self._pins = threading.Lock()
        self._released = collections.deque()
        self.stats = {"exports": 0, "imports": 0, "peer_maps": 0, "system_maps": 0,
                      "local_maps": 0, "migrations": 0, "moves_notified": 0,
                      "moves_skipped_busy": 0, "remaps": 0}

    # ------------------------------------------------------------------ fabric
    def p2p_map_type(self, importer) -> int:
        """pci_p2pdma_distance between this device (the provider) and `importer`."""
        return self.dev.gpu.pci.p2pdma_distance(importer.gpu.pci)[0]

    # ------------------------------------------------------------------ export
    def export(self, ctx, bo) -> DmaBuf:
        """The BO's dma-buf (created on first export, with a new reference after)."""
        dev = self.dev
        with dev.lock:
            ctx._check()
            if ctx._bos.get(getattr(bo, "va", None)) is not bo:
                raise InvalidArgument(f"{bo!r} is not a live buffer object of context {ctx.id}")

            def create():
                bo.get()
                if bo.resv is None:
                    bo.resv = DmaResv()
                    for f in ctx.pending_fences():  # earlier work may still write it
                        bo.resv.add_fence(f, DMA_RESV_USAGE_WRITE)
                bo.dmabuf = DmaBuf(self, bo, bo.size, bo.resv, exporter=dev)
                ctx.shared += 1
                self.stats["exports"] += 1
                return bo.dmabuf
            return self.cache.export(bo, create)

    # ------------------------------------------------------------------ dma_buf_ops
    def attach(self, dmabuf, attachment) -> None:
        importer = attachment.importer
        if importer is self.dev:
            attachment.priv = SG_LOCAL
        elif attachment.peer2peer and self.p2p_map_type(importer) in P2P_ALLOWED:
            attachment.priv = SG_PEER
        else:
            self._pin_system(dmabuf.priv)
            attachment.priv = SG_SYSTEM

    def detach(self, dmabuf, attachment) -> None:
        if attachment.priv == SG_SYSTEM:
            with self._pins:
                dmabuf.priv.sys_pins -= 1

    def map(self, attachment) -> SgTable:
        bo = attachment.dmabuf.priv
        sysmem, extents = bo.sysmem, bo.extents  # no lock: see the module comment
        if sysmem is not None:
            self.stats["system_maps"] += 1
            return SgTable([(sysmem.bus_addr, bo.size)], SG_SYSTEM, bo.size)
        if attachment.priv == SG_LOCAL:
            self.stats["local_maps"] += 1
            return SgTable(list(extents), SG_LOCAL, bo.size)
        if attachment.priv == SG_PEER:
            self.stats["peer_maps"] += 1
            bar = self.dev.gpu.pci.bar0
            return SgTable([(bar + phys, n) for phys, n in extents], SG_PEER, bo.size)
        raise InvalidArgument(f"{bo!r} left system memory while pinned there")

    def unmap(self, attachment, sgt) -> None:
        pass

    def release(self, dmabuf) -> None:
        self._released.append(dmabuf.priv)
        if self.dev.lock.acquire(blocking=False):
            try:
                self.reap()
            finally:
                self.dev.lock.release()
        else:  # the submission context reaps it once the lock is free
            self.dev.submit_wq.call(self._reap)

    def _reap(self) -> None:
        with self.dev.lock:
            self.reap()

    def reap(self) -> None:
        """(lock held) Drop the references of released dma-bufs; the BO's memory goes once
        its last user is done with it."""
        dev = self.dev
        while self._released:
            bo = self._released.popleft()
            bo.dmabuf = None
            ctx = bo.context
            if ctx is not None and ctx._bos.get(bo.va) is bo:
                ctx.shared -= 1
            if bo.put():
                fences = bo.resv.fences() if bo.resv is not None else []
                dev._defer(fences, lambda bo=bo: dev._release_bo_memory(bo))

    # ------------------------------------------------------------------ moves
    def begin_move(self, bo) -> Fence | None:
        """Before moving `bo` (lock held): -> the fence of the move, to signal when it is
        done, or None if `bo` is shared and a job still uses it (no move now). A shared
        BO's move fence goes into its reservation object at KERNEL usage, and its
        importers are told (move_notify)."""
        fence = Fence(-1, 0)
        if bo.resv is not None:
            with RESV_LOCK:
                if not bo.resv.test_signaled():
                    self.stats["moves_skipped_busy"] += 1
                    return None
                bo.resv.add_fence(fence, DMA_RESV_USAGE_KERNEL)
        if bo.dmabuf is not None:
            bo.dmabuf.move_notify()
            self.stats["moves_notified"] += 1
        return fence

    def _pin_system(self, bo) -> None:
        """Migrate `bo` to system memory (if it is not there) and keep it there while the
        attachment lives; while it is busy it waits (host/kmd/wouldblock.py: up to the
        device timeout, lock released; WouldBlock in non-blocking mode)."""
        dev = self.dev
        deadline = time.monotonic() + dev.timeout
        with dev.lock:
            with self._pins:
                bo.sys_pins += 1
            try:
                while bo.sysmem is None:
                    if bo.refcount <= 0:
                        raise InvalidContext("the buffer object was released")
                    if dev.evicted_bytes + bo.size > dev.max_evicted_bytes:
                        raise OutOfMemory(f"migrating {bo.size} bytes to system memory would "
                                          f"exceed the device's {dev.max_evicted_bytes} bytes "
                                          "for evicted and migrated buffers (--max-evicted)")
                    ctx = bo.context
                    busy = ctx is not None and not ctx.destroyed and dev._ctx_on_gpu(ctx)
                    if not busy and dev._evict_bo(bo):
                        self.stats["migrations"] += 1
                        break
                    # its context's jobs, or the users of the shared buffer (begin_move)
                    fences = dev._busy_fences(ctx) if busy else \
                        (bo.resv.fences() if bo.resv is not None else [])
                    wouldblock.wait(dev, fences, deadline, OutOfMemory(
                        "the shared buffer object stayed busy: it could not be migrated to "
                        "system memory"))
            except BaseException:
                with self._pins:
                    bo.sys_pins -= 1
                raise

    # ------------------------------------------------------------------ import
    def import_(self, ctx, dmabuf, peer2peer: bool = True) -> PrimeImport:
        """Attach `dmabuf` for this device and map it at a fresh VA of ctx."""
        dev = self.dev
        if not isinstance(dmabuf, DmaBuf):
            raise InvalidArgument(f"not a dma-buf: {dmabuf!r}")
        with dev.lock:
            if len(ctx._imports) >= ctx.limits.max_imports:
                raise LimitReached(f"{ctx.limits.max_imports} imports live in context {ctx.id}")
        att = dmabuf.attach(dev, self, peer2peer=peer2peer)  # no lock: it may migrate
        try:
            with dev.lock:
                ctx._check()
                size = _round_up(dmabuf.size, _PAGE)
                align = min(1 << 21, 1 << (size.bit_length() - 1))
                va = ctx.vm.va.alloc(size, align)
                imp = PrimeImport(ctx, att, va, size, SG_LOCAL)
                att.importer_priv = imp
                try:
                    self._map_import(imp, att.map())
                except BaseException:
                    ctx.vm.va.free(va)
                    raise
                ctx._imports[va] = imp
                ctx.shared += 1
                ctx.stats["imports"] += 1
                self.stats["imports"] += 1
                return imp
        except BaseException:
            att.detach()
            raise

    def _map_import(self, imp: PrimeImport, sgt: SgTable) -> None:
        flags = regs.PTE_READ | regs.PTE_WRITE
        if sgt.kind == SG_PEER:
            flags |= regs.PTE_PEER
        elif sgt.kind == SG_SYSTEM:
            flags |= regs.PTE_SYSTEM
        segments = [(addr, _round_up(n, _PAGE)) for addr, n in sgt.segments]
        imp.ctx.vm.map(imp.va, segments, flags)
        imp.kind = sgt.kind

    def move_notify(self, attachment) -> None:
        """dma_buf_attach_ops.move_notify, from the exporter: map again before next use."""
        imp = attachment.importer_priv
        if imp is not None:
            imp.stale = True
            imp.ctx.stale_imports = True

    def remap_stale(self, ctx) -> None:
        """run_job (lock held): re-map the context's stale imports before its job runs."""
        ctx.stale_imports = False
        for imp in list(ctx._imports.values()):
            if imp.stale:
                imp.stale = False
                sgt = imp.attachment.map()
                ctx.vm.unmap(imp.va)
                self._map_import(imp, sgt)
                self.stats["remaps"] += 1
        self.dev.mmio.write(regs.REG_VM_INVALIDATE, ctx.vmid)

    def free_import(self, ctx, imp: PrimeImport) -> None:
        """Unmap an import once ctx's pending work is done, then detach."""
        dev = self.dev
        with dev.lock:
            ctx._check()
            if ctx._imports.get(getattr(imp, "va", None)) is not imp:
                raise InvalidArgument(f"{imp!r} is not an import of context {ctx.id}")
            del ctx._imports[imp.va]
            ctx.shared -= 1
            imp.freed = True

            def release():
                if not ctx.vm.freed:
                    ctx.vm.unmap(imp.va)
                    ctx.vm.va.free(imp.va)
                imp.attachment.detach()
            dev._defer(ctx.pending_fences(), release)

    # ------------------------------------------------------------------ implicit sync
    @staticmethod
    def touched(ctx, touches) -> list:
        """-> [(resv, write)] of the shared buffers the ranges (va, size, write) touch."""
        out = {}
        for va, size, write in touches:
            for addr in (va, va + max(size, 1) - 1):
                m = ctx.vm.mapping_at(addr)
                if m is None:
                    continue
                obj = ctx._bos.get(m[0]) or ctx._imports.get(m[0])
                resv = getattr(obj, "resv", None)
                if resv is not None:
                    out[resv] = out.get(resv, False) or bool(write)
        return list(out.items())

    @staticmethod
    def shared_resvs(ctx) -> list:
        """-> [(resv, True)] of every shared buffer of ctx: its exported BOs and imports."""
        out = {}
        for obj in list(ctx._bos.values()) + list(ctx._imports.values()):
            resv = getattr(obj, "resv", None)
            if resv is not None:
                out[resv] = True
        return list(out.items())

    @staticmethod
    def add_job_fence(resvs, fence) -> None:
        for resv, write in resvs:
            resv.add_fence(fence, DMA_RESV_USAGE_WRITE if write else DMA_RESV_USAGE_READ)

    @staticmethod
    def implicit_deps(resvs) -> list:
        deps = []
        for resv, write in resvs:
            deps += resv.implicit_deps(write)
        return deps

    def snapshot(self) -> dict:
        """GET_STATS `prime`: exports, imports by placement, migrations and moves."""
        return dict(self.stats, dmabufs=len(self.cache))

