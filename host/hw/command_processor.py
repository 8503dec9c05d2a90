"""The command processor: decodes and executes packets (host/hw/packets.py) for one engine.

Where packets come from. The ring is RB_SIZE bytes of VRAM at RB_BASE, read as dwords
modulo RB_SIZE: a packet may straddle the end of the ring. Ring packets run in VMID 0
(VRAM physical addresses). An INDIRECT_BUFFER packet makes the CP fetch `length_dw`
dwords at a VRAM physical address and execute them in the IB's VMID, then return to the
ring; the RB_RPTR moves past the IB packet only when the whole IB is done.

What each packet does:
  NOP              nothing (any body length)
  INDIRECT_BUFFER  ring only; see above (vmid < NUM_VMIDS, IB inside VRAM, dword aligned)
  COPY             copy engines only (either of regs.COPY_ENGINES: copy0 and copy1 are
                   identical DMA engines): translate src with READ and dst with WRITE, then
                   copy extent by extent with np.copyto (memcpy speed; numpy drops the GIL).
                   As on real DMA engines, overlapping src and dst give undefined results.
  LAUNCH           compute engine only: run a built-in kernel (host/hw/kernels.py)
  LAUNCH_CODE      compute engine only: run an entry of a code object on the streaming
                   multiprocessors (host/hw/sm, spec/isa.md), in the IB's VMID; the
                   reserved dword must be 0
  FENCE            ring only: with a stamp slot (7-dword body), write the u64 seq and the
                   u64 device clock at the slot's VRAM physical address (16-aligned);
                   write the u64 seq at a VRAM physical address (8-aligned), wake every
                   WAIT of the GPU, then with FENCE_IRQ raise IRQ_FENCE(engine,
                   address=addr, data=seq, timestamp=the device clock when seq was
                   written, i.e. when the work before the fence completed). Without
                   FENCE_IRQ nothing is raised: a later fence's interrupt covers it, and
                   the stamp slot keeps its completion time for the driver
  WAIT             ring only: stall until the u64 at the VRAM physical address >= value;
                   sleeps on the GPU's fence condition (woken by every FENCE, re-checked
                   every WAIT_POLL seconds for CPU writes), stoppable by reset/shutdown;
                   the engine counts a stalled WAIT as busy time (RB_BUSY_NS)
  TLB_FLUSH        ring only: flush the TLB of vmid (VM_INVALIDATE_ALL: every VMID)

Errors. A packet that cannot be executed as written — unknown opcode, wrong body length,
a body running past WPTR or past the end of its IB, a packet on the wrong engine or a
ring-only packet inside an IB, an unknown kernel or a wrong argument count, an address
outside VRAM — raises IRQ_ILLEGAL_PACKET(engine, vmid, address = byte offset of the
packet in the ring or IB, data = header dword). A page fault during COPY, LAUNCH or
LAUNCH_CODE raises IRQ_PAGE_FAULT(engine, vmid, address, access). A code object that fails
validation, a launch that does not fit its entry, or a kernel that executes `trap` raises
IRQ_CODE_FAULT(engine, vmid, address = VA of the offending record, data = COBJ_ERR_*
reason). Either way, inside an IB the rest of the IB
is skipped; in the ring only that packet is (a packet running past WPTR drops everything
up to WPTR). Execution then goes on with the next ring packet, so a FENCE after a faulting
IB still signals. Interrupts of work that was stopped by a reset are not raised.

Every interrupt carries `timestamp`: the device clock (the `clock` callable the Gpu
passes in, Gpu.clock_ns) read when the CP raised it (for IRQ_FENCE: when it wrote the
fence value).
"""

from __future__ import annotations

import logging
import struct
import threading
import time

import numpy as np

from pvgpu.host.hw import kernels
from pvgpu.host.hw.interrupts import Interrupt
from pvgpu.host.hw.mmu import MmuFault
from pvgpu.host.hw.packets import (FENCE_BODY_DW, FENCE_IRQ, LAUNCH_CODE_DW, LAUNCH_FIXED_DW,
                             PKT_COPY, PKT_FENCE, PKT_INDIRECT_BUFFER, PKT_LAUNCH, PKT_LAUNCH_CODE,
                             PKT_NAMES, PKT_NOP, PKT_TLB_FLUSH, PKT_WAIT,
                             STAMPED_FENCE_BODY_DW)
from pvgpu.host.hw.regs import (COPY_ENGINES, ENGINE_COMPUTE, ENGINE_NAMES, IRQ_CODE_FAULT, IRQ_FENCE,
                          IRQ_ILLEGAL_PACKET, IRQ_PAGE_FAULT, NUM_VMIDS, VM_INVALIDATE_ALL)
from pvgpu.host.hw.sm import CodeFault, CodeLaunch, StreamingMultiprocessors
from pvgpu.spec.kernels import ACCESS_READ, ACCESS_WRITE

log = logging.getLogger("pvgpu.hw.cp")

# A COPY checks for reset between chunks of COPY_CHUNK bytes (memcpy in smaller pieces
# runs ~20 % slower here: glibc switches to non-temporal stores only for large copies).
# Pieces of at least COPY_SPLIT bytes are shared out to the copy engines' DMA lanes, one
# worker thread per host CPU (Gpu.dma_lanes), in LANE_PIECE bytes at a time (memcpy in
# pieces this large runs as fast as in one); smaller ones are not worth the handoff.
COPY_CHUNK = 256 << 20
COPY_SPLIT = 8 << 20
LANE_PIECE = 2 << 20
RING_FETCH_DW = 16  # dwords fetched with a ring packet's header (its body, if it fits)
WAIT_POLL = 0.002  # seconds between re-checks of a WAIT (CPU writes do not notify)
RING_ONLY = frozenset({PKT_INDIRECT_BUFFER, PKT_FENCE, PKT_WAIT, PKT_TLB_FLUSH})
BODY_DW = {PKT_INDIRECT_BUFFER: 4, PKT_COPY: 6, PKT_WAIT: 4, PKT_TLB_FLUSH: 1,
           PKT_LAUNCH_CODE: LAUNCH_CODE_DW}  # FENCE: 5, or 7 with a stamp slot (_fence)


class _Illegal(Exception):
    pass


def _u64(lo: int, hi: int) -> int:
    return lo | (hi << 32)


_DWORDS = [struct.Struct(f"<{n}I") for n in range(2 * RING_FETCH_DW + 1)]
_SEQ = struct.Struct("<Q")
_new_tuple = tuple.__new__  # an Interrupt without namedtuple's Python-level __new__
_SEQ_STAMP = struct.Struct("<QQ")


class FenceCondition(threading.Condition):
    """The GPU's fence condition: every FENCE notifies it if a WAIT is waiting on it."""

    def __init__(self):
        self.lock = threading.RLock()  # held as `with cond.lock`: no Python-level __enter__
        super().__init__(self.lock)
        self.waiting = 0  # WAIT packets waiting now (changed with the condition held)


def _dwords(buf, addr: int, ndw: int) -> tuple:
    """ndw little-endian dwords of VRAM at physical addr (the caller checked the range)."""
    fmt = _DWORDS[ndw] if ndw < len(_DWORDS) else struct.Struct(f"<{ndw}I")
    return fmt.unpack_from(buf, addr)


class CommandProcessor:
    def __init__(self, engine: int, vram, mmu, irq, fence_cond, name: str = "gpu", cus=None,
                 clock=time.monotonic_ns):
        self.engine = engine
        self.clock = clock  # () -> device time in ns, stamped on every interrupt
        self.cus = cus if cus is not None else kernels.SERIAL
        self.vram = vram
        self.mmu = mmu
        self.irq = irq
        self.fence_cond = fence_cond
        self.name = f"{name}.{ENGINE_NAMES.get(engine, engine)}"
        handlers = {
            PKT_NOP: self._nop,
            PKT_INDIRECT_BUFFER: self._indirect_buffer,
            PKT_COPY: self._copy,
            PKT_LAUNCH: self._launch,
            PKT_FENCE: self._fence,
            PKT_WAIT: self._wait,
            PKT_TLB_FLUSH: self._tlb_flush,
            PKT_LAUNCH_CODE: self._launch_code,
        }
        # what a packet is looked up in: opcode -> (handler, body dwords or None), for a
        # ring packet and for a packet inside an IB (no ring-only packets there)
        self._ring_ops = {op: (fn, BODY_DW.get(op)) for op, fn in handlers.items()}
        self._ib_ops = {op: v for op, v in self._ring_ops.items() if op not in RING_ONLY}
        self._kernel_mem = {}  # vmid -> its KernelMemory (stateless: made once)
        self.sm = StreamingMultiprocessors(mmu, clock) if engine == ENGINE_COMPUTE else None
        self.packets = 0
        self.ibs = 0
        self.copies = 0
        self.bytes_copied = 0
        self.launches = 0
        self.fences = 0
        self.waits = 0
        self.page_faults = 0
        self.code_faults = 0
        self.illegal_packets = 0
        self.internal_errors = 0

    def stats(self) -> dict:
        out = {k: getattr(self, k) for k in (
            "packets", "ibs", "copies", "bytes_copied", "launches", "fences", "waits",
            "page_faults", "code_faults", "illegal_packets", "internal_errors")}
        if self.sm is not None:
            out["sm"] = self.sm.stats()
        return out

    # ----------------------------------------------------------------- the ring
    def _ring_dwords(self, base: int, size: int, off: int, ndw: int) -> tuple:
        buf = self.vram.buf
        if off + 4 * ndw <= size:
            if ndw < len(_DWORDS):
                return _DWORDS[ndw].unpack_from(buf, base + off)
            return _dwords(buf, base + off, ndw)
        first = (size - off) // 4
        return _dwords(buf, base + off, first) + _dwords(buf, base, ndw - first)

    def run_ring_fetch(self, base: int, size: int, rptr: int, wptr: int,
                       ctl: kernels.StopToken) -> int:
        """Execute the packets of one fetch at rptr (rptr != wptr): the packet there, then
        each packet behind it that was fetched with it (RING_FETCH_DW dwords, never past
        wptr), stopping early on a stop; -> the new rptr."""
        avail = ((wptr - rptr) % size) // 4
        n = avail if avail < RING_FETCH_DW else RING_FETCH_DW
        if rptr + 4 * n <= size:  # (_ring_dwords without a wrap)
            head = _DWORDS[n].unpack_from(self.vram.buf, base + rptr)
        else:
            head = self._ring_dwords(base, size, rptr, n)
        hdr = head[0]
        ndw = (hdr >> 8) & 0xFFFF  # split_header
        if ndw >= avail:
            self._illegal(ctl, 0, rptr, hdr, f"packet of {1 + ndw} dwords runs past WPTR")
            return wptr
        if ndw < n:
            body = head[1:1 + ndw]
        else:
            body = self._ring_dwords(base, size, (rptr + 4) % size, ndw)
        ops = self._ring_ops
        i, end = 0, 1 + ndw
        while True:  # the packet at rptr, then those fetched with it (a job's FENCE, padding)
            opcode = hdr & 0xFF
            if opcode != PKT_NOP:
                op = ops.get(opcode)
                try:
                    if op is None or op[1] is not None and op[1] != len(body):
                        raise _Illegal(self._refusal(opcode, body, ops))
                    op[0](body, 0, ctl)
                except Exception as e:  # noqa: BLE001 - reported by _failed
                    self._failed(e, opcode, 0, ctl, (rptr + 4 * i) % size, hdr)
            self.packets += 1
            i = end
            if i >= n:
                break
            hdr = head[i]
            end = i + 1 + ((hdr >> 8) & 0xFFFF)
            if end > n:
                break
            if hdr & 0xFF != PKT_NOP:  # (a NOP needs neither its body nor a stop check)
                if ctl.stopped():
                    break
                body = head[i + 1:end]
        return (rptr + 4 * i) % size

    def ring_error(self, ctl, base: int, size: int) -> None:
        self._illegal(ctl, 0, base, 0, f"bad ring configuration base={base:#x} size={size:#x}")

    # ----------------------------------------------------------- dispatch
    def _refusal(self, opcode, body, ops) -> str:
        """Why a packet that `ops` (_ring_ops or _ib_ops) has no handler of its length for
        is illegal."""
        if opcode not in ops:
            if opcode in self._ring_ops:
                return f"{PKT_NAMES[opcode]} is not allowed in an indirect buffer"
            return f"unknown opcode {opcode:#x}"
        return f"{PKT_NAMES[opcode]} body of {len(body)} dwords, want {ops[opcode][1]}"

    def _failed(self, exc: Exception, opcode, vmid, ctl, offset, hdr) -> None:
        """A packet raised `exc`: report it as its interrupt (the rest of an IB is skipped)."""
        if isinstance(exc, _Illegal):
            self._illegal(ctl, vmid, offset, hdr, str(exc))
        elif isinstance(exc, MmuFault):
            self.page_faults += 1
            log.info("%s: %s", self.name, exc)
            self._raise(ctl, Interrupt(IRQ_PAGE_FAULT, self.engine, exc.vmid, exc.address,
                                       exc.access, timestamp=self.clock()))
        elif isinstance(exc, CodeFault):
            self.code_faults += 1
            log.info("%s: vmid %d: %s", self.name, vmid, exc)
            self._raise(ctl, Interrupt(IRQ_CODE_FAULT, self.engine, vmid, exc.address, 0,
                                       exc.reason, timestamp=self.clock()))
        else:  # a hardware bug must not kill the engine
            self.internal_errors += 1
            log.exception("%s: internal error executing %s", self.name,
                          PKT_NAMES.get(opcode, opcode))
            self._illegal(ctl, vmid, offset, hdr, "internal error")

    def _raise(self, ctl, irq: Interrupt) -> None:
        if not ctl.stopped():
            self.irq.raise_irq(irq)

    def _illegal(self, ctl, vmid, offset, hdr, reason) -> None:
        self.illegal_packets += 1
        log.info("%s: illegal packet %#010x at %#x (vmid %d): %s", self.name, hdr, offset,
                 vmid, reason)
        self._raise(ctl, Interrupt(IRQ_ILLEGAL_PACKET, self.engine, vmid, offset, 0, hdr,
                                   timestamp=self.clock()))

    def _vram_addr(self, addr: int, nbytes: int, align: int) -> int:
        if addr % align or addr + nbytes > self.vram.size:
            raise _Illegal(f"VRAM address {addr:#x} (+{nbytes}) misaligned or out of range")
        return addr

    # ------------------------------------------------------------- packets
    def _nop(self, body, vmid, ctl):
        pass

    def _indirect_buffer(self, body, vmid, ctl):
        addr = body[0] | body[1] << 32
        length, ib_vmid = body[2], body[3]
        if ib_vmid >= NUM_VMIDS:
            raise _Illegal(f"IB vmid {ib_vmid}")
        if addr & 3 or addr + 4 * length > self.vram.size:
            raise _Illegal(f"VRAM address {addr:#x} (+{4 * length}) misaligned or out of range")
        self.ibs += 1
        dws = (_DWORDS[length] if length < len(_DWORDS) else struct.Struct(f"<{length}I")) \
            .unpack_from(self.vram.buf, addr)
        ops = self._ib_ops
        i = 0
        while i < length:
            if i and ctl.stopped():  # between packets (the IB packet itself just started)
                return
            hdr = dws[i]
            opcode, ndw = hdr & 0xFF, (hdr >> 8) & 0xFFFF  # split_header
            if i + 1 + ndw > length:
                self._illegal(ctl, ib_vmid, 4 * i, hdr, "packet runs past the end of the IB")
                return
            body = dws[i + 1:i + 1 + ndw]
            self.packets += 1
            op = ops.get(opcode)  # (as in run_ring_fetch)
            try:
                if op is None or op[1] is not None and op[1] != ndw:
                    raise _Illegal(self._refusal(opcode, body, ops))
                op[0](body, ib_vmid, ctl)
            except Exception as e:  # noqa: BLE001 - reported by _failed
                self._failed(e, opcode, ib_vmid, ctl, 4 * i, hdr)
                return  # the rest of the IB is skipped
            i += 1 + ndw

    def _copy(self, body, vmid, ctl):
        if self.engine not in COPY_ENGINES:
            raise _Illegal("COPY on a non-copy engine")
        src = _u64(body[0], body[1])
        dst = _u64(body[2], body[3])
        size = _u64(body[4], body[5])
        src_ext = self.mmu.translate(vmid, src, size, ACCESS_READ)
        dst_ext = self.mmu.translate(vmid, dst, size, ACCESS_WRITE)
        self.copies += 1
        si = di = so = do = 0
        lanes = self.cus
        while si < len(src_ext):
            s, d = src_ext[si], dst_ext[di]
            n = min(s.shape[0] - so, d.shape[0] - do, COPY_CHUNK)
            if n >= COPY_SPLIT:  # a large piece goes over the DMA lanes in parallel
                lanes.share(n, lambda lo, hi, d=d[do:do + n], s=s[so:so + n]:
                            np.copyto(d[lo:hi], s[lo:hi]), LANE_PIECE)
            else:
                np.copyto(d[do:do + n], s[so:so + n])
            self.bytes_copied += n
            so += n
            do += n
            if so == s.shape[0]:
                si, so = si + 1, 0
            if do == d.shape[0]:
                di, do = di + 1, 0
            if ctl.stopped():
                return

    def _launch(self, body, vmid, ctl):
        if self.engine != ENGINE_COMPUTE:
            raise _Illegal("LAUNCH on a non-compute engine")
        if len(body) < LAUNCH_FIXED_DW:
            raise _Illegal("LAUNCH body too short")
        kernel_id = body[0]
        grid, block, nargs = body[1:4], body[4:7], body[7]
        if len(body) != LAUNCH_FIXED_DW + 2 * nargs:
            raise _Illegal(f"LAUNCH body of {len(body)} dwords for {nargs} arguments")
        dw = _DWORDS[2 * nargs] if 2 * nargs < len(_DWORDS) else struct.Struct(f"<{2 * nargs}I")
        self.launches += 1
        mem = self._kernel_mem.get(vmid)
        if mem is None:
            mem = self._kernel_mem[vmid] = kernels.KernelMemory(self.mmu, vmid, self.cus)
        try:  # the argument slots, as the packet's bytes
            kernels.launch_slots(kernel_id, grid, block, dw.pack(*body[LAUNCH_FIXED_DW:]), mem,
                                 ctl)
        except kernels.InvalidLaunch as e:
            raise _Illegal(str(e)) from None

    def _launch_code(self, body, vmid, ctl):
        if self.engine != ENGINE_COMPUTE:
            raise _Illegal("LAUNCH_CODE on a non-compute engine")
        if body[14]:
            raise _Illegal("LAUNCH_CODE reserved dword not 0")
        launch = CodeLaunch(object_va=_u64(body[0], body[1]), entry_va=_u64(body[2], body[3]),
                            grid=tuple(body[4:7]), block=tuple(body[7:10]), dyn_shared=body[10],
                            params_va=_u64(body[11], body[12]), params_size=body[13])
        self.launches += 1
        self.sm.launch(vmid, launch, ctl)

    def _fence(self, body, vmid, ctl):
        slot = None
        if len(body) == STAMPED_FENCE_BODY_DW:
            slot = body[5] | body[6] << 32
            if slot & 15 or slot + 16 > self.vram.size:
                raise _Illegal(f"fence stamp slot {slot:#x} misaligned or out of range")
        elif len(body) != FENCE_BODY_DW:
            raise _Illegal(f"FENCE body of {len(body)} dwords, want {FENCE_BODY_DW} or "
                           f"{STAMPED_FENCE_BODY_DW}")
        addr = body[0] | body[1] << 32
        if addr & 7 or addr + 8 > self.vram.size:
            raise _Illegal(f"VRAM address {addr:#x} (+8) misaligned or out of range")
        seq = body[2] | body[3] << 32
        buf = self.vram.buf
        stamp = self.clock()  # the job completed now
        if slot is not None:
            _SEQ_STAMP.pack_into(buf, slot, seq, stamp)
        _SEQ.pack_into(buf, addr, seq)
        cond = self.fence_cond
        if cond.waiting:  # (a WAIT counts itself in, under the lock, before it looks at
            # the value: one that has not yet sees the new value; one that has is notified)
            with cond.lock:
                cond.notify_all()
        self.fences += 1
        # (no stop check here: the fence's work is done, and the ring checked for a stop
        # before the FENCE started: _drain before a fetch, run_ring_fetch within one)
        if body[4] & FENCE_IRQ:  # (Interrupt's fields, in order)
            self.irq.raise_irq(_new_tuple(Interrupt, (IRQ_FENCE, self.engine, 0, addr, 0, seq,
                                                      stamp)))

    def _wait(self, body, vmid, ctl):
        addr = self._vram_addr(_u64(body[0], body[1]), 8, 8)
        value = _u64(body[2], body[3])
        self.waits += 1
        q = self.vram.qwords
        cond = self.fence_cond
        with cond:
            cond.waiting += 1
            try:
                while int(q[addr >> 3]) < value and not ctl.stopped():
                    cond.wait(WAIT_POLL)
            finally:
                cond.waiting -= 1

    def _tlb_flush(self, body, vmid, ctl):
        target = body[0]
        if target == VM_INVALIDATE_ALL:
            self.mmu.flush_all()
        elif target < NUM_VMIDS:
            self.mmu.flush(target)
        else:
            raise _Illegal(f"TLB_FLUSH vmid {target}")
