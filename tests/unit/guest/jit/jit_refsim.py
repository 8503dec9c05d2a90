"""A reference interpreter of the device ISA, for the compiler's tests only.

It executes code objects as spec/isa.md describes them (written from spec/isa.md and
spec/isa.py, without the compiler's code), so that the corpus kernels compiled by the JIT
can be run against numpy before any hardware exists: a wrong instruction selection or a
wrong expectation in the manifest shows up here. It favours plainness over speed: one
block at a time, all threads of the block as lanes of numpy arrays, and the threads at
the lowest program counter executing together (which reconverges at the immediate
post-dominator for the structured code compilers emit), with warps formed from them for
warp operations. It is not the device: the hardware's SMs are the authority.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from pvgpu.spec import isa

_DT = {isa.TYPE_B8: np.uint8, isa.TYPE_U8: np.uint8, isa.TYPE_S8: np.int8,
       isa.TYPE_B16: np.uint16, isa.TYPE_U16: np.uint16, isa.TYPE_S16: np.int16,
       isa.TYPE_F16: np.float16, isa.TYPE_BF16: np.uint16, isa.TYPE_B32: np.uint32,
       isa.TYPE_U32: np.uint32, isa.TYPE_S32: np.int32, isa.TYPE_F32: np.float32,
       isa.TYPE_B64: np.uint64, isa.TYPE_U64: np.uint64, isa.TYPE_S64: np.int64,
       isa.TYPE_F64: np.float64, isa.TYPE_PRED: np.bool_}
_UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
_SINT = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}
HEAP_BASE = 0x10_0000_0000


class Fault(Exception):
    """The launch faulted (page fault, misaligned access, trap)."""


def bits_of(t: int) -> int:
    return isa.TYPE_BITS[t]


def signed(t: int) -> bool:
    return t in isa.SIGNED_TYPES


def is_float(t: int) -> bool:
    return t in isa.FLOAT_TYPES


def wide(t: int) -> int:
    n = isa.TYPE_NAMES[t]
    return isa.TYPES_BY_NAME[n[0] + str(2 * int(n[1:]))]


def bf16_to_f32(u: np.ndarray) -> np.ndarray:
    return (u.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), r)


def directed(exact: np.ndarray, dtype, rnd: int) -> np.ndarray:
    """Round float64 values to dtype with a rounding mode (RN, RZ, RM, RP)."""
    r = exact.astype(dtype)
    if rnd in (isa.RND_DEFAULT, isa.RND_RN):
        return r
    with np.errstate(invalid="ignore"):
        back = r.astype(np.float64)
        if rnd == isa.RND_RZ:
            fix = np.abs(back) > np.abs(exact)
            r[fix] = np.nextafter(r[fix], dtype(0))
        elif rnd == isa.RND_RM:
            fix = back > exact
            r[fix] = np.nextafter(r[fix], dtype(-np.inf))
        elif rnd == isa.RND_RP:
            fix = back < exact
            r[fix] = np.nextafter(r[fix], dtype(np.inf))
    return r


def fused(a, b, c, approx):
    """a*b+c rounded once (f64): exact rational arithmetic where all are finite."""
    out = approx.copy()
    for i in range(len(a)):
        if math.isfinite(a[i]) and math.isfinite(b[i]) and math.isfinite(c[i]):
            exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
            try:
                out[i] = float(exact)
            except OverflowError:
                out[i] = math.copysign(math.inf, exact)
    return out


class Memory:
    """Device memory: buffers at VAs from HEAP_BASE (global and const space)."""

    def __init__(self, size: int = 64 << 20):
        self.heap = np.zeros(size, np.uint8)
        self.top = 0

    def alloc(self, nbytes: int, data: bytes | np.ndarray | None = None) -> int:
        off = (self.top + 255) // 256 * 256
        if off + nbytes > len(self.heap):
            raise MemoryError("reference heap full")
        self.top = off + max(nbytes, 1)
        if data is not None:
            b = np.frombuffer(bytes(data) if not isinstance(data, np.ndarray) else
                              np.ascontiguousarray(data).tobytes(), np.uint8)
            self.heap[off:off + len(b)] = b
        return HEAP_BASE + off

    def read(self, va: int, nbytes: int) -> bytes:
        off = va - HEAP_BASE
        return self.heap[off:off + nbytes].tobytes()

    def offsets(self, addr: np.ndarray, width: int) -> np.ndarray:
        off = addr.astype(np.uint64) - np.uint64(HEAP_BASE)
        bad = (addr < HEAP_BASE) | (off + np.uint64(width) > np.uint64(self.top))
        if bad.any():
            raise Fault(f"page fault at {int(addr[bad][0]):#x}")
        return off.astype(np.int64)


class Launch:
    """One launch of one entry: run(), then read memory back."""

    def __init__(self, obj, entry, mem: Memory, data_va: int, const_va: int, params: bytes,
                 grid, block, dyn_shared: int = 0, max_steps: int = 5_000_000):
        self.obj, self.e, self.mem = obj, entry, mem
        self.data_va, self.const_va = data_va, const_va
        self.params = np.frombuffer(params, np.uint8)
        assert len(params) == entry.param_size
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.block = tuple(block) + (1,) * (3 - len(block))
        self.dyn = dyn_shared
        self.code = obj.code
        self.max_steps = max_steps
        self.clock = 0

    # ------------------------------------------------------------------ operands
    def read(self, opnd: int, t: int, lanes: np.ndarray, imm: int) -> np.ndarray:
        kind, value = isa.operand_kind(opnd), isa.operand_value(opnd)
        n = len(lanes)
        dt = _DT[t]
        if kind == isa.OPND_PRED:
            return self.pred[lanes, value].copy()
        if kind == isa.OPND_R32:
            b = self.r32[lanes, value]
            w = bits_of(t)
            return (b & np.uint32((1 << w) - 1)).astype(_UINT[w]).view(dt) if w < 32 else b.view(dt)
        if kind == isa.OPND_R64:
            return self.r64[lanes, value].view(dt)
        w = bits_of(t)
        if kind == isa.OPND_IMM:
            return np.full(n, imm & ((1 << w) - 1), _UINT[w]).view(dt)
        if kind == isa.OPND_SIMM:
            return np.full(n, value & ((1 << w) - 1), _UINT[w]).view(dt)
        if kind in (isa.OPND_DATA, isa.OPND_CONST):
            base = self.data_va if kind == isa.OPND_DATA else self.const_va
            return np.full(n, base + value, np.uint64).view(dt)
        if kind == isa.OPND_SREG:
            v = self.sreg(value, lanes)
            return v.astype(np.uint64 if w == 64 else np.uint32).view(dt)
        raise AssertionError(f"operand kind {kind}")

    def write(self, opnd: int, t: int, lanes: np.ndarray, v: np.ndarray) -> None:
        kind, idx = isa.operand_kind(opnd), isa.operand_value(opnd)
        if kind == isa.OPND_PRED:
            self.pred[lanes, idx] = v.astype(bool)
            return
        v = np.asarray(v).astype(_DT[t], copy=False)
        w = bits_of(t)
        if kind == isa.OPND_R64:
            assert w == 64, "a 64-bit register written with a narrow type"
            self.r64[lanes, idx] = v.view(np.uint64)
            return
        assert kind == isa.OPND_R32 and w <= 32
        if w == 32:
            self.r32[lanes, idx] = v.view(np.uint32)
        elif signed(t):
            self.r32[lanes, idx] = v.astype(np.int32).view(np.uint32)
        else:
            self.r32[lanes, idx] = v.view(_UINT[w]).astype(np.uint32)

    def sreg(self, n: int, lanes: np.ndarray) -> np.ndarray:
        tid = lanes
        bx, by, bz = self.block
        tx, ty, tz = tid % bx, (tid // bx) % by, tid // (bx * by)
        lane = tid % 32
        table = {
            isa.SREG_TID_X: tx, isa.SREG_TID_Y: ty, isa.SREG_TID_Z: tz,
            isa.SREG_NTID_X: bx, isa.SREG_NTID_Y: by, isa.SREG_NTID_Z: bz,
            isa.SREG_CTAID_X: self.ctaid[0], isa.SREG_CTAID_Y: self.ctaid[1],
            isa.SREG_CTAID_Z: self.ctaid[2], isa.SREG_NCTAID_X: self.grid[0],
            isa.SREG_NCTAID_Y: self.grid[1], isa.SREG_NCTAID_Z: self.grid[2],
            isa.SREG_LANEID: lane, isa.SREG_WARPID: tid // 32,
            isa.SREG_NWARPID: (self.nthreads + 31) // 32, isa.SREG_SMID: 0, isa.SREG_NSMID: 1,
            isa.SREG_CLOCK: self.clock & 0xFFFFFFFF, isa.SREG_CLOCK64: self.clock,
            isa.SREG_GLOBALTIMER: 1_000_000 + self.clock,
            isa.SREG_LANEMASK_EQ: 1 << lane, isa.SREG_LANEMASK_LT: (1 << lane) - 1,
            isa.SREG_LANEMASK_LE: (2 << lane) - 1,
            isa.SREG_LANEMASK_GE: (~((1 << lane) - 1)) & 0xFFFFFFFF,
            isa.SREG_LANEMASK_GT: (~((2 << lane) - 1)) & 0xFFFFFFFF,
            isa.SREG_DYNAMIC_SMEM_SIZE: self.dyn,
            isa.SREG_TOTAL_SMEM_SIZE: self.e.shared_size + self.dyn, isa.SREG_GRIDID: 1,
        }
        v = table[n]
        return np.broadcast_to(np.asarray(v, dtype=np.int64), lanes.shape).copy()

    # ------------------------------------------------------------------ memory
    def address(self, rec, lanes) -> np.ndarray:
        a = int(rec["a"])
        kind = isa.operand_kind(a)
        uses_imm = any(isa.operand_kind(int(rec[s])) == isa.OPND_IMM for s in ("a", "b", "c"))
        off = 0 if uses_imm else int(rec["imm"])
        if kind == isa.OPND_NONE:
            base = np.zeros(len(lanes), np.uint64)
        elif kind == isa.OPND_R32:
            base = self.r32[lanes, isa.operand_value(a)].astype(np.uint64)
        else:
            base = self.read(a, isa.TYPE_U64, lanes, int(rec["imm"]))
        return base + np.uint64(off & 0xFFFF_FFFF_FFFF_FFFF)

    def resolve(self, space: int, addr: np.ndarray, width: int):
        """-> list of (space, lane mask, offsets) with generic addresses classified."""
        if space != isa.SPACE_GENERIC:
            return [(space, np.ones(len(addr), bool), addr)]
        out = []
        rest = np.ones(len(addr), bool)
        for sp, base in ((isa.SPACE_SHARED, isa.GENERIC_SHARED_BASE),
                         (isa.SPACE_LOCAL, isa.GENERIC_LOCAL_BASE)):
            m = (addr >= np.uint64(base)) & (addr < np.uint64(base + isa.GENERIC_WINDOW_SIZE))
            if m.any():
                out.append((sp, m, addr - np.uint64(base)))
            rest &= ~m
        if rest.any():
            out.append((isa.SPACE_GLOBAL, rest, addr))
        return out

    def check_range(self, off: np.ndarray, width: int, limit: int, what: str) -> np.ndarray:
        bad = off + np.uint64(width) > np.uint64(limit)
        if bad.any():
            raise Fault(f"{what} access out of range at {int(off[bad][0]):#x}")
        return off.astype(np.int64)

    def load(self, space, addr, lanes, t) -> np.ndarray:
        w = bits_of(t) // 8
        if (addr % np.uint64(w)).any():
            raise Fault("misaligned load")
        raw = np.zeros((len(lanes), w), np.uint8)
        idx = np.arange(w)
        for sp, m, a in self.resolve(space, addr, w):
            if sp in (isa.SPACE_GLOBAL, isa.SPACE_CONST):
                off = self.mem.offsets(a[m], w)
                raw[m] = self.mem.heap[off[:, None] + idx]
            elif sp == isa.SPACE_SHARED:
                off = self.check_range(a[m], w, len(self.shared), "shared")
                raw[m] = self.shared[off[:, None] + idx]
            elif sp == isa.SPACE_LOCAL:
                off = self.check_range(a[m], w, self.e.local_size, "local")
                raw[m] = self.local[lanes[m][:, None], off[:, None] + idx]
            elif sp == isa.SPACE_PARAM:
                off = self.check_range(a[m], w, len(self.params), "param")
                raw[m] = self.params[off[:, None] + idx]
            else:
                raise AssertionError(sp)
        return raw.view(_UINT[8 * w]).reshape(-1).view(_DT[t])

    def store(self, space, addr, lanes, t, v) -> None:
        w = bits_of(t) // 8
        if (addr % np.uint64(w)).any():
            raise Fault("misaligned store")
        raw = np.ascontiguousarray(v.astype(_DT[t])).view(np.uint8).reshape(len(lanes), w)
        idx = np.arange(w)
        for sp, m, a in self.resolve(space, addr, w):
            if sp == isa.SPACE_GLOBAL:
                off = self.mem.offsets(a[m], w)
                self.mem.heap[off[:, None] + idx] = raw[m]
            elif sp == isa.SPACE_SHARED:
                off = self.check_range(a[m], w, len(self.shared), "shared")
                self.shared[off[:, None] + idx] = raw[m]
            elif sp == isa.SPACE_LOCAL:
                off = self.check_range(a[m], w, self.e.local_size, "local")
                self.local[lanes[m][:, None], off[:, None] + idx] = raw[m]
            else:
                raise Fault(f"store to space {sp}")

    # ------------------------------------------------------------------ running
    def run(self) -> None:
        for z in range(self.grid[2]):
            for y in range(self.grid[1]):
                for x in range(self.grid[0]):
                    self.run_block((x, y, z))

    def run_block(self, ctaid) -> None:
        e = self.e
        self.ctaid = ctaid
        T = self.nthreads = self.block[0] * self.block[1] * self.block[2]
        self.r32 = np.zeros((T, max(e.n_r32, 1)), np.uint32)
        self.r64 = np.zeros((T, max(e.n_r64, 1)), np.uint64)
        self.pred = np.zeros((T, max(e.n_pred, 1)), bool)
        self.shared = np.zeros(e.shared_size + self.dyn, np.uint8)
        self.local = np.zeros((T, max(e.local_size, 1)), np.uint8)
        pc = np.full(T, e.code_start, np.int64)
        done = np.zeros(T, bool)
        waiting = np.zeros(T, bool)
        end = e.code_start + e.code_count
        steps = 0
        while True:
            runnable = ~done & ~waiting
            if not runnable.any():
                if not waiting.any():
                    return
                self.release_barrier(np.nonzero(waiting)[0], pc)
                waiting[:] = False
                continue
            p = int(pc[runnable].min())
            assert e.code_start <= p < end, f"pc {p} outside the entry"
            lanes = np.nonzero(runnable & (pc == p))[0]
            rec = self.code[p]
            steps += 1
            self.clock += 1
            if steps > self.max_steps:
                raise Fault("step limit reached (an endless loop?)")
            g = int(rec["guard"])
            if g & isa.GUARD_ON:
                gv = self.pred[lanes, g & isa.GUARD_INDEX]
                if g & isa.GUARD_NEG:
                    gv = ~gv
                pc[lanes[~gv]] = p + 1
                lanes = lanes[gv]
                if not len(lanes):
                    continue
            op = int(rec["op"])
            if op == isa.OP_BRA:
                pc[lanes] = int(rec["imm"])
            elif op == isa.OP_EXIT:
                done[lanes] = True
            elif op == isa.OP_TRAP:
                raise Fault("trap")
            elif op == isa.OP_BAR and isa.mod_field(int(rec["mod"]), isa.MOD_VARIANT_MASK) != \
                    isa.VAR_BAR_ARRIVE:
                waiting[lanes] = True
            else:
                self.execute(rec, lanes)
                pc[lanes] = p + 1

    def release_barrier(self, lanes, pc) -> None:
        p = int(pc[lanes[0]])
        rec = self.code[p]
        var = isa.mod_field(int(rec["mod"]), isa.MOD_VARIANT_MASK)
        if var in (isa.VAR_BAR_RED_POPC, isa.VAR_BAR_RED_AND, isa.VAR_BAR_RED_OR):
            for q in np.unique(pc[lanes]):
                r = self.code[int(q)]
                assert isa.mod_field(int(r["mod"]), isa.MOD_VARIANT_MASK) == var
            c = self.pred[lanes, isa.operand_value(int(rec["c"]))]
            if int(rec["mod"]) & isa.MOD_NEG_C:
                c = ~c
            if var == isa.VAR_BAR_RED_POPC:
                self.write(int(rec["d"]), isa.TYPE_U32, lanes, np.full(len(lanes), c.sum(), np.uint32))
            else:
                res = c.all() if var == isa.VAR_BAR_RED_AND else c.any()
                self.write(int(rec["d"]), isa.TYPE_PRED, lanes, np.full(len(lanes), res))
        pc[lanes] += 1

    # ------------------------------------------------------------------ instructions
    def execute(self, rec, lanes) -> None:
        op, t, t2, mod = int(rec["op"]), int(rec["type"]), int(rec["type2"]), int(rec["mod"])
        imm = int(rec["imm"])
        var = isa.mod_field(mod, isa.MOD_VARIANT_MASK)
        rnd = mod & isa.MOD_ROUND_MASK
        space = isa.mod_field(mod, isa.MOD_SPACE_MASK)

        def src(slot, typ=t):
            return self.read(int(rec[slot]), typ, lanes, imm)

        def dst(v, typ=t, slot="d"):
            self.write(int(rec[slot]), typ, lanes, v)

        if op == isa.OP_NOP or op == isa.OP_MEMBAR:
            return
        if op == isa.OP_MOV:
            return dst(src("a"))
        if op == isa.OP_LD:
            return dst(self.load(space, self.address(rec, lanes), lanes, t))
        if op == isa.OP_ST:
            return self.store(space, self.address(rec, lanes), lanes, t, src("b"))
        if op in (isa.OP_ATOM, isa.OP_RED):
            return self.atomic(rec, lanes, t, mod, space)
        if op == isa.OP_CVT:
            return dst(self.convert(src("a", t2), t2, t, rnd, mod))
        if op == isa.OP_CVTA:
            a = src("a").astype(np.uint64)
            base = {isa.SPACE_SHARED: isa.GENERIC_SHARED_BASE,
                    isa.SPACE_LOCAL: isa.GENERIC_LOCAL_BASE}.get(space, 0)
            r = a + np.uint64(base) if var == isa.VAR_CVTA_TO_GENERIC else a - np.uint64(base)
            return dst(r.astype(_DT[t]))
        if op == isa.OP_SELP:
            c = src("c", isa.TYPE_PRED)
            if mod & isa.MOD_NEG_C:
                c = ~c
            return dst(np.where(c, src("a"), src("b")))
        if op == isa.OP_SLCT:
            c = src("c", t2)
            return dst(np.where(c >= 0, src("a"), src("b")))
        if op in (isa.OP_SETP, isa.OP_SET):
            ct = t if op == isa.OP_SETP else t2
            r = self.compare(src("a", ct), src("b", ct), ct, isa.mod_field(mod, isa.MOD_CMP_MASK))
            b = isa.mod_field(mod, isa.MOD_BOOL_MASK)
            if b:
                c = src("c", isa.TYPE_PRED)
                if mod & isa.MOD_NEG_C:
                    c = ~c
                f = {isa.BOOL_AND: np.logical_and, isa.BOOL_OR: np.logical_or,
                     isa.BOOL_XOR: np.logical_xor}[b]
                r1, r2 = f(r, c), f(~r, c)
            else:
                r1, r2 = r, ~r
            if op == isa.OP_SETP:
                dst(r1, isa.TYPE_PRED)
                if isa.operand_kind(int(rec["d2"])):
                    dst(r2, isa.TYPE_PRED, "d2")
                return
            one = np.float32(1.0) if t == isa.TYPE_F32 else _DT[t](-1 if t == isa.TYPE_S32 else 0xFFFFFFFF)
            return dst(np.where(r1, one, _DT[t](0)))
        if op == isa.OP_TESTP:
            a = src("a").astype(np.float64)
            tiny = np.finfo(_DT[t]).tiny
            r = {isa.VAR_TESTP_FINITE: np.isfinite(a), isa.VAR_TESTP_INFINITE: np.isinf(a),
                 isa.VAR_TESTP_NUMBER: ~np.isnan(a), isa.VAR_TESTP_NOTANUMBER: np.isnan(a),
                 isa.VAR_TESTP_NORMAL: np.isfinite(a) & (np.abs(a) >= tiny),
                 isa.VAR_TESTP_SUBNORMAL: (a != 0) & (np.abs(a) < tiny)}[var]
            return dst(r, isa.TYPE_PRED)
        if op in (isa.OP_SHFL, isa.OP_VOTE, isa.OP_ACTIVEMASK):
            return self.warp_op(rec, lanes, op, t, mod, var)
        if is_float(t) and op not in (isa.OP_AND, isa.OP_OR, isa.OP_XOR, isa.OP_NOT):
            return dst(self.float_op(op, rec, lanes, t, mod, rnd, src))
        return self.int_op(op, rec, lanes, t, mod, var, src, dst)

    def compare(self, a, b, t, cmp_):
        with np.errstate(invalid="ignore"):
            if is_float(t):
                a = a.astype(np.float64) if t != isa.TYPE_BF16 else bf16_to_f32(a).astype(np.float64)
                b = b.astype(np.float64) if t != isa.TYPE_BF16 else bf16_to_f32(b).astype(np.float64)
                nan = np.isnan(a) | np.isnan(b)
            else:
                nan = np.zeros(len(a), bool)
                if cmp_ in (isa.CMP_LO, isa.CMP_LS, isa.CMP_HI, isa.CMP_HS):
                    a = a.view(_UINT[bits_of(t)]) if a.dtype.itemsize * 8 == bits_of(t) else a
                    b = b.view(_UINT[bits_of(t)]) if b.dtype.itemsize * 8 == bits_of(t) else b
            base = {isa.CMP_EQ: a == b, isa.CMP_NE: a != b, isa.CMP_LT: a < b, isa.CMP_LE: a <= b,
                    isa.CMP_GT: a > b, isa.CMP_GE: a >= b, isa.CMP_LO: a < b, isa.CMP_LS: a <= b,
                    isa.CMP_HI: a > b, isa.CMP_HS: a >= b, isa.CMP_EQU: a == b,
                    isa.CMP_NEU: a != b, isa.CMP_LTU: a < b, isa.CMP_LEU: a <= b,
                    isa.CMP_GTU: a > b, isa.CMP_GEU: a >= b}
            if cmp_ == isa.CMP_NUM:
                return ~nan
            if cmp_ == isa.CMP_NAN:
                return nan
            r = base[cmp_]
            if cmp_ >= isa.CMP_EQU:
                return r | nan
            if cmp_ == isa.CMP_NE and is_float(t):
                return r & ~nan
            return r & ~nan

    def convert(self, a, t2, t, rnd, mod):
        if t2 == isa.TYPE_BF16:
            a = bf16_to_f32(a)
            t2 = isa.TYPE_F32
        if is_float(t2):
            x = a.astype(np.float64)
            if mod & isa.MOD_FTZ and t2 == isa.TYPE_F32:
                x = np.where(np.abs(x) < np.finfo(np.float32).tiny, 0.0 * x, x)
            if is_float(t):
                if rnd in (isa.RND_RNI, isa.RND_RZI, isa.RND_RMI, isa.RND_RPI):
                    x = {isa.RND_RNI: np.rint, isa.RND_RZI: np.trunc, isa.RND_RMI: np.floor,
                         isa.RND_RPI: np.ceil}[rnd](x)
                    rnd = isa.RND_RN
                if mod & isa.MOD_SAT:
                    x = np.where(np.isnan(x), 0.0, np.clip(x, 0.0, 1.0))
                if t == isa.TYPE_BF16:
                    return f32_to_bf16(x.astype(np.float32))
                with np.errstate(over="ignore", invalid="ignore"):
                    return directed(x, _DT[t], rnd)
            f = {isa.RND_RNI: np.rint, isa.RND_RMI: np.floor, isa.RND_RPI: np.ceil}.get(rnd, np.trunc)
            with np.errstate(invalid="ignore"):
                r = f(x)
            w = bits_of(t)
            lo, hi = (-(1 << (w - 1)), (1 << (w - 1)) - 1) if signed(t) else (0, (1 << w) - 1)
            r = np.where(np.isnan(r), 0.0, np.clip(r, lo, hi))
            return np.array([int(v) & ((1 << w) - 1) for v in r], dtype=_UINT[w]).view(_DT[t])
        # integer source
        if is_float(t):
            ints = [int(v) for v in a]
            exact = np.array(ints, dtype=np.float64)
            if t == isa.TYPE_BF16:
                return f32_to_bf16(exact.astype(np.float32))
            return directed(exact, _DT[t], rnd)
        w = bits_of(t)
        vals = [int(v) for v in a]
        if mod & isa.MOD_SAT:
            lo, hi = (-(1 << (w - 1)), (1 << (w - 1)) - 1) if signed(t) else (0, (1 << w) - 1)
            vals = [min(max(v, lo), hi) for v in vals]
        return np.array([v & ((1 << w) - 1) for v in vals], dtype=_UINT[w]).view(_DT[t])

    def float_op(self, op, rec, lanes, t, mod, rnd, src):
        dt = _DT[t]

        def f(slot):
            v = src(slot).astype(np.float64)
            if mod & isa.MOD_FTZ and t == isa.TYPE_F32:
                v = np.where(np.abs(v) < np.finfo(np.float32).tiny, 0.0 * v, v)
            return v

        with np.errstate(all="ignore"):
            if op == isa.OP_ADD:
                r = f("a") + f("b")
            elif op == isa.OP_SUB:
                r = f("a") - f("b")
            elif op == isa.OP_MUL:
                r = f("a") * f("b")
            elif op in (isa.OP_FMA, isa.OP_MAD):
                a, b, c = f("a"), f("b"), f("c")
                r = a * b + c
                if t == isa.TYPE_F64:
                    r = fused(a, b, c, r)
            elif op == isa.OP_DIV:
                r = f("a") / f("b")
            elif op == isa.OP_ABS:
                r = np.abs(f("a"))
            elif op == isa.OP_NEG:
                r = -f("a")
            elif op == isa.OP_MIN:
                r = np.fmin(f("a"), f("b"))
            elif op == isa.OP_MAX:
                r = np.fmax(f("a"), f("b"))
            elif op == isa.OP_COPYSIGN:
                r = np.copysign(f("b"), f("a"))
            elif op == isa.OP_SQRT:
                r = np.sqrt(f("a"))
            elif op == isa.OP_RSQRT:
                r = 1.0 / np.sqrt(f("a"))
            elif op == isa.OP_RCP:
                r = 1.0 / f("a")
            elif op == isa.OP_EX2:
                r = np.exp2(f("a"))
            elif op == isa.OP_LG2:
                r = np.log2(f("a"))
            elif op == isa.OP_SIN:
                r = np.sin(f("a"))
            elif op == isa.OP_COS:
                r = np.cos(f("a"))
            elif op == isa.OP_TANH:
                r = np.tanh(f("a"))
            else:
                raise AssertionError(f"float op {isa.OPCODES[op].name}")
            if mod & isa.MOD_SAT:
                r = np.where(np.isnan(r), 0.0, np.clip(r, 0.0, 1.0))
            if t == isa.TYPE_F64 or op in (isa.OP_MIN, isa.OP_MAX, isa.OP_ABS, isa.OP_NEG,
                                           isa.OP_COPYSIGN):
                out = r.astype(dt)
            else:
                out = directed(r, dt, rnd)
            if mod & isa.MOD_FTZ and t == isa.TYPE_F32:
                out = np.where(np.abs(out) < np.finfo(np.float32).tiny, dt(0) * out, out)
            return out

    def int_op(self, op, rec, lanes, t, mod, var, src, dst):
        w = bits_of(t) if t != isa.TYPE_PRED else 1
        mask = (1 << w) - 1

        def ints(slot, typ=t):
            return [int(v) for v in src(slot, typ)]

        def out(vals, typ=t):
            wb = bits_of(typ) if typ != isa.TYPE_PRED else 1
            if typ == isa.TYPE_PRED:
                return dst(np.array([bool(v) for v in vals]), typ)
            m = (1 << wb) - 1
            dst(np.array([v & m for v in vals], dtype=_UINT[wb]).view(_DT[typ]), typ)

        def sx(v, bits=w):
            v &= (1 << bits) - 1
            return v - (1 << bits) if signed(t) and v >> (bits - 1) else v

        if t == isa.TYPE_PRED:
            a = src("a", t)
            if op == isa.OP_NOT:
                return dst(~a, t)
            b = src("b", t)
            return dst({isa.OP_AND: a & b, isa.OP_OR: a | b, isa.OP_XOR: a ^ b}[op], t)
        if op in (isa.OP_ADD, isa.OP_SUB):
            a, b = ints("a"), ints("b")
            r = [x + y if op == isa.OP_ADD else x - y for x, y in zip(a, b)]
            if mod & isa.MOD_SAT:
                r = [min(max(v, -(1 << 31)), (1 << 31) - 1) for v in r]
            return out(r)
        if op in (isa.OP_MUL, isa.OP_MAD):
            a, b = ints("a"), ints("b")
            p = [x * y for x, y in zip(a, b)]
            if var == isa.VAR_WIDE:
                wt = wide(t)
                if op == isa.OP_MAD:
                    p = [x + y for x, y in zip(p, ints("c", wt))]
                return out(p, wt)
            if var == isa.VAR_HI:
                p = [x >> w for x in p]
            if op == isa.OP_MAD:
                p = [x + y for x, y in zip(p, ints("c"))]
                if mod & isa.MOD_SAT:
                    p = [min(max(v, -(1 << 31)), (1 << 31) - 1) for v in p]
            return out(p)
        if op == isa.OP_DIV:
            a, b = ints("a"), ints("b")
            r = []
            for x, y in zip(a, b):
                if y == 0:
                    r.append(-1)
                else:
                    q = abs(x) // abs(y)
                    r.append(q if (x < 0) == (y < 0) else -q)
            return out(r)
        if op == isa.OP_REM:
            a, b = ints("a"), ints("b")
            r = []
            for x, y in zip(a, b):
                if y == 0:
                    r.append(x)
                else:
                    q = abs(x) // abs(y)
                    q = q if (x < 0) == (y < 0) else -q
                    r.append(x - q * y)
            return out(r)
        if op == isa.OP_ABS:
            return out([abs(x) for x in ints("a")])
        if op == isa.OP_NEG:
            return out([-x for x in ints("a")])
        if op in (isa.OP_MIN, isa.OP_MAX):
            f = min if op == isa.OP_MIN else max
            return out([f(x, y) for x, y in zip(ints("a"), ints("b"))])
        if op in (isa.OP_AND, isa.OP_OR, isa.OP_XOR):
            a, b = ints("a"), ints("b")
            f = {isa.OP_AND: lambda x, y: x & y, isa.OP_OR: lambda x, y: x | y,
                 isa.OP_XOR: lambda x, y: x ^ y}[op]
            return out([f(x, y) for x, y in zip(a, b)])
        if op == isa.OP_NOT:
            return out([~x for x in ints("a")])
        if op == isa.OP_SHL:
            return out([x << min(s, w) for x, s in zip(ints("a"), ints("b", isa.TYPE_U32))])
        if op == isa.OP_SHR:
            return out([x >> min(s, w) if signed(t) else (x & mask) >> min(s, w)
                        for x, s in zip(ints("a"), ints("b", isa.TYPE_U32))])
        if op == isa.OP_POPC:
            return out([bin(x & mask).count("1") for x in ints("a")], isa.TYPE_U32)
        if op == isa.OP_CLZ:
            return out([w - (x & mask).bit_length() for x in ints("a")], isa.TYPE_U32)
        if op == isa.OP_BREV:
            return out([int(format(x & mask, f"0{w}b")[::-1], 2) for x in ints("a")])
        if op == isa.OP_BFIND:
            r = []
            for x in ints("a"):
                v = (~x if x < 0 else x) & mask
                pos = v.bit_length() - 1 if v else -1
                if pos < 0:
                    r.append(0xFFFFFFFF)
                else:
                    r.append(w - 1 - pos if var == isa.VAR_BFIND_SHIFTAMT else pos)
            return out(r, isa.TYPE_U32)
        if op == isa.OP_BFE:
            r = []
            for x, p, ln in zip(ints("a"), ints("b", isa.TYPE_U32), ints("c", isa.TYPE_U32)):
                p, ln = p & 0xFF, ln & 0xFF
                xs = x & mask
                if signed(t):
                    sbit = (xs >> min(p + ln - 1, w - 1)) & 1 if ln else 0
                else:
                    sbit = 0
                v = 0
                for i in range(w):
                    if i < ln and p + i < w:
                        v |= ((xs >> (p + i)) & 1) << i
                    elif i >= ln or p + i >= w:
                        v |= sbit << i
                r.append(v)
            return out(r)
        if op == isa.OP_BFI:
            r = []
            for a, b, p, ln in zip(ints("a"), ints("b"), ints("c", isa.TYPE_U32),
                                   ints("d2", isa.TYPE_U32)):
                p, ln = p & 0xFF, ln & 0xFF
                v = b & mask
                for i in range(ln):
                    if p + i >= w:
                        break
                    v = (v & ~(1 << (p + i))) | (((a >> i) & 1) << (p + i))
                r.append(v)
            return out(r)
        if op == isa.OP_PRMT:
            assert var == 0, "prmt modes are not used by the corpus"
            r = []
            for a, b, c in zip(ints("a"), ints("b"), ints("c", isa.TYPE_U32)):
                src8 = ((b & 0xFFFFFFFF) << 32) | (a & 0xFFFFFFFF)
                v = 0
                for k in range(4):
                    sel = (c >> (4 * k)) & 0xF
                    byte = (src8 >> (8 * (sel & 7))) & 0xFF
                    if sel & 8:
                        byte = 0xFF if byte & 0x80 else 0
                    v |= byte << (8 * k)
                r.append(v)
            return out(r)
        raise AssertionError(f"integer op {isa.OPCODES[op].name}.{isa.TYPE_NAMES[t]}")

    def atomic(self, rec, lanes, t, mod, space) -> None:
        op = isa.mod_field(mod, isa.MOD_ATOM_MASK)
        dt = _DT[t]
        w = bits_of(t) // 8
        addr = self.address(rec, lanes)
        if (addr % np.uint64(w)).any():
            raise Fault("misaligned atomic")
        b = self.read(int(rec["b"]), t, lanes, int(rec["imm"]))
        c = self.read(int(rec["c"]), t, lanes, int(rec["imm"])) if op == isa.ATOM_CAS else None
        old = np.zeros(len(lanes), dt)
        for sp, m, a in self.resolve(space, addr, w):
            if sp == isa.SPACE_GLOBAL:
                buf, offs = self.mem.heap, self.mem.offsets(a[m], w)
            elif sp == isa.SPACE_SHARED:
                buf, offs = self.shared, self.check_range(a[m], w, len(self.shared), "shared")
            else:
                raise Fault(f"atomic on space {sp}")
            for i, off in zip(np.nonzero(m)[0].tolist(), offs.tolist()):
                self.atomic_one(buf[off:off + w].view(dt), i, op, b, c, old)
        if int(rec["op"]) == isa.OP_ATOM:
            self.write(int(rec["d"]), t, lanes, old)

    @staticmethod
    def atomic_one(cell, i, op, b, c, old) -> None:
        with np.errstate(over="ignore"):
            o, x = cell[0], b[i]
            if op == isa.ATOM_ADD:
                n = o + x
            elif op == isa.ATOM_MIN:
                n = min(o, x)
            elif op == isa.ATOM_MAX:
                n = max(o, x)
            elif op == isa.ATOM_INC:
                n = 0 if o >= x else o + 1
            elif op == isa.ATOM_DEC:
                n = x if (o == 0 or o > x) else o - 1
            elif op == isa.ATOM_EXCH:
                n = x
            elif op == isa.ATOM_CAS:
                n = c[i] if o == x else o
            elif op == isa.ATOM_AND:
                n = o & x
            elif op == isa.ATOM_OR:
                n = o | x
            elif op == isa.ATOM_XOR:
                n = o ^ x
            else:
                raise AssertionError(op)
            old[i] = o
            cell[0] = n

    def warp_op(self, rec, lanes, op, t, mod, var) -> None:
        warps = lanes // 32
        for w in np.unique(warps):
            ls = lanes[warps == w]
            lane_ids = ls % 32
            if op == isa.OP_ACTIVEMASK:
                m = sum(1 << int(x) for x in lane_ids)
                self.write(int(rec["d"]), isa.TYPE_B32, ls, np.full(len(ls), m, np.uint32))
                continue
            if op == isa.OP_VOTE:
                p = self.pred[ls, isa.operand_value(int(rec["a"]))]
                if mod & isa.MOD_NEG_C:
                    p = ~p
                if var == isa.VAR_VOTE_BALLOT:
                    m = sum(1 << int(x) for x, v in zip(lane_ids, p) if v)
                    self.write(int(rec["d"]), isa.TYPE_B32, ls, np.full(len(ls), m, np.uint32))
                else:
                    r = {isa.VAR_VOTE_ALL: p.all(), isa.VAR_VOTE_ANY: p.any(),
                         isa.VAR_VOTE_UNI: p.all() or not p.any()}[var]
                    self.write(int(rec["d"]), isa.TYPE_PRED, ls, np.full(len(ls), r))
                continue
            imm = int(rec["imm"])
            a = self.read(int(rec["a"]), isa.TYPE_B32, ls, imm)
            b = self.read(int(rec["b"]), isa.TYPE_U32, ls, imm)
            c = self.read(int(rec["c"]), isa.TYPE_U32, ls, imm)
            by_lane = {int(x): v for x, v in zip(lane_ids, a)}
            res = np.zeros(len(ls), np.uint32)
            ok = np.zeros(len(ls), bool)
            for i, lane in enumerate(lane_ids.tolist()):
                bval, cval, segmask = int(b[i]) & 31, int(c[i]) & 31, (int(c[i]) >> 8) & 31
                max_lane = (lane & segmask) | (cval & ~segmask)
                min_lane = lane & segmask
                if var == isa.VAR_SHFL_UP:
                    j = lane - bval
                    pv = j >= max_lane
                elif var == isa.VAR_SHFL_DOWN:
                    j = lane + bval
                    pv = j <= max_lane
                elif var == isa.VAR_SHFL_BFLY:
                    j = lane ^ bval
                    pv = j <= max_lane
                else:
                    j = min_lane | (bval & ~segmask)
                    pv = j <= max_lane
                if not pv or j not in by_lane:
                    j = lane
                res[i] = by_lane[j]
                ok[i] = pv
            self.write(int(rec["d"]), isa.TYPE_B32, ls, res)
            if isa.operand_kind(int(rec["d2"])):
                self.write(int(rec["d2"]), isa.TYPE_PRED, ls, ok)
