"""The protocol conformance suite of spec/pvgpu.md, as a tool anyone can run.

`pvgpu conformance --endpoint ENDPOINT` runs every check against any implementation of
the device; tests/conformance runs the very same checks against our own host. A check
talks only the wire protocol: raw control-channel peers (rawpeer.py), and virtqueues in
guest memory written by our own driver and read back raw (rawdevice.py) -- never the
host's internals.

  registry.py   @check("CLAUSE-ID", ...): the checks and the clauses they exercise
  checks/       the checks, one module per part of the spec
  context.py    Target (what runs the checks) and Context (what a check is handed)
  runner.py     bounded runs: a probe, one worker with a deadline per check, results
  rawpeer.py    a bare DEALER socket that sends any frames at all
  rawdevice.py  raw device requests through our driver
  codeobj.py    code objects built by hand (spec/isa.md) for CMD_LAUNCH_CODE
  burns.py      longer and longer burns: checks that hold on any machine, without timing
"""

from pvgpu.conformance.context import Context, Skip, Target
from pvgpu.conformance.registry import Check, all_checks, check, select
from pvgpu.conformance.runner import FAIL, PASS, SKIP, Result, run, run_case

__all__ = ["Check", "Context", "FAIL", "PASS", "Result", "SKIP", "Skip", "Target", "all_checks",
           "check", "run", "run_case", "select"]
