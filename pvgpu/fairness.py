"""Fairness figures from the host's scheduling statistics (the demo and `bench sched`).

A statistics snapshot is what `Device.stats()` returns (the KMD's GET_STATS map): device
time `now_ns` and, per vGPU and engine, the device time its jobs have used, `busy_ns`
(charged when a job completes). The utilisation of a vGPU on an engine over a run is

    U_i = (busy_ns_i(end) - busy_ns_i(start)) / (now_ns(end) - now_ns(start))

and the metrics are Jain's fairness index (R. Jain, D. Chiu, W. Hawe, DEC-TR-301, 1984)
over the shares, and Gdev's mean error (S. Kato et al., "Gdev: First-Class GPU Resource
Management in the Operating System", USENIX ATC 2012, §6.3):

    Jain's index   J = (sum x)^2 / (n * sum x^2),  x_i = U_i / B_i  (B_i the share, 0..1);
                   1 when every vGPU gets the same fraction of its share, 1/n at worst
    mean error     mean over vGPUs (and samples) of |U_i - B_i|  (Gdev: "within 7 %")

Everything here is pure: snapshots in, numbers out.
"""

from __future__ import annotations

COPY_ENGINES = ("copy0", "copy1")  # copy0 runs host->device (and d2d), copy1 device->host


def jain(xs) -> float:
    """Jain's fairness index of `xs` (non-negative); 1.0 when all are equal (or all 0)."""
    xs = [float(x) for x in xs]
    if not xs:
        raise ValueError("Jain's index of nothing")
    if any(x < 0 for x in xs):
        raise ValueError(f"Jain's index needs non-negative values, not {xs}")
    sq = sum(x * x for x in xs)
    if sq == 0:
        return 1.0
    return sum(xs) ** 2 / (len(xs) * sq)


def normalised(utils: dict, shares: dict) -> dict:
    """x_i = U_i / B_i for every vGPU in `shares` (both as fractions 0..1)."""
    return {n: utils.get(n, 0.0) / shares[n] for n in shares}


def jain_over_shares(utils: dict, shares: dict) -> float:
    """Jain's index over x_i = U_i / B_i."""
    return jain(normalised(utils, shares).values())


def mean_abs_error(utils: dict, shares: dict) -> float:
    """Mean |U_i - B_i| over the vGPUs in `shares` (fractions; x100 for percentage points)."""
    if not shares:
        raise ValueError("mean error of no vGPUs")
    return sum(abs(utils.get(n, 0.0) - b) for n, b in shares.items()) / len(shares)


def busy_ns(snapshot: dict, name: str, engine: str = "compute") -> int:
    """Device time vGPU `name` has used on `engine` since the host started (0 if none)."""
    per_vgpu = snapshot.get("vgpus", {}).get(name, {}).get(engine)
    if per_vgpu is not None and "busy_ns" in per_vgpu:
        return int(per_vgpu["busy_ns"])
    eng = snapshot.get("engines", {}).get(engine, {}).get("vgpus", {}).get(name, {})
    return int(eng.get("busy_ns", 0))


def turnaround_us(snapshot: dict, name: str, engine: str = "compute") -> int | None:
    """vGPU `name`'s measured turnaround on `engine` (the gap between its jobs that BAND
    holds a free ring for, µs), or None before it has been measured."""
    value = (snapshot.get("engines", {}).get(engine, {}).get("vgpus", {}).get(name, {})
             .get("turnaround_us"))
    return None if value is None else int(value)


def utilisation(prev: dict, cur: dict, names, engine: str = "compute") -> dict:
    """{name: U} on `engine` between two snapshots, clamped to [0, 1].

    Jobs are charged when they complete, so a window can see a job that started before
    it: short windows read up to one job's length high or low (hence the clamp)."""
    span = int(cur["now_ns"]) - int(prev["now_ns"])
    if span <= 0:
        raise ValueError(f"snapshots out of order or equal (now_ns {prev['now_ns']} -> {cur['now_ns']})")
    return {n: min(1.0, max(0.0, (busy_ns(cur, n, engine) - busy_ns(prev, n, engine)) / span))
            for n in names}


def copy_utilisation(prev: dict, cur: dict, names) -> dict:
    """{name: U} of the busier copy engine (copy0 host->device, copy1 device->host)."""
    per = [utilisation(prev, cur, names, e) for e in COPY_ENGINES]
    return {n: max(u[n] for u in per) for n in names}


def contexts(snapshot: dict, name: str) -> int:
    """Live contexts of vGPU `name` on the snapshot's device."""
    return int(snapshot.get("vgpus", {}).get(name, {}).get("contexts", 0))


def all_active(snapshot: dict, names) -> bool:
    """True when every vGPU in `names` has a live context (its guest has started)."""
    return all(contexts(snapshot, n) > 0 for n in names)


def summarise(utils: dict, shares: dict, samples=()) -> dict:
    """The figures of one run: `utils` the run's mean utilisation per vGPU, `shares` the
    configured shares (fractions), `samples` optional per-interval {name: U} dicts.
    -> {jain, mean_abs_error, mean_abs_error_samples (None without samples)}."""
    out = {"jain": jain_over_shares(utils, shares), "mean_abs_error": mean_abs_error(utils, shares),
           "mean_abs_error_samples": None}
    samples = list(samples)
    if samples:
        out["mean_abs_error_samples"] = sum(mean_abs_error(s, shares) for s in samples) / len(samples)
    return out
