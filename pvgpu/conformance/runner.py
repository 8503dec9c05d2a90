"""Running checks against a target, bounded, and reporting them.

A probe says hello first: a host that does not answer it fails every check at once
("no answer within S s") instead of once per check. Each check then runs in a worker
thread of its own with a deadline of the target's timeout; every wait inside a check has
that deadline too, so a check that overran ends soon after and closes what it started.
Results print as one line per check and run (memory model), with the clause IDs, and as
JSON.
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import asdict, dataclass

from pvgpu.spec import wire

from pvgpu.conformance.context import Context, Skip, Target
from pvgpu.conformance.rawpeer import NoAnswer, RawPeer

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
CLEANUP_S = 10.0  # how long an overrun check gets to stop before it is abandoned


@dataclass
class Result:
    check: str
    clauses: tuple
    memory: str | None
    status: str
    seconds: float = 0.0
    reason: str = ""
    detail: str = ""  # the traceback of a failure

    @property
    def case(self) -> str:
        return f"{self.check}[{self.memory}]" if self.memory else self.check

    def line(self) -> str:
        why = f"  -- {self.reason}" if self.reason else ""
        return f"{self.status}  {' '.join(self.clauses)}  {self.case}  ({self.seconds:.2f} s){why}"


def cases(checks, memories) -> list:
    """-> [(check, memory model or None)]: a per-memory check once per model."""
    return [(c, m) for c in checks for m in (memories if c.per_memory else (None,))]


def probe(target: Target) -> str | None:
    """Say hello and read each device's features into target.features; -> why every check
    must fail (the host did not answer hello), or None. Any other odd answer is for the
    checks to report."""
    peer = RawPeer(target.endpoint, timeout=target.timeout, curve=target.curve_for(target.endpoint))
    try:
        r = peer.request({"op": wire.OP_HELLO, "version": list(wire.PROTOCOL_VERSION),
                          "name": "pvgpu-conformance", "memory": wire.MEMORY_INLINE,
                          "mem_size": 1 << 20})
    except NoAnswer as e:
        peer.close()
        return str(e)
    try:
        if r.get("ok") is True and isinstance(r.get("devices"), list):
            for d in r["devices"]:
                f = peer.request({"op": "get_features", "dev": d.get("index")})
                if isinstance(f.get("features"), int):
                    target.features[d.get("index")] = f["features"]
            peer.request({"op": "bye"})
    except Exception:  # noqa: BLE001
        pass
    finally:
        peer.close()
    return None


def run_case(target: Target, check, memory: str | None = None) -> Result:
    """Run one check (in one memory model) with a deadline; -> its Result."""
    result = Result(check.name, check.clauses, memory, FAIL)
    offered = target.features.get(0)
    if check.feature is not None and offered is not None and not offered >> check.feature & 1:
        name = wire.FEATURE_NAMES.get(check.feature, "?")
        result.status = SKIP
        result.reason = f"device 0 does not offer feature bit {check.feature} ({name})"
        return result
    ctx = Context(target, memory)
    start = time.monotonic()
    outcome = {}  # written by the worker only; read once it has finished

    def body():
        try:
            check.fn(**{need: ctx.fixture(need) for need in check.needs})
            outcome.update(status=PASS)
        except Skip as e:
            outcome.update(status=SKIP, reason=str(e))
        except BaseException as e:  # noqa: BLE001 -- every failure is a result
            outcome.update(status=FAIL, reason=failure_reason(e, target.timeout),
                           detail=traceback.format_exc())
        finally:
            ctx.close()

    worker = threading.Thread(target=body, name=f"check {result.case}", daemon=True)
    worker.start()
    worker.join(target.timeout)
    if worker.is_alive():
        ctx.cancelled = True  # it can start nothing more; its own waits end in time
        worker.join(min(target.timeout, CLEANUP_S))  # and then it closes what it started
        result.reason = f"no answer within {target.timeout:g} s" + (
            "; the check was abandoned still running" if worker.is_alive() else "")
    else:
        result.status = outcome["status"]
        result.reason = outcome.get("reason", "")
        result.detail = outcome.get("detail", "")
    result.seconds = time.monotonic() - start
    return result


def failure_reason(e: BaseException, timeout: float) -> str:
    """One line: why the check failed."""
    if isinstance(e, NoAnswer):
        return str(e)
    if isinstance(e, TimeoutError) or type(e).__name__ in ("HostLost", "ChannelTimeout"):
        return f"no answer within {timeout:g} s ({type(e).__name__}: {e})"
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    where = f"{frame.filename.rpartition('/')[2]}:{frame.lineno}: {frame.line}" if frame else ""
    if isinstance(e, AssertionError):
        return f"assertion failed at {where}" + (f" ({text})" if text else "")
    return f"{type(e).__name__}: {text}" + (f" at {where}" if where else "")


def run(target: Target, checks, *, report=None) -> list:
    """Run every (check, memory) case; report(result) after each. -> [Result]."""
    silent = probe(target)
    results = []
    for check, memory in cases(checks, target.memories):
        if silent:
            result = Result(check.name, check.clauses, memory, FAIL,
                            reason=f"not run: the host did not answer hello ({silent})")
        else:
            result = run_case(target, check, memory)
        results.append(result)
        if report:
            report(result)
    return results


def summary(results) -> dict:
    counts = {s: sum(r.status == s for r in results) for s in (PASS, FAIL, SKIP)}
    return {"passed": counts[PASS], "failed": counts[FAIL], "skipped": counts[SKIP],
            "total": len(results)}


def as_json(target: Target, results, patterns) -> dict:
    return {"tool": "pvgpu conformance", "endpoint": target.endpoint,
            "protocol_version": list(wire.PROTOCOL_VERSION), "memory": list(target.memories),
            "timeout_s": target.timeout, "clauses": list(patterns or []),
            "results": [dict(asdict(r), clauses=list(r.clauses)) for r in results],
            "summary": summary(results)}
