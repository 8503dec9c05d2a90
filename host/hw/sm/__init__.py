"""The compute engine's streaming multiprocessors: code objects validated and executed.

The hardware side of spec/isa.md. The command processor hands a PKT_LAUNCH_CODE to
StreamingMultiprocessors.launch; everything below is internal to host/hw and imports
nothing from the guest (spec/isa.py is the only contract with the compiler).

  codeobject.py  fetch through the MMU (EXEC), header/entry/parameter checks, CodeFault,
                 the cache of checked objects by their bytes
  isa_check.py   instruction validation (ISA-VALID-*)
  program.py     Program: a checked entry, its scheduling order (reconvergence)
  decode.py      instruction records -> executable instructions (lazily, per program)
  executor.py    Batch: registers, SIMT scheduling, barriers of a batch of blocks
  values.py      register values: arrays, uniform values, affine values; typed views
  alu.py         integer, float, bit, comparison and conversion semantics
  fpmath.py      IEEE rounding modes, fused multiply-add, exact fallbacks
  lsu.py         ld/st/atom/red in every state space
  memory.py      global memory through the MMU (ranges, gathers, scatters), atomics
  warp.py        shfl, vote, activemask
  launch.py      StreamingMultiprocessors: one launch from packet to the last batch
  stopping.py    the stop token inside long instructions
"""

from pvgpu.host.hw.sm.codeobject import CodeFault
from pvgpu.host.hw.sm.launch import CodeLaunch, StreamingMultiprocessors

__all__ = ["CodeFault", "CodeLaunch", "StreamingMultiprocessors"]
