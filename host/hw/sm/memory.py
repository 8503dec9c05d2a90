"""Global memory of a launch, and atomics (spec/isa.md ISA-MEM-*).

GlobalMemory reaches the launching context's memory through its page tables (Mmu.
translate with READ for loads, WRITE for stores, both for atomics), so VRAM, system and
peer pages all work and nothing outside the context can be touched (SM-EXEC-6).

  * A range of consecutive addresses (a load or store whose address is affine in the
    thread index with the access width as stride, values.Lin) is translated once into
    extents and copied as slices: read_range / write_range.
  * Any other set of addresses is located: the pages the lanes touch are translated in
    runs of consecutive pages, each page is mapped to (root array, byte offset) -- the
    root being the VRAM array, a DMA-mapped host buffer or a peer's VRAM -- and the
    lanes are gathered from (or scattered into) a typed view of each root.

A fault names the lowest address of the instruction's lanes that does not translate
(MmuFault, turned into IRQ_PAGE_FAULT by the command processor). Every lane of an
instruction is translated before anything is written, so a faulting store writes
nothing; earlier instructions' writes stay (ISA-MEM-3). Stores of lanes with the same
address land in lane order, the last one wins (ISA-MEM-5).

Atomics (ISA-MEM-4) run as if the lanes executed one after another in lane order:
distinct addresses at once; conflicting lanes of an operation without a result with
ufunc.at (add, min, max, and, or, xor); integer add with a result by a segmented prefix
sum; cas on few addresses by runs (all lanes up to the next one whose compare value
matches fail at once: a CAS loop costs one step per success), inc/dec with one limit in
closed form; the other operations with a result by segments (ufunc.accumulate per
address) or by rounds (one lane per address per round), whichever takes fewer steps.
Batches run one after another on the engine's thread, so an instruction's atomics are
indivisible with respect to every other access of the launch.
"""

from __future__ import annotations

import numpy as np

from pvgpu.host.hw.mmu import MmuFault
from pvgpu.host.hw.regs import PAGE_SHIFT, PAGE_SIZE
from pvgpu.host.hw.sm import stopping
from pvgpu.spec import isa
from pvgpu.spec.kernels import ACCESS_READ, ACCESS_WRITE

_PAGE_MASK = PAGE_SIZE - 1
BITMAP_PAGES = 1 << 16  # spans up to this many pages find their runs with a bitmap
HOLD_GIL_BYTES = 1 << 16  # copies up to this size keep the GIL (copy_bytes)


def copy_bytes(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[:] = src, both contiguous uint8 arrays of one length. A copy of up to
    HOLD_GIL_BYTES keeps the GIL: numpy lets it go for any copy of more than a few hundred
    elements, and taking it back can mean waiting behind a busy thread of the host for a
    whole switch interval, far longer than the copy."""
    if dst.shape[0] <= HOLD_GIL_BYTES:
        memoryview(dst)[:] = memoryview(src)
    else:
        dst[:] = src


def root_of(view: np.ndarray):
    """(root array, byte offset of view in it): the array whose memory view is part of."""
    root = view
    while isinstance(root.base, np.ndarray):
        root = root.base
    off = view.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return root, off


class GlobalMemory:
    def __init__(self, mmu, vmid: int):
        self.mmu = mmu
        self.vmid = vmid
        self._typed: dict = {}  # (id(root), dtype) -> (root, typed view)
        self.on_write = None  # fn(list of uint8 arrays) before they are written

    # ------------------------------------------------------------- ranges
    def extents(self, va: int, nbytes: int, access: int) -> list:
        return self.mmu.translate(self.vmid, va, nbytes, access)

    def read_range(self, va: int, count: int, dtype, copy: bool = True) -> np.ndarray:
        """count elements at va (consecutive) -> a new array (or, copy=False, a view of
        the memory when the range is one extent)."""
        dtype = np.dtype(dtype)
        ext = self.extents(va, count * dtype.itemsize, ACCESS_READ)
        if len(ext) == 1 and not copy:
            return ext[0].view(dtype)
        out = np.empty(count * dtype.itemsize, dtype=np.uint8)
        off = 0
        for e in ext:
            copy_bytes(out[off:off + e.shape[0]], e)
            off += e.shape[0]
        return out.view(dtype)

    def write_range(self, va: int, values, count: int, dtype) -> None:
        """values (an array of count, or a scalar) at va, consecutive."""
        dtype = np.dtype(dtype)
        ext = self.extents(va, count * dtype.itemsize, ACCESS_WRITE)
        if self.on_write is not None:
            self.on_write(ext)
        if getattr(values, "ndim", 0) == 0:  # (a Python or numpy scalar, a 0-d array)
            fill = np.asarray(values, dtype)
            for e in ext:
                e.view(dtype)[:] = fill
            return
        raw = np.ascontiguousarray(values, dtype).view(np.uint8)
        off = 0
        for e in ext:
            n = e.shape[0]
            copy_bytes(e, raw[off:off + n])
            off += n

    def read_one(self, va: int, dtype):
        dtype = np.dtype(dtype)
        ext = self.extents(va, dtype.itemsize, ACCESS_READ)
        return (ext[0] if len(ext) == 1 else np.concatenate(ext)).view(dtype)[0]

    # ------------------------------------------------------------- scattered
    def _typed_view(self, root: np.ndarray, dtype):
        key = (id(root), dtype)
        hit = self._typed.get(key)
        if hit is None:
            n = root.shape[0] - root.shape[0] % dtype.itemsize
            hit = (root, root[:n].view(dtype))
            self._typed[key] = hit
        return hit[1]

    def locate(self, addrs: np.ndarray, width: int, access: int) -> list:
        """Lanes' addresses (uint64, aligned to width) -> [(root, lanes or None, byte
        offsets in root)], every lane in exactly one group; raises MmuFault."""
        pages = addrs >> np.uint64(PAGE_SHIFT)
        pmin, pmax = int(pages.min()), int(pages.max())
        amin, amax = int(addrs.min()), int(addrs.max())
        span = pmax - pmin + 1
        if span <= BITMAP_PAGES:
            touched = np.zeros(span, dtype=bool)
            rel = (pages - np.uint64(pmin)).astype(np.int64)
            touched[rel] = True
            used = np.flatnonzero(touched)
            uniq = used + pmin
            lookup = ("bitmap", rel)
        else:
            uniq, inverse = np.unique(pages, return_inverse=True)
            uniq = uniq.astype(np.int64)
            used = None
            lookup = ("unique", inverse.reshape(-1))
        brk = np.flatnonzero(np.diff(uniq) != 1) + 1
        starts = np.concatenate(([0], brk)).tolist()
        ends = np.concatenate((brk, [uniq.shape[0]])).tolist()
        page_off = np.empty(uniq.shape[0], dtype=np.int64)
        page_root = np.empty(uniq.shape[0], dtype=np.int32)
        roots: list = []
        root_index: dict = {}
        uniq_l = uniq.tolist()
        for run, (s, e) in enumerate(zip(starts, ends)):
            if run % stopping.CHECK_EVERY == stopping.CHECK_EVERY - 1:
                stopping.check()
            p0, p1 = uniq_l[s], uniq_l[e - 1] + 1
            va0 = max(p0 << PAGE_SHIFT, amin)
            va1 = min(p1 << PAGE_SHIFT, amax + width)
            try:
                ext = self.extents(va0, va1 - va0, access)
            except MmuFault as f:
                above = addrs[addrs >= np.uint64(f.address)]
                first = int(above.min()) if above.size else f.address
                raise MmuFault(f.vmid, first, f.access, f.reason) from None
            va = va0
            for view in ext:
                root, off = root_of(view)
                rid = root_index.get(id(root))
                if rid is None:
                    rid = root_index[id(root)] = len(roots)
                    roots.append(root)
                n = view.shape[0]
                first_page = va >> PAGE_SHIFT
                last_page = (va + n - 1) >> PAGE_SHIFT
                k0 = s + (first_page - p0)
                k1 = s + (last_page - p0) + 1
                page_off[k0:k1] = (off - (va & _PAGE_MASK)) + (
                    np.arange(k1 - k0, dtype=np.int64) << PAGE_SHIFT)
                page_root[k0:k1] = rid
                va += n
        if lookup[0] == "bitmap":
            slot = np.empty(span, dtype=np.int64)
            slot[used] = np.arange(used.shape[0])
            k = slot[lookup[1]]
        else:
            k = lookup[1]
        phys = page_off[k] + (addrs & np.uint64(_PAGE_MASK)).astype(np.int64)
        if len(roots) == 1:
            return [(roots[0], None, phys)]
        rid = page_root[k]
        return [(r, np.flatnonzero(rid == i), phys[rid == i]) for i, r in enumerate(roots)]

    def gather(self, addrs: np.ndarray, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        out = None
        w = dtype.itemsize
        for root, lanes, phys in self.locate(addrs, w, ACCESS_READ):
            vals = self._typed_view(root, dtype)[phys // w]
            if lanes is None:
                return vals
            if out is None:
                out = np.empty(addrs.shape[0], dtype)
            out[lanes] = vals
        return out

    def scatter(self, addrs: np.ndarray, values, dtype) -> None:
        dtype = np.dtype(dtype)
        w = dtype.itemsize
        groups = self.locate(addrs, w, ACCESS_WRITE)  # every lane translated first
        self._before_write(groups, w)
        values = np.asarray(values, dtype)
        for root, lanes, phys in groups:
            v = values if values.ndim == 0 or lanes is None else values[lanes]
            self._typed_view(root, dtype)[phys // w] = v

    def _before_write(self, groups, w: int) -> None:
        if self.on_write is not None:
            self.on_write([root[int(phys.min()):int(phys.max()) + w]
                           for root, _, phys in groups if phys.shape[0]])

    def atomic(self, addrs, dtype, aop, b, c, want_old):
        dtype = np.dtype(dtype)
        w = dtype.itemsize
        groups = self.locate(addrs, w, ACCESS_READ | ACCESS_WRITE)
        self._before_write(groups, w)
        n = addrs.shape[0]
        b = np.broadcast_to(np.asarray(b, dtype), (n,))
        c = None if c is None else np.broadcast_to(np.asarray(c, dtype), (n,))
        old = np.empty(n, dtype) if want_old else None
        for root, lanes, phys in groups:
            view = self._typed_view(root, dtype)
            sel = slice(None) if lanes is None else lanes
            r = apply_atomic(view, phys // w, aop, b[sel], None if c is None else c[sel],
                             want_old)
            if want_old:
                old[sel] = r
        return old


# ------------------------------------------------------------------ atomics
_UFUNC_AT = {isa.ATOM_ADD: np.add, isa.ATOM_MIN: np.minimum, isa.ATOM_MAX: np.maximum,
             isa.ATOM_AND: np.bitwise_and, isa.ATOM_OR: np.bitwise_or,
             isa.ATOM_XOR: np.bitwise_xor}


def atomic_op(aop, old, b, c):
    """The new value of one atomic step (vectorised over distinct addresses)."""
    if aop == isa.ATOM_ADD:
        return np.add(old, b, dtype=old.dtype)
    if aop == isa.ATOM_MIN:
        return np.minimum(old, b)
    if aop == isa.ATOM_MAX:
        return np.maximum(old, b)
    if aop == isa.ATOM_INC:
        return np.where(old >= b, old.dtype.type(0), old + old.dtype.type(1))
    if aop == isa.ATOM_DEC:
        return np.where((old == 0) | (old > b), b, old - old.dtype.type(1))
    if aop == isa.ATOM_EXCH:
        return np.array(b, copy=True)
    if aop == isa.ATOM_CAS:
        return np.where(old == b, c, old)
    if aop == isa.ATOM_AND:
        return old & b
    if aop == isa.ATOM_OR:
        return old | b
    return old ^ b


def apply_atomic(view: np.ndarray, idx: np.ndarray, aop: int, b, c, want_old: bool):
    """Apply lanes' atomics to view[idx] in lane order; -> the old values (or None)."""
    k = idx.shape[0]
    if k == 0:
        return np.empty(0, view.dtype) if want_old else None
    order = np.argsort(idx, kind="stable")
    sidx = idx[order]
    dup = sidx[1:] == sidx[:-1]
    if not dup.any():
        old = view[idx]
        view[idx] = atomic_op(aop, old, b, c)
        return old if want_old else None
    if not want_old and aop in _UFUNC_AT and not (
            aop in (isa.ATOM_MIN, isa.ATOM_MAX) and view.dtype.kind == "f"):
        _UFUNC_AT[aop].at(view, idx, b)
        return None
    head = np.concatenate(([True], ~dup))  # first lane of each address (sorted order)
    gstart = np.flatnonzero(head)
    gid = np.cumsum(head) - 1
    ngroups = gstart.shape[0]
    sb = b[order]
    old_sorted = np.empty(k, view.dtype)
    if aop == isa.ATOM_ADD and view.dtype.kind in "iu":
        ut = np.dtype(f"uint{8 * view.dtype.itemsize}")
        bu = sb.view(ut)
        cs = np.cumsum(bu, dtype=ut)
        before = cs[gstart] - bu[gstart]  # sum of the groups before, wrapping
        excl = cs - bu - before[gid]
        mem = view[sidx[gstart]].view(ut)
        old_sorted[:] = (mem[gid] + excl).view(view.dtype)
        gend = np.append(gstart[1:], k) - 1
        view[sidx[gstart]] = (mem + (cs[gend] - before)).view(view.dtype)
    elif aop == isa.ATOM_EXCH:
        prev = np.empty(k, view.dtype)
        prev[1:] = sb[:-1]
        prev[gstart] = view[sidx[gstart]]
        old_sorted[:] = prev
        gend = np.append(gstart[1:], k) - 1
        view[sidx[gstart]] = sb[gend]
    elif aop in (isa.ATOM_CAS, isa.ATOM_INC, isa.ATOM_DEC) and ngroups < 64:
        gend = np.append(gstart[1:], k)
        sc = None if c is None else c[order]
        for g, (g0, g1) in enumerate(zip(gstart.tolist(), gend.tolist())):
            if g % stopping.CHECK_EVERY == stopping.CHECK_EVERY - 1:
                stopping.check()
            a = sidx[g0]
            fn = _cas_run if aop == isa.ATOM_CAS else _counter_run
            view[a] = fn(aop, view[a], sb[g0:g1], None if sc is None else sc[g0:g1],
                         old_sorted[g0:g1])
    else:
        sc = None if c is None else c[order]
        rank = np.arange(k) - gstart[gid]
        rounds = int(rank.max()) + 1
        ufunc = _UFUNC_AT.get(aop) if aop != isa.ATOM_ADD or view.dtype.kind == "f" else None
        if ufunc is not None and ngroups < rounds:
            gend = np.append(gstart[1:], k)
            for g, (g0, g1) in enumerate(zip(gstart.tolist(), gend.tolist())):
                if g % stopping.CHECK_EVERY == stopping.CHECK_EVERY - 1:
                    stopping.check()
                a = sidx[g0]
                seq = np.concatenate(([view[a]], sb[g0:g1])).astype(view.dtype)
                acc = _sequential(ufunc, seq, view.dtype)
                old_sorted[g0:g1] = acc[:-1]
                view[a] = acc[-1]
        else:
            by_round = np.argsort(rank, kind="stable")
            counts = np.bincount(rank, minlength=rounds)
            bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
            for r in range(rounds):
                if r % stopping.CHECK_EVERY == stopping.CHECK_EVERY - 1:
                    stopping.check()
                lanes = by_round[bounds[r]:bounds[r + 1]]
                a = sidx[lanes]
                o = view[a]
                view[a] = atomic_op(aop, o, sb[lanes], None if sc is None else sc[lanes])
                old_sorted[lanes] = o
    if not want_old:
        return None
    old = np.empty(k, view.dtype)
    old[order] = old_sorted
    return old


def _cas_run(aop, v, b, c, old):
    """The CAS of lanes b/c (lane order) on one word holding v: each run of lanes whose
    compare value differs fails at once (old = v); -> the final value. One step per
    successful lane, however many lanes fail (the usual CAS loop: one success a round)."""
    pos, k = 0, b.shape[0]
    while pos < k:
        hit = np.flatnonzero(b[pos:] == v)
        if not hit.shape[0]:
            old[pos:] = v
            break
        j = pos + int(hit[0])
        old[pos:j + 1] = v
        v = c[j]
        pos = j + 1
        stopping.check()
    return v


def _counter_run(aop, v, b, c, old):
    """inc/dec of lanes on one word: with one limit b for all of them (atomicInc(p, n)) the
    values cycle through 0..b, in closed form; otherwise lane by lane."""
    k = b.shape[0]
    if int(b.min()) != int(b.max()):
        for j in range(k):
            old[j] = v
            v = atomic_op(aop, np.asarray([v]), b[j:j + 1], None)[0]
        return v
    dt = old.dtype
    limit, v0 = int(b[0]), int(v)
    m = limit + 1
    j = np.arange(k, dtype=object if m > 1 << 62 else np.int64)
    if aop == isa.ATOM_INC:
        seq = (v0 + j) % m if v0 <= limit else np.where(j == 0, v0, (j - 1) % m)
        last = (v0 + k) % m if v0 <= limit else (k - 1) % m
    else:
        seq = (v0 - j) % m if v0 <= limit else np.where(j == 0, v0, (limit - (j - 1)) % m)
        last = (v0 - k) % m if v0 <= limit else (limit - (k - 1)) % m
    old[:] = np.asarray(seq, dtype=object).astype(dt) if m > 1 << 62 else np.asarray(seq).astype(dt)
    return dt.type(last)


def _sequential(ufunc, seq, dtype):
    """ufunc.accumulate, one element after another in dtype (exactly what lane-ordered
    atomics compute)."""
    return ufunc.accumulate(seq, dtype=dtype)
