"""`pvgpu bench p2p`: device-to-device copies between the host's two GPUs, three ways,
against one memcpy of the same size measured in the same run.

  p2p      host `--topology switch`; the destination context on device 1 has peer access
           to device 0 (`ctx1.enable_peer_access(d0)`): `ctx1.memcpy_peer(dst, src)` is
           one COPY_D2D in which device 1's copy engine reads device 0's VRAM through its
           BAR ("peer"; the first call imports the source: a warm-up, not timed)
  bounce   the same host, peer access disabled: `memcpy_peer` stages the data through
           pinned host memory ("staged": device 0 -> pinned buffer -> device 1, the two
           devices overlapping on two buffers); measured again on a `--topology sockets`
           host, where peer-to-peer is impossible (reported beside it)
  guest    through the guest: `src.to_host(buf)` into a pageable numpy array, then
           `dst.copy_from_host(buf)` (device -> guest memory -> device)
  memcpy   `np.copyto` into a preallocated, pre-touched destination of the same size
  mt       the best memcpy of the same bytes by 1 .. CPUs threads (bench/memcpy.py, one
           contiguous slice each): the copy engine shares a large copy out to its DMA
           lanes, one thread per CPU, so P2P is reported against this limit too

Sizes 16, 64 and 256 MiB (`--quick`: 16 and 64). Every way of a size runs once per round
(interleaved, so a drifting machine affects them alike), after one verified warm-up each
(the destination is cleared first and compared with the source afterwards); medians over
the rounds (7, `--quick` 3). Targets: P2P >= 1.5x as fast as the bounce path and >= 0.85x
a single memcpy of the same size. The exit code reports verification only, not targets.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import shutil
import statistics
import sys

import numpy as np

from pvgpu.bench.common import rounds, write_json
from pvgpu.bench.memcpy import ParallelMemcpy, best_parallel, thread_counts
from pvgpu import guest
from pvgpu.procs import HostProcess, private_endpoint
from pvgpu.spec import wire

MiB = 1 << 20
SIZES_MIB = (16, 64, 256)
QUICK_SIZES_MIB = (16, 64)
TARGET_VS_BOUNCE = 1.5
TARGET_VS_MEMCPY = 0.85  # one memcpy (issue 12)
MEM_SIZE = 512 * MiB  # guest memory: pinned staging buffers and the bounce chunks
VRAM = "2G"  # per device: the largest source and destination, plus the imports
BLOCK = 256


def parse_sizes(text: str | None) -> list | None:
    """"16,64" -> [16, 64] (MiB; None -> None: the default sizes); ValueError if not
    positive integers."""
    if text is None:
        return None
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        raise ValueError(f"--sizes {text!r}: comma-separated MiB, e.g. 16,64") from None
    if not sizes or any(s <= 0 for s in sizes):
        raise ValueError(f"--sizes {text!r}: every size must be a positive number of MiB")
    return sizes


def _source(n: int) -> np.ndarray:
    """n float32 with a pattern that no stale or misplaced chunk reproduces (bit patterns:
    some are NaNs, so compare them as uint32)."""
    return (np.arange(n, dtype=np.uint32) * np.uint32(2654435761)).view(np.float32)


def _verify(ctx1, dst, data, copy, expect_how=None) -> dict:
    """Clear dst, copy once (the warm-up), compare with the source; -> {verified, how}:
    verified also needs memcpy_peer to have gone `expect_how`."""
    n = dst.size
    ctx1.launch("fill", n // BLOCK, BLOCK, (dst, 0.0, n))
    ctx1.synchronize()
    how = copy()
    same = np.array_equal(dst.to_host().view(np.uint32), data.view(np.uint32))
    return {"verified": bool(same and how == expect_how), "how": how}


def _bench_host(topology: str, sizes_mib, reps: int, ways) -> dict:
    """One host of `topology` and one guest; `ways` among memcpy, p2p, bounce, guest.
    -> {size_mib: {way: {verified, how, runs_s}}, "peer": device 1's peer_info of device 0,
    "peer_refused": (without p2p) whether enable_peer_access was refused, "host_exit"}."""
    endpoint, tmpdir = private_endpoint(f"pvgpu-bench-p2p-{topology}")
    host = HostProcess([endpoint], vram=VRAM, extra_args=["--topology", topology])
    mts = {k: ParallelMemcpy(k) for k in thread_counts()} if "memcpy" in ways else {}
    out = {}
    try:
        with guest.connect(endpoint, memory=wire.MEMORY_SHARED, mem_size=MEM_SIZE) as conn:
            d0, d1 = conn.devices
            out["peer"] = d1.peer_info(d0)
            ctx0, ctx1 = d0.create_context("p2p-src"), d1.create_context("p2p-dst")
            if "p2p" in ways:
                ctx1.enable_peer_access(d0)
            else:
                try:  # the fabric must refuse it
                    ctx1.enable_peer_access(d0)
                    out["peer_refused"] = False
                except guest.PvgpuError:
                    out["peer_refused"] = True
            for size in sizes_mib:
                print(f"  {topology}: {size} MiB, {', '.join(ways)} ...", flush=True)
                n = size * MiB // 4
                data = _source(n)
                src, dst = ctx0.to_device(data), ctx1.empty(n)
                pageable, mdst = np.ones(n, np.float32), np.ones(n, np.float32)  # pre-touched

                def peer():
                    ctx1.enable_peer_access(d0)
                    return ctx1.memcpy_peer(dst, src)

                def staged():
                    ctx1.disable_peer_access(d0)
                    return ctx1.memcpy_peer(dst, src)

                def through_guest():
                    src.to_host(pageable)
                    dst.copy_from_host(pageable)
                fns = {"p2p": (peer, "peer"), "bounce": (staged, "staged"),
                       "guest": (through_guest, None)}  # (copy, what memcpy_peer returns)
                fns = {k: v for k, v in fns.items() if k in ways}
                row = {k: _verify(ctx1, dst, data, fn, how) for k, (fn, how) in fns.items()}
                # peer access is a flag of the context: toggling it per call costs nothing
                variants = {k: fn for k, (fn, _how) in fns.items()}
                if "memcpy" in ways:
                    np.copyto(mdst, data)
                    row["memcpy"] = {"verified": bool(np.array_equal(mdst.view(np.uint32),
                                                                     data.view(np.uint32)))}
                    variants["memcpy"] = lambda: np.copyto(mdst, data)
                    for k, mt in mts.items():
                        variants[f"memcpy_mt{k}"] = functools.partial(mt, mdst, data)
                for k, runs in rounds(variants, max_reps=reps).items():
                    row.setdefault(k, {})["runs_s"] = runs
                out[size] = row
                for a in (src, dst):
                    a.free()
            ctx0.destroy()
            ctx1.destroy()
    finally:
        for mt in mts.values():
            mt.close()
        out["host_exit"] = host.stop()
        shutil.rmtree(tmpdir, ignore_errors=True)
    return out


def _gbs(nbytes: int, t: float) -> float:
    return nbytes / t / 1e9


def run_bench(json_path: str | None = None, quick: bool = False, *, sizes_mib=None,
              reps: int | None = None) -> int:
    reps = reps or (3 if quick else 7)
    sizes = list(sizes_mib or (QUICK_SIZES_MIB if quick else SIZES_MIB))
    print(f"p2p: device 0 -> device 1 copies of {', '.join(f'{s} MiB' for s in sizes)}, medians of "
          f"{reps}; targets: P2P >= {TARGET_VS_BOUNCE}x the bounce path, >= {TARGET_VS_MEMCPY}x "
          "one memcpy", flush=True)
    switch = _bench_host("switch", sizes, reps, ("memcpy", "p2p", "bounce", "guest"))
    sockets = _bench_host("sockets", sizes, reps, ("bounce",))

    results = {"machine": {"python": platform.python_version(), "numpy": np.__version__,
                           "cpus": os.cpu_count()},
               "reps": reps, "sizes_mib": sizes,
               "targets": {"p2p_vs_bounce": f">= {TARGET_VS_BOUNCE}",
                           "p2p_vs_memcpy": f">= {TARGET_VS_MEMCPY}"},
               "links": {"switch": switch["peer"], "sockets": sockets["peer"]},
               "sockets_refused_peer_access": sockets.get("peer_refused"),
               "host_exit": {"switch": switch["host_exit"], "sockets": sockets["host_exit"]},
               "sizes": []}
    verified = True
    met = []
    print(f"\n{'size':>8} {'memcpy':>13} {'p2p':>13} {'bounce':>13} {'bounce/sockets':>15} "
          f"{'via guest':>13}   {'p2p/bounce':>10} {'p2p/guest':>9} {'p2p/memcpy':>10} "
          f"{'p2p/mt':>7}  targets")
    for s in sizes:
        nbytes = s * MiB
        med = {}
        for way in ("memcpy", "p2p", "bounce", "guest"):
            med[way] = statistics.median(switch[s][way]["runs_s"])
        med["memcpy_mt"], mt_threads = best_parallel(
            {1: med["memcpy"], **{int(k[len("memcpy_mt"):]): statistics.median(v["runs_s"])
                                  for k, v in switch[s].items() if k.startswith("memcpy_mt")}})
        med["bounce_sockets"] = statistics.median(sockets[s]["bounce"]["runs_s"])
        ok = all(v["verified"] for k, v in switch[s].items() if not k.startswith("memcpy_mt")) \
            and sockets[s]["bounce"]["verified"]
        verified &= ok
        ratios = {"p2p_vs_bounce": med["bounce"] / med["p2p"],
                  "p2p_vs_bounce_sockets": med["bounce_sockets"] / med["p2p"],
                  "p2p_vs_guest": med["guest"] / med["p2p"],
                  "p2p_vs_memcpy": med["memcpy"] / med["p2p"],
                  "p2p_vs_memcpy_mt": med["memcpy_mt"] / med["p2p"]}
        met.append(ratios["p2p_vs_bounce"] >= TARGET_VS_BOUNCE
                   and ratios["p2p_vs_memcpy"] >= TARGET_VS_MEMCPY)
        results["sizes"].append({
            "size_mib": s, "verified": ok, "met_targets": met[-1], "memcpy_mt_threads": mt_threads,
            "modes": {k: {"median_ms": v * 1e3, "gbs": _gbs(nbytes, v)} for k, v in med.items()},
            "ratios": ratios,
            "runs_s": {**{k: v["runs_s"] for k, v in switch[s].items()},
                       "bounce_sockets": sockets[s]["bounce"]["runs_s"]},
            "verified_by_mode": {**{k: switch[s][k]["verified"] for k in ("p2p", "bounce", "guest")},
                                 "bounce_sockets": sockets[s]["bounce"]["verified"]}})

        def cell(k, width=13):
            return f"{med[k] * 1e3:6.1f}ms {_gbs(nbytes, med[k]):4.1f}".rjust(width)
        print(f"{s:>4} MiB {cell('memcpy')} {cell('p2p')} {cell('bounce')} {cell('bounce_sockets', 15)} "
              f"{cell('guest')}   {ratios['p2p_vs_bounce']:9.2f}x {ratios['p2p_vs_guest']:8.2f}x "
              f"{ratios['p2p_vs_memcpy']:9.2f}x {ratios['p2p_vs_memcpy_mt']:6.2f}x  "
              f"{'met' if met[-1] else 'NOT met'}"
              f"{'' if ok else '  WRONG RESULT'}")
    print("(ms and GB/s; bounce = staged through pinned host memory with peer access disabled; "
          "bounce/sockets = the same on a host without peer-to-peer; via guest = to_host into "
          "a pageable array, then copy_from_host)")
    results["verified"] = verified
    results["met_targets"] = all(met)
    hosts_ok = switch["host_exit"] == 0 and sockets["host_exit"] == 0
    refused = sockets.get("peer_refused")
    memcpy_gbs = ", ".join(f"{r['size_mib']} MiB {r['modes']['memcpy']['gbs']:.2f} GB/s"
                           for r in results["sizes"])
    print(f"this machine's memcpy (np.copyto, one thread): {memcpy_gbs}")
    print("best memcpy by 1 .. CPUs threads (p2p/mt is against it): " + ", ".join(
        f"{r['size_mib']} MiB {r['modes']['memcpy_mt']['gbs']:.2f} GB/s ({r['memcpy_mt_threads']} "
        f"thread{'s' if r['memcpy_mt_threads'] > 1 else ''})" for r in results["sizes"]))
    print(f"targets (p2p >= {TARGET_VS_BOUNCE}x bounce and >= {TARGET_VS_MEMCPY}x memcpy): "
          f"{'met' if all(met) else 'NOT met'} (met at {sum(met)} of {len(met)} sizes)")
    print(f"results {'verified' if verified else 'WRONG'}; sockets host "
          f"{'refused' if refused else 'ALLOWED'} peer access; hosts exited "
          f"{switch['host_exit']}, {sockets['host_exit']}")
    write_json(json_path, results)
    return 0 if verified and refused and hosts_ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pvgpu.bench.p2p", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=None, help="MiB, comma-separated (default 16,64,256)")
    ap.add_argument("--reps", type=int, default=None, help="default 7 (3 with --quick)")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    try:
        sizes = parse_sizes(a.sizes)
    except ValueError as e:
        ap.error(str(e))
    return run_bench(a.json, a.quick, sizes_mib=sizes, reps=a.reps)


if __name__ == "__main__":
    sys.exit(main())
