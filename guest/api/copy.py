"""Copies between host memory and device memory: one `CopyPipeline(direction, sync)` for
every copy, and the `StagingPool` of bounce chunks each device keeps.

A copy goes through guest memory and the host's copy engine, in pieces, one request each
(COPY_H2D or COPY_D2H whose data descriptor is the piece's guest memory):

  - pageable host memory (any numpy array) is staged through bounce chunks of the device's
    pool, `dev.staging_chunk` bytes each: H2D fills a chunk and submits it, so the guest's
    memcpy of chunk N+1 overlaps the device's DMA of chunk N (split transaction); D2H
    submits chunks ahead and copies each out as it completes;
  - pinned host memory (guest/api/pinned.py) lies in guest memory already: each request's
    descriptor is the array's own range, `dev.pinned_request` bytes at most, no bounce;
  - an H2D copy of at most `dev.small_h2d_max` bytes (SMALL_H2D_MAX) travels inside its
    command's descriptor instead (spec [CMD-H2D-1]).

A synchronous copy keeps `dev.staging_depth` (pinned: `dev.pinned_depth`) requests in
flight, one with pipeline=False, waits for all of them, raises the first error, then the
stream's earlier asynchronous error. Each wait names its kind (direction, pinned or bounce,
the piece's size class), so the session expects it to take as long as the earlier ones of
that kind (FrontendSession.wait_for: it sleeps through most of a long one). An asynchronous copy submits every piece, its kick
deferred (the driver's kick policy, guest/frontend/driver.py), and returns; each piece
completes on its own (D2H data lands, the chunk goes back to the pool, an error
is kept for the stream's next synchronize). Bounce chunks of requests that failed without
coming back stay quarantined until the device's reset: the device may still DMA into them.
"""

from __future__ import annotations

import collections
import functools

import numpy as np

from pvgpu.guest.api import pinned
from pvgpu.guest.api.commands import ring_command
from pvgpu.spec import wire

STAGING_CHUNK = 8 << 20
STAGING_DEPTH = 4  # bounce chunks per device: in flight at once for one copy, and the pool size
SMALL_H2D_MAX = 216  # an H2D copy this small travels in its command's descriptor (spec [CMD-H2D-1])
PINNED_REQUEST_SHARED = 64 << 20  # largest request of a pinned copy, shared memory model
PINNED_REQUEST_INLINE = 4 << 20  # ... inline model (the data travels in kick/call frames)
PINNED_DEPTH = 4  # requests of one synchronous pinned copy in flight at once
H2D, D2H = "h2d", "d2h"


def init_device(dev) -> None:
    """The copy settings, the staging pool and the copy counters of a Device (called by its
    __init__)."""
    session = dev.connection.session
    dev.staging_depth = STAGING_DEPTH  # chunks in flight for one synchronous copy
    dev.small_h2d_max = SMALL_H2D_MAX  # 0: every H2D goes through a bounce chunk
    dev.pinned_request = PINNED_REQUEST_INLINE if session.inline else PINNED_REQUEST_SHARED
    dev.pinned_depth = PINNED_DEPTH
    # what the copies did (for tests and measurements): bounce chunks taken from the pool,
    # pinned requests and bytes, small copies sent as one descriptor
    dev.copy_stats = {"staging_chunks": 0, "pinned_requests": 0, "pinned_bytes": 0,
                      "small_copies": 0}
    # Every device may hold STAGING_DEPTH chunks; keep them to half of the heap.
    share = session.heap.size // (2 * STAGING_DEPTH * max(1, len(session.devices)))
    dev._staging = StagingPool(dev, max(64 << 10, min(STAGING_CHUNK, share // 4096 * 4096)))


class StagingPool:
    """The bounce chunks of one device: guest memory from the session heap, at most
    `dev.staging_depth` of them unless asynchronous copies hold more. A synchronous copy
    `take`s chunks and `give`s them back; an asynchronous one `lend`s them, and each comes
    back (`give_back`) when its request completes."""

    def __init__(self, dev, chunk: int):
        self.device = dev
        self.chunk = chunk  # bytes per chunk
        self.free: list[int] = []  # idle chunks (gpa)
        self.count = 0  # chunks taken from the heap and not given back to it
        self.lent: set[int] = set()  # chunks of asynchronous copies still on the device
        self.quarantined: list[int] = []  # memory of failed requests, reusable after the reset
        self.stale: set[int] = set()  # lent chunks of an earlier chunk size

    @property
    def _heap(self):
        return self.device.connection.session.heap

    def take(self) -> int:
        dev = self.device
        if not self.free and self.count >= dev.staging_depth and self.lent:
            # the pool is lent out to asynchronous copies: they come back as they complete
            dev.connection.session.wait_for(lambda: self.free or not self.lent)
        dev.copy_stats["staging_chunks"] += 1
        if self.free:
            return self.free.pop()
        gpa = self._heap.alloc(self.chunk)
        self.count += 1
        return gpa

    def give(self, gpa: int) -> None:
        self.free.append(gpa)

    def lend(self) -> int:
        """A chunk for an asynchronous copy; it comes back with give_back."""
        gpa = self.take()
        self.lent.add(gpa)
        return gpa

    def give_back(self, gpa: int) -> None:
        if gpa in self.lent:  # (not after a reset freed it)
            self.lent.discard(gpa)
            if gpa in self.stale:  # the chunk size changed while it was lent
                self.stale.discard(gpa)
                self.count -= 1
                self._heap.free(gpa)
            else:
                self.free.append(gpa)

    def quarantine(self, gpas) -> None:
        """Guest memory of requests that failed without coming back (bounce chunks, pinned
        blocks, launch parameters): the device may still DMA into it until it is reset, so
        it is reused only after reset()."""
        self.quarantined.extend(gpas)

    def resize(self, chunk: int) -> None:
        """Chunks of `chunk` bytes from now: idle ones of the old size go back to the heap
        at once, lent ones when they return."""
        for gpa in self.free:
            self._heap.free(gpa)
        self.count -= len(self.free)
        self.free = []
        self.stale |= self.lent
        self.chunk = chunk

    def reset(self) -> None:
        """The device was reset: no DMA is in flight, every chunk goes back to the heap."""
        heap = self._heap
        for gpa in self.free + self.quarantined + sorted(self.lent):
            heap.free(gpa)
        self.free, self.quarantined, self.lent = [], [], set()
        self.count = 0
        self.stale = set()


class _Bounce:
    """The pieces of a pageable copy: bounce chunks of the device's pool."""

    kind = "bounce"

    def __init__(self, pipe: "CopyPipeline", data: np.ndarray):
        self.pipe, self.data = pipe, data  # data: the host array's bytes (uint8)
        self.pool = pipe.ctx.device._staging
        self.piece = self.pool.chunk
        self.depth = pipe.ctx.device.staging_depth

    def submit(self, va: int, off: int, size: int):
        pipe, pool = self.pipe, self.pool
        gpa = pool.take() if pipe.sync else pool.lend()
        try:
            if pipe.direction == H2D:
                req = pipe.stage_h2d(va, self.data[off:off + size], gpa)
            else:
                req = pipe.submit(wire.CMD_COPY_D2H, va, size, writable=[(gpa, size)])
        except BaseException:  # never reached the device
            (pool.give if pipe.sync else pool.give_back)(gpa)
            raise
        req.bounce = gpa
        if not pipe.sync:
            req.on_done = functools.partial(self._async_done, off, size)
        return req

    def arrived(self, req, off: int, size: int) -> None:
        """A synchronous piece completed: D2H data lands in the host array."""
        if self.pipe.direction == D2H:
            self.data[off:off + size] = self.pipe.driver.mem.view(req.bounce, size)

    def release(self, req) -> None:
        self.pool.give(req.bounce)

    def abandon(self, reqs) -> None:
        self.pool.quarantine(r.bounce for r in reqs)

    def _async_done(self, off: int, size: int, req) -> None:
        """An asynchronous piece came back: D2H data lands in the host array, the chunk goes
        back to the pool, an error is kept for the stream's next synchronize."""
        try:
            req.response()
            if self.pipe.direction == D2H:
                self.data[off:off + size] = self.pipe.driver.mem.view(req.bounce, size)
        except Exception as e:
            self.pipe.stream._keep_error(e)
        finally:
            self.pool.give_back(req.bounce)


class _Pinned:
    """The pieces of a pinned copy: ranges of the pinned block itself (one DMA each)."""

    kind = "pinned"

    def __init__(self, pipe: "CopyPipeline", ext):
        self.pipe = pipe
        self.block, self.gpa, _n = ext
        dev = pipe.ctx.device
        self.piece = dev.pinned_request
        self.depth = dev.pinned_depth
        self._done = functools.partial(self.block.allocator._done, self.block, dev)

    def submit(self, va: int, off: int, size: int):
        pipe, block, gpa = self.pipe, self.block, self.gpa + off
        if pipe.direction == H2D:
            if pipe.driver.session.inline:
                pipe.driver.mem.mark_dirty(gpa, size)  # the kick carries the data
            rw = {"readable": [(gpa, size)]}
        else:
            rw = {"writable": [(gpa, size)]}
        block.busy += 1
        try:
            req = pipe.submit(wire.CMD_COPY_H2D if pipe.direction == H2D else wire.CMD_COPY_D2H,
                              va, size, **rw)
        except BaseException:
            block.busy -= 1  # never reached the device
            raise
        stats = pipe.ctx.device.copy_stats
        stats["pinned_requests"] += 1
        stats["pinned_bytes"] += size
        req.on_done = self._done if pipe.sync else self._async_done
        return req

    def arrived(self, req, off: int, size: int) -> None:
        pass  # the device wrote into the array itself

    def release(self, req) -> None:
        pass  # the block's own count (busy) comes back in on_done

    def abandon(self, reqs) -> None:
        pass  # a request that failed taints the block (PinnedAllocator._done)

    def _async_done(self, req) -> None:
        try:
            req.response()
        except Exception as e:
            self.pipe.stream._keep_error(e)
        finally:
            self._done(req)


class CopyPipeline:
    """One copy of `direction` (H2D or D2H) on a context's stream, synchronous (`sync`:
    returns when the data has arrived) or asynchronous (returns once every piece is
    submitted); `pipeline=False` keeps one request of a synchronous copy in flight."""

    def __init__(self, ctx, stream, direction: str, sync: bool, *, pipeline: bool = True):
        if direction not in (H2D, D2H):
            raise ValueError(f"direction must be {H2D!r} or {D2H!r}, not {direction!r}")
        self.ctx, self.stream, self.direction, self.sync = ctx, stream, direction, sync
        self.pipeline = pipeline
        self.driver = ctx._driver

    def run(self, va: int, host: np.ndarray) -> None:
        """Copy between device address `va` and the host array `host` (the source of an
        H2D copy, the destination of a D2H one)."""
        dev = self.ctx.device
        ext = pinned.extent(host, dev.connection)
        if ext is not None:
            self._pieces(va, ext[2], _Pinned(self, ext))
            return
        if self.direction == H2D:
            data = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        else:
            if not host.flags.c_contiguous or not host.flags.writeable:
                raise ValueError("dst must be a writable C-contiguous array")
            data = host.reshape(-1).view(np.uint8)
        n = data.nbytes
        if n == 0:
            return
        if self.direction == H2D and n <= dev.small_h2d_max:
            self._in_descriptor(va, data)
            return
        self._pieces(va, n, _Bounce(self, data))

    def submit(self, type_: int, va: int, size: int, *, readable=(), writable=(), extra=b""):
        """Submit one copy request of the stream -> the request. A piece of an asynchronous
        copy defers its kick (the driver's kick policy); a synchronous one kicks at once, so
        the device copies it while the next piece is staged."""
        return self.driver.submit(ring_command(type_, (va, size), ctx_id=self.ctx.ctx_id,
                                               ring_idx=self.stream.ring_idx, extra=extra),
                                  readable=readable, writable=writable, kick=self.sync)

    def stage_h2d(self, va: int, chunk: np.ndarray, gpa: int):
        """Copy one chunk into the guest memory at `gpa` and submit its COPY_H2D."""
        mem = self.driver.mem
        mem.view(gpa, chunk.nbytes)[:] = chunk
        if self.driver.session.inline:
            mem.mark_dirty(gpa, chunk.nbytes)
        return self.submit(wire.CMD_COPY_H2D, va, chunk.nbytes, readable=[(gpa, chunk.nbytes)])

    def _in_descriptor(self, va: int, data: np.ndarray) -> None:
        """A small H2D copy: header, body and data in one descriptor, no bounce."""
        s = self.stream
        self.ctx.device.copy_stats["small_copies"] += 1
        if self.sync:
            self.driver.call(ring_command(wire.CMD_COPY_H2D, (va, data.nbytes),
                                          ctx_id=self.ctx.ctx_id, ring_idx=s.ring_idx,
                                          extra=data.tobytes()))
            s._raise_async_error()
            return
        req = self.submit(wire.CMD_COPY_H2D, va, data.nbytes, extra=data.tobytes())
        req.on_done = s._async_done
        s._track(req)

    def _pieces(self, va: int, n: int, pieces) -> None:
        s = self.stream
        step = pieces.piece
        if not self.sync:
            for off in range(0, n, step):
                s._track(pieces.submit(va + off, off, min(step, n - off)))
            return
        if n == 0:
            return
        depth = max(1, pieces.depth) if self.pipeline else 1
        kind = (self.direction, pieces.kind)  # + the piece's size class: what a wait expects
        inflight: collections.deque[tuple] = collections.deque()  # (request, offset, size)
        first_error = None

        def settle() -> None:
            nonlocal first_error
            req, off, size = inflight[0]
            self.driver.session.wait_for(lambda: req.done, kind=(kind, size.bit_length()))
            inflight.popleft()
            try:
                req.response()
                pieces.arrived(req, off, size)
            except Exception as e:
                first_error = first_error or e
            finally:
                pieces.release(req)

        try:
            for off in range(0, n, step):
                if len(inflight) >= depth:
                    settle()
                size = min(step, n - off)
                inflight.append((pieces.submit(va + off, off, size), off, size))
            while inflight:
                settle()
        except BaseException:
            pieces.abandon(r for r, _o, _s in inflight)
            raise
        if first_error is not None:
            raise first_error
        s._raise_async_error()
