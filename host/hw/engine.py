"""An engine: one ring, its registers and the thread that runs its command processor.

A Gpu has regs.NUM_ENGINES engines (compute, copy0, copy1), each with its own thread, so
they execute concurrently: a long kernel on the compute engine does not delay copies.

Ring protocol (as in amdgpu_ring.c): the driver writes packets into the ring at WPTR and
publishes the new WPTR with a doorbell (RB_DOORBELL), which wakes the engine's thread.
The engine executes packets while RPTR != WPTR and advances RB_RPTR after each packet.
When the pointers are equal, the ring is idle. Pointers are byte offsets in
[0, RB_SIZE); a written WPTR is taken modulo RB_SIZE and rounded down to a dword (so a
free-running WPTR works too). RB_WPTR may also be written without a doorbell: the value
is published but the engine is not woken (it will see it when it next looks).

RB_STATUS reads BUSY while a packet is executing or RPTR != WPTR.

RB_BUSY_NS reads the total device-clock ns the engine has spent executing ring packets
(an IB counts as the one ring packet that runs it), including the part of a packet that is
executing now; a WAIT that stalls counts as busy (the engine is occupied, as a GPU's
busy counter sees it). It only grows: RB_RESET does not clear it. The KMD can sample it
to compute utilisation. stats()["busy_ns"] reads the same.

RB_KICK_SYNC (write any value): the writing thread lends itself to the command processor.
If the engine is started, idle (no packet executing) and RPTR != WPTR, the packets up to
that WPTR execute on the writing thread, and the write returns once they have; the
engine's thread is not woken for them, and the interrupts they raise are delivered on
the writing thread. Packets published meanwhile are left to the engine's thread, so the
writer is held only for the work it kicked. Otherwise the write is a
doorbell without a new WPTR. The driver publishes WPTR first (RB_WPTR): a short job then
completes without two thread handoffs. Busy time, resets and stop checks are as for the
engine's own thread.

RB_KICK_SYNC_WPTR (write the new WPTR): publishes the value as RB_WPTR does, then acts as
RB_KICK_SYNC, in one register write (and one hold of the register lock). A driver that
nothing else can publish a WPTR past meanwhile (it holds its own lock) uses it to submit
and run a short job at once.

Whichever thread executes, it drains the ring a fetch at a time: the command processor
fetches up to RING_FETCH_DW dwords at RPTR and executes the packets wholly inside them
(a job's IB, its FENCE and the padding NOP are one fetch), checking for a stop between
them; then the engine publishes RPTR past them and goes on with the next fetch without
waiting, taking the register lock once per fetch.

RB_RESET (write 1): the current packet is abandoned at its next stop check, pending
packets are dropped and RPTR = WPTR = 0; RB_BASE/RB_SIZE are kept. Stop checks: burn at
least every BURN_CHECK_INTERVAL (1 ms; burn(BURN_FOREVER) runs until a reset), WAIT
immediately, COPY between extents and 32 MiB chunks, IBs between packets, and every
kernel between chunks of work of at most a few ms (kernels.py: elementwise kernels every
ELEMENTWISE_CHUNK elements on each compute unit, gemm between row blocks of C, softmax
between row blocks, reduce_sum between input blocks); only the numpy call of the chunk
already running finishes first. A stopped kernel leaves its outputs partially written.
Work stopped by a reset raises no interrupts. The write returns once the engine has left
the abandoned packet (bounded by RESET_TIMEOUT), except when written from the engine's
own thread (an interrupt handler), where the engine stops after the handler returns.

A ring configuration that is unusable (RB_SIZE not a power of two >= 4 KiB, RB_BASE not
page aligned, or the ring outside VRAM) makes a doorbell raise IRQ_ILLEGAL_PACKET
(address = RB_BASE) and drop the submitted packets.
"""

from __future__ import annotations

import logging
import threading
import time

from pvgpu.host.hw.command_processor import CommandProcessor
from pvgpu.host.hw.kernels import StopToken
from pvgpu.host.hw.regs import (ENGINE_NAMES, PAGE_SIZE, RB_BASE, RB_BUSY_NS, RB_DOORBELL, RB_RESET,
                          RB_KICK_SYNC, RB_KICK_SYNC_WPTR, RB_RPTR, RB_SIZE, RB_STATUS,
                          RB_STATUS_BUSY, RB_STATUS_IDLE, RB_WPTR, REG_ENGINE)
from pvgpu.host.hw.mmio import RO, RW, WO

log = logging.getLogger("pvgpu.hw.engine")

RESET_TIMEOUT = 1.0


class _EngineStop(StopToken):
    """The stop token of one drain: stopped once the engine's generation moves on."""

    def __init__(self, engine: "Engine", gen: int):
        self._stopped, self._wake = None, engine._wake  # StopToken's fields
        self._engine, self._gen = engine, gen

    def stopped(self) -> bool:
        return self._engine._gen != self._gen


class Engine:
    def __init__(self, engine: int, vram, mmu, irq, fence_cond, name: str = "gpu", cus=None,
                 clock=time.monotonic_ns):
        self.id = engine
        self.vram = vram
        self.fence_cond = fence_cond
        self.clock = clock  # () -> device time in ns (Gpu.clock_ns)
        self.name = f"{name}.{ENGINE_NAMES.get(engine, engine)}"
        self.cp = CommandProcessor(engine, vram, mmu, irq, fence_cond, name, cus, clock)
        self._regs = threading.RLock()  # the registers
        self._cond = threading.Condition(self._regs)  # the engine's thread waits on it
        self._idle = threading.Condition(self._regs)  # a reset waits on it for the executor
        self._wake = threading.Event()  # set on reset/shutdown: cuts sleeps short
        self._base = 0
        self._size = 0
        self._ring_valid = False  # _ring_ok(), kept up to date by the RB_BASE/RB_SIZE writes
        self._ptr_mask = ~3  # what a written WPTR is ANDed with (_mask_wptr)
        self._rptr = 0
        self._wptr = 0
        self._gen = 0  # bumped by reset and shutdown: work of an older gen is abandoned
        self._stop_token = _EngineStop(self, 0)  # of the current gen (made by _claim)
        self._exec_gen = None  # gen of the packet executing now, None when idle
        self._shutdown = False
        self._busy_total = 0  # ns spent in finished ring packets
        self._busy_since = None  # clock() when the executing packet started, None when idle
        self._thread: threading.Thread | None = None
        self._executor = None  # the thread executing packets now (the engine's or a kicker)
        self._reset_waiters = 0  # resets waiting on _idle for the executor to leave
        self.doorbells = 0
        self.sync_kicks = 0  # RB_KICK_SYNC writes that ran the ring on the writing thread
        self.resets = 0
        self.internal_errors = 0

    # -------------------------------------------------------------- registers
    def attach(self, mmio) -> None:
        r = lambda reg: REG_ENGINE(self.id, reg)  # noqa: E731
        mmio.define(r(RB_BASE), "RB_BASE", RW, on_write=self._set_base)
        mmio.define(r(RB_SIZE), "RB_SIZE", RW, on_write=self._set_size)
        mmio.define(r(RB_RPTR), "RB_RPTR", RO, on_read=lambda: self._rptr)
        mmio.define(r(RB_WPTR), "RB_WPTR", RW, on_read=lambda: self._wptr,
                    on_write=self._set_wptr)
        mmio.define(r(RB_DOORBELL), "RB_DOORBELL", WO, on_write=self.doorbell)
        mmio.define(r(RB_RESET), "RB_RESET", WO, on_write=self._reset_reg)
        mmio.define(r(RB_STATUS), "RB_STATUS", RO, on_read=self.status)
        mmio.define(r(RB_BUSY_NS), "RB_BUSY_NS", RO, on_read=lambda: self.busy_ns)
        mmio.define(r(RB_KICK_SYNC), "RB_KICK_SYNC", WO, on_write=lambda _v: self.kick_sync())
        mmio.define(r(RB_KICK_SYNC_WPTR), "RB_KICK_SYNC_WPTR", WO, on_write=self.kick_sync)

    def _set_base(self, value: int) -> None:
        with self._regs:
            self._base = value
            self._configure()

    def _set_size(self, value: int) -> None:
        with self._regs:
            self._size = value
            self._configure()

    def _configure(self) -> None:
        """Re-derive the ring's validity and the WPTR mask from RB_BASE/RB_SIZE."""
        size, base = self._size, self._base
        self._ring_valid = (size >= PAGE_SIZE and size & (size - 1) == 0
                            and base % PAGE_SIZE == 0 and base + size <= self.vram.size)
        self._ptr_mask = (size - 1) & ~3 if self._ring_valid else ~3

    def _ring_ok(self) -> bool:
        return self._ring_valid

    def _mask_wptr(self, value: int) -> int:
        return value & self._ptr_mask

    def _set_wptr(self, value: int) -> None:
        with self._regs:
            self._wptr = value & self._ptr_mask

    def doorbell(self, value: int) -> None:
        with self._regs:
            self._wptr = value & self._ptr_mask
            self.doorbells += 1
            self._cond.notify_all()

    def kick_sync(self, wptr: int | None = None) -> None:
        """RB_KICK_SYNC: drain the ring on this thread if the engine is idle; a `wptr`
        (RB_KICK_SYNC_WPTR) is published first."""
        with self._regs:
            if wptr is not None:
                self._wptr = wptr & self._ptr_mask
            if (self._thread is None or self._shutdown or self._exec_gen is not None
                    or self._rptr == self._wptr):
                self.doorbells += 1
                self._cond.notify_all()
                return
            self.sync_kicks += 1
            start = self._claim()
        self._drain(start, start[4])  # up to the WPTR it claimed the ring with

    def status(self) -> int:
        busy = self._exec_gen is not None or self._rptr != self._wptr
        return RB_STATUS_BUSY if busy else RB_STATUS_IDLE

    @property
    def busy_ns(self) -> int:
        """Total ns spent executing packets, the one executing now included (RB_BUSY_NS)."""
        with self._regs:
            total, since = self._busy_total, self._busy_since
            if since is not None:
                total += max(0, self.clock() - since)
            return total

    def _reset_reg(self, value: int) -> None:
        if value & 1:
            self.reset()

    def reset(self) -> None:
        with self._cond:
            self._gen += 1
            target = self._gen
            self._rptr = self._wptr = 0
            self.resets += 1
            self._wake.set()
            self._cond.notify_all()
        with self.fence_cond:  # a WAIT notices at once
            self.fence_cond.notify_all()
        if (threading.current_thread() is not self._thread
                and threading.get_ident() != self._executor):
            with self._idle:
                self._reset_waiters += 1
                try:
                    self._idle.wait_for(
                        lambda: self._exec_gen is None or self._exec_gen >= target, RESET_TIMEOUT)
                finally:
                    self._reset_waiters -= 1

    # ------------------------------------------------------------- the thread
    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self.name} already started")
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        with self._cond:
            self._shutdown = True
            self._gen += 1
            self._wake.set()
            self._cond.notify_all()
        with self.fence_cond:
            self.fence_cond.notify_all()

    def join(self, timeout: float) -> bool:
        """-> True when the thread has ended (or never started)."""
        if self._thread is None:
            return True
        if threading.current_thread() is self._thread:  # stop() from an interrupt handler
            return False
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, timeout: float = 1.0) -> bool:
        self.request_stop()
        return self.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._shutdown and (self._rptr == self._wptr
                                              or self._exec_gen is not None):
                    self._cond.wait()
                if self._shutdown:
                    return
                start = self._claim()
            self._drain(start)

    def _claim(self) -> tuple:
        """Make the calling thread the executor (under _cond); -> where it starts: (the
        generation it runs, RB_BASE, RB_SIZE, RPTR, WPTR, whether the ring is usable)."""
        gen = self._gen
        if self._stop_token._gen != gen:  # a reset or shutdown set _wake since
            self._wake.clear()
            self._stop_token = _EngineStop(self, gen)
        self._exec_gen = gen
        self._executor = threading.get_ident()
        self._busy_since = self.clock()
        size, rptr = self._size, self._rptr
        return gen, self._base, size, rptr, self._wptr, self._ring_valid and rptr < size

    def _drain(self, start: tuple, stop_at: int | None = None) -> None:
        """Execute ring packets from RPTR until RPTR == WPTR (or `stop_at`: then the
        packets up to it only), a reset or a shutdown; `start` is what _claim() saw."""
        ctl = self._stop_token
        run_fetch = self.cp.run_ring_fetch
        gen, base, size, rptr, wptr, ring_ok = start
        while True:
            new_rptr = wptr if stop_at is None else stop_at
            try:
                if ring_ok:
                    new_rptr = run_fetch(base, size, rptr, new_rptr, ctl)
                else:
                    self.cp.ring_error(ctl, base, size)
            except Exception:  # noqa: BLE001 - the engine must survive anything
                self.internal_errors += 1
                log.exception("%s: internal error; dropping the ring's pending packets",
                              self.name)
            with self._regs:
                if self._gen == gen:
                    self._rptr = new_rptr
                if (self._gen != gen or self._shutdown or self._rptr == self._wptr
                        or self._rptr == stop_at):
                    self._exec_gen = None
                    self._executor = None
                    self._busy_total += max(0, self.clock() - self._busy_since)
                    self._busy_since = None
                    # a reset's wait hears of it; the engine's thread only if work is left
                    # (woken for nothing, it could steal the next kick's job)
                    if self._reset_waiters:
                        self._idle.notify_all()
                    if self._rptr != self._wptr:
                        self._cond.notify_all()
                    return
                base, size, rptr, wptr = self._base, self._size, self._rptr, self._wptr
                ring_ok = self._ring_valid and rptr < size

    def stats(self) -> dict:
        return dict(self.cp.stats(), doorbells=self.doorbells, sync_kicks=self.sync_kicks,
                    resets=self.resets,
                    engine_internal_errors=self.internal_errors, busy_ns=self.busy_ns)
