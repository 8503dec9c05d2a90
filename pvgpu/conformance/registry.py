"""The registry of conformance checks.

    @check("CTL-HELLO-10")
    def ctl_hello_10_the_first_error_in_the_spec_order_wins(raw_peer): ...

`check` names the clauses of spec/pvgpu.md a check exercises and registers it. A check
asks for what it needs by the names of its parameters, each handed out by its Context
(context.py) and closed after it: `ctx` (the context itself), `raw_peer` (a factory of
raw control-channel peers), `raw` (a device session read back raw; the check then runs
once per memory model) and `two` (two sessions, as two guests).
"""

from __future__ import annotations

import fnmatch
import importlib
import inspect
import re
from dataclasses import dataclass
from typing import Callable

NEEDS = ("ctx", "raw_peer", "raw", "two")
CLAUSE_ID = re.compile(r"^[A-Z]+(?:-[A-Z0-9]+)+$")
GROUPS = ("ctl_control_channel", "ctl_session_trust", "vq_validation", "evtq", "cmd_fence",
          "cmd_events", "cmd_shm", "cmd_va", "cmd_prime", "cmd_launch_code", "cmd_launch_batch")


@dataclass(frozen=True)
class Check:
    name: str
    clauses: tuple
    fn: Callable
    group: str  # the module of pvgpu/conformance/checks that holds it
    needs: tuple  # parameter names, from NEEDS
    per_memory: bool  # runs once per memory model
    feature: int | None  # a PVGPU_F_* bit that device 0 must offer, or None

    def matches(self, patterns) -> bool:
        """True if a pattern (fnmatch, any case) matches one of its clause IDs or its name."""
        return any(fnmatch.fnmatchcase(c, p.upper()) for p in patterns for c in self.clauses) or \
            any(fnmatch.fnmatchcase(self.name, p.lower()) for p in patterns)


REGISTRY: list = []


def check(*clauses: str, name: str | None = None, per_memory: bool | None = None,
          feature: int | None = None):
    """Register the decorated function as a check of `clauses`. per_memory: run it once
    per memory model (default: when it takes `raw`); feature: a device feature bit it
    needs, without which it is skipped."""
    if not clauses or not all(CLAUSE_ID.match(c) for c in clauses):
        raise ValueError(f"a check names clause IDs: {clauses!r}")

    def register(fn):
        params = tuple(inspect.signature(fn).parameters)
        unknown = [p for p in params if p not in NEEDS]
        if unknown:
            raise TypeError(f"{fn}: unknown parameters {unknown}; a check takes {NEEDS}")
        check_name = name or fn.__name__
        if any(c.name == check_name for c in REGISTRY):
            raise ValueError(f"two checks named {check_name}")
        REGISTRY.append(Check(check_name, tuple(clauses), fn, fn.__module__.rpartition(".")[2],
                              params, "raw" in params if per_memory is None else per_memory,
                              feature))
        return fn
    return register


def all_checks() -> list:
    """-> every registered check, in the order of GROUPS, then of definition."""
    for group in GROUPS:
        importlib.import_module(f"pvgpu.conformance.checks.{group}")
    return sorted(REGISTRY, key=lambda c: GROUPS.index(c.group))


def select(patterns=None, group: str | None = None) -> list:
    """-> the checks whose clause IDs or name match one of `patterns` (all when None), of
    one group when given."""
    return [c for c in all_checks() if (group is None or c.group == group)
            and (not patterns or c.matches(patterns))]
