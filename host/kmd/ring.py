"""The driver side of an engine's command ring (amdgpu_ring.c).

A ring is a power-of-two sized buffer in VRAM that the driver fills with packets and the
engine's command processor drains. Two byte offsets describe it: the write pointer
(wptr), one past the last packet the driver has published, and the read pointer (rptr),
the next byte the command processor will fetch. When the pointers are equal, the ring
is idle. The driver writes at wptr and publishes new work by writing the new wptr to the
engine's doorbell (RB_DOORBELL); the hardware advances rptr (readable as RB_RPTR) as it
fetches. The driver never lets wptr catch up with rptr from behind — a full ring would
look idle — so at most size - 32 bytes are ever outstanding.

The API is transactional, as in amdgpu:
  alloc(ndw)  remember the old wptr and reserve room for ndw dwords plus alignment
              padding. If the ring is too full, wait (re-reading RB_RPTR) up to
              `timeout` seconds, then raise RingFull: the caller gets a clear error
              instead of a hang if the engine is stuck. The wait calls `sleep(interval)`,
              which the device binds to a condition wait that releases its lock, so the
              interrupt handler (on the engine thread) is never blocked by a full ring.
  extend(ndw) reserve room for ndw more dwords behind what the open transaction holds,
              if the ring has it now (never waits; False otherwise): several jobs of a
              submission batch go into one transaction, published by one commit.
  write(data) stage packet bytes at the reserved position (wrapping at the end);
              rewrite() replaces a staged packet by another of the same size.
  commit()    pad with a NOP to the 8-dword fetch alignment, copy the staged bytes into
              the ring in one VRAM write and ring the doorbell (or, with
              commit(doorbell=False), only publish wptr through RB_WPTR; with
              commit(publish=False), publish nothing: the caller writes the new wptr to
              RB_KICK_SYNC_WPTR itself).
  undo()      drop everything written since alloc(): wptr goes back.
  emit(data)  a whole transaction of one write: alloc(), write(data), commit().
A packet never straddles the end of the ring: when the reservation would cross it,
alloc() first fills the rest of the ring with one NOP and starts again at offset 0, so
the command processor never has to reassemble a packet.
"""

from __future__ import annotations

import time

from pvgpu.host.hw import packets, regs
from pvgpu.host.kmd.errors import InvalidArgument, RingFull

ALIGN_DW = 8  # fetch alignment: commit() pads wptr to a multiple of 8 dwords
DEFAULT_RING_SIZE = 64 << 10
DEFAULT_TIMEOUT = 5.0
_PADS = [b""] + [packets.nop(n) for n in range(1, ALIGN_DW)]  # the padding NOPs (emit, commit)


class Ring:
    """One engine ring: `size` bytes of VRAM at physical address `base`."""

    def __init__(self, mmio, vram, engine: int, base: int, size: int = DEFAULT_RING_SIZE,
                 *, timeout: float = DEFAULT_TIMEOUT, sleep=None, name: str = ""):
        if size & (size - 1) or size < 4096 or base % regs.PAGE_SIZE:
            raise InvalidArgument("ring size must be a power of two >= 4 KiB, base page aligned")
        self.mmio = mmio
        self.vram = vram
        self.engine = engine
        self.base = base
        self.size = size
        self.timeout = timeout
        self.sleep = sleep or time.sleep
        self.name = name or regs.ENGINE_NAMES.get(engine, f"engine{engine}")
        self.wptr = 0  # published write pointer (bytes)
        self._rptr = 0  # last RB_RPTR value read
        self._wptr_old = None  # set between alloc() and commit()/undo()
        self._pos = 0  # where write() puts the next byte
        self._reserved = 0  # bytes reserved by alloc()
        self._written = 0  # bytes written since alloc()
        self._staged = []  # bytes written since alloc(), not yet in VRAM (commit() puts them)
        self.packets_committed = 0  # transactions committed (one WPTR write each)
        self.full_waits = 0
        self._doorbell = regs.REG_ENGINE(engine, regs.RB_DOORBELL)
        self._wptr_reg = regs.REG_ENGINE(engine, regs.RB_WPTR)
        self.kick_sync_reg = regs.REG_ENGINE(engine, regs.RB_KICK_SYNC)
        self.kick_sync_wptr_reg = regs.REG_ENGINE(engine, regs.RB_KICK_SYNC_WPTR)
        self.max_dw = (self.size - 4 * ALIGN_DW) // 4 - ALIGN_DW  # the largest alloc() ever

    def _reg(self, reg: int) -> int:
        return regs.REG_ENGINE(self.engine, reg)

    def init(self) -> None:
        """Program the ring registers (the engine must be stopped or idle)."""
        self.mmio.write(self._reg(regs.RB_RESET), 1)
        self.mmio.write(self._reg(regs.RB_BASE), self.base)
        self.mmio.write(self._reg(regs.RB_SIZE), self.size)
        self.wptr = self._rptr = 0
        self._wptr_old = None
        self._staged = []

    def after_reset(self) -> None:
        """The engine was reset (RB_RESET): the hardware's pointers are 0, and so are ours."""
        self.wptr = self._rptr = 0
        self._wptr_old = None
        self._staged = []

    def read_rptr(self) -> int:
        self._rptr = self.mmio.read(self._reg(regs.RB_RPTR)) % self.size
        return self._rptr

    def _free_bytes(self, rptr: int) -> int:
        return (rptr - self.wptr) % self.size or self.size

    def free_bytes(self) -> int:
        """Room left right now (re-reads RB_RPTR)."""
        return self._free_bytes(self.read_rptr())

    @property
    def idle(self) -> bool:
        return self.read_rptr() == self.wptr

    @property
    def in_transaction(self) -> bool:
        """Whether alloc() has opened a transaction that is not committed or undone yet."""
        return self._wptr_old is not None

    def alloc(self, ndw: int) -> None:
        assert self._wptr_old is None, "ring alloc() while a transaction is open"
        self._reserve(ndw, wait=True)

    def extend(self, ndw: int) -> bool:
        """Reserve room for ndw more dwords in the open transaction, behind what it holds,
        if the ring has that room now; -> False (nothing reserved) if it has not: the
        caller commits the transaction and alloc()s anew. Never waits."""
        assert self._wptr_old is not None, "ring extend() without alloc()"
        return self._reserve(ndw, wait=False)

    def _reserve(self, ndw: int, wait: bool) -> bool:
        if ndw <= 0 or ndw > self.max_dw:
            raise InvalidArgument(f"ring alloc of {ndw} dwords (max {self.max_dw})")
        size, wptr = self.size, self.wptr
        pos = wptr if self._wptr_old is None else self._pos
        nbytes = 4 * (-(-ndw // ALIGN_DW) * ALIGN_DW)
        skip = size - pos if pos + nbytes > size else 0
        need = (pos - wptr) % size + skip + nbytes  # what the transaction then holds
        # need < free: the pointers must never become equal through the driver writing
        if need >= self._free_bytes(self._rptr) and need >= self._free_bytes(self.read_rptr()):
            if not wait:
                return False
            self.full_waits += 1
            deadline = time.monotonic() + self.timeout
            while need >= self._free_bytes(self.read_rptr()):
                if time.monotonic() >= deadline:
                    raise RingFull(f"{self.name} ring full: {need} bytes needed, wptr "
                                   f"{self.wptr:#x} rptr {self._rptr:#x}")
                self.sleep(0.0005)
        if self._wptr_old is None:
            self._wptr_old = self._pos = wptr
        while skip:  # one NOP to the end of the ring (several if it is huge)
            dw = min(skip // 4, packets.MAX_BODY_DW + 1)
            self._write_raw(packets.nop(dw))
            skip -= 4 * dw
        assert self._pos == pos or self._pos == 0
        self._reserved = nbytes
        self._written = 0
        return True

    def _write_raw(self, data: bytes) -> None:
        """Stage packet bytes at _pos; _flush() copies them into VRAM in one go."""
        self._staged.append(data)
        self._pos = (self._pos + len(data)) % self.size

    def _flush(self) -> None:
        staged = self._staged
        data = staged[0] if len(staged) == 1 else b"".join(staged)
        staged.clear()
        if not data:
            return
        pos = self._wptr_old
        first = min(len(data), self.size - pos)
        self.vram.write(self.base + pos, data[:first])
        if first < len(data):
            self.vram.write(self.base, data[first:])

    def write(self, data: bytes) -> int:
        """Stage a packet; -> its index in the transaction (for rewrite())."""
        n = len(data)
        assert self._wptr_old is not None, "ring write() outside alloc()/commit()"
        assert n % 4 == 0 and self._written + n <= self._reserved, \
            "ring write() of a partial dword or beyond the reservation"
        self._written += n
        self._staged.append(data)
        self._pos = (self._pos + n) % self.size
        return len(self._staged) - 1

    def rewrite(self, index: int, data: bytes) -> None:
        """Replace the packet write() staged as `index` in the open transaction by one of
        the same size (e.g. set a flag of a FENCE before the commit publishes it)."""
        assert self._wptr_old is not None and len(data) == len(self._staged[index])
        self._staged[index] = data

    def commit(self, doorbell: bool = True, publish: bool = True) -> int:
        """Pad, publish the new wptr through the doorbell; -> the new wptr. Without
        `doorbell` the wptr is published (RB_WPTR) but the engine is not woken: the caller
        then runs the ring itself (RB_KICK_SYNC). Without `publish`, no register is
        written: the caller publishes and runs it in one write (RB_KICK_SYNC_WPTR)."""
        assert self._wptr_old is not None, "ring commit() without alloc()"
        pad_dw = (-(self._pos // 4)) % ALIGN_DW
        if pad_dw:
            self._write_raw(_PADS[pad_dw])
        self._flush()
        self.wptr = self._pos
        self._wptr_old = None
        self.packets_committed += 1
        if publish:
            self.mmio.write(self._doorbell if doorbell else self._wptr_reg, self.wptr)
        return self.wptr

    def emit(self, data: bytes, doorbell: bool = True, publish: bool = True) -> int:
        """alloc(), write(data) and commit(doorbell, publish) as one transaction; -> the
        new wptr.
        When the padded data fits before the end of the ring and the last RB_RPTR read
        shows room for it, it goes into VRAM with its padding in one write."""
        assert self._wptr_old is None, "ring emit() while a transaction is open"
        ndw = len(data) >> 2
        pad = -ndw % ALIGN_DW
        wptr, size = self.wptr, self.size
        end = wptr + 4 * (ndw + pad)
        if (end > size or end - wptr >= ((self._rptr - wptr) % size or size)
                or not 0 < ndw <= self.max_dw):
            self.alloc(ndw)  # the general path: it may wrap, wait for room or refuse
            self.write(data)
            return self.commit(doorbell, publish)
        self.vram.write(self.base + wptr, data + _PADS[pad] if pad else data)
        self.wptr = end if end < size else 0
        self.packets_committed += 1
        if publish:
            self.mmio.write(self._doorbell if doorbell else self._wptr_reg, self.wptr)
        return self.wptr

    def undo(self) -> None:
        assert self._wptr_old is not None, "ring undo() without alloc()"
        self._staged.clear()
        self.wptr = self._wptr_old
        self._wptr_old = None
