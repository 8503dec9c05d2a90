"""Interrupt controller of one emulated GPU (the IH block).

An engine raises an Interrupt record (source = regs.IRQ_*). When REG_IRQ_ENABLE is 1 the
controller calls the KMD's handler synchronously on the thread executing the raising
engine's packets (its own thread, or the thread that wrote RB_KICK_SYNC), like a top-half
running in interrupt context: the handler should be short and must not wait for the
engine that called it. Handlers of different engines may run concurrently, so the
handler must be thread-safe. No lock is held while the handler runs: it may write MMIO
registers (ring a doorbell, reset an engine).

While REG_IRQ_ENABLE is 0 interrupts are latched (up to MAX_LATCHED, oldest dropped and
counted); writing 1 delivers the latched ones, in order, on the writing thread.

A handler exception never reaches the engine: it is logged and counted.

Every Interrupt carries `timestamp`, the device clock (Gpu.clock_ns, ns on the host's
monotonic base) when the hardware raised it, like the timestamp in an amdgpu IV ring
entry: for IRQ_FENCE it is when the fence value was written (the job completed), not when
the handler runs, so a latched interrupt keeps its original time.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import NamedTuple

from pvgpu.host.hw.regs import ENGINE_NAMES, IRQ_NAMES

log = logging.getLogger("pvgpu.hw.irq")

MAX_LATCHED = 4096


class Interrupt(NamedTuple):
    """One interrupt vector entry (immutable; a tuple, cheap to make per fence)."""

    source: int  # regs.IRQ_*
    engine: int  # regs.ENGINE_*
    vmid: int = 0
    address: int = 0
    access: int = 0  # pvgpu.spec.kernels.ACCESS_* (page faults)
    data: int = 0
    timestamp: int = 0  # device clock (ns) when the interrupt was raised

    def __str__(self):
        return (f"{IRQ_NAMES.get(self.source, self.source)} "
                f"engine={ENGINE_NAMES.get(self.engine, self.engine)} vmid={self.vmid} "
                f"address={self.address:#x} access={self.access} data={self.data:#x} "
                f"timestamp={self.timestamp}")


class InterruptController:
    def __init__(self, name: str = "gpu"):
        self.name = name
        self._lock = threading.Lock()
        self._handler = None
        self._enabled = False
        self._latched: collections.deque = collections.deque()
        self.raised = 0
        self.delivered = 0
        self.dropped = 0  # latched interrupts lost to overflow
        self.unhandled = 0  # enabled but no handler set
        self.handler_errors = 0
        self.counts = collections.defaultdict(int)  # by source

    def set_handler(self, fn) -> None:
        """fn(Interrupt) -> None, or None to detach."""
        self._handler = fn

    @property
    def enabled(self) -> bool:
        return self._enabled

    @property
    def latched(self) -> int:
        return len(self._latched)

    def pending(self) -> list:
        """A copy of the latched interrupts (debugging)."""
        with self._lock:
            return list(self._latched)

    def set_enabled(self, enabled: bool) -> None:
        """The REG_IRQ_ENABLE hook."""
        with self._lock:
            self._enabled = bool(enabled)
            backlog = list(self._latched) if self._enabled else []
            if self._enabled:
                self._latched.clear()
        for irq in backlog:
            self.raise_irq(irq, raised=False)

    def raise_irq(self, irq: Interrupt, raised: bool = True) -> None:
        """Hand irq to the handler: a raised one (counted, and latched while interrupts
        are disabled), or (raised=False) a latched one once they are enabled. One lock
        hold for the latch check and the handler's pick."""
        with self._lock:
            if raised:
                self.raised += 1
                self.counts[irq.source] += 1
                if not self._enabled:
                    if len(self._latched) >= MAX_LATCHED:
                        self._latched.popleft()
                        self.dropped += 1
                    self._latched.append(irq)
                    return
            handler = self._handler
            if handler is not None:
                self.delivered += 1  # taken back if the handler fails
            else:
                self.unhandled += 1
        if handler is None:
            log.debug("%s: no handler for %s", self.name, irq)
            return
        try:
            handler(irq)
        except Exception:  # noqa: BLE001 - the handler must never kill an engine thread
            self._failed(irq)

    def _failed(self, irq: Interrupt) -> None:
        with self._lock:
            self.handler_errors += 1
            self.delivered -= 1
        log.exception("%s: interrupt handler failed on %s", self.name, irq)
