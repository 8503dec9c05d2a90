"""The compute engine's streaming multiprocessors: running one PKT_LAUNCH_CODE.

StreamingMultiprocessors.launch(vmid, launch, ctl), called by the command processor:

  1. fetch the code object through the MMU with EXEC (codeobject.fetch, COBJ-VALID-1);
  2. check it, or take the checked Program of the same bytes from the cache
     (COBJ-VALID-2, -5): a CodeFault names the offending record;
  3. check the launch against the entry (COBJ-VALID-3): threads per block, shared memory,
     parameter bytes -- else CodeFault(entry address, COBJ_ERR_LAUNCH); the object's cache
     entry remembers the shapes (entry, block, shared memory, parameter bytes) that passed;
  4. read the parameter buffer through the MMU with READ into a private copy;
  5. run the grid's blocks in batches (executor.Batch), in linear block order.

Batches. A batch holds as many blocks as fit BATCH_THREADS threads and BATCH_BYTES of
registers, local and shared memory (at least one block), so one instruction is one numpy
operation over up to BATCH_THREADS lanes: large enough that numpy's per-call cost is
small, small enough to stay near the caches. A batch does not straddle a row of the grid
when the row has enough blocks, so %ctaid.x stays affine in the thread index. Blocks are
independent except through global memory and atomics (SM-EXEC-1), so running them batch
after batch on the engine's thread is a valid schedule (the engine's compute units are not
used: batches in parallel would make faults and partial results depend on timing); a
block waiting for a later block to write a flag waits forever, as it may on real hardware
when the later block is not resident.

Device time: %globaltimer reads the device clock (Gpu.clock_ns); %clock64 counts the
same nanoseconds at CLOCK_RATE_KHZ, strictly increasing between reads. The engine's busy
time (and so the scheduler's accounting) includes the launch like any other packet.

A launch stopped by the engine (reset, shutdown, job timeout) returns quietly: what it
wrote stays written, and no interrupt is raised.
"""

from __future__ import annotations

import math
import threading
import time
from typing import NamedTuple

import numpy as np

from pvgpu.host.hw.sm.codeobject import (CodeFault, ModuleCache, _RelFault, check_entry, entry_index,
                                   fetch)
from pvgpu.host.hw.sm.executor import Batch, Geometry, Shape
from pvgpu.host.hw.sm.stopping import Stopped
from pvgpu.host.hw.sm.isa_check import first_bad_instruction
from pvgpu.host.hw.sm.memory import GlobalMemory
from pvgpu.host.hw.sm.program import Program
from pvgpu.spec import isa
from pvgpu.spec.kernels import ACCESS_READ

BATCH_THREADS = 1 << 18  # threads of one batch (at most; at least one block)
BATCH_BYTES = 256 << 20  # register and local memory of one batch (estimate, at most)
SHAPE_LANES = 1 << 20  # lanes of the batch shapes kept between launches (index arrays)


class CodeLaunch(NamedTuple):
    """The fields of a PKT_LAUNCH_CODE (host/hw/packets.py)."""
    object_va: int
    entry_va: int
    grid: tuple
    block: tuple
    dyn_shared: int
    params_va: int
    params_size: int


class LaunchState:
    """What the batches of one launch share."""

    def __init__(self, sm, vmid, launch: CodeLaunch, prog: Program, params: np.ndarray):
        self.sm = sm
        self.vmid = vmid
        self.object_va = launch.object_va
        self.params = params
        self.dyn_shared = launch.dyn_shared
        self.shared_bytes = prog.shared_size + launch.dyn_shared
        self.gmem = GlobalMemory(sm.mmu, vmid)
        self.clock = sm.clock
        self.cycles = sm.cycles
        self.gridid = sm.next_gridid()
        self.lane_instructions = 0


class StreamingMultiprocessors:
    def __init__(self, mmu, clock=time.monotonic_ns):
        self.mmu = mmu
        self.clock = clock
        self.cache = ModuleCache()
        self.shapes: dict = {}  # (block, nb) -> executor.Shape, shared by launches
        self._shape_lanes = 0
        self._lock = threading.Lock()
        self._gridid = 0
        self._last_cycle = 0
        self.current = None  # the LaunchState running now
        self.launches = 0
        self.code_faults = 0
        self.lane_instructions = 0
        self.batches = 0

    def stats(self) -> dict:
        return {"code_launches": self.launches, "code_faults": self.code_faults,
                "lane_instructions": self.lane_instructions, "batches": self.batches,
                "module_cache": self.cache.stats()}

    def next_gridid(self) -> int:
        with self._lock:
            self._gridid += 1
            return self._gridid

    def cycles(self) -> int:
        """%clock64: the device clock in ns (CLOCK_RATE_KHZ), strictly increasing."""
        with self._lock:
            c = max(self.clock(), self._last_cycle + 1)
            self._last_cycle = c
            return c

    # --------------------------------------------------------------- a launch
    def program(self, vmid: int, launch: CodeLaunch) -> Program:
        """Fetch and check the object and the entry (steps 1-3); raises MmuFault or
        CodeFault."""
        mod = self.cache.module(fetch(self.mmu, vmid, launch.object_va))
        key = (launch.entry_va - launch.object_va, launch.block, launch.dyn_shared,
               launch.params_size)
        prog = mod.checked.get(key)  # passed every check before
        if prog is not None:
            return prog
        if mod.fault is not None:
            raise mod.fault.at(launch.object_va)
        index = entry_index(mod.header, launch.object_va, launch.entry_va)
        with mod.lock:
            prog = mod.entries.get(index)
            if prog is None:
                prog = mod.entries[index] = _check_program(mod.raw, mod.header, index)
        if isinstance(prog, _RelFault):
            raise prog.at(launch.object_va)
        threads = math.prod(launch.block)
        why = None
        if not 1 <= threads <= prog.block_limit:
            why = f"{threads} threads per block (limit {prog.block_limit})"
        elif prog.shared_size + launch.dyn_shared > isa.MAX_DYNAMIC_SHARED:
            why = f"{prog.shared_size + launch.dyn_shared} bytes of shared memory"
        elif launch.params_size != prog.param_size:
            why = f"{launch.params_size} parameter bytes, the entry takes {prog.param_size}"
        if why:
            raise CodeFault(launch.entry_va, isa.COBJ_ERR_LAUNCH, why)
        with mod.lock:
            if len(mod.checked) >= mod.MAX_CHECKED:
                mod.checked.clear()
            mod.checked[key] = prog
        return prog

    def launch(self, vmid: int, launch: CodeLaunch, ctl) -> None:
        """Run a code launch to its end; raises MmuFault or CodeFault."""
        with self._lock:
            self.launches += 1
        try:
            prog = self.program(vmid, launch)
        except CodeFault:
            with self._lock:
                self.code_faults += 1
            raise
        params = np.zeros(0, dtype=np.uint8)
        if launch.params_size:
            ext = self.mmu.translate(vmid, launch.params_va, launch.params_size, ACCESS_READ)
            params = np.concatenate(ext) if len(ext) > 1 else ext[0].copy()
        state = LaunchState(self, vmid, launch, prog, params)
        self.current = state
        try:
            self._run(state, prog, launch, ctl)
        except Stopped:
            pass
        except CodeFault:
            with self._lock:
                self.code_faults += 1
            raise
        finally:
            self.current = None
            with self._lock:
                self.lane_instructions += state.lane_instructions

    def _new_shape(self, block, nb: int) -> Shape:
        shape = Shape(block, nb)
        with self._lock:
            if self._shape_lanes + shape.N > SHAPE_LANES:
                self.shapes.clear()
                self._shape_lanes = 0
            self.shapes[block, nb] = shape
            self._shape_lanes += shape.N
        return shape

    def _run(self, state, prog, launch, ctl) -> None:
        gx, gy, gz = launch.grid
        total = gx * gy * gz
        T = math.prod(launch.block)
        per_block = T * (4 * prog.n_r32 + 8 * prog.n_r64 + prog.n_pred + prog.local_size + 64)
        per_block += state.shared_bytes
        nb = max(1, min(BATCH_THREADS // T, BATCH_BYTES // per_block))
        start = 0
        while start < total:
            if ctl.stopped():
                raise Stopped()
            end = min(start + nb, total)
            if nb <= gx:  # keep a batch inside one row of the grid
                end = min(end, (start // gx + 1) * gx)
            shape = self.shapes.get((launch.block, end - start))
            if shape is None:
                shape = self._new_shape(launch.block, end - start)
            geo = Geometry(shape, launch.grid, start)
            Batch(state, prog, geo).run(ctl)
            with self._lock:
                self.batches += 1
            start = end


def _check_program(raw: np.ndarray, header, index: int):
    """-> Program, or the _RelFault of the entry or its first bad instruction."""
    try:
        entry = check_entry(raw, header, index)
    except _RelFault as f:
        return f
    first = header.code_off + entry.code_start * isa.INSTR_SIZE
    code = np.frombuffer(raw, dtype=isa.INSTR_DTYPE, count=entry.code_count, offset=first)
    bad = first_bad_instruction(code, entry, header)
    if bad is not None:
        i, why = bad
        return _RelFault(first + i * isa.INSTR_SIZE, isa.COBJ_ERR_INSTR, why)
    return Program(entry, header, code)
