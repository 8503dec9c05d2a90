"""Hardware fences (amdgpu_fence.c / dma_fence).

Each engine ring has a FenceDriver: a u64 write-back slot in a KMD-owned VRAM page and a
sequence counter. Emitting a fence appends a FENCE packet to the ring that tells the
command processor to write the next sequence number to the slot once everything before
it in the ring has completed, and (FENCE_IRQ) to raise IRQ_FENCE. The interrupt handler
calls process(): it reads the slot and signals, in order, every pending fence whose
sequence number is <= the value there — sequence numbers on one ring complete in order,
so one write-back value retires a whole prefix of the pending list, and a lost or merged
interrupt costs nothing. So only the last of several fences committed together needs
FENCE_IRQ (emit(flags=0), then irq_on_last()): its interrupt retires them all.

A driver given a page of timestamp slots (`stamps`) emits stamped FENCEs: the command
processor also writes (seq, completion time) into slot seq % STAMP_SLOTS, and retirement
gives each fence the time its own work completed (Fence.timestamp), not the time of the
interrupt that retired it. A slot that no longer holds the fence's seq (more than
STAMP_SLOTS fences pending, or a fence forced complete by an engine reset) leaves the
timestamp to the caller.

A Fence signals exactly once. Its error (None, a GpuFault or a string) is set before it
signals. add_done_callback(fn) calls fn(fence) exactly once: on the signalling thread
(the engine's interrupt thread) after the fence is marked signalled, or on the caller's
thread if the fence has already signalled. Callbacks never run with a device lock held:
a thread that holds one when it signals a fence (or adds a callback to a signalled one)
runs the callbacks once it has released it (host/kmd/lock.py); wait() returns at once
all the same. A callback that raises is logged and does not stop the others.
"""

from __future__ import annotations

import collections
import logging
import struct
import threading

from pvgpu.host.hw import packets
from pvgpu.host.kmd import lock as devlock

log = logging.getLogger(__name__)

_lock = threading.Lock()  # guards every Fence's state; held only for a few statements
FENCE_DW = 6  # dwords of one FENCE packet
STAMPED_FENCE_DW = 8  # ... with a timestamp slot
STAMP_SLOT_SIZE = 16  # (u64 seq, u64 completion time)
STAMP_SLOTS = 256  # one 4 KiB page per ring
_SEQ = struct.Struct("<Q")
_SEQ_STAMP = struct.Struct("<QQ")
_FLAGS_AT = 4 * packets.FENCE_FLAGS_DW  # (irq_on_last)
_IRQ_FLAGS = struct.pack("<I", packets.FENCE_IRQ)


class Fence:
    """A point on one engine's timeline: `seq` on `engine`."""

    __slots__ = ("engine", "seq", "driver", "error", "timestamp", "_signaled", "_callbacks",
                 "_event", "__weakref__")

    def __init__(self, engine: int, seq: int, driver: "FenceDriver | None" = None):
        self.engine = engine
        self.seq = seq
        self.driver = driver
        self.error = None
        self.timestamp = None  # device clock (ns) when the work completed, once known
        self._signaled = False
        self._callbacks = None  # a list once a callback is added
        self._event = None

    @classmethod
    def signaled_fence(cls, engine: int = -1, error=None) -> "Fence":
        f = cls(engine, 0)
        f.error = error
        f._signaled = True
        return f

    @property
    def signaled(self) -> bool:
        return self._signaled

    def done(self) -> bool:
        return self._signaled

    @property
    def wb_addr(self) -> int:
        """VRAM physical address where the hardware writes this fence's sequence."""
        return self.driver.wb_addr

    @property
    def device(self):
        return self.driver.device if self.driver is not None else None

    def set_error(self, error) -> bool:
        """Attach an error to a fence that has not signalled yet (the first one wins)."""
        with _lock:
            if self._signaled or self.error is not None:
                return False
            self.error = error
            return True

    def add_done_callback(self, fn) -> None:
        with _lock:
            if not self._signaled:
                if self._callbacks is None:
                    self._callbacks = [fn]
                else:
                    self._callbacks.append(fn)
                return
        _run(self, (fn,))

    def wait(self, timeout: float | None = None) -> bool:
        """Block until signalled; False on timeout."""
        if self._signaled:  # never goes back
            return True
        with _lock:
            if self._signaled:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def signal(self, error=None) -> bool:
        """Signal now (software signalling, e.g. on device stop); False if already done."""
        return signal_all((self,), error) == 1

    def __repr__(self) -> str:
        state = "signaled" if self._signaled else "pending"
        err = f", error={self.error!s}" if self.error is not None else ""
        return f"Fence(engine={self.engine}, seq={self.seq}, {state}{err})"


def _run(fence: Fence, callbacks) -> None:
    devlock.call_soon(_call, fence, callbacks)  # after the thread's device locks go


def _call(fence: Fence, callbacks) -> None:
    for fn in callbacks:
        try:
            fn(fence)
        except Exception:  # a broken callback must not kill the interrupt thread
            log.exception("fence callback %r failed for %r", fn, fence)


def signal_all(fences, error=None, pairs=()) -> int:
    """Signal `fences` (with `error`), then the (fence, error) `pairs`, in order: all are
    marked first, in one hold of the fence lock, then callbacks run in the same order;
    -> how many this call signalled (a fence signals once: the first error sticks)."""
    marked = []  # (fence, its callbacks)
    n = 0
    with _lock:
        for f in fences:
            if not f._signaled:
                _mark(f, error, marked)
                n += 1
        for f, err in pairs:
            if not f._signaled:
                _mark(f, err, marked)
                n += 1
    for f, callbacks in marked:
        _run(f, callbacks)
    return n


def _mark(f: Fence, error, marked: list) -> None:
    """Mark an unsignalled fence signalled (fence lock held); its callbacks go to `marked`."""
    if error is not None and f.error is None:
        f.error = error
    f._signaled = True
    if f._event is not None:
        f._event.set()
    if f._callbacks:
        marked.append((f, f._callbacks))
        f._callbacks = None


class FenceDriver:
    """The fence state of one engine ring."""

    def __init__(self, engine: int, vram, wb_addr: int, lock=None, device=None,
                 stamps: int | None = None):
        """stamps: VRAM physical address of STAMP_SLOTS timestamp slots (zeroed here)."""
        self.engine = engine
        self.vram = vram
        self.wb_addr = wb_addr
        self.lock = lock if lock is not None else threading.RLock()
        self.device = device
        self.stamps = stamps
        self.packet_dw = FENCE_DW if stamps is None else STAMPED_FENCE_DW
        self.next_seq = 1
        self.last_seq = 0  # highest sequence seen written back
        self.pending = collections.deque()
        self._last_packet = None  # (its index in the ring's transaction, its bytes) of the
        # last FENCE emit() staged
        vram.write_u64(wb_addr, 0)
        if stamps is not None:
            vram.fill(stamps, STAMP_SLOTS * STAMP_SLOT_SIZE, 0)

    @property
    def emitted_seq(self) -> int:
        return self.next_seq - 1

    def emit(self, ring, flags: int = packets.FENCE_IRQ) -> Fence:
        """Write a FENCE packet into the ring's open transaction; -> the new pending fence.

        The fence is pending before the doorbell rings, so its interrupt cannot be missed.
        Call with the lock held; cancel() it if the ring transaction is undone."""
        seq = self.next_seq
        packet = self._packet(seq, flags)
        self._last_packet = (ring.write(packet), packet)
        self.next_seq = seq + 1
        fence = Fence(self.engine, seq, self)
        self.pending.append(fence)
        return fence

    def emit_with(self, ring, data: bytes, doorbell: bool = True, publish: bool = True) -> Fence:
        """One whole ring transaction (ring.emit): `data` (the job's packets), then a
        FENCE with FENCE_IRQ; -> the new pending fence. Call with the lock held."""
        seq = self.next_seq
        fence = Fence(self.engine, seq, self)
        self.pending.append(fence)
        self.next_seq = seq + 1
        try:
            ring.emit(data + self._packet(seq, packets.FENCE_IRQ), doorbell, publish)
        except BaseException:
            self.cancel(fence)
            raise
        return fence

    def _packet(self, seq: int, flags: int) -> bytes:
        """The FENCE packet of `seq`, with its stamp slot when the ring has stamps."""
        stamps = self.stamps
        stamp = None if stamps is None else stamps + STAMP_SLOT_SIZE * (seq % STAMP_SLOTS)
        return packets.fence(self.wb_addr, seq, flags, stamp)

    def irq_on_last(self, ring) -> None:
        """Make the last fence emitted into the ring's open transaction raise IRQ_FENCE:
        its staged packet with its flags dword set to FENCE_IRQ (the only flag)."""
        index, packet = self._last_packet
        ring.rewrite(index, packet[:_FLAGS_AT] + _IRQ_FLAGS + packet[_FLAGS_AT + 4:])

    def cancel(self, fence: Fence) -> None:
        """Forget the fence just emitted (its ring transaction was undone)."""
        assert self.pending and self.pending[-1] is fence and fence.seq == self.next_seq - 1
        self.pending.pop()
        self.next_seq -= 1

    def read_wb(self) -> int:
        return _SEQ.unpack_from(self.vram.buf, self.wb_addr)[0]  # 8-aligned, inside VRAM

    def retire(self, seq: int | None = None) -> list:
        """Pop every pending fence the hardware has completed; -> them, in order."""
        with self.lock:
            return self.retire_locked(seq)

    def retire_locked(self, seq: int | None = None) -> list:
        """retire(), for a caller that holds the lock."""
        value = _SEQ.unpack_from(self.vram.buf, self.wb_addr)[0]  # (read_wb)
        if seq is not None and value < seq < self.next_seq:  # seq <= emitted_seq
            value = seq
        if value > self.last_seq:
            self.last_seq = value
        done = []
        pending = self.pending
        while pending and pending[0].seq <= self.last_seq:
            done.append(pending.popleft())
        if self.stamps is not None and done:
            buf, base = self.vram.buf, self.stamps
            for f in done:
                slot = base + STAMP_SLOT_SIZE * (f.seq % STAMP_SLOTS)
                seq, stamp = _SEQ_STAMP.unpack_from(buf, slot)
                if seq == f.seq and f.timestamp is None:
                    f.timestamp = stamp
        return done

    def process(self, seq: int | None = None) -> int:
        """Interrupt-time fence processing; -> number of fences signalled."""
        done = self.retire(seq)
        if done:
            signal_all(done)
        return len(done)

    def oldest_pending(self) -> Fence | None:
        with self.lock:
            return self.pending[0] if self.pending else None

    def last_emitted(self) -> Fence | None:
        with self.lock:
            return self.pending[-1] if self.pending else None

    def force_completion(self) -> list:
        """After an engine reset (amdgpu_fence_driver_force_completion): write the last
        emitted sequence to the write-back slot, so that nothing waits for fences whose
        work was abandoned, and pop those fences; -> them (the caller signals them)."""
        with self.lock:
            self.vram.write_u64(self.wb_addr, self.emitted_seq)
            return self.retire()

    def fail_all(self, error) -> int:
        """Signal every pending fence with `error` (device stop / loss)."""
        with self.lock:
            done = list(self.pending)
            self.pending.clear()
        signal_all(done, error)
        return len(done)
