"""What a session may see of the host's statistics, and what it holds (spec [CMD-STATS-4]).

A KMD's `sched_stats()` describes the whole device: every vGPU, every context with its
name. A guest's GET_STATS gets `session_view` of it: the device-wide totals, and of the
per-vGPU and per-context entries only its own vGPU and its own contexts. Everything, every
session included, is for the host's user on the admin endpoint (host/admin.py), which
describes a session with `session_usage`.
"""

from __future__ import annotations

import collections


def session_view(stats: dict, vgpu: str, own_contexts) -> dict:
    """A KMD `sched_stats()` map as a session bound to vGPU `vgpu` may see it: the
    per-vGPU entries of `vgpus` and of each engine's `vgpus` only for `vgpu`, `mem`
    `contexts` only those whose KMD context id is in `own_contexts`, and the number of
    the device's contexts as `mem` `contexts_total`. Returns a new map."""
    out = dict(stats)
    if "vgpus" in stats:
        out["vgpus"] = {k: v for k, v in stats["vgpus"].items() if k == vgpu}
    if "engines" in stats:
        out["engines"] = {name: {**e, "vgpus": {k: v for k, v in e.get("vgpus", {}).items()
                                                if k == vgpu}}
                          for name, e in stats["engines"].items()}
    mem = stats.get("mem")
    if mem is not None and "contexts" in mem:
        own = {str(i) for i in own_contexts}
        out["mem"] = {**mem, "contexts": {k: v for k, v in mem["contexts"].items() if k in own},
                      "contexts_total": len(mem["contexts"])}
    return out


def session_usage(compute, mem_contexts: dict, engine_names: dict) -> dict:
    """What one session holds on one device (`compute`: its pvgpu.host.backend.commands
    ComputeDevice): its contexts (guest ids, names, priority, resident and evicted bytes,
    from `mem_contexts`, the KMD's `mem_stats()["contexts"]`), their sum, and the device
    time its jobs used per engine (`busy_ns` by engine name, destroyed contexts
    included). Safe off the I/O loop's thread: it copies what it reads first."""
    contexts, vram, evicted = [], 0, 0
    busy = collections.Counter(compute.retired_busy_ns)
    for ctx_id, state in list(compute.contexts.items()):
        kctx = state.kmd_ctx
        mem = mem_contexts.get(str(kctx.id), {})
        res, ev = mem.get("resident_bytes", 0), mem.get("evicted_bytes", 0)
        contexts.append({"id": ctx_id, "name": kctx.name, "priority": kctx.priority,
                         "resident_bytes": res, "evicted_bytes": ev})
        vram += res
        evicted += ev
        busy.update(dict(enumerate(getattr(kctx, "busy_ns", ()))))
    return {"device": compute.device_index, "contexts": contexts, "vram_bytes": vram,
            "evicted_bytes": evicted,
            "busy_ns": {engine_names.get(e, str(e)): ns for e, ns in sorted(busy.items())}}
