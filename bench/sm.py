"""The SMs' speed, at the hardware level: code objects run by host/hw/sm against numpy.

  lanes      lane-instructions per second of a divergence-free kernel over 1 Mi threads
             (64 arithmetic instructions per thread between one load and one store)
  divergent  the same figure for a kernel whose threads loop a different number of times
             (tid mod 32 + 1 times: every warp diverges and reconverges)
  vector_add c = a + b over 16 Mi floats, against numpy.add on the same arrays

No host process, no driver: VRAM, an MMU with page tables for one VMID, and the
StreamingMultiprocessors, as the command processor uses them. Kernels are written with
spec/isa.py's encoder. Every figure is a ratio to numpy or a rate; run_bench returns
them (for `pvgpu bench ptx` and the README) and prints them; times are medians.

Usage: python -m pvgpu.bench.sm [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
import struct
import sys

import numpy as np

from pvgpu.bench.common import rounds, write_json
from pvgpu.host.hw.kernels import NEVER_STOP
from pvgpu.host.hw.mmu import Mmu
from pvgpu.host.hw.regs import PAGE_SIZE, PDE_VALID, PT_ENTRIES, PTE_EXEC, PTE_READ, PTE_VALID, PTE_WRITE
from pvgpu.host.hw.sm import CodeLaunch, StreamingMultiprocessors
from pvgpu.host.hw.sysmem import SystemMemory
from pvgpu.host.hw.vram import Vram
from pvgpu.spec import isa
from pvgpu.spec.isa import OPND_PRED, OPND_R32, OPND_R64, OPND_SIMM, OPND_SREG, operand

VMID = 1
RW = PTE_VALID | PTE_READ | PTE_WRITE
EXEC = PTE_VALID | PTE_READ | PTE_EXEC


def r(i):
    return operand(OPND_R32, i)


def rd(i):
    return operand(OPND_R64, i)


def p(i):
    return operand(OPND_PRED, i)


def k(v):
    return operand(OPND_SIMM, v)


def sreg(s):
    return operand(OPND_SREG, s)


def I(op, t=isa.TYPE_NONE, **kw):  # noqa: E743 - an instruction, as in an assembler
    return isa.encode_instruction(op, t, **kw)


def _f32(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def space(s):
    return s << isa.MOD_SPACE_SHIFT


def code_object(code: list, param_size: int, n_r32=32, n_r64=16, n_pred=4) -> bytes:
    """One entry `k` over `code`, in the layout of spec/isa.md."""
    entries = struct.pack(isa.COBJ_ENTRY_FORMAT, 0, 1, 0, len(code), n_r32, n_r64, n_pred, 0, 0,
                          param_size, 0, 0, 0, 0, 0)
    hs = isa.COBJ_HEADER_SIZE
    entries_off = hs
    strtab_off = entries_off + 56
    code_off = strtab_off + 8
    size = code_off + len(code) * isa.INSTR_SIZE
    header = struct.pack(isa.COBJ_HEADER_FORMAT, isa.COBJ_MAGIC, isa.COBJ_VERSION, 0, size,
                         entries_off, 1, 0, 0, 0, 0, strtab_off, 1, code_off, len(code),
                         0, 0, 0, 0, 0, 0, 0, 0, 0)
    out = bytearray(size)
    out[:hs] = header
    out[entries_off:entries_off + len(entries)] = entries
    out[strtab_off] = ord("k")
    out[code_off:] = b"".join(code)
    return bytes(out)


def _global_index(code):
    """r0 = %ctaid.x * %ntid.x + %tid.x."""
    code += [I(isa.OP_MOV, isa.TYPE_U32, d=r(1), a=sreg(isa.SREG_CTAID_X)),
             I(isa.OP_MOV, isa.TYPE_U32, d=r(2), a=sreg(isa.SREG_NTID_X)),
             I(isa.OP_MOV, isa.TYPE_U32, d=r(3), a=sreg(isa.SREG_TID_X)),
             I(isa.OP_MAD, isa.TYPE_U32, d=r(0), a=r(1), b=r(2), c=r(3))]


def vector_add() -> bytes:
    """c[i] = a[i] + b[i] for i < n (params a, b, c: u64 at 0, 8, 16; n: u32 at 24)."""
    ld = space(isa.SPACE_PARAM)
    code = [I(isa.OP_LD, isa.TYPE_U64, mod=ld, d=rd(0), imm=0),
            I(isa.OP_LD, isa.TYPE_U64, mod=ld, d=rd(1), imm=8),
            I(isa.OP_LD, isa.TYPE_U64, mod=ld, d=rd(2), imm=16),
            I(isa.OP_LD, isa.TYPE_U32, mod=ld, d=r(4), imm=24)]
    _global_index(code)
    end = len(code) + 12
    code += [I(isa.OP_SETP, isa.TYPE_U32, mod=isa.CMP_GE << isa.MOD_CMP_SHIFT, d=p(0), a=r(0),
               b=r(4)),
             I(isa.OP_BRA, guard=isa.GUARD_ON | 0, imm=end),
             I(isa.OP_MUL, isa.TYPE_U32, mod=isa.VAR_WIDE << 8, d=rd(3), a=r(0), b=k(4)),
             I(isa.OP_ADD, isa.TYPE_U64, d=rd(4), a=rd(0), b=rd(3)),
             I(isa.OP_ADD, isa.TYPE_U64, d=rd(5), a=rd(1), b=rd(3)),
             I(isa.OP_ADD, isa.TYPE_U64, d=rd(6), a=rd(2), b=rd(3)),
             I(isa.OP_LD, isa.TYPE_F32, mod=space(isa.SPACE_GLOBAL), d=r(5), a=rd(4)),
             I(isa.OP_LD, isa.TYPE_F32, mod=space(isa.SPACE_GLOBAL), d=r(6), a=rd(5)),
             I(isa.OP_ADD, isa.TYPE_F32, d=r(7), a=r(5), b=r(6)),
             I(isa.OP_ST, isa.TYPE_F32, mod=space(isa.SPACE_GLOBAL), a=rd(6), b=r(7)),
             I(isa.OP_NOP), I(isa.OP_NOP)]
    assert len(code) == end
    code.append(I(isa.OP_EXIT))
    return code_object(code, 28)


def alu_chain(divergent: bool) -> bytes:
    """x = in[i]; 64 dependent f32/u32 operations (repeated tid % 32 + 1 times when divergent);
    out[i] = x."""
    ld = space(isa.SPACE_PARAM)
    code = [I(isa.OP_LD, isa.TYPE_U64, mod=ld, d=rd(0), imm=0),
            I(isa.OP_LD, isa.TYPE_U64, mod=ld, d=rd(1), imm=8)]
    _global_index(code)
    code += [I(isa.OP_MUL, isa.TYPE_U32, mod=isa.VAR_WIDE << 8, d=rd(3), a=r(0), b=k(4)),
             I(isa.OP_ADD, isa.TYPE_U64, d=rd(4), a=rd(0), b=rd(3)),
             I(isa.OP_ADD, isa.TYPE_U64, d=rd(5), a=rd(1), b=rd(3)),
             I(isa.OP_LD, isa.TYPE_F32, mod=space(isa.SPACE_GLOBAL), d=r(5), a=rd(4)),
             I(isa.OP_MOV, isa.TYPE_U32, d=r(8), a=k(0)),
             I(isa.OP_MOV, isa.TYPE_F32, d=r(12), a=operand(isa.OPND_IMM), imm=_f32(0.25))]
    loop = len(code)
    body = []
    for j in range(16):  # x stays in [0, 1]: x = 0.7 x + 0.25, then 0.99 x
        body += [I(isa.OP_FMA, isa.TYPE_F32, d=r(5), a=r(5), b=operand(isa.OPND_IMM), c=r(12),
                   imm=_f32(0.7)),
                 I(isa.OP_MUL, isa.TYPE_F32, d=r(5), a=r(5), b=operand(isa.OPND_IMM),
                   imm=_f32(0.99)),
                 I(isa.OP_ADD, isa.TYPE_U32, d=r(9), a=r(0), b=k(j)),
                 I(isa.OP_XOR, isa.TYPE_B32, d=r(10), a=r(9), b=r(0))]
    code += body
    if divergent:
        code += [I(isa.OP_ADD, isa.TYPE_U32, d=r(8), a=r(8), b=k(1)),
                 I(isa.OP_AND, isa.TYPE_B32, d=r(11), a=r(3), b=k(31)),
                 I(isa.OP_SETP, isa.TYPE_U32, mod=isa.CMP_LE << isa.MOD_CMP_SHIFT, d=p(1),
                   a=r(8), b=r(11)),
                 I(isa.OP_BRA, guard=isa.GUARD_ON | 1, imm=loop)]
    code += [I(isa.OP_ST, isa.TYPE_F32, mod=space(isa.SPACE_GLOBAL), a=rd(5), b=r(5)),
             I(isa.OP_EXIT)]
    return code_object(code, 16)


class Machine:
    """VRAM, one VMID's page tables, the SMs."""

    def __init__(self, vram_size: int):
        self.vram = Vram(vram_size)
        self.mmu = Mmu(self.vram, SystemMemory())
        self.sm = StreamingMultiprocessors(self.mmu)
        self.tables = vram_size - (16 << 20)  # page tables at the top of VRAM
        self.root = self._table()
        self.mmu.set_root(VMID, self.root)
        self.phys = 1 << 20
        self.va = 1 << 32

    def _table(self) -> int:
        addr = self.tables
        self.tables += PAGE_SIZE
        self.vram.fill(addr, PAGE_SIZE, 0)
        return addr

    def _map(self, va, phys, npages, flags):
        q = self.vram.qwords
        for i in range(npages):
            v = va + i * PAGE_SIZE
            table = self.root
            for shift in (39, 30, 21):
                slot = (table >> 3) + ((v >> shift) & (PT_ENTRIES - 1))
                if not int(q[slot]) & PDE_VALID:
                    q[slot] = self._table() | PDE_VALID
                table = int(q[slot]) & ~(PAGE_SIZE - 1)
            q[(table >> 3) + ((v >> 12) & (PT_ENTRIES - 1))] = (phys + i * PAGE_SIZE) | flags

    def alloc(self, data: bytes | np.ndarray, flags=RW) -> int:
        raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
        npages = -(-max(len(raw), 1) // PAGE_SIZE)
        va, phys = self.va, self.phys
        self._map(va, phys, npages, flags)
        self.vram.write(phys, raw)
        self.va += (npages + 1) * PAGE_SIZE
        self.phys += npages * PAGE_SIZE
        return va

    def view(self, va, count, dtype) -> np.ndarray:
        ext = self.mmu.translate(VMID, va, count * np.dtype(dtype).itemsize, 1)
        return ext[0].view(dtype)

    def launch(self, obj_va, params: bytes, grid, block) -> CodeLaunch:
        pva = self.alloc(params)
        return CodeLaunch(obj_va, obj_va + isa.COBJ_HEADER_SIZE, (grid, 1, 1), (block, 1, 1), 0,
                          pva, len(params))

    def run(self, launch: CodeLaunch) -> int:
        before = self.sm.lane_instructions
        self.sm.launch(VMID, launch, NEVER_STOP)
        return self.sm.lane_instructions - before


def run_bench(json_path: str | None = None, quick: bool = False, out=print) -> dict:
    n_vec = (1 << 22) if quick else (1 << 24)
    n_alu = (1 << 18) if quick else (1 << 20)
    reps = 2 if quick else 3
    m = Machine(((3 * n_vec * 4 + 4 * n_alu * 4) // PAGE_SIZE + 8192) * PAGE_SIZE + (64 << 20))
    results = {}

    # lane-instructions per second
    x = np.linspace(0, 1, n_alu, dtype=np.float32)
    src, dst = m.alloc(x), m.alloc(np.zeros(n_alu, np.float32))
    for name, divergent in (("lanes", False), ("divergent", True)):
        obj = m.alloc(alu_chain(divergent), EXEC)
        launch = m.launch(obj, struct.pack("<QQ", src, dst), n_alu // 256, 256)
        out(f"{name:10s} {n_alu} threads, {reps} runs after a warm-up ...")
        counts = []
        times = rounds({name: lambda: counts.append(m.run(launch))}, max_reps=reps, warmup=True)
        best = statistics.median(times[name])
        rate = counts[-1] / best
        results[name] = {"threads": n_alu, "lane_instructions": counts[-1], "seconds": best,
                         "lane_instructions_per_s": rate}
        out(f"{name:10s} {n_alu} threads: {rate / 1e6:8.1f} M lane-instructions/s "
            f"({counts[-1] / 1e6:.0f} M in {best * 1e3:.0f} ms)")

    # vector_add against numpy
    a = np.random.default_rng(0).standard_normal(n_vec).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(n_vec).astype(np.float32)
    va, vb, vc = m.alloc(a), m.alloc(b), m.alloc(np.zeros(n_vec, np.float32))
    obj = m.alloc(vector_add(), EXEC)
    launch = m.launch(obj, struct.pack("<QQQI", va, vb, vc, n_vec), -(-n_vec // 256), 256)
    c = np.empty_like(a)
    times = rounds({"sm": lambda: m.run(launch), "numpy": lambda: np.add(a, b, out=c)},
                   max_reps=reps, warmup=True)
    if not np.array_equal(m.view(vc, n_vec, np.float32), a + b):
        raise AssertionError("vector_add on the SMs gave a wrong result")
    sm_t, np_t = statistics.median(times["sm"]), statistics.median(times["numpy"])
    results["vector_add"] = {"n": n_vec, "sm_seconds": sm_t, "numpy_seconds": np_t,
                             "ratio_to_numpy": np_t / sm_t}
    out(f"vector_add {n_vec} floats: {sm_t * 1e3:.0f} ms, numpy {np_t * 1e3:.1f} ms: "
        f"{np_t / sm_t:.3f}x numpy")
    write_json(json_path, results, out)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    run_bench(args.json, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
