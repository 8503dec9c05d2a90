"""DMA-BUF sharing of device memory between drivers (Linux dma-buf, drivers/dma-buf/).

A DmaBuf is one exported buffer. The exporting driver creates it with an ops table and
its private data (the buffer object) and keeps the buffer's reservation object in it —
the same DmaResv, not a copy, so implicit synchronisation spans every device that
shares the buffer. An importing driver attaches (dma_buf_dynamic_attach), maps the
attachment to get a scatter list of bus addresses (dma_buf_map_attachment), unmaps and
detaches. PRIME rules: one dma-buf per exported object (DmaBufCache), and an exporter
that imports its own dma-buf finds its object again in `priv` (`exporter is self`).

The exporter's ops table (dma_buf_ops), each called with no lock of this module held:
  attach(dmabuf, attachment)       may raise (AttachRefused, say when the importer can
                                   reach the memory neither peer-to-peer nor through
                                   system memory); may set attachment.priv
  detach(dmabuf, attachment)
  map(attachment) -> SgTable       map_dma_buf: where the importer finds the memory now
  unmap(attachment, sgt)           unmap_dma_buf: exactly once per successful map
  release(dmabuf)                  the last reference went; exactly once
The importer's ops table (dma_buf_attach_ops):
  move_notify(attachment)          the buffer moved: map again before the next use; it
                                   must not block on the exporter (it may run under the
                                   exporter's lock)

Every attachment is dynamic: when the exporter moves or evicts the buffer it calls
DmaBuf.move_notify(), which marks each attachment's mapping stale and tells the
importer. A stale mapping is unmapped (exporter unmap) by the next map(), unmap() or
detach(), so every map the exporter saw is matched by one unmap. A map that races with
a move is unmapped and retried.

Lifetime: get()/put() count references; the exporter's handle holds one and each
attachment holds one, so the buffer is released (exporter release, once) only when it
is neither exported nor attached. revoke() withdraws the export: no new attachments,
the existing ones work until detached.

An attachment belongs to one importer, which serialises its own calls on it; only
move_notify() comes concurrently from the exporter.
"""

from __future__ import annotations

import itertools
import threading
from typing import Protocol

from pvgpu.host.kmd.errors import INVALID_ARGUMENT, PERMISSION, KmdError
from pvgpu.host.kmd.resv import DmaResv

SG_LOCAL = "local"  # the importer's own VRAM (it exported the buffer itself)
SG_PEER = "peer"  # the exporter's VRAM through its PCIe BAR (peer-to-peer)
SG_SYSTEM = "system"  # system memory bus addresses (the bounce path)
SG_KINDS = (SG_LOCAL, SG_PEER, SG_SYSTEM)

_ids = itertools.count(1)


class DmaBufError(KmdError):
    """Base of the dma-buf errors."""

    code = INVALID_ARGUMENT


class DmaBufReleased(DmaBufError):
    """The dma-buf's last reference is gone; it can no longer be used."""


class DmaBufRevoked(DmaBufError):
    """The export was withdrawn: the dma-buf takes no new attachments."""

    code = PERMISSION


class AttachRefused(DmaBufError):
    """The exporter refused the attachment (raised by exporter ops attach)."""


class DmaBufExporterOps(Protocol):
    def attach(self, dmabuf: "DmaBuf", attachment: "DmaBufAttachment") -> None: ...
    def detach(self, dmabuf: "DmaBuf", attachment: "DmaBufAttachment") -> None: ...
    def map(self, attachment: "DmaBufAttachment") -> "SgTable": ...
    def unmap(self, attachment: "DmaBufAttachment", sgt: "SgTable") -> None: ...
    def release(self, dmabuf: "DmaBuf") -> None: ...


class DmaBufImporterOps(Protocol):
    def move_notify(self, attachment: "DmaBufAttachment") -> None: ...


class SgTable:
    """A mapped dma-buf: (bus_addr, length) segments covering the whole buffer."""

    __slots__ = ("segments", "kind", "size")

    def __init__(self, segments, kind: str, size: int | None = None):
        segments = [(int(a), int(n)) for a, n in segments]
        if kind not in SG_KINDS:
            raise ValueError(f"bad scatter list kind {kind!r}")
        if not segments or any(a < 0 or n <= 0 for a, n in segments):
            raise ValueError(f"bad scatter list segments {segments!r}")
        total = sum(n for _, n in segments)
        if size is not None and total != size:
            raise ValueError(f"scatter list covers {total} bytes, not {size}")
        self.segments = segments
        self.kind = kind
        self.size = total

    def __repr__(self) -> str:
        return f"SgTable({self.kind}, size={self.size:#x}, segments={len(self.segments)})"


class DmaBuf:
    """One exported buffer (struct dma_buf)."""

    __slots__ = ("id", "ops", "priv", "size", "resv", "exporter", "refcount", "released",
                 "revoked", "stats", "_attachments", "_generation", "_lock", "_cache",
                 "__weakref__")

    def __init__(self, ops: DmaBufExporterOps, priv, size: int, resv: DmaResv | None = None,
                 *, exporter=None):
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"bad dma-buf size {size!r}")
        self.id = next(_ids)
        self.ops = ops
        self.priv = priv  # the exporter's object (its buffer object)
        self.size = size
        self.resv = resv if resv is not None else DmaResv()
        self.exporter = exporter  # the exporting device
        self.refcount = 1  # the exporter's handle
        self.released = False
        self.revoked = False
        self.stats = {"attaches": 0, "detaches": 0, "maps": 0, "unmaps": 0,
                      "move_notifies": 0}
        self._attachments = []
        self._generation = 0  # bumped by every move_notify
        self._lock = threading.Lock()
        self._cache = None  # (DmaBufCache, key) that names it

    @property
    def attachments(self) -> list:
        with self._lock:
            return list(self._attachments)

    @property
    def nattach(self) -> int:
        return len(self._attachments)

    def _check_live(self) -> None:
        if self.released:
            raise DmaBufReleased(f"dma-buf {self.id} was released")

    def get(self) -> "DmaBuf":
        with self._lock:
            self._check_live()
            self.refcount += 1
            return self

    def put(self) -> bool:
        """Drop a reference; True when it was the last one (the exporter released it)."""
        with self._lock:
            self._check_live()
            self.refcount -= 1
            if self.refcount:
                return False
            self.released = True
        if self._cache is not None:
            self._cache[0]._forget(self._cache[1], self)
        self.ops.release(self)
        return True

    def revoke(self) -> None:
        """Withdraw the export: attach() fails from now on; attachments stay usable."""
        with self._lock:
            self.revoked = True

    def attach(self, importer, importer_ops: DmaBufImporterOps, peer2peer: bool = False,
               importer_priv=None) -> "DmaBufAttachment":
        """dma_buf_dynamic_attach: -> a new attachment of `importer` (holds a reference)."""
        with self._lock:
            self._check_live()
            if self.revoked:
                raise DmaBufRevoked(f"dma-buf {self.id} was revoked: it takes no new "
                                    "attachments")
            self.refcount += 1
        attachment = DmaBufAttachment(self, importer, importer_ops, peer2peer, importer_priv)
        try:
            self.ops.attach(self, attachment)
        except BaseException:
            self.put()
            raise
        with self._lock:
            self._attachments.append(attachment)
            self.stats["attaches"] += 1
        return attachment

    def move_notify(self) -> None:
        """dma_buf_move_notify: the exporter moved the buffer; every mapping is stale."""
        with self._lock:
            self._check_live()
            self._generation += 1
            self.stats["move_notifies"] += 1
            attachments = list(self._attachments)
            for a in attachments:
                if a._sgt is not None:
                    a.stale = True
        for a in attachments:
            a.importer_ops.move_notify(a)

    def __repr__(self) -> str:
        state = "released" if self.released else "revoked" if self.revoked else "live"
        return (f"DmaBuf(id={self.id}, size={self.size:#x}, refcount={self.refcount}, "
                f"nattach={self.nattach}, {state})")


class DmaBufAttachment:
    """One importer's attachment to a dma-buf (struct dma_buf_attachment)."""

    __slots__ = ("dmabuf", "importer", "importer_ops", "peer2peer", "priv", "importer_priv",
                 "stale", "detached", "_sgt", "__weakref__")

    def __init__(self, dmabuf: DmaBuf, importer, importer_ops: DmaBufImporterOps,
                 peer2peer: bool, importer_priv=None):
        self.dmabuf = dmabuf
        self.importer = importer  # the importing device
        self.importer_ops = importer_ops
        self.peer2peer = peer2peer  # the importer can use the exporter's BAR directly
        self.priv = None  # the exporter's per-attachment data
        self.importer_priv = importer_priv
        self.stale = False  # the mapping predates a move: map again before using it
        self.detached = False
        self._sgt = None  # the exporter's mapping, unmapped once, even when stale

    @property
    def sgt(self) -> SgTable | None:
        """The current mapping; None when unmapped or stale."""
        return None if self.stale else self._sgt

    def _take_sgt(self) -> SgTable | None:
        sgt, self._sgt, self.stale = self._sgt, None, False
        return sgt

    def _unmap_sgt(self, sgt: SgTable) -> None:
        self.dmabuf.ops.unmap(self, sgt)
        with self.dmabuf._lock:
            self.dmabuf.stats["unmaps"] += 1

    def map(self) -> SgTable:
        """dma_buf_map_attachment: -> the mapping, cached until unmapped or moved."""
        buf = self.dmabuf
        while True:
            with buf._lock:
                if self.detached:
                    raise DmaBufError(f"attachment to dma-buf {buf.id} was detached")
                if self._sgt is not None and not self.stale:
                    return self._sgt
                old = self._take_sgt()
                generation = buf._generation
            if old is not None:
                self._unmap_sgt(old)
            sgt = buf.ops.map(self)
            assert isinstance(sgt, SgTable) and sgt.size == buf.size, \
                f"exporter mapped dma-buf {buf.id} ({buf.size:#x} bytes) as {sgt!r}"
            with buf._lock:
                buf.stats["maps"] += 1
                if buf._generation == generation:
                    self._sgt = sgt
                    return sgt
            self._unmap_sgt(sgt)  # moved while being mapped: map again

    def unmap(self) -> None:
        """dma_buf_unmap_attachment (of the current or a stale mapping)."""
        with self.dmabuf._lock:
            if self.detached:
                raise DmaBufError(f"attachment to dma-buf {self.dmabuf.id} was detached")
            sgt = self._take_sgt()
        if sgt is None:
            raise DmaBufError(f"attachment to dma-buf {self.dmabuf.id} is not mapped")
        self._unmap_sgt(sgt)

    def detach(self) -> None:
        """dma_buf_detach: unmap if mapped, tell the exporter, drop the reference."""
        buf = self.dmabuf
        with buf._lock:
            if self.detached:
                raise DmaBufError(f"attachment to dma-buf {buf.id} was already detached")
            self.detached = True
            buf._attachments.remove(self)
            buf.stats["detaches"] += 1
            sgt = self._take_sgt()
        if sgt is not None:
            self._unmap_sgt(sgt)
        buf.ops.detach(buf, self)
        buf.put()

    def __repr__(self) -> str:
        state = ("detached" if self.detached else "stale" if self.stale
                 else "mapped" if self._sgt is not None else "unmapped")
        return f"DmaBufAttachment(dmabuf={self.dmabuf.id}, {state})"


class DmaBufCache:
    """One dma-buf per exported object (PRIME): re-exporting returns the live one."""

    def __init__(self):
        self._lock = threading.Lock()
        self._bufs = {}  # key -> DmaBuf, until released

    def export(self, key, factory) -> DmaBuf:
        """-> the live, unrevoked dma-buf of `key` with a new reference, or factory()'s
        new one (which this cache then names until it is released). factory runs under
        the cache's lock, so two exports of one key never make two dma-bufs."""
        with self._lock:
            buf = self._bufs.get(key)
            if buf is not None and not buf.revoked:
                try:
                    return buf.get()
                except DmaBufReleased:
                    pass  # its last put() is forgetting it right now
            buf = factory()
            assert buf._cache is None, f"{buf!r} is already named by a cache"
            buf._cache = (self, key)
            self._bufs[key] = buf
            return buf

    def lookup(self, key) -> DmaBuf | None:
        """The dma-buf `key` is exported as (no reference taken), or None."""
        with self._lock:
            return self._bufs.get(key)

    def _forget(self, key, buf: DmaBuf) -> None:
        with self._lock:
            if self._bufs.get(key) is buf:
                del self._bufs[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._bufs)
