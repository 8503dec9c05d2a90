"""A structure-aware fuzzer of the host: control channel, device commands, descriptor chains.

  values.py    interesting values (edge integers of every width, wrong types, NaN, nesting)
  control.py   mutations of valid control messages of a live session (spec §2)
  commands.py  every command of spec §6.5 from spec/wire, mutated; code objects and launches
  chains.py    one family of invalid chains per rule of spec §4.7
  shapes.py    valid chains of unusual shape (pieces, gaps, zero-length, indirect)
  session.py   a raw session: the wire and one control queue, both memory models
  runner.py    the loop, the oracle (health checks, liveness, host log) and the report

`pvgpu bench fuzz --cases N --seed S [--json FILE]` runs it against a host it starts.
"""
