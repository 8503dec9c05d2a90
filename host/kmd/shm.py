"""Shared device memory: Gdev's gshmget / gshmat / gshmdt / gshmctl(RMID) in the KMD.

A SharedSegment is VRAM that several contexts map at once — contexts of one client or of
several (guest sessions) — so that one context's kernel writes what another's reads, with
no copy through the host. It is a buffer object that no context owns: the buddy blocks
(and their physically contiguous extents) belong to the segment, and each attachment
maps those same physical pages at a fresh VA of the attaching context's GpuVm.

Naming (pvgpu.host.kmd.device.KmdDevice.shm, one ShmManager per device):
  - get(key, size, namespace=client): the first call with a key allocates the segment;
    later calls with the same key *in the same namespace* return it (a size that does not
    match, after page rounding, is an error; size 0 only looks up). Keys are private to
    their namespace (the backend passes the guest session), so two clients that pick the
    same key get two segments. Key None always allocates a new segment that no key names
    (the backend passes it for the wire's SHM_KEY_PRIVATE, IPC_PRIVATE).
  - export(seg, client) -> (handle_id, token): a capability, like an exported event or a
    dma-buf fd. Only the creator exports; the token is 64 bits from `secrets`.
    import_(handle_id, token, client) grants `client` the right to attach the segment.
  - Context.attach_shared(seg) is allowed to the creator's contexts and to those of
    clients that imported it (`seg.allowed`), once per context, while the segment is not
    removed.

Lifetime and reference counts (the rules of SysV shm and Gdev):
  - `refcount` = 1 while the segment is *alive* (not removed, or still attached) + 1 per
    mapping whose PTEs are still in some VM. `attachments` are the logical attachments
    (context -> VA).
  - detach (Context.detach_shared) ends the logical attachment at once; the unmap (PTEs
    cleared, TLB invalidated by GpuVm.unmap, VA freed) and the reference drop are deferred
    behind the context's fences pending at that moment, like Context.free(bo).
  - remove (RMID, creator only) marks the segment: no new attachment, its key is free for
    a new segment at once, its exports are withdrawn. When it is removed and no context
    is attached any more the segment is *dead*: its size leaves the creator's vGPU memory
    account (as Context.free does for a BO) and the base reference is dropped.
  - When the last reference goes (dead, and every deferred unmap done) the VRAM is
    released — cleared, as all freed VRAM (KmdDevice._release_vram).
  - destroy_context detaches every segment of the context (the VM goes away as a whole);
    release_client(client) removes every segment the client created and revokes what it
    imported — the backend calls it when a session (or its device) is reset/reclaimed.

Quota: the segment counts against the creator's vGPU memory share (the same
`_vgpu_mem` account as Context.alloc, spec SCHED-VGPU-1) from get() until it is dead,
whoever else is still attached.

Locking: everything runs under the device lock (an RLock), like the rest of the KMD;
deferred work runs from KmdDevice._reclaim_locked, never on an interrupt thread.
There is no implicit synchronisation between contexts that share a segment (as in
Gdev): ordering is the clients' business (events).
"""

from __future__ import annotations

import hmac
import itertools
import secrets

import numpy as np

from pvgpu.host.hw import regs
from pvgpu.host.kmd.bo import blocks_to_extents
from pvgpu.host.kmd.errors import (InvalidArgument, InvalidSegment, OutOfMemory, PermissionDenied)
from pvgpu.host.kmd.vm import VA_MAX_ALIGN

PAGE_SIZE = regs.PAGE_SIZE
_U64 = (1 << 64) - 1


def _round_up(x: int, a: int) -> int:
    return -(-x // a) * a


class SharedSegment:
    """VRAM shared by the contexts that attach it (a BO that no context owns)."""

    __slots__ = ("id", "key", "namespace", "size", "blocks", "extents", "vgpu", "owner",
                 "allowed", "attachments", "refcount", "removed", "dead", "released",
                 "device", "export", "__weakref__")

    def __init__(self, device, seg_id: int, key: int, namespace, size: int, blocks, vgpu: str):
        self.device = device
        self.id = seg_id
        self.key = key
        self.namespace = namespace  # the creator (client) whose key table names it
        self.owner = namespace
        self.size = size  # page rounded; == the blocks' total
        self.blocks = blocks
        self.extents = blocks_to_extents(blocks)
        self.vgpu = vgpu  # name of the vGPU whose memory share it counts against
        self.allowed = {namespace}  # clients that may attach it
        self.attachments = {}  # Context -> va (logical attachments)
        self.refcount = 1  # alive + one per mapping not yet unmapped
        self.removed = False
        self.dead = False  # removed and detached by all: left the quota
        self.released = False  # VRAM given back
        self.export = None  # (handle_id, token) of its live export

    @property
    def nattach(self) -> int:
        return len(self.attachments)

    @property
    def phys(self) -> int:
        return self.extents[0][0]

    def get(self) -> "SharedSegment":
        assert self.refcount > 0, "get() on a released segment"
        self.refcount += 1
        return self

    def put(self) -> bool:
        """Drop a reference; True when it was the last one."""
        assert self.refcount > 0, "put() on a released segment"
        self.refcount -= 1
        return self.refcount == 0

    def __repr__(self) -> str:
        state = "released" if self.released else "removed" if self.removed else "live"
        key = "private" if self.key is None else f"{self.key:#x}"
        return (f"SharedSegment(id={self.id}, key={key}, size={self.size:#x}, "
                f"nattach={self.nattach}, refcount={self.refcount}, {state})")


class ShmManager:
    """The shared segments of one KmdDevice (gdev_shm in Gdev's kernel driver)."""

    def __init__(self, device, default_vgpu):
        self.device = device
        self.default_vgpu = default_vgpu  # whose share a segment of no given vGPU counts in
        self.segments = {}  # id -> SharedSegment, until its VRAM is released
        self._keys = {}  # (namespace, key) -> SharedSegment (alive, not removed)
        self._exports = {}  # handle_id -> SharedSegment
        self._ids = itertools.count(1)
        self._handles = itertools.count(1)

    # ------------------------------------------------------------------ naming
    def get(self, key: int | None, size: int, *, namespace=None, vgpu=None) -> tuple:
        """gshmget: -> (segment, created); key None: a new private segment. See the module
        docstring."""
        for what, v in (("key", key), ("size", size)):
            if what == "key" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v <= _U64:
                raise InvalidArgument(f"bad shared segment {what} {v!r}")
        key, size = None if key is None else int(key), int(size)
        dev = self.device
        if size > dev.vram_size:
            raise OutOfMemory(f"{size} bytes is more than the device's VRAM")
        psize = _round_up(size, PAGE_SIZE)
        shares = dev.add_vgpu(vgpu if vgpu is not None else self.default_vgpu)
        with dev.lock:
            dev._reclaim_locked()
            if key is not None:
                seg = self._keys.get((namespace, key))
                if seg is not None:
                    if size and psize != seg.size:
                        raise InvalidArgument(f"shared segment with key {key:#x} has "
                                              f"{seg.size} bytes, not {psize}")
                    return seg, False
            if size == 0:
                raise InvalidSegment("a private segment needs a size" if key is None else
                                     f"no shared segment with key {key:#x} (size 0 only "
                                     "looks one up)")
            used, limit = dev._vgpu_mem[shares.name], dev.vgpu_mem_limit(shares)
            if used + psize > limit:
                raise OutOfMemory(f"vGPU {shares.name!r} memory share exhausted: {used} of "
                                  f"{limit} bytes in use, {psize} more requested")
            # may evict contexts' BOs (a segment itself is never evicted); the quota is
            # re-checked because _alloc_vram may wait with the lock released
            blocks = dev._alloc_vram(psize, None)
            if dev._vgpu_mem[shares.name] + psize > limit:
                dev.mm.free_blocks(blocks)
                raise OutOfMemory(f"vGPU {shares.name!r} memory share exhausted")
            seg = SharedSegment(dev, next(self._ids), key, namespace, psize, blocks, shares.name)
            self.segments[seg.id] = seg
            if key is not None:
                self._keys[(namespace, key)] = seg
            dev._vgpu_mem[shares.name] += psize
            dev.stats["shm_created"] += 1
            return seg, True

    def remove(self, seg: SharedSegment, client=None) -> None:
        """gshmctl(IPC_RMID): only the creator; idempotent. The memory goes once every
        context has detached (and their work on it has finished)."""
        dev = self.device
        with dev.lock:
            self._check(seg)
            if client is not seg.owner:
                raise PermissionDenied(f"only the creator of shared segment {seg.id} may "
                                       "remove it")
            self._remove_locked(seg)

    def _remove_locked(self, seg: SharedSegment) -> None:
        if seg.removed:
            return
        seg.removed = True
        if self._keys.get((seg.namespace, seg.key)) is seg:
            del self._keys[(seg.namespace, seg.key)]
        self._withdraw(seg)
        self.device.stats["shm_removed"] += 1
        self._maybe_dead(seg)

    def _maybe_dead(self, seg: SharedSegment) -> None:
        if seg.removed and not seg.attachments and not seg.dead:
            seg.dead = True
            self.device._vgpu_mem[seg.vgpu] -= seg.size
            self._put(seg)

    def _put(self, seg: SharedSegment) -> None:
        if seg.put():
            seg.released = True
            self.segments.pop(seg.id, None)
            self.device._release_vram(seg.blocks)
            self.device.stats["shm_released"] += 1

    def _check(self, seg) -> None:
        if not isinstance(seg, SharedSegment) or seg.device is not self.device:
            raise InvalidArgument(f"{seg!r} is not a shared segment of this device")
        if seg.released:
            raise InvalidSegment(f"shared segment {seg.id} no longer exists")

    # ------------------------------------------------------------------ capabilities
    def export(self, seg: SharedSegment, client=None) -> tuple:
        """-> (handle_id, token) that lets another client import `seg` (creator only; the
        same handle while the export lives)."""
        with self.device.lock:
            self._check(seg)
            if client is not seg.owner:
                raise PermissionDenied(f"only the creator of shared segment {seg.id} may "
                                       "export it")
            if seg.removed:
                raise InvalidSegment(f"shared segment {seg.id} was removed")
            if seg.export is None:
                handle = next(self._handles)
                seg.export = (handle, secrets.randbits(64) or 1)
                self._exports[handle] = seg
            return seg.export

    def import_(self, handle_id: int, token: int, client=None) -> SharedSegment:
        """Grant `client` the segment exported as (handle_id, token). An unknown or
        withdrawn handle and a wrong token are the same PermissionDenied."""
        with self.device.lock:
            seg = self._exports.get(handle_id)
            ok = seg is not None and hmac.compare_digest(
                seg.export[1].to_bytes(8, "little"), (int(token) & _U64).to_bytes(8, "little"))
            if not ok:
                raise PermissionDenied(f"no shared segment export with handle {handle_id} "
                                       "and this token")
            seg.allowed.add(client)
            return seg

    def _withdraw(self, seg: SharedSegment) -> None:
        if seg.export is not None:
            self._exports.pop(seg.export[0], None)
            seg.export = None

    def release_client(self, client) -> None:
        """A client (session) is gone: remove the segments it created (freed once the
        others detach) and revoke its imports. Its contexts detach when destroyed."""
        with self.device.lock:
            for seg in list(self.segments.values()):
                if seg.owner is client:
                    self._remove_locked(seg)
                if client is not seg.owner:
                    seg.allowed.discard(client)

    # ------------------------------------------------------------------ attach / detach
    def attach(self, ctx, seg: SharedSegment, readonly: bool = False) -> int:
        """gshmat: map the segment's pages at a fresh VA of ctx; -> the VA."""
        dev = self.device
        with dev.lock:
            ctx._check()
            self._check(seg)
            dev._reclaim_locked()
            if seg.removed:
                raise InvalidSegment(f"shared segment {seg.id} was removed: it takes no "
                                     "new attachments")
            if ctx.client not in seg.allowed:
                raise PermissionDenied(f"context {ctx.id} may not attach shared segment "
                                       f"{seg.id}: its client neither created nor imported it")
            if seg in ctx._shm:
                raise InvalidArgument(f"shared segment {seg.id} is already attached to "
                                      f"context {ctx.id} at {ctx._shm[seg]:#x}")
            align = min(VA_MAX_ALIGN, 1 << (seg.size.bit_length() - 1))
            va = ctx.vm.va.alloc(seg.size, align)
            flags = regs.PTE_READ | (0 if readonly else regs.PTE_WRITE)
            try:
                ctx.vm.map(va, seg.extents, flags)
            except BaseException:
                ctx.vm.va.free(va)
                raise
            seg.get()
            seg.attachments[ctx] = va
            ctx._shm[seg] = va
            ctx.stats["shm_attached"] += 1
            return va

    def detach(self, ctx, seg: SharedSegment) -> None:
        """gshmdt: end ctx's attachment; the PTEs go once ctx's pending work is done."""
        dev = self.device
        with dev.lock:
            ctx._check()
            va = ctx._shm.pop(seg, None) if isinstance(seg, SharedSegment) else None
            if va is None:
                raise InvalidSegment(f"{seg!r} is not attached to context {ctx.id}")
            del seg.attachments[ctx]
            ctx.stats["shm_detached"] += 1
            self._maybe_dead(seg)

            def unmap():
                if not ctx.vm.freed:
                    ctx.vm.unmap(va)  # clears the PTEs and invalidates the VMID's TLB
                    ctx.vm.va.free(va)
                self._put(seg)
            dev._defer(ctx.pending_fences(), unmap)

    def detach_all_locked(self, ctx) -> list:
        """destroy_context: end every attachment of ctx now; -> the segments whose
        mapping references drop_mappings() must put once the VM is gone."""
        segs = list(ctx._shm)
        ctx._shm.clear()
        for seg in segs:
            del seg.attachments[ctx]
            self._maybe_dead(seg)
        return segs

    def drop_mappings(self, segs) -> None:
        for seg in segs:
            self._put(seg)

    # ------------------------------------------------------------------ introspection
    def stats(self) -> dict:
        with self.device.lock:
            live = [s for s in self.segments.values() if not s.dead]
            return {"segments": len(live), "bytes": sum(s.size for s in live),
                    "attachments": sum(s.nattach for s in live),
                    "removed_pending": sum(1 for s in self.segments.values() if s.removed)}
