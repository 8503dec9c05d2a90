"""Pinned host memory: numpy arrays that live inside the guest's memory (the "page-locked"
memory of CUDA's cudaHostAlloc), so that a copy between one and a DeviceArray is a single
DMA by the host's copy engine, with no bounce buffer.

    p = dev.pinned_empty((n,), np.float32)   # or conn.pinned_empty / pinned_zeros / pinned_array
    p[:] = data                              # an ndarray: fill it in place
    d.copy_from_host(p)                      # COPY_H2D whose data descriptor is p's own range
    d.to_host(out=p)                         # COPY_D2H straight into p
    p.free()                                 # or `with dev.pinned_empty(...) as p:`

A `PinnedArray` is an ndarray subclass over a view of guest memory (a block of the
session heap, `conn.session.heap`). The copy APIs (`DeviceArray.copy_from_host`,
`to_host(out)`, `Context.copy_h2d/copy_d2h` and their async forms) recognise one —
also a contiguous slice or plain-ndarray view of one — and send requests whose data
descriptors point at the array's guest-physical range, split into requests of at most
`dev.pinned_request` bytes with `dev.pinned_depth` of them in flight (the CopyPipeline of
guest/api/copy.py, as every copy). In the shared memory model that is zero copy: the
host's copy engine reads and writes the array's memory in place. In the inline model it still saves the guest's bounce copy: H2D marks
the range dirty, so the kick carries it; the D2H data comes back in the call's patches,
which land in the array (it is a view of the guest memory mirror).

Asynchronous copies from or to pinned memory return at once and hold the block until
their requests complete: as in CUDA, the application must not modify the source of an
async H2D, nor read the destination of an async D2H, before the stream (or an event
recorded after the copy) has synchronized. `free()` returns at once; the heap block goes
back when the last request still using it completes; a second `free()` does nothing. A
pinned array that becomes garbage without `free()` (it and every view of it) returns its
block too: its finalizer only queues the block, and the next API call on the connection
gives it back to the heap (guest/api/lifetime.py).

After `free()` the memory may be handed out again: copies from or to the array raise
`PinnedMemoryError`, and the freed array object itself becomes read-only. (Views taken
before the free still point at the old memory; using them is a use-after-free, as with
cudaFreeHost.) Arrays derived from a pinned array that do not share its memory (copies,
results of arithmetic) are ordinary host memory (`pinned` is False).

A COPY_D2H that fails may leave the first bytes of a pinned destination overwritten by
the error response (the response continues into the data descriptor, spec [CMD-CHAIN-5]);
its contents are undefined after an error, as a bounce chunk's would be.
"""

from __future__ import annotations

import weakref

import numpy as np

from pvgpu.spec import wire
from pvgpu.guest.api import errors, operands
from pvgpu.guest.api.locking import ApiObject, unlocked
from pvgpu.guest.frontend.heap import OutOfGuestMemory

_BASE_WALK = 16  # how far up an ndarray's .base chain to look for a pinned array


class PinnedMemoryError(errors.PvgpuError, ValueError):
    """A copy used pinned memory that was freed (or belongs to a closed connection)."""


def _address(arr: np.ndarray) -> int:
    return arr.__array_interface__["data"][0]


class _Block:
    """One heap allocation of pinned memory."""

    __slots__ = ("allocator", "gpa", "nbytes", "addr", "freed", "busy", "tainted", "released",
                 "finalizer", "__weakref__")

    def __init__(self, allocator, gpa: int, nbytes: int, addr: int):
        self.allocator = allocator
        self.gpa, self.nbytes, self.addr = gpa, nbytes, addr
        self.freed = False  # the application freed it (no new copies)
        self.busy = 0  # requests on the device that use it
        self.tainted = None  # a device whose request using it failed without coming back
        self.released = False  # the heap has it back
        # queues the block's memory for freeing once the block becomes garbage; at exit the
        # session's end frees everything
        self.finalizer = weakref.finalize(self, allocator.garbage.append, (gpa, nbytes))
        self.finalizer.atexit = False

    def contains(self, arr: np.ndarray) -> bool:
        off = _address(arr) - self.addr
        return 0 <= off and off + arr.nbytes <= self.nbytes


class _Holder:
    """The owner (`.base`) of a pinned allocation's root array: holds its block and the
    guest-memory view the array's data lives in."""

    __slots__ = ("block", "raw", "__array_interface__")

    def __init__(self, block: _Block, raw: np.ndarray):
        self.block, self.raw = block, raw
        self.__array_interface__ = {"data": (block.addr, False), "shape": (block.nbytes,),
                                    "typestr": "|u1", "version": 3}


class PinnedAllocator:
    """The pinned blocks of one connection (carved from its session heap)."""

    def __init__(self, conn):
        self.connection = conn
        # (gpa, nbytes) of blocks whose arrays became garbage (appended by their finalizers),
        # given back to the heap by drain()
        self.garbage: list[tuple[int, int]] = []
        self.live = 0  # blocks handed out and not yet back in the heap
        self.live_bytes = 0

    @property
    def _heap(self):
        return self.connection.session.heap

    def empty(self, shape, dtype) -> "PinnedArray":
        shape, dtype, nbytes = operands.allocation(shape, dtype)
        with self.connection._conn_lock:
            session = self.connection.session
            if session.closed:
                raise PinnedMemoryError("the connection is closed")
            self.drain()
            try:
                gpa = self._heap.alloc(max(nbytes, 1), align=wire.PAGE_SIZE)
            except OutOfGuestMemory as e:
                raise OutOfGuestMemory(
                    f"{e}; pinned memory comes from the guest memory heap: connect with a larger "
                    f"mem_size (now {session.mem_size >> 20} MiB)") from None
            raw = session.mem.view(gpa, max(nbytes, 1))[:nbytes]
            block = _Block(self, gpa, nbytes, _address(raw))
            self.live += 1
            self.live_bytes += nbytes
        # Every view of the memory, of any type, has `root` in its .base chain, and root's
        # base is the holder: the block lives (its memory stays allocated) while any view
        # does, and `extent` finds the block of any view.
        root = np.asarray(_Holder(block, raw))
        arr = root.view(dtype).reshape(shape).view(PinnedArray)
        arr._pin = block
        return arr

    def drain(self) -> None:
        """Give the heap back the blocks whose arrays were garbage collected."""
        while self.garbage:
            gpa, nbytes = self.garbage.pop()
            self.live -= 1
            self.live_bytes -= nbytes
            if not self.connection.session.closed:
                self._heap.free(gpa)

    def free(self, block: _Block) -> None:
        with self.connection._conn_lock:
            if not block.freed:
                block.freed = True
                if block.busy == 0:
                    self._release(block)
            self.drain()

    def _release(self, block: _Block) -> None:
        if block.released:
            return
        block.released = True
        block.finalizer.detach()
        self.live -= 1
        self.live_bytes -= block.nbytes
        dev = block.tainted
        if dev is not None and dev.driver.needs_reset:
            # the device may still write into it until it is reset: reused only after reset()
            dev._staging.quarantine([block.gpa])
        elif not self.connection.session.closed:
            self._heap.free(block.gpa)

    def _done(self, block: _Block, dev, req) -> None:
        """A request that used `block` came back (or failed)."""
        if req.failed is not None:
            block.tainted = dev
            block.finalizer.detach()  # garbage collection must not hand it out again; free() may
        block.busy -= 1
        if block.busy == 0 and block.freed:
            self._release(block)


class PinnedArray(np.ndarray, ApiObject):
    """A numpy array in pinned (guest-DMA-able) memory; see the module docstring.

    `gpa`: the guest-physical address of its first byte; `pinned`: True while it is
    pinned memory (False once freed, and for arrays derived from it that do not share its
    memory); `free()` / a `with` block give the memory back."""

    _pin = None

    def __array_finalize__(self, obj):
        pin = getattr(obj, "_pin", None)
        if pin is not None and not pin.contains(self):
            pin = None  # a new array (copy, ufunc result): ordinary memory
        self._pin = pin

    def __array_wrap__(self, arr, context=None, return_scalar=False):
        if self._pin is None or not self._pin.contains(arr):  # a new array: not pinned
            arr = arr.view(np.ndarray)
            return arr[()] if return_scalar else arr
        return super().__array_wrap__(arr, context, return_scalar)

    def __reduce__(self):
        return self.view(np.ndarray).__reduce__()  # pickles as an ordinary array

    @property
    @unlocked("reads its block's flag")
    def pinned(self) -> bool:
        """Whether the array is in pinned memory that has not been freed."""
        return self._pin is not None and not self._pin.freed

    @property
    @unlocked("reads its block's flag")
    def freed(self) -> bool:
        """Whether its pinned memory was given back (`free()`): copies then refuse it."""
        return self._pin is not None and self._pin.freed

    @property
    @unlocked("computed from its block and address")
    def gpa(self) -> int:
        """The guest-physical address of the array's first byte (what copy descriptors name)."""
        pin = self._pin
        if pin is None:
            raise PinnedMemoryError("this array is not in pinned memory")
        return pin.gpa + (_address(self) - pin.addr)

    @unlocked("takes the connection lock itself (PinnedAllocator.free)")
    def free(self) -> None:
        """Give the whole pinned allocation back (every view of it). Returns at once; the
        heap gets it back when the asynchronous copies still using it complete."""
        pin = self._pin
        if pin is not None and not pin.freed:
            pin.allocator.free(pin)
            self.flags.writeable = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()


def extent(arr, conn):
    """-> (block, gpa, nbytes) if `arr` (C-contiguous) is a view of pinned memory of
    `conn` (a PinnedArray, a slice of one, a plain ndarray view of one), else None.
    Raises PinnedMemoryError for a view of pinned memory that was freed."""
    a = arr
    for _ in range(_BASE_WALK):
        if type(a) is _Holder:
            pin = a.block
            break
        if not isinstance(a, np.ndarray):
            return None
        a = a.base
    else:
        return None
    if pin.allocator.connection is not conn:
        return None  # another connection's pinned memory is ordinary memory here
    if pin.freed:
        raise PinnedMemoryError("copy from or to pinned memory that was freed")
    if not arr.flags.c_contiguous:
        return None
    off = _address(arr) - pin.addr
    n = arr.nbytes
    if not (0 <= off and off + n <= pin.nbytes):
        return None
    return pin, pin.gpa + off, n
