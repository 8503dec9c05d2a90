"""An engine: one ring, its registers and the thread that runs its command processor.

Ring protocol (as in amdgpu_ring.c): the driver writes packets into the ring at WPTR and
publishes the new WPTR with a doorbell (RB_DOORBELL), which wakes the engine's thread.
The engine executes packets while RPTR != WPTR and advances RB_RPTR after each packet.
When the pointers are equal, the ring is idle. Pointers are byte offsets in
[0, RB_SIZE); a written WPTR is taken modulo RB_SIZE and rounded down to a dword (so a
free-running WPTR works too). RB_WPTR may also be written without a doorbell: the value
is published but the engine is not woken (it will see it when it next looks).

RB_STATUS reads BUSY while a packet is executing or RPTR != WPTR.

RB_RESET (write 1): the current packet is abandoned at its next stop check (burn checks
at least every millisecond, WAIT immediately, COPY between extents and 32 MiB chunks,
IBs between packets; a numpy kernel call already running finishes first), pending
packets are dropped and RPTR = WPTR = 0; RB_BASE/RB_SIZE are kept. Work stopped by a
reset raises no interrupts. The write returns once the engine has left the abandoned
packet (bounded by RESET_TIMEOUT), except when written from the engine's own thread (an
interrupt handler), where the engine stops after the handler returns.

A ring configuration that is unusable (RB_SIZE not a power of two >= 4 KiB, RB_BASE not
page aligned, or the ring outside VRAM) makes a doorbell raise IRQ_ILLEGAL_PACKET
(address = RB_BASE) and drop the submitted packets.
"""

from __future__ import annotations

import logging
import threading

from host.hw.command_processor import CommandProcessor
from host.hw.kernels import StopToken
from host.hw.regs import (ENGINE_NAMES, PAGE_SIZE, RB_BASE, RB_DOORBELL, RB_RESET, RB_RPTR,
                          RB_SIZE, RB_STATUS, RB_STATUS_BUSY, RB_STATUS_IDLE, RB_WPTR,
                          REG_ENGINE)
from host.hw.mmio import RO, RW, WO

log = logging.getLogger("pvgpu.hw.engine")

RESET_TIMEOUT = 1.0


class Engine:
    def __init__(self, engine: int, vram, mmu, irq, fence_cond, name: str = "gpu", cus=None):
        self.id = engine
        self.vram = vram
        self.fence_cond = fence_cond
        self.name = f"{name}.{ENGINE_NAMES.get(engine, engine)}"
        self.cp = CommandProcessor(engine, vram, mmu, irq, fence_cond, name, cus)
        self._cond = threading.Condition()
        self._wake = threading.Event()  # set on reset/shutdown: cuts sleeps short
        self._base = 0
        self._size = 0
        self._rptr = 0
        self._wptr = 0
        self._gen = 0  # bumped by reset and shutdown: work of an older gen is abandoned
        self._exec_gen = None  # gen of the packet executing now, None when idle
        self._shutdown = False
        self._thread: threading.Thread | None = None
        self.doorbells = 0
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

    def _set_base(self, value: int) -> None:
        with self._cond:
            self._base = value

    def _set_size(self, value: int) -> None:
        with self._cond:
            self._size = value

    def _ring_ok(self) -> bool:
        size, base = self._size, self._base
        return (size >= PAGE_SIZE and size & (size - 1) == 0 and base % PAGE_SIZE == 0
                and base + size <= self.vram.size)

    def _mask_wptr(self, value: int) -> int:
        if self._ring_ok():
            value &= self._size - 1
        return value & ~3

    def _set_wptr(self, value: int) -> None:
        with self._cond:
            self._wptr = self._mask_wptr(value)

    def doorbell(self, value: int) -> None:
        with self._cond:
            self._wptr = self._mask_wptr(value)
            self.doorbells += 1
            self._cond.notify_all()

    def status(self) -> int:
        busy = self._exec_gen is not None or self._rptr != self._wptr
        return RB_STATUS_BUSY if busy else RB_STATUS_IDLE

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
        if threading.current_thread() is not self._thread:
            with self._cond:
                self._cond.wait_for(
                    lambda: self._exec_gen is None or self._exec_gen >= target, RESET_TIMEOUT)

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
                while not self._shutdown and self._rptr == self._wptr:
                    self._cond.wait()
                if self._shutdown:
                    return
                gen = self._gen
                self._wake.clear()
                self._exec_gen = gen
                base, size, rptr, wptr = self._base, self._size, self._rptr, self._wptr
                ring_ok = self._ring_ok() and rptr < size and wptr < size
            ctl = StopToken(lambda: self._gen != gen, self._wake)
            new_rptr = wptr
            try:
                if ring_ok:
                    new_rptr = self.cp.run_ring_packet(base, size, rptr, wptr, ctl)
                else:
                    self.cp.ring_error(ctl, base, size)
            except Exception:  # noqa: BLE001 - the engine thread must survive anything
                self.internal_errors += 1
                log.exception("%s: internal error; dropping the ring's pending packets",
                              self.name)
            with self._cond:
                self._exec_gen = None
                if self._gen == gen:
                    self._rptr = new_rptr
                self._cond.notify_all()

    def stats(self) -> dict:
        return dict(self.cp.stats(), doorbells=self.doorbells, resets=self.resets,
                    engine_internal_errors=self.internal_errors)
