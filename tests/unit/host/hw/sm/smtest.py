"""Test harness for the SMs: VRAM, an MMU with hand-built page tables, a loader.

Env does by hand what the driver does for real (COBJ-LOAD-1): it places a code object in
pages mapped EXEC|READ, allocates the .global/.const segments, writes their VAs into the
header, writes the parameter buffer, and launches through StreamingMultiprocessors (or
through a CommandProcessor with a PKT_LAUNCH_CODE in an IB, for the packet tests).
"""

from __future__ import annotations

import struct
import sys
import threading
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hwtest import RO, RW, PageTables  # noqa: E402

from pvgpu.host.hw.kernels import NEVER_STOP, StopToken  # noqa: E402
from pvgpu.host.hw.mmu import Mmu  # noqa: E402
from pvgpu.host.hw.pcie import PcieFabric  # noqa: E402
from pvgpu.host.hw.regs import PAGE_SIZE, PTE_EXEC, PTE_READ, PTE_VALID  # noqa: E402
from pvgpu.host.hw.sm import CodeLaunch, StreamingMultiprocessors  # noqa: E402
from pvgpu.host.hw.sysmem import SystemMemory  # noqa: E402
from pvgpu.host.hw.vram import Vram  # noqa: E402
from pvgpu.spec import isa  # noqa: E402
from pvgpu.spec.kernels import ACCESS_READ, ACCESS_WRITE  # noqa: E402

import smasm  # noqa: E402

VMID = 3
EXEC = PTE_VALID | PTE_READ | PTE_EXEC
CODE_VA = 0x10_0000_0000
SEG_VA = 0x20_0000_0000
PARAM_VA = 0x30_0000_0000
BUF_VA = 0x40_0000_0000

__all__ = ["Env", "Module", "StopAfter", "RW", "RO", "EXEC", "VMID", "smasm"]


class Module:
    """A loaded code object: its VA, entries by name, their parameter tables."""

    def __init__(self, obj: bytes, va: int):
        self.obj = obj
        self.va = va
        h = smasm.header(obj)
        self.header = h
        self.entries = {}
        try:
            self._parse(obj, va, h)
        except (struct.error, UnicodeDecodeError, ValueError):
            self.entries = {}  # a malformed object (tests of validation): entry 0 by offset

    def _parse(self, obj, va, h):
        strtab = obj[h["strtab_off"]:h["strtab_off"] + h["strtab_size"]]
        for i in range(min(h["entry_count"], 64)):
            off = h["entries_off"] + i * isa.COBJ_ENTRY_SIZE
            f = dict(zip(isa.COBJ_ENTRY_FIELDS, struct.unpack_from(isa.COBJ_ENTRY_FORMAT, obj, off)))
            name = strtab[f["name_off"]:f["name_off"] + f["name_len"]].decode()
            params = []
            for j in range(f["params_first"], f["params_first"] + f["n_params"]):
                params.append(struct.unpack_from(isa.COBJ_PARAM_FORMAT, obj,
                                                 h["params_off"] + j * isa.COBJ_PARAM_SIZE))
            self.entries[name] = (va + off, f, params)

    def entry(self, name=None):
        if not self.entries:
            return self.va + self.header["entries_off"], None, []
        if name is None:
            name = next(iter(self.entries))
        return self.entries[name]

    def pack(self, name, args) -> bytes:
        """Arguments by the entry's parameter table (ints, floats, bytes)."""
        _, f, params = self.entry(name)
        buf = bytearray(f["param_size"])
        for (off, size, _align, t), v in zip(params, args):
            if isinstance(v, (bytes, bytearray)):
                raw = bytes(v)
            elif t in isa.FLOAT_TYPES:
                raw = np.array(v, dtype={2: np.float16, 4: np.float32, 8: np.float64}[size]).tobytes()
            else:
                raw = (int(v) & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
            buf[off:off + size] = raw
        return bytes(buf)


class StopAfter(StopToken):
    """A stop token that reports stopped after `n` checks (an engine reset, for tests)."""

    def __init__(self, n: int):
        self.n = n
        self.checks = 0
        super().__init__(self._check)

    def _check(self):
        self.checks += 1
        return self.checks > self.n

    def sleep(self, seconds):
        return self.stopped()


class Env:
    def __init__(self, vram_size: int = 128 << 20, clock=None, peer_size: int = 0):
        """peer_size: also a second GPU's VRAM in a PCIe fabric (self.peer, self.peer_bar)."""
        self.vram = Vram(vram_size)
        self.sysmem = SystemMemory()
        if peer_size:
            self.peer = Vram(peer_size)
            fabric = PcieFabric("switch", [self.vram, self.peer])
            self.peer_bar = fabric.endpoints[1].bar0
            self.mmu = Mmu(self.vram, self.sysmem, "gpu0", fabric, 0)
        else:
            self.mmu = Mmu(self.vram, self.sysmem)
        self.pt = PageTables(self.vram, 1 << 20)
        self.mmu.set_root(VMID, self.pt.root)
        self.phys_next = 8 << 20
        self.maps = {}  # va -> (phys, nbytes)
        self.code_next = CODE_VA
        self.seg_next = SEG_VA
        self.buf_next = BUF_VA
        kw = {} if clock is None else {"clock": clock}
        self.sm = StreamingMultiprocessors(self.mmu, **kw)
        self.lock = threading.Lock()

    # ------------------------------------------------------------ memory
    def map(self, va: int, nbytes: int, flags: int = RW) -> int:
        npages = -(-max(nbytes, 1) // PAGE_SIZE)
        phys = self.phys_next
        self.phys_next += npages * PAGE_SIZE
        assert self.phys_next <= self.vram.size, "test VRAM exhausted"
        self.vram.fill(phys, npages * PAGE_SIZE, 0)
        self.pt.map(va, phys, npages, flags)
        self.maps[va] = (phys, npages * PAGE_SIZE)
        return va

    def _phys(self, va: int) -> int:
        for base, (phys, n) in self.maps.items():
            if base <= va < base + n:
                return phys + (va - base)
        raise KeyError(f"{va:#x} not mapped by the test")

    def poke(self, va: int, data: bytes) -> None:
        """Write through the physical mapping (any permission)."""
        self.vram.write(self._phys(va), data)

    def buffer(self, data, flags: int = RW, pad: int = 0) -> int:
        """Allocate a buffer (page aligned), fill it with data (an array or bytes)."""
        raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
        va = self.buf_next
        n = len(raw) + pad
        self.buf_next += -(-max(n, 1) // PAGE_SIZE) * PAGE_SIZE + (1 << 20)  # holes between
        self.map(va, n, flags)
        self.poke(va, raw)
        return va

    def read(self, va: int, count: int, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        ext = self.mmu.translate(VMID, va, count * dtype.itemsize, ACCESS_READ)
        return np.concatenate(ext).view(dtype).copy()

    def write(self, va: int, arr: np.ndarray) -> None:
        raw = np.ascontiguousarray(arr).view(np.uint8).reshape(-1)
        off = 0
        for e in self.mmu.translate(VMID, va, raw.shape[0], ACCESS_WRITE):
            e[:] = raw[off:off + e.shape[0]]
            off += e.shape[0]

    # ------------------------------------------------------------ modules
    def load(self, text_or_obj, flags: int = EXEC) -> Module:
        """Assemble (text) or take (bytes) an object, allocate its segments, place it."""
        if isinstance(text_or_obj, str):
            asm = smasm.Assembler(text_or_obj)
            data_va = self.seg_next if asm.data_size else 0
            if asm.data_size:
                self.map(data_va, asm.data_size)
                self.seg_next += -(-asm.data_size // PAGE_SIZE) * PAGE_SIZE + (1 << 20)
            const_va = self.seg_next if asm.const_size else 0
            if asm.const_size:
                self.map(const_va, asm.const_size, RO)
                self.seg_next += -(-asm.const_size // PAGE_SIZE) * PAGE_SIZE + (1 << 20)
            asm.data_va, asm.const_va = data_va, const_va
            obj = asm.build()
            h = smasm.header(obj)
            if h["data_init_size"]:
                self.poke(data_va, obj[h["data_init_off"]:h["data_init_off"] + h["data_init_size"]])
            if h["const_init_size"]:
                self.poke(const_va, obj[h["const_init_off"]:h["const_init_off"] + h["const_init_size"]])
        else:
            obj = bytes(text_or_obj)
        va = self.code_next
        self.code_next += -(-len(obj) // PAGE_SIZE) * PAGE_SIZE + (1 << 20)
        self.map(va, len(obj), flags)
        self.poke(va, obj)
        return Module(obj, va)

    def params(self, data: bytes) -> int:
        if not data:
            return 0
        va = self.buf_next
        self.buf_next += -(-len(data) // PAGE_SIZE) * PAGE_SIZE + (1 << 20)
        self.map(va, len(data), RO)
        self.poke(va, data)
        return va

    def code_launch(self, mod: Module, entry=None, grid=(1, 1, 1), block=(1, 1, 1),
                    args=(), dyn_shared: int = 0, params: bytes | None = None,
                    entry_va: int | None = None) -> CodeLaunch:
        name = entry
        if params is None:
            params = mod.pack(name, args)
        eva = entry_va if entry_va is not None else mod.entry(name)[0]
        grid = _dim3(grid)
        block = _dim3(block)
        return CodeLaunch(mod.va, eva, grid, block, dyn_shared, self.params(params), len(params))

    def run(self, mod: Module, entry=None, grid=(1, 1, 1), block=(1, 1, 1), args=(),
            dyn_shared: int = 0, params: bytes | None = None, ctl=NEVER_STOP,
            entry_va: int | None = None) -> None:
        launch = self.code_launch(mod, entry, grid, block, args, dyn_shared, params, entry_va)
        self.sm.launch(VMID, launch, ctl)


def _dim3(d):
    if isinstance(d, int):
        return (d, 1, 1)
    d = tuple(d)
    return d + (1,) * (3 - len(d))


# ------------------------------------------------------------------ elementwise kernels
def _reg(t: str, k: int) -> str:
    if t == "pred":
        return f"p{k}"
    return f"rd{k}" if isa.TYPE_BITS[isa.TYPES_BY_NAME[t]] == 64 else f"r{k}"


def _mem_type(t: str) -> str:
    return "u8" if t == "pred" else t


DTYPES = {"b8": np.uint8, "u8": np.uint8, "s8": np.int8, "b16": np.uint16, "u16": np.uint16,
          "s16": np.int16, "f16": np.float16, "bf16": np.uint16, "b32": np.uint32,
          "u32": np.uint32, "s32": np.int32, "f32": np.float32, "b64": np.uint64,
          "u64": np.uint64, "s64": np.int64, "f64": np.float64, "pred": np.uint8}


def elementwise(env: Env, body: str, ins, outs, n: int, active=None, block: int = 64):
    """Run `body` once per element i < n: inputs[k] = (type, array) are loaded into
    registers {a}, {b}, {c}, {e}; outputs (types) are stored from {d}, {d2}, {f}.
    active: optional bool array; the body runs guarded by it (@p63), other lanes store
    what their output registers hold (0: registers start at zero). -> output arrays."""
    names_in = ["a", "b", "c", "e"]
    names_out = ["d", "d2", "f"]
    regs = {}
    lines = [".entry k r32=64 r64=64 pred=64"]
    for k in range(len(ins) + len(outs) + 1):
        lines.append(f".param u64 p{k}")
    lines.append(".param u32 n")
    lines += ["  mov.u32 r0, %ctaid.x", "  mov.u32 r1, %ntid.x", "  mov.u32 r2, %tid.x",
              "  mad.lo.u32 r3, r0, r1, r2", "  ld.param.u32 r4, [n]",
              "  setp.ge.u32 p0, r3, r4", "  @p0 exit", "  cvt.u64.u32 rd0, r3"]
    for k, (t, _) in enumerate(ins):
        mt = _mem_type(t)
        w = isa.TYPE_BITS[isa.TYPES_BY_NAME[mt]] // 8
        reg = _reg(t, 20 + k)
        lines += [f"  ld.param.u64 rd1, [p{k}]", f"  mul.lo.u64 rd2, rd0, {w}",
                  "  add.u64 rd3, rd1, rd2"]
        if t == "pred":
            lines += ["  ld.global.u8 r5, [rd3]", f"  setp.ne.u32 {reg}, r5, 0"]
        else:
            lines.append(f"  ld.global.{mt} {reg}, [rd3]")
        regs[names_in[k]] = reg
    for k, t in enumerate(outs):
        regs[names_out[k]] = _reg(t, 40 + k)
    if active is not None:
        k = len(ins) + len(outs)
        lines += [f"  ld.param.u64 rd1, [p{k}]", "  add.u64 rd3, rd1, rd0",
                  "  ld.global.u8 r5, [rd3]", "  setp.ne.u32 p63, r5, 0"]
    for line in body.strip().splitlines():
        line = line.strip().format(**regs)
        lines.append(("  @p63 " if active is not None else "  ") + line)
    for k, t in enumerate(outs):
        mt = _mem_type(t)
        w = isa.TYPE_BITS[isa.TYPES_BY_NAME[mt]] // 8
        reg = regs[names_out[k]]
        lines += [f"  ld.param.u64 rd1, [p{len(ins) + k}]", f"  mul.lo.u64 rd2, rd0, {w}",
                  "  add.u64 rd3, rd1, rd2"]
        if t == "pred":
            lines += [f"  selp.u32 r5, 1, 0, {reg}", "  st.global.u8 [rd3], r5"]
        else:
            lines.append(f"  st.global.{mt} [rd3], {reg}")
    lines.append("  exit")
    mod = env.load("\n".join(lines))
    args = []
    for t, arr in ins:
        args.append(env.buffer(np.ascontiguousarray(arr, DTYPES[t])))
    out_vas = []
    for t in outs:
        va = env.buffer(np.zeros(n, DTYPES[t]))
        out_vas.append(va)
        args.append(va)
    args.append(env.buffer(np.zeros(n, np.uint8) if active is None
                           else np.asarray(active, np.uint8)))
    args.append(n)
    env.run(mod, grid=-(-n // block), block=block, args=args)
    return [env.read(va, n, DTYPES[t]) for va, t in zip(out_vas, outs)]
