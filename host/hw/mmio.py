"""MMIO register file of one emulated GPU (the BAR0 register aperture).

Registers are 64 bits wide at 8-byte aligned offsets (host/hw/regs.py). The register
file only stores values and dispatches side effects: the GPU builder `define`s each
register with its access mode and hooks (a doorbell write wakes an engine, a
VM_INVALIDATE write flushes the TLB, RB_RESET resets an engine, RB_RPTR reads the
engine's read pointer). Like a real bus:

  - reading an unknown (or misaligned) offset returns 0, writing one is ignored;
  - writing a read-only register is ignored; reading a write-only register returns 0;
  - values are truncated to 64 bits.

Every ignored access is counted (unknown_reads, unknown_writes, ignored_writes) so tests
and the KMD's debug output can spot driver bugs.
"""

from __future__ import annotations

import functools
import logging

log = logging.getLogger("pvgpu.hw.mmio")

MASK64 = (1 << 64) - 1

RW, RO, WO = "rw", "ro", "wo"


class Register:
    __slots__ = ("name", "mode", "value", "on_read", "on_write")

    def __init__(self, name, mode, value, on_read, on_write):
        self.name = name
        self.mode = mode
        self.value = value
        self.on_read = on_read
        self.on_write = on_write


class RegisterFile:
    def __init__(self, name: str = "gpu"):
        self.name = name
        self._regs: dict[int, Register] = {}
        self.unknown_reads = 0
        self.unknown_writes = 0
        self.ignored_writes = 0

    def define(self, offset: int, name: str, mode: str = RW, value: int = 0,
               on_read=None, on_write=None) -> None:
        """Declare a register. on_read() -> int replaces the stored value on reads;
        on_write(value) runs after the value is stored."""
        assert offset % 8 == 0 and offset not in self._regs, hex(offset)
        assert mode in (RW, RO, WO)
        self._regs[offset] = Register(name, mode, value & MASK64, on_read, on_write)

    # --------------------------------------------------------------- bus accesses
    def read(self, offset: int) -> int:
        reg = self._regs.get(offset)
        if reg is None:
            self.unknown_reads += 1
            return 0
        if reg.mode == WO:
            return 0
        if reg.on_read is not None:
            return int(reg.on_read()) & MASK64
        return reg.value

    def reader(self, offset: int):
        """-> a callable that reads the register at `offset` as read() does, for a driver
        that reads it on every operation (the clock): a readable register's read hook
        itself when it has one (its value is then taken as the hook returns it), else
        read() of that offset."""
        reg = self._regs.get(offset)
        if reg is not None and reg.mode != WO and reg.on_read is not None:
            return reg.on_read
        return functools.partial(self.read, offset)

    def writer(self, offset: int):
        """-> a callable that writes the register at `offset` as write() does, for a driver
        that writes it on every operation (a ring's kick): a write-only register's write
        hook itself when it has one (the value it would store is never read back; the
        caller passes values of 64 bits at most), else write() of that offset."""
        reg = self._regs.get(offset)
        if reg is not None and reg.mode == WO and reg.on_write is not None:
            return reg.on_write
        return functools.partial(self.write, offset)

    def write(self, offset: int, value: int) -> None:
        value = int(value) & MASK64
        reg = self._regs.get(offset)
        if reg is None:
            self.unknown_writes += 1
            log.debug("%s: write %#x to unknown register %#x ignored", self.name, value, offset)
            return
        if reg.mode == RO:
            self.ignored_writes += 1
            return
        reg.value = value
        if reg.on_write is not None:
            reg.on_write(value)

    # ------------------------------------------------------------- hardware side
    def peek(self, offset: int) -> int:
        """The stored value, without side effects (hardware/tests)."""
        return self._regs[offset].value

    def poke(self, offset: int, value: int) -> None:
        """Set a stored value from the hardware side (e.g. a read-only status)."""
        self._regs[offset].value = int(value) & MASK64

    def name_of(self, offset: int) -> str | None:
        reg = self._regs.get(offset)
        return reg.name if reg else None
