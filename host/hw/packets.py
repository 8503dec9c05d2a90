"""Command packets the command processor executes (the PM4 of the emulated GPU).

A packet is a little-endian dword stream: a header dword `opcode | (body_dwords << 8)`
followed by `body_dwords` dwords. The KMD writes packets into an engine's ring (and into
indirect buffers); the command processor of that engine decodes them. Packets in the ring
run in VMID 0 (physical VRAM addresses); an INDIRECT_BUFFER names the VMID its packets
run in, so every address inside an IB is a GPU virtual address of that VMID.

  NOP             body: any (padding)
  INDIRECT_BUFFER addr_lo addr_hi length_dw vmid      IB at VRAM physical addr (KMD-owned);
                                                      an IB may not contain IB/FENCE/TLB_FLUSH
  COPY            src_lo src_hi dst_lo dst_hi size_lo size_hi       copy engine only
  LAUNCH          kernel_id gx gy gz bx by bz nargs (arg_lo arg_hi)*nargs   compute only
  FENCE           addr_lo addr_hi seq_lo seq_hi flags [stamp_lo stamp_hi]
                                                      write u64 seq at VRAM physical addr;
                                                      FENCE_IRQ raises IRQ_FENCE(seq); with
                                                      stamp (a 7-dword body), first write the
                                                      u64 seq and the u64 completion time at
                                                      VRAM physical stamp (16 bytes)
  WAIT            addr_lo addr_hi value_lo value_hi    stall until u64 at addr >= value
  TLB_FLUSH       vmid                                 drop the TLB entries of vmid
  LAUNCH_CODE     object_lo object_hi entry_lo entry_hi gx gy gz bx by bz dyn_shared
                  params_lo params_hi params_size reserved             compute only
                  run entry `entry` (VA of its record) of the code object at VA `object`
                  (spec/isa.md), parameters read from VA `params`; reserved is 0
"""

import struct

PKT_NOP = 0x00
PKT_INDIRECT_BUFFER = 0x01
PKT_COPY = 0x02
PKT_LAUNCH = 0x03
PKT_FENCE = 0x04
PKT_WAIT = 0x05
PKT_TLB_FLUSH = 0x06
PKT_LAUNCH_CODE = 0x07
PKT_NAMES = {PKT_NOP: "NOP", PKT_INDIRECT_BUFFER: "INDIRECT_BUFFER", PKT_COPY: "COPY",
             PKT_LAUNCH: "LAUNCH", PKT_FENCE: "FENCE", PKT_WAIT: "WAIT", PKT_TLB_FLUSH: "TLB_FLUSH",
             PKT_LAUNCH_CODE: "LAUNCH_CODE"}
LAUNCH_FIXED_DW = 8  # body dwords of LAUNCH before its arguments
LAUNCH_CODE_DW = 15  # body dwords of LAUNCH_CODE
FENCE_IRQ = 1
MAX_BODY_DW = 0xFFFF
MAX_LAUNCH_ARGS = (MAX_BODY_DW - LAUNCH_FIXED_DW) // 2  # two dwords per argument


def header(opcode: int, body_dw: int) -> int:
    assert 0 <= body_dw <= MAX_BODY_DW
    return opcode | (body_dw << 8)


def split_header(hdr: int) -> tuple:
    """-> (opcode, body_dw)"""
    return hdr & 0xFF, (hdr >> 8) & 0xFFFF


def _lo_hi(v: int) -> tuple:
    return v & 0xFFFFFFFF, (v >> 32) & 0xFFFFFFFF


def nop(total_dw: int = 1) -> bytes:
    """A NOP that occupies exactly total_dw dwords (used for padding)."""
    if total_dw < len(_NOPS):
        return _NOPS[total_dw]
    assert total_dw >= 1
    return struct.pack("<I", header(PKT_NOP, total_dw - 1)) + bytes(4 * (total_dw - 1))


_NOPS = [b""] + [struct.pack("<I", header(PKT_NOP, n - 1)) + bytes(4 * (n - 1))
                 for n in range(1, 9)]  # the ring's padding: built once
_IB_HEADER = header(PKT_INDIRECT_BUFFER, 4)
_FENCE_HEADER = header(PKT_FENCE, 5)
_STAMPED_FENCE_HEADER = header(PKT_FENCE, 7)
FENCE_BODY_DW = 5  # ... and STAMPED_FENCE_BODY_DW with a timestamp slot
STAMPED_FENCE_BODY_DW = 7
FENCE_FLAGS_DW = 5  # the flags dword's index in a FENCE packet (header first)


def indirect_buffer(addr: int, length_dw: int, vmid: int) -> bytes:
    return struct.pack("<5I", _IB_HEADER, addr & 0xFFFFFFFF, addr >> 32, length_dw, vmid)


def copy(src: int, dst: int, size: int) -> bytes:
    return struct.pack("<7I", header(PKT_COPY, 6), *_lo_hi(src), *_lo_hi(dst), *_lo_hi(size))


def launch(kernel_id: int, grid, block, args) -> bytes:
    n = len(args)
    if n < len(_LAUNCHES):
        fmt = _LAUNCHES[n]
    else:
        assert n <= MAX_LAUNCH_ARGS
        fmt = _launch_struct(n)
    if args and min(args) < 0:
        args = [a & 0xFFFFFFFFFFFFFFFF for a in args]
    return fmt.pack(PKT_LAUNCH | (LAUNCH_FIXED_DW + 2 * n) << 8, kernel_id, *grid, *block, n,
                    *args)  # (header(PKT_LAUNCH, ...), without the call)


def _launch_struct(nargs: int) -> struct.Struct:
    return struct.Struct(f"<9I{nargs}Q")


_LAUNCHES = [_launch_struct(n) for n in range(17)]  # the common argument counts: built once


def fence(addr: int, seq: int, flags: int = FENCE_IRQ, stamp: int | None = None) -> bytes:
    """FENCE; `stamp`: the 16-byte, 16-aligned VRAM slot that gets (seq, completion time)."""
    if stamp is None:
        return struct.pack("<6I", _FENCE_HEADER, addr & 0xFFFFFFFF, addr >> 32,
                           seq & 0xFFFFFFFF, (seq >> 32) & 0xFFFFFFFF, flags)
    return struct.pack("<8I", _STAMPED_FENCE_HEADER, addr & 0xFFFFFFFF, addr >> 32,
                       seq & 0xFFFFFFFF, (seq >> 32) & 0xFFFFFFFF, flags,
                       stamp & 0xFFFFFFFF, stamp >> 32)


def wait(addr: int, value: int) -> bytes:
    return struct.pack("<5I", header(PKT_WAIT, 4), *_lo_hi(addr), *_lo_hi(value))


def tlb_flush(vmid: int) -> bytes:
    return struct.pack("<2I", header(PKT_TLB_FLUSH, 1), vmid)


def launch_code(object_va: int, entry_va: int, grid, block, dyn_shared: int, params_va: int,
                params_size: int) -> bytes:
    body = struct.pack("<4I", *_lo_hi(object_va), *_lo_hi(entry_va))
    body += struct.pack("<7I", *grid, *block, dyn_shared)
    body += struct.pack("<4I", *_lo_hi(params_va), params_size, 0)
    return struct.pack("<I", header(PKT_LAUNCH_CODE, LAUNCH_CODE_DW)) + body
