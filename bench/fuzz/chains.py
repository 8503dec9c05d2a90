"""Invalid descriptor chains: one family per rule of spec §4.7 (VQ-CHAIN validation).

Each family draws, for a seed, a chain (or an avail index) that breaks exactly its rule,
laid out in a ring of Q descriptors over guest memory of `mem_size` bytes, with indirect
tables and buffers in a scratch area. `publish` writes it into guest memory through the
memory object (so the inline model marks it dirty for the next kick) and makes it
available. The device must answer every one with DEVICE_NEEDS_RESET and config_changed
(VQ-INVALID-1); the unit tests check that transport/chain.py's own validator rejects each
family with its clause.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from pvgpu.spec.wire import (VIRTQ_DESC_F_INDIRECT, VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE,
                       VIRTQ_DESC_FORMAT, VIRTQ_DESC_SIZE, VIRTQ_MAX_CHAIN_BYTES,
                       VIRTQ_MAX_INDIRECT)
from pvgpu.transport.errors import (VQ_ADDR_RANGE, VQ_AVAIL_JUMP, VQ_CHAIN_LEN, VQ_HEAD_RANGE,
                              VQ_INDIRECT_LEN, VQ_INDIRECT_NESTED, VQ_INDIRECT_NEXT,
                              VQ_INDIRECT_NOT_NEGOTIATED, VQ_LOOP, VQ_NEXT_RANGE,
                              VQ_WRITE_ORDER)

_DESC = struct.Struct(VIRTQ_DESC_FORMAT)
NEXT, WRITE, INDIRECT = VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE, VIRTQ_DESC_F_INDIRECT
IDX_MASK = 0xFFFF


@dataclass
class Geometry:
    """Where a family may put things: the queue size, guest memory, a scratch area."""

    qsize: int
    mem_size: int
    scratch: int  # gpa of the scratch area (indirect tables, buffers)
    scratch_size: int
    indirect: bool  # VIRTIO_F_INDIRECT_DESC negotiated


@dataclass
class BadChain:
    clause: str
    head: int = 0
    descs: dict = field(default_factory=dict)  # table index -> (addr, len, flags, next)
    tables: list = field(default_factory=list)  # (gpa, [(addr, len, flags, next), ...])
    jump: int = 0  # how far beyond +1 the avail idx moves (VQ-AVAIL-JUMP)


def table_bytes(entries) -> bytes:
    return b"".join(_DESC.pack(*e) for e in entries)


def publish(mem, layout, avail_idx: int, bad: BadChain) -> int:
    """Write `bad` into guest memory and publish it at avail index `avail_idx`.
    -> the new avail idx."""
    for i, d in bad.descs.items():
        mem.write(layout.desc + i * VIRTQ_DESC_SIZE, _DESC.pack(*d))
    for gpa, entries in bad.tables:
        mem.write(gpa, table_bytes(entries))
    slot = layout.avail + 4 + 2 * (avail_idx % layout.size)
    mem.write(slot, struct.pack("<H", bad.head))
    new = (avail_idx + 1 + bad.jump) & IDX_MASK
    mem.write(layout.avail + 2, struct.pack("<H", new))
    return new


# ---------------------------------------------------------------------- helpers
def _buf(rng, g: Geometry, n: int = 64) -> tuple:
    """(addr, len) of a buffer inside the scratch area's second half."""
    n = rng.randrange(1, n + 1)
    half = g.scratch + g.scratch_size // 2
    return half + rng.randrange(0, g.scratch_size // 2 - n), n


def _direct(rng, g: Geometry, count: int, flags=0) -> tuple:
    """count distinct descriptor indices chained with NEXT; -> (indices, descs) where the
    last one has no NEXT yet."""
    idx = rng.sample(range(g.qsize), count)
    descs = {}
    for k, i in enumerate(idx):
        addr, n = _buf(rng, g)
        last = k == count - 1
        descs[i] = (addr, n, flags | (0 if last else NEXT), 0 if last else idx[k + 1])
    return idx, descs


def _table(rng, g: Geometry, n: int, flags=0) -> list:
    """n indirect-table entries chained 0 -> 1 -> ... -> n-1."""
    out = []
    for k in range(n):
        addr, ln = _buf(rng, g)
        last = k == n - 1
        out.append((addr, ln, flags | (0 if last else NEXT), 0 if last else k + 1))
    return out


def _with_indirect(rng, g: Geometry, table_gpa: int, table_len: int, flags=INDIRECT) -> BadChain:
    """Zero or more readable direct descriptors, then one INDIRECT descriptor."""
    pre = rng.randrange(0, min(3, g.qsize - 1) + 1)
    idx = rng.sample(range(g.qsize), pre + 1)
    descs = {}
    for k in range(pre):
        addr, n = _buf(rng, g)
        descs[idx[k]] = (addr, n, NEXT, idx[k + 1])
    descs[idx[pre]] = (table_gpa, table_len, flags | (WRITE if rng.random() < 0.5 else 0), 0)
    return BadChain("", head=idx[0], descs=descs)


def _set(bad: BadChain, clause: str) -> BadChain:
    bad.clause = clause
    return bad


# ---------------------------------------------------------------------- the families
def avail_jump(rng, g: Geometry) -> BadChain:
    """avail.idx moves more than Q entries ahead."""
    idx, descs = _direct(rng, g, 1)
    return BadChain(VQ_AVAIL_JUMP, head=idx[0], descs=descs,
                    jump=rng.randrange(g.qsize, IDX_MASK - 1))


def head_range(rng, g: Geometry) -> BadChain:
    return BadChain(VQ_HEAD_RANGE, head=rng.randrange(g.qsize, IDX_MASK + 1))


def next_range(rng, g: Geometry) -> BadChain:
    if g.indirect and rng.random() < 0.5:  # inside an indirect table
        n = rng.randrange(1, 9)
        entries = _table(rng, g, n)
        k = rng.randrange(n)
        addr, ln, flags, _ = entries[k]
        entries[k] = (addr, ln, flags | NEXT, rng.randrange(n, IDX_MASK + 1))
        bad = _with_indirect(rng, g, g.scratch, n * VIRTQ_DESC_SIZE)
        bad.tables.append((g.scratch, entries))
        return _set(bad, VQ_NEXT_RANGE)
    idx, descs = _direct(rng, g, rng.randrange(1, min(5, g.qsize) + 1))
    addr, n, flags, _ = descs[idx[-1]]
    descs[idx[-1]] = (addr, n, flags | NEXT, rng.randrange(g.qsize, IDX_MASK + 1))
    return BadChain(VQ_NEXT_RANGE, head=idx[0], descs=descs)


def loop(rng, g: Geometry) -> BadChain:
    if g.indirect and rng.random() < 0.5:
        n = rng.randrange(1, 9)
        entries = _table(rng, g, n)
        addr, ln, _, _ = entries[-1]
        entries[-1] = (addr, ln, NEXT, rng.randrange(n))  # back into the table
        bad = _with_indirect(rng, g, g.scratch, n * VIRTQ_DESC_SIZE)
        bad.tables.append((g.scratch, entries))
        return _set(bad, VQ_LOOP)
    idx, descs = _direct(rng, g, rng.randrange(1, min(6, g.qsize) + 1))
    addr, n, _, _ = descs[idx[-1]]
    descs[idx[-1]] = (addr, n, NEXT, idx[rng.randrange(len(idx))])
    return BadChain(VQ_LOOP, head=idx[0], descs=descs)


def indirect_not_negotiated(rng, g: Geometry) -> BadChain:
    n = rng.randrange(1, 5)
    bad = _with_indirect(rng, g, g.scratch, n * VIRTQ_DESC_SIZE)
    bad.tables.append((g.scratch, _table(rng, g, n)))
    return _set(bad, VQ_INDIRECT_NOT_NEGOTIATED)


def indirect_next(rng, g: Geometry) -> BadChain:
    n = rng.randrange(1, 5)
    bad = _with_indirect(rng, g, g.scratch, n * VIRTQ_DESC_SIZE, flags=INDIRECT | NEXT)
    (i, (addr, ln, flags, _)), = [(i, d) for i, d in bad.descs.items() if d[2] & INDIRECT]
    bad.descs[i] = (addr, ln, flags, rng.randrange(g.qsize))
    bad.tables.append((g.scratch, _table(rng, g, n)))
    return _set(bad, VQ_INDIRECT_NEXT)


def indirect_nested(rng, g: Geometry) -> BadChain:
    n = rng.randrange(1, 6)
    entries = _table(rng, g, n)
    k = rng.randrange(n)
    _, _, flags, nxt = entries[k]
    entries[k] = (g.scratch, 16 * rng.randrange(1, 4), flags | INDIRECT, nxt)
    bad = _with_indirect(rng, g, g.scratch, n * VIRTQ_DESC_SIZE)
    bad.tables.append((g.scratch, entries))
    return _set(bad, VQ_INDIRECT_NESTED)


def indirect_len(rng, g: Geometry) -> BadChain:
    length = rng.choice((0, rng.randrange(1, 16), 16 * rng.randrange(1, 8) + rng.randrange(1, 16),
                         (VIRTQ_MAX_INDIRECT + 1) * VIRTQ_DESC_SIZE,
                         (rng.randrange(VIRTQ_MAX_INDIRECT + 1, 1 << 28)) * VIRTQ_DESC_SIZE))
    bad = _with_indirect(rng, g, g.scratch, length)
    bad.tables.append((g.scratch, _table(rng, g, 2)))
    return _set(bad, VQ_INDIRECT_LEN)


def write_order(rng, g: Geometry) -> BadChain:
    if g.indirect and (g.qsize < 2 or rng.random() < 0.5):  # inside an indirect table
        n = rng.randrange(2, 8)
        entries = _table(rng, g, n)
        k = rng.randrange(n - 1)
        entries = [(a, ln, f | (WRITE if i <= k else 0), nx)
                   for i, (a, ln, f, nx) in enumerate(entries)]
        a, ln, f, nx = entries[-1]
        entries[-1] = (a, rng.choice((0, ln)), f & ~WRITE, nx)  # a readable after a writable
        bad = _with_indirect(rng, g, g.scratch, n * VIRTQ_DESC_SIZE)
        bad.tables.append((g.scratch, entries))
        return _set(bad, VQ_WRITE_ORDER)
    count = rng.randrange(2, min(6, g.qsize) + 1)
    idx, descs = _direct(rng, g, count)
    w = rng.randrange(count - 1)  # this one writable, the last readable
    a, ln, f, nx = descs[idx[w]]
    descs[idx[w]] = (a, ln, f | WRITE, nx)
    a, ln, f, nx = descs[idx[-1]]
    descs[idx[-1]] = (a, rng.choice((0, ln)), f & ~WRITE, nx)
    return BadChain(VQ_WRITE_ORDER, head=idx[0], descs=descs)


def _outside(rng, g: Geometry) -> tuple:
    """(addr, len), len > 0, with addr + len > mem_size."""
    n = rng.choice((1, 16, 4096, g.mem_size, 0xFFFF_FFFF))
    addr = rng.choice((g.mem_size - n + 1 if n <= g.mem_size else 0, g.mem_size,
                       2**64 - 1, 2**63, 2**64 - n, rng.randrange(g.mem_size, 2**64)))
    if addr + n <= g.mem_size:
        addr = g.mem_size
    return addr, n


def addr_range(rng, g: Geometry) -> BadChain:
    addr, n = _outside(rng, g)
    if g.indirect and rng.random() < 0.3:  # the indirect table itself outside
        entries = rng.randrange(1, 8)
        length = entries * VIRTQ_DESC_SIZE
        taddr = rng.choice((g.mem_size - length + 1, g.mem_size, 2**64 - length,
                            rng.randrange(g.mem_size, 2**64 - length)))
        return _set(_with_indirect(rng, g, taddr, length), VQ_ADDR_RANGE)
    if g.indirect and rng.random() < 0.5:  # a buffer of a table entry outside
        k = rng.randrange(1, 6)
        entries = _table(rng, g, k)
        j = rng.randrange(k)
        _, _, f, nx = entries[j]
        entries[j] = (addr, n, f, nx)
        bad = _with_indirect(rng, g, g.scratch, k * VIRTQ_DESC_SIZE)
        bad.tables.append((g.scratch, entries))
        return _set(bad, VQ_ADDR_RANGE)
    count = rng.randrange(1, min(4, g.qsize) + 1)
    idx, descs = _direct(rng, g, count)
    j = rng.randrange(count)
    _, _, f, nx = descs[idx[j]]
    descs[idx[j]] = (addr, n, f, nx)
    return BadChain(VQ_ADDR_RANGE, head=idx[0], descs=descs)


def chain_len(rng, g: Geometry) -> BadChain:
    """2^32 bytes or more in total: whole-memory buffers through an indirect table (a
    direct chain of Q descriptors cannot reach it in guest memory of a few MiB)."""
    per = g.mem_size
    n = -(-VIRTQ_MAX_CHAIN_BYTES // per) + rng.randrange(3)
    w = rng.randrange(n + 1)  # entries from w on are writable
    entries = [(0, per, (WRITE if k >= w else 0) | (NEXT if k < n - 1 else 0),
                k + 1 if k < n - 1 else 0) for k in range(n)]
    bad = _with_indirect(rng, g, g.scratch, n * VIRTQ_DESC_SIZE)
    bad.tables.append((g.scratch, entries))
    return _set(bad, VQ_CHAIN_LEN)


FAMILIES = {
    VQ_AVAIL_JUMP: avail_jump,
    VQ_HEAD_RANGE: head_range,
    VQ_NEXT_RANGE: next_range,
    VQ_LOOP: loop,
    VQ_INDIRECT_NOT_NEGOTIATED: indirect_not_negotiated,
    VQ_INDIRECT_NEXT: indirect_next,
    VQ_INDIRECT_NESTED: indirect_nested,
    VQ_INDIRECT_LEN: indirect_len,
    VQ_WRITE_ORDER: write_order,
    VQ_ADDR_RANGE: addr_range,
    VQ_CHAIN_LEN: chain_len,
}
NEEDS_INDIRECT = frozenset({VQ_INDIRECT_NEXT, VQ_INDIRECT_NESTED, VQ_INDIRECT_LEN, VQ_CHAIN_LEN})


def families_for(indirect: bool, qsize: int = 2) -> list:
    """The clauses a queue of `qsize` with (or without) VIRTIO_F_INDIRECT_DESC can be
    fuzzed with (one descriptor alone cannot put a readable after a writable one)."""
    if indirect:
        return [c for c in FAMILIES if c != VQ_INDIRECT_NOT_NEGOTIATED]
    return [c for c in FAMILIES if c not in NEEDS_INDIRECT
            and (qsize > 1 or c != VQ_WRITE_ORDER)]


def bad_chain(rng, g: Geometry, clause: str | None = None) -> BadChain:
    clauses = families_for(g.indirect, g.qsize)
    return FAMILIES[clause or clauses[rng.randrange(len(clauses))]](rng, g)
