"""The lifetime of memory that Python objects hold: a DeviceArray that owns device memory
frees it when its last reference goes away, as CuPy and PyTorch arrays do (and a
PinnedArray gives its guest memory back, guest/api/pinned.py).

Owning arrays are those whose resource id is theirs: `ctx.empty/zeros/to_device` (and a
DeviceArray made over a `ctx.alloc`), whose memory is freed (MEM_FREE), and an
ImportedArray, whose import ends (MEM_FREE of the import; the exporter's memory lives on
as long as it and other importers hold it). Views own nothing: dropping a MappedArray
leaves its mapping in place (until `unmap`, or the context's destruction), dropping a
SharedArray leaves its attachment (until `detach`, or the context's destruction); the
buffer a mapping shows is freed only after its last mapping is gone.

A finalizer may run at any allocation of any thread: inside another API call that holds
the connection lock, between two commands of a chunked copy, at interpreter exit, or
after the connection or the context is gone. So it never calls the driver: it only
appends (context, resource id) to the connection's `Releases` queue (a deque append is
atomic), and the next API call on the connection sends the MEM_FREEs under the lock
before doing anything else (only the outermost call, never one nested in another).
MEM_FREE waits for the context's earlier work on the device (spec [CMD-FREE-2]), so work
still using the array when it was dropped completes normally. Frees are never lost:
those of a context that was destroyed, of a device that was reset or of a connection
that closed are dropped because that already freed everything; one the device refuses
because the buffer is still mapped (spec [CMD-FREE-3]) is retried after the context's
next `unmap`. An allocation that runs out of device memory collects garbage (gc.collect,
for arrays in reference cycles), frees what that released and tries once more.

Objects with a device-side life of their own (contexts, events) end explicitly: `destroy()`,
or a `with` block (DestroyedOnExit).
"""

from __future__ import annotations

import collections
import gc
import weakref
from typing import TYPE_CHECKING

from pvgpu.guest.frontend.driver import DeviceNeedsReset, DeviceResponseError, VirtioGpuDriver, command
from pvgpu.guest.frontend.session import HostLost
from pvgpu.spec import wire


class Releases:
    """The resources of one connection whose owners became garbage, freed at the next
    safe point (`drain`, called by every outermost API call under the lock)."""

    def __init__(self, conn):
        self.connection = conn
        # (context, resource id), appended by finalizers
        self._queue: collections.deque[tuple] = collections.deque()
        self._draining = False
        self.freed = 0  # MEM_FREEs sent for dropped arrays (for tests and measurements)

    def track(self, arr) -> weakref.finalize:
        """Free `arr`'s resource when `arr` becomes garbage; -> the finalizer (detach it
        when the resource is freed otherwise)."""
        fin = weakref.finalize(arr, self._queue.append, (arr.context, arr.resource_id))
        fin.atexit = False  # at exit the session's end frees everything
        return fin

    @property
    def pending(self) -> int:
        return len(self._queue)

    def drain(self) -> None:
        """Free what became garbage (the connection lock is held)."""
        pinned = self.connection._pinned
        if self._draining or not (self._queue or pinned.garbage):
            return  # the common case: nothing became garbage
        self._draining = True
        try:
            pinned.drain()
            while self._queue:
                ctx, rid = self._queue.popleft()
                try:
                    self._free(ctx, rid)
                except BaseException:
                    self._queue.appendleft((ctx, rid))
                    raise
        finally:
            self._draining = False

    def retry_mapped(self, ctx) -> None:
        """After an unmap in `ctx`: frees refused while the buffer was mapped, again."""
        self._queue.extend((ctx, rid) for rid in ctx._mapped_frees)
        ctx._mapped_frees.clear()

    def collect(self) -> bool:
        """Collect garbage and free it now; -> whether any memory came back."""
        before = self.freed
        gc.collect()
        self.drain()
        return self.freed > before

    def _free(self, ctx, rid: int) -> None:
        session = self.connection.session
        if ctx.destroyed or session.closed or session.host_lost or ctx._driver.needs_reset:
            return  # its memory went with the context, the device's reset or the session
        try:
            ctx._driver.call(command(wire.CMD_MEM_FREE, (rid,), ctx_id=ctx.ctx_id))
        except DeviceResponseError as e:
            if e.resp == wire.RESP_ERR_INVALID_PARAMETER:  # still mapped (CMD-FREE-3)
                ctx._mapped_frees.append(rid)
            # otherwise the resource or its context is gone already (lost, destroyed)
            return
        except (DeviceNeedsReset, HostLost):
            return  # the reset, or the session's end, frees it
        self.freed += 1


class DestroyedOnExit:
    """`with obj:` destroys it at the end, unless it is gone already or its device must
    be reset first (then destroying would only raise DeviceNeedsReset)."""

    if TYPE_CHECKING:  # what the classes that use it have
        destroyed: bool
        _driver: VirtioGpuDriver

        def destroy(self) -> None: ...

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self.destroyed and not self._driver.needs_reset:
            self.destroy()
