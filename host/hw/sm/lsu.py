"""The load/store unit: ld, st, atom and red in every state space (spec/isa.md §2.7).

An address (ISA-MEM-1) is the `a` operand (R64, R32 zero-extended, DATA, CONST, SIMM,
IMM or none) plus the signed `imm` offset, modulo 2**64. Its value for the group is one
of: a uniform int (every lane the same address), an affine values.Lin, or an array.

Spaces (ISA-MEM-2):
  global, const  VAs through the launch's GlobalMemory (memory.py): a uniform address is
                 one read, an affine one with the access width as stride over a
                 contiguous run of lanes is one range, anything else a gather/scatter;
  shared         offsets in the block's shared memory: the batch keeps the shared memory
                 of its nb blocks in one array, block q at q * stride;
  local          offsets in the thread's local memory: one array, lane i at i * stride;
  param          offsets in the launch's parameter buffer (read only);
  generic        split per lane by the windows GENERIC_SHARED_BASE / GENERIC_LOCAL_BASE.

A misaligned address, or one outside the shared, local or param memory, is a page fault
(MmuFault) naming the address (the generic address of a shared or local one) with the
access (ACCESS_READ, ACCESS_WRITE, or both for atomics), ISA-MEM-3. A shared or local
access checks every lane before it writes anything, as global ones do.
"""

from __future__ import annotations

import numpy as np

from pvgpu.host.hw.mmu import MmuFault
from pvgpu.host.hw.sm import values as V
from pvgpu.host.hw.sm.memory import apply_atomic
from pvgpu.spec import isa
from pvgpu.spec.isa import (GENERIC_LOCAL_BASE, GENERIC_SHARED_BASE, GENERIC_WINDOW_SIZE,
                      SPACE_CONST, SPACE_GENERIC, SPACE_GLOBAL, SPACE_LOCAL, SPACE_PARAM,
                      SPACE_SHARED)
from pvgpu.spec.kernels import ACCESS_READ, ACCESS_WRITE

U64 = np.uint64
_M64 = V.M64


def address(b, act, ins):
    """-> the group's address: int, Lin (64-bit) or uint64 array over act's lanes (idx
    order; all N lanes when act.all)."""
    v = b.val(ins.addr) if ins.addr is not None else 0
    off = ins.offset
    if isinstance(v, np.ndarray):
        arr = b.at(v, act.idx)
        arr = arr.astype(U64) if arr.dtype != np.uint64 else arr
        return arr + U64(off & _M64) if off else arr  # (read only, never modified)
    if isinstance(v, V.Lin):
        if v.bits == 32:
            w = V.lin_widen(b.geo, v, False, 32, 64)
            if w is None:
                return b.at(v, act.idx).astype(U64) + U64(off & _M64)
            v = w
        return V.lin_add(v, off, 64) if off else v
    return (int(v) + off) & _M64


def _lanes_of(b, act, addr):
    """An address value -> (uint64 array of the act's lanes' addresses)."""
    if isinstance(addr, np.ndarray):
        return addr
    if isinstance(addr, V.Lin):
        return addr.at(b.geo, act.idx)
    return np.full(act.k, addr, dtype=U64)


def _contiguous(b, act, addr, w):
    """-> (first address, count) if the lanes' addresses are consecutive w-byte ones."""
    if not isinstance(addr, V.Lin) or addr.stride(b.geo.T) != w:
        return None
    if act.all:
        lo, hi = 0, b.N
    else:
        span = act.span()
        if span is None:
            return None
        lo, hi = span
    first = (addr.c0 + w * lo) & _M64
    if first % w or first + w * (hi - lo) > 1 << 64:
        return None  # (the gather path reports a misaligned access)
    return first, hi - lo


def _fault(b, address: int, access: int, why: str):
    raise MmuFault(b.launch.vmid, address & _M64, access, why)


def _check_aligned(b, addrs: np.ndarray, w: int, access: int, base: int = 0):
    if w > 1:
        bad = (addrs & U64(w - 1)) != 0
        if bad.any():
            _fault(b, int(addrs[bad].min()) + base, access, "misaligned access")


# ------------------------------------------------------------------ spaces
def _window_split(addrs: np.ndarray):
    """-> (shared mask, local mask) of generic addresses."""
    sh = (addrs >= U64(GENERIC_SHARED_BASE)) & (addrs < U64(GENERIC_SHARED_BASE + GENERIC_WINDOW_SIZE))
    lo = (addrs >= U64(GENERIC_LOCAL_BASE)) & (addrs < U64(GENERIC_LOCAL_BASE + GENERIC_WINDOW_SIZE))
    return sh, lo


def _space_of(a: int) -> tuple:
    if GENERIC_SHARED_BASE <= a < GENERIC_SHARED_BASE + GENERIC_WINDOW_SIZE:
        return SPACE_SHARED, a - GENERIC_SHARED_BASE
    if GENERIC_LOCAL_BASE <= a < GENERIC_LOCAL_BASE + GENERIC_WINDOW_SIZE:
        return SPACE_LOCAL, a - GENERIC_LOCAL_BASE
    return SPACE_GLOBAL, a


def _lin_space(b, addr):
    """A generic Lin address wholly inside one window -> (space, Lin offset), else None."""
    lo, hi = addr.range(b.geo, signed=False)
    for space, base in ((SPACE_SHARED, GENERIC_SHARED_BASE), (SPACE_LOCAL, GENERIC_LOCAL_BASE)):
        if base <= lo and hi < base + GENERIC_WINDOW_SIZE:
            return space, V.lin_sub(addr, base, 64)
    if (lo >= 0 and hi < 1 << 64 and not (lo < GENERIC_SHARED_BASE + GENERIC_WINDOW_SIZE
                                            and hi >= GENERIC_LOCAL_BASE)):
        return SPACE_GLOBAL, addr
    return None


class _Flat:
    """Shared or local memory of a batch seen as one flat byte array."""

    def __init__(self, b, space):
        self.b = b
        self.space = space
        if space == SPACE_SHARED:
            self.mem, self.stride, self.size = b.shared, b.shared_stride, b.launch.shared_bytes
            self.base = GENERIC_SHARED_BASE
        else:
            self.mem, self.stride, self.size = b.local, b.local_stride, b.prog.local_size
            self.base = GENERIC_LOCAL_BASE

    def _base(self, w: int) -> np.ndarray:
        """Per lane of the batch: the element index (of width w) where its block's (shared)
        or its own (local) memory starts."""
        def make():
            if self.space == SPACE_LOCAL:
                owner = self.b.geo.lanes()
            else:
                owner = self.b.geo.tq()[1]
            return owner.astype(U64) * U64(self.stride // w)
        return self.b.geo.cached(("flat", self.space, w, self.stride), make)

    def index(self, offs: np.ndarray, lanes, w: int, access: int) -> np.ndarray:
        """Element indexes into a typed view of mem, after bounds and alignment checks
        (reductions first: the elementwise search runs only when a lane is bad)."""
        if offs.shape[0] == 0:
            return offs
        if w > 1 and int(np.bitwise_or.reduce(offs)) & (w - 1):
            _check_aligned(self.b, offs, w, access, self.base)
        if int(offs.max()) + w > self.size:
            bad = offs + U64(w) > U64(self.size)
            _fault(self.b, int(offs[bad].min()) + self.base, access,
                   f"outside {isa.SPACE_NAMES[self.space]} memory")
        base = self._base(w)
        if lanes is not None:
            base = base[lanes]
        return base + (offs >> U64(w.bit_length() - 1))

    def view(self, dtype):
        return self.mem.view(dtype)


def _lanes_index(b, act):
    return None if act.all else act.idx


# ------------------------------------------------------------------ loads
def load(b, act, ins) -> None:
    """ld: d = the value at the address, per lane."""
    addr = address(b, act, ins)
    space = ins.space
    dt = ins.dtype
    w = dt.itemsize
    if (act.all and w == ins.fdt.itemsize and space in (SPACE_GLOBAL, SPACE_CONST)
            and isinstance(addr, V.Lin)):
        run = _contiguous(b, act, addr, w)
        if run is not None:  # a view of memory, copied only if memory changes under it
            vals = b.launch.gmem.read_range(run[0], run[1], ins.fdt, copy=False)
            b.put_view(*ins.d, vals)
            return
    if space == SPACE_GENERIC:
        vals = _generic(b, act, addr, w, lambda sp, a, a_act: _load_space(b, a_act, sp, a, dt))
    else:
        vals = _load_space(b, act, space, addr, dt)
    b.write_at(ins.d, V.bits(vals, ins.type, ins.fdt), act)


def _load_space(b, act, space, addr, dt):
    w = dt.itemsize
    lanes = _lanes_index(b, act)
    if space in (SPACE_GLOBAL, SPACE_CONST):
        gm = b.launch.gmem
        if not isinstance(addr, (np.ndarray, V.Lin)):
            if addr % w:
                _fault(b, addr, ACCESS_READ, "misaligned access")
            return gm.read_one(addr, dt)
        run = _contiguous(b, act, addr, w)
        if run is not None:
            return gm.read_range(run[0], run[1], dt)
        addrs = _lanes_of(b, act, addr)
        _check_aligned(b, addrs, w, ACCESS_READ)
        return gm.gather(addrs, dt)
    if space == SPACE_PARAM:
        return _param(b, act, addr, dt)
    flat = _Flat(b, space)
    if not isinstance(addr, (np.ndarray, V.Lin)) and space == SPACE_SHARED and act.all:
        offs = np.array([addr], dtype=U64)
        flat.index(offs, np.array([0]), w, ACCESS_READ)  # checks
        per_block = flat.view(dt).reshape(b.geo.nb, -1)[:, addr // w]
        return np.repeat(per_block, b.geo.T) if b.geo.nb > 1 else per_block[0]
    if not isinstance(addr, (np.ndarray, V.Lin)) and space == SPACE_LOCAL and act.all:
        flat.index(np.array([addr], dtype=U64), np.array([0]), w, ACCESS_READ)
        return flat.view(dt).reshape(b.N, -1)[:, addr // w].copy()
    offs = _lanes_of(b, act, addr)
    idx = flat.index(offs, lanes, w, ACCESS_READ)
    return flat.view(dt)[idx]


def _param(b, act, addr, dt):
    w = dt.itemsize
    buf = b.launch.params
    if not isinstance(addr, (np.ndarray, V.Lin)):
        if addr % w or addr + w > buf.shape[0]:
            _fault(b, addr, ACCESS_READ, "outside the parameter buffer")
        return buf[addr:addr + w].view(dt)[0]
    offs = _lanes_of(b, act, addr)
    _check_aligned(b, offs, w, ACCESS_READ)
    bad = offs + U64(w) > U64(buf.shape[0])
    if bad.any():
        _fault(b, int(offs[bad].min()), ACCESS_READ, "outside the parameter buffer")
    n = buf.shape[0] - buf.shape[0] % w
    return buf[:n].view(dt)[(offs // U64(w)).astype(np.int64)]


def _generic(b, act, addr, w, fn):
    """Run fn(space, address, act) for the lanes of each window of a generic address;
    -> the lanes' values in act order (or None when fn returns None)."""
    if not isinstance(addr, (np.ndarray, V.Lin)):
        space, a = _space_of(addr)
        return fn(space, a, act)
    if isinstance(addr, V.Lin):
        hit = _lin_space(b, addr)
        if hit is not None:
            return fn(hit[0], hit[1], act)
        addr = addr.at(b.geo, act.idx)
    sh, lo = _window_split(addr)
    if not sh.any() and not lo.any():
        return fn(SPACE_GLOBAL, addr, act)
    out = None
    for space, m, base in ((SPACE_SHARED, sh, GENERIC_SHARED_BASE),
                           (SPACE_LOCAL, lo, GENERIC_LOCAL_BASE),
                           (SPACE_GLOBAL, ~(sh | lo), 0)):
        if not m.any():
            continue
        sub = _sub_active(b, act, m)
        r = fn(space, addr[m] - U64(base), sub)
        if r is not None:
            if out is None:
                out = np.empty(act.k, dtype=np.asarray(r).dtype)
            out[m] = r
    return out


def _sub_active(b, act, m):
    """The Active of the lanes m (a bool mask over act's lanes) of act."""
    from pvgpu.host.hw.sm.executor import Active
    lanes = act.idx if act.mask is not None else b.geo.lanes()
    mask = np.zeros(b.N, dtype=bool)
    mask[lanes[m]] = True
    sub = Active(mask, int(np.count_nonzero(m)), False, b.N)
    return sub


# ------------------------------------------------------------------ stores
def store(b, act, ins) -> None:
    """st: the value b at the address, per lane (in lane order where addresses repeat)."""
    addr = address(b, act, ins)
    dt = ins.dtype
    val = b.val(ins.value)
    if isinstance(val, (V.Lin, np.ndarray)) and not (act.all and type(val) is np.ndarray):
        val = b.at(val, act.idx)
    typed = V.typed(val, ins.type) if isinstance(val, np.ndarray) else V.scalar(val, ins.type)
    if type(typed) is not np.ndarray or typed.dtype != dt:
        typed = np.asarray(typed).astype(dt, copy=False)
    if ins.space == SPACE_GENERIC:
        def fn(space, a, sub):
            part = typed if typed.ndim == 0 or sub is act else typed[_sub_positions(b, act, sub)]
            _store_space(b, sub, space, a, dt, part)
        _generic(b, act, addr, dt.itemsize, fn)
    else:
        _store_space(b, act, ins.space, addr, dt, typed)


def _sub_positions(b, act, sub):
    """Positions of sub's lanes within act's lanes."""
    lanes = act.idx if act.mask is not None else b.geo.lanes()
    return np.searchsorted(lanes, sub.idx)


def _store_space(b, act, space, addr, dt, vals):
    w = dt.itemsize
    lanes = _lanes_index(b, act)
    if space == SPACE_GLOBAL:
        gm = b.launch.gmem
        if not isinstance(addr, (np.ndarray, V.Lin)):
            if addr % w:
                _fault(b, addr, ACCESS_WRITE, "misaligned access")
            last = vals if vals.ndim == 0 else vals[-1]  # lane order: the last one lands
            gm.write_range(addr, last, 1, dt)
            return
        run = _contiguous(b, act, addr, w)
        if run is not None:
            gm.write_range(run[0], vals, run[1], dt)
            return
        addrs = _lanes_of(b, act, addr)
        _check_aligned(b, addrs, w, ACCESS_WRITE)
        gm.scatter(addrs, vals, dt)
        return
    flat = _Flat(b, space)
    if not isinstance(addr, (np.ndarray, V.Lin)) and space == SPACE_LOCAL and act.all:
        flat.index(np.array([addr], dtype=U64), np.array([0]), w, ACCESS_WRITE)
        flat.view(dt).reshape(b.N, -1)[:, addr // w] = vals
        return
    offs = _lanes_of(b, act, addr)
    idx = flat.index(offs, lanes, w, ACCESS_WRITE)
    flat.view(dt)[idx] = vals


# ------------------------------------------------------------------ atomics
def atomic(b, act, ins) -> None:
    """atom / red: ISA-MEM-4."""
    addr = address(b, act, ins)
    dt = ins.dtype
    lanes = act.idx
    bv = b.at(b.val(ins.b), lanes)
    bv = V.typed(bv, ins.type) if isinstance(bv, np.ndarray) else V.scalar(bv, ins.type)
    cv = None
    if ins.c is not None:
        cv = b.at(b.val(ins.c), lanes)
        cv = V.typed(cv, ins.type) if isinstance(cv, np.ndarray) else V.scalar(cv, ins.type)
    want = ins.d is not None

    def fn(space, a, sub):
        pos = None if sub is act else _sub_positions(b, act, sub)
        pb = bv if np.ndim(bv) == 0 or pos is None else bv[pos]
        pc = cv if cv is None or np.ndim(cv) == 0 or pos is None else cv[pos]
        return _atomic_space(b, sub, space, a, dt, ins.aop, pb, pc, want)

    old = _generic(b, act, addr, dt.itemsize, fn) if ins.space == SPACE_GENERIC else fn(
        ins.space, addr, act)
    if want:
        b.write_at(ins.d, V.bits(old, ins.type, ins.fdt), act)


def _atomic_space(b, act, space, addr, dt, aop, bv, cv, want):
    w = dt.itemsize
    addrs = _lanes_of(b, act, addr)
    access = ACCESS_READ | ACCESS_WRITE
    if space == SPACE_GLOBAL:
        _check_aligned(b, addrs, w, access)
        return b.launch.gmem.atomic(addrs, dt, aop, bv, cv, want)
    if space != SPACE_SHARED:
        _fault(b, int(addrs.min()) if addrs.size else 0, access, "atomic outside global/shared")
    flat = _Flat(b, space)
    idx = flat.index(addrs, _lanes_index(b, act), w, access)
    n = idx.shape[0]
    bb = np.broadcast_to(np.asarray(bv, dt), (n,))
    cc = None if cv is None else np.broadcast_to(np.asarray(cv, dt), (n,))
    return apply_atomic(flat.view(dt), idx, aop, bb, cc, want)
