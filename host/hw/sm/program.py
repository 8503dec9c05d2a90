"""A checked entry, ready to run: its instructions, resources and scheduling order.

Program holds what a launch of one entry needs: the entry's instructions (INSTR_DTYPE,
already checked by isa_check.py), its register counts, shared/local/param sizes, the
object's segment addresses, and where the code sits in the object (for the VA of a
trapping instruction). Instructions are decoded into executable form (decode.py) the
first time they run and kept (Program.decoded), so a huge object costs only what runs.

Scheduling order (SM-EXEC-2). The executor runs, at each step, the runnable threads whose
next instruction comes first in `order`; threads at the same instruction run together.
`order` is the entry's basic blocks in a topological order of the control-flow graph with
its back edges (found by a depth-first search from the entry) removed, ties broken by the
original position (Kahn's algorithm with a heap). For code laid out in program order this
is the program order itself; a block that a compiler placed out of line (an `else` after
the function's end that branches back) still comes before the join it reaches. Threads
that diverge therefore wait for each other at the first block every path reaches: the
immediate post-dominator for structured code, with loops running all their iterations
before their exit. prio[pc] is an instruction's position in that order.
"""

from __future__ import annotations

import heapq

import numpy as np

from pvgpu.spec import isa


class Program:
    def __init__(self, entry, header, code: np.ndarray):
        self.entry = entry
        self.n = code.shape[0]
        self.code = code
        self.start = entry.code_start  # global index of instruction 0
        self.code_off = header.code_off + entry.code_start * isa.INSTR_SIZE
        self.data_va = header.data_va
        self.const_va = header.const_va
        self.data_size = header.data_size
        self.const_size = header.const_size
        self.n_r32, self.n_r64, self.n_pred = entry.n_r32, entry.n_r64, entry.n_pred
        self.param_size = entry.param_size
        self.shared_size = entry.shared_size
        self.local_size = entry.local_size
        self.block_limit = entry.block_limit
        self.prio, self.order = schedule_order(code, self.start)
        self.decoded = [None] * self.n  # pc -> decode.Instr, filled on first use

    def instruction_offset(self, pc: int) -> int:
        """Byte offset of instruction pc (0-based in the entry) in the object."""
        return self.code_off + pc * isa.INSTR_SIZE


def schedule_order(code: np.ndarray, start: int) -> tuple:
    """-> (prio, order): prio[pc] is pc's position in the scheduling order, order its
    inverse (see the module doc)."""
    n = code.shape[0]
    op = code["op"]
    guarded = code["guard"] != 0
    is_bra = op == isa.OP_BRA
    ends = is_bra | (op == isa.OP_EXIT) | (op == isa.OP_TRAP)
    targets = (code["imm"][is_bra].astype(np.int64) - start)
    leaders = np.unique(np.concatenate((
        [0], targets, np.flatnonzero(ends) + 1)))
    leaders = leaders[(leaders >= 0) & (leaders < n)]
    nblocks = leaders.shape[0]
    if nblocks == 1:
        ident = np.arange(n, dtype=np.int64)
        return ident, ident
    block_end = np.append(leaders[1:], n)  # exclusive
    last = block_end - 1
    block_of_target = np.searchsorted(leaders, code["imm"][last].astype(np.int64) - start)
    succ = []
    last_op, last_guarded = op[last].tolist(), guarded[last].tolist()
    tgt = block_of_target.tolist()
    for b in range(nblocks):
        s = []
        o = last_op[b]
        if o == isa.OP_BRA:
            s.append(tgt[b])
        if (o not in (isa.OP_BRA, isa.OP_EXIT, isa.OP_TRAP) or last_guarded[b]) and b + 1 < nblocks:
            s.append(b + 1)
        succ.append(s)
    # back edges: to a block on the DFS stack
    state = [0] * nblocks  # 0 new, 1 on stack, 2 done
    back = set()
    stack = [(0, 0)]
    state[0] = 1
    while stack:
        b, i = stack[-1]
        if i < len(succ[b]):
            stack[-1] = (b, i + 1)
            c = succ[b][i]
            if state[c] == 1:
                back.add((b, c))
            elif state[c] == 0:
                state[c] = 1
                stack.append((c, 0))
        else:
            state[b] = 2
            stack.pop()
    indeg = [0] * nblocks
    for b in range(nblocks):
        if state[b]:
            for c in succ[b]:
                if (b, c) not in back:
                    indeg[c] += 1
    heap = [0]
    seen = [False] * nblocks
    block_order = []
    while heap:
        b = heapq.heappop(heap)
        if seen[b]:
            continue
        seen[b] = True
        block_order.append(b)
        for c in succ[b]:
            if (b, c) not in back:
                indeg[c] -= 1
                if indeg[c] == 0:
                    heapq.heappush(heap, c)
    block_order += [b for b in range(nblocks) if not seen[b]]  # unreachable: last
    order = np.concatenate([np.arange(leaders[b], block_end[b]) for b in block_order])
    prio = np.empty(n, dtype=np.int64)
    prio[order] = np.arange(n)
    return prio, order.astype(np.int64)
