"""`pvgpu`: the command line — host, info, run, tenant, demo, bench.

  pvgpu host [--listen EP]... [--vram SIZE]     start the backend with two emulated GPUs
                                                  on the local ipc endpoint (+ each EP)
  pvgpu host --listen tcp://.. --curve-secret-key FILE --authorized-keys DIR
                                                  tcp with CURVE: only the listed guest keys
  pvgpu keygen DIR [--name NAME]                  write a CURVE key pair (NAME.key, NAME.key_secret)
  pvgpu info [--connect EP]                       list the devices as a guest sees them
  pvgpu smi [--endpoint EP] [-l S] [--json]       devices, utilisation and every session (admin)
  pvgpu trace start FILE | stop | status          an engine trace of a running host (admin)
  pvgpu run WORKLOAD... [--connect EP] [--memory shared|inline] [--size N]
  pvgpu tenant WORKLOAD --seconds S [--vgpu NAME] one guest of a shared-GPU run (long, short, copy, mixed)
  pvgpu demo                                      host + two guests, every result verified
  pvgpu demo --guests N --sched band [--shares ..] N guests sharing device 0 through vGPUs, live table
            [--plot DIR]                          ... and their utilisation over time as DIR/demo.png
  pvgpu demo p2p                                  a buffer shared by two guests on two GPUs, with
                                                  and without peer-to-peer
  pvgpu bench [--json FILE]                       hot paths against this machine's limits
  pvgpu bench sched [--seconds S] [--policies ..] scheduler fairness (Gdev's experiment) + overlap
                    [--plot DIR]                  ... and utilisation per vGPU over time, DIR/sched.png
  pvgpu bench copies [--json FILE] [--quick]      pinned vs pageable copies, chunk sizes, small copies
                     [--plot DIR]                 ... and bandwidth against size, DIR/copies.png
  pvgpu bench dataflow [--json FILE] [--quick]    shared device memory vs copies through the host
  pvgpu bench p2p [--json FILE] [--quick] [--sizes MiB,..]  GPU-to-GPU copies: P2P vs bounce vs memcpy
  pvgpu bench ptx [--json FILE] [--quick]         PTX kernels on the SMs vs numpy and the built-ins
  pvgpu bench jobs [--json FILE] [--quick]        the fixed cost of a job: tiny launches, round
                                                  trips, 8 guests at once, the KMD alone
  pvgpu bench faults [--json FILE] [--quick]      reclaim of a SIGKILLed guest, HostLost after a
                                                  host's SIGKILL/SIGTERM (exit 1: a target missed)
  pvgpu bench soak [--rounds R] [--workloads]     host RSS after rounds of 8 guests x 2,000
                                                  mixed operations: a plateau, not growth
  pvgpu bench fuzz [--cases N] [--seed S] [--json FILE]  fuzz the control channel, commands and
                                                  chains of a host it starts; exit 1 on a crash,
                                                  hang or traceback
  pvgpu conformance --endpoint EP [--memory M] [--clauses PATTERN] [--json FILE|-] [--timeout S]
                                                  the protocol conformance checks against any host

Every command takes --log-level LEVEL (standard logging; the library's loggers are
`pvgpu.*`) and --debug. A user error (a bad option, no host, a refused session) is one
line and a hint on stderr, exit status 2; a failure of the command itself exit status 1;
a traceback only with --debug. Guest commands connect to --connect, else $PVGPU_ENDPOINT,
else the default endpoint.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import re
import signal
import sys

from pvgpu.spec import wire

TENANT_WORKLOADS = ("long", "short", "copy", "mixed")  # pvgpu.tenant.WORKLOADS (no numpy here)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(i?B)?\s*$", re.I)


def parse_size(text: str) -> int:
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 512M, 1G, 1048576)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m.group(2).upper()]


def _add_guest_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--connect", metavar="ENDPOINT", default=None,
                   help="host endpoint (default: $PVGPU_ENDPOINT, else the local ipc "
                        "endpoint, %s)" % _default_ep_help())
    p.add_argument("--memory", choices=wire.MEMORY_MODELS, default=wire.MEMORY_SHARED,
                   help="guest memory model: shared (zero copy, same machine) or inline (remote)")
    p.add_argument("--mem-size", type=parse_size, default=f"{wire.DEFAULT_GUEST_MEM_SIZE >> 20}M",
                   help="guest memory size (default %(default)s)")
    _add_key_options(p)


def _add_key_options(p: argparse.ArgumentParser) -> None:
    """The CURVE keys of a guest's connection to a tcp endpoint (spec §2.13)."""
    p.add_argument("--server-key", metavar="KEY", default=None,
                   help="tcp with CURVE: the host's public key, a .key file or its Z85 text "
                        "(default: $PVGPU_SERVER_KEY)")
    p.add_argument("--client-key", metavar="KEY", default=None,
                   help="tcp with CURVE: this guest's key pair (one the host authorizes), a "
                        ".key_secret file from `pvgpu keygen` or the Z85 text of the secret "
                        "key (default: $PVGPU_CLIENT_KEY)")


def _default_ep() -> str:
    from pvgpu.transport.channel import default_endpoint
    return default_endpoint()


def _default_ep_help() -> str:
    """The default endpoint for a help text: its directory may be refused (CTL-ENDPOINT-2),
    which only the commands that use it report."""
    from pvgpu.transport.channel import ChannelError
    try:
        return _default_ep()
    except ChannelError as e:
        return f"unusable here: {e}"


class UserError(Exception):
    """An error in what the user asked (no host there, a refused session...): `main`
    prints its message and hint, exit status 2."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


def version() -> str:
    """The installed distribution's version, else the package's __version__."""
    from importlib import metadata
    try:
        return metadata.version("pvgpu")
    except metadata.PackageNotFoundError:
        import pvgpu
        return getattr(pvgpu, "__version__", "unknown")


def _add_common_options(p: argparse.ArgumentParser, *, top: bool) -> None:
    """--log-level and --debug, before the command or after it; a sub-command's copy
    sets them only when given (SUPPRESS), so it never resets the top level's."""
    unset = {} if top else {"default": argparse.SUPPRESS}
    p.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, metavar="LEVEL",
                   help="log at this level and above to stderr: DEBUG, INFO, WARNING "
                        "(default), ERROR", **({"default": None} if top else unset))
    p.add_argument("--debug", action="store_true",
                   help="show the traceback of an error", **unset)


def _add_admin_endpoint_options(p: argparse.ArgumentParser) -> None:
    """--endpoint and --admin-endpoint: which host's admin endpoint (smi, trace)."""
    p.add_argument("--endpoint", metavar="ENDPOINT", default=None,
                   help="the host's ipc endpoint; its admin endpoint is beside it "
                        "(default: the local endpoint)")
    p.add_argument("--admin-endpoint", metavar="ipc://PATH", default=None,
                   help="the host's admin endpoint, if not the one beside --endpoint")


class _Version(argparse.Action):
    """--version, looked up only when asked: importlib.metadata takes tens of milliseconds to
    import, which no other command needs to pay."""

    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"pvgpu {version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="pvgpu", description="A paravirtualized GPU for compute.")
    ap.add_argument("--version", action=_Version)
    _add_common_options(ap, top=True)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("host", help="run the host backend with emulated GPUs")
    p.add_argument("--listen", action="append", metavar="ENDPOINT", default=[],
                   help="another endpoint to bind (repeatable): ipc://PATH or tcp://HOST:PORT; "
                        "the local ipc endpoint (%s) is always bound too unless --no-default"
                        % _default_ep_help())
    p.add_argument("--no-default", action="store_true",
                   help="do not bind the local ipc endpoint (only the --listen ones)")
    p.add_argument("--admin-endpoint", metavar="ipc://PATH", default=None,
                   help="the admin socket `pvgpu smi` reads (its directory: 0700; default: "
                        "beside the first ipc endpoint, ipc://DIR/NAME -> "
                        "ipc://DIR/NAME.admin/admin.sock)")
    p.add_argument("--vram", type=parse_size, default="1G", help="VRAM per device (default %(default)s)")
    p.add_argument("--gpus", type=int, default=2, help="number of emulated GPUs (default 2)")
    p.add_argument("--topology", choices=_layouts(), default="switch",
                   help="PCIe layout of the GPUs: switch = behind one PCIe switch (peer-to-peer "
                        "allowed, default); hostbridge = on root ports of one whitelisted host "
                        "bridge (peer-to-peer through the root complex); sockets = under two "
                        "host bridges (no peer-to-peer: shared buffers bounce through system "
                        "memory)")
    p.add_argument("--heartbeat-ms", type=int, default=wire.DEFAULT_HEARTBEAT_MS,
                   help="heartbeat period; a guest silent for %d periods is reclaimed" % wire.HEARTBEAT_MISSES)
    p.add_argument("--max-guest-mem", type=parse_size, default=f"{wire.MAX_GUEST_MEM_SIZE >> 30}G",
                   help="largest guest memory a session may announce (default %(default)s)")
    p.add_argument("--max-evicted", type=parse_size, default=None, metavar="SIZE",
                   help="host memory per device for buffer objects evicted from a full VRAM "
                        "(oversubscription; default 2x --vram, 0 = no eviction)")
    p.add_argument("--trace", metavar="FILE", default=None,
                   help="record what the engines run and write it to FILE at shutdown "
                        "(SIGINT/SIGTERM), as Chrome/Perfetto trace-event JSON: open it in "
                        "https://ui.perfetto.dev")
    g = p.add_argument_group("scheduling and vGPUs")
    g.add_argument("--sched", choices=("fifo", "credit", "band"), default=None,
                   help="GPU scheduling policy among vGPUs (default fifo): fifo = first come "
                        "first served; credit = Gdev's credit scheduler; band = Gdev's "
                        "bandwidth-aware non-preemptive device scheduler")
    g.add_argument("--vgpu", action="append", metavar="NAME:compute=P,copy=P,mem=P", default=[],
                   help="define a vGPU with shares in percent of each device (repeatable; "
                        "omitted shares are 100); guests bind by name at hello, or are "
                        "assigned the least-used one")
    g.add_argument("--vgpu-config", metavar="FILE",
                   help="JSON file with 'sched', 'vgpus' and scheduler parameters; "
                        "command-line options override it")
    g.add_argument("--job-timeout-ms", type=int, default=None,
                   help="a GPU job running longer is stopped, its engine reset and its "
                        "context lost (TDR; default 10000)")
    g.add_argument("--hw-limit", type=int, default=None,
                   help="jobs in flight per engine ring (drm_sched credits; default 2)")
    g.add_argument("--time-buffer-us", type=int, default=None,
                   help="BAND's time buffer in µs for a vGPU whose turnaround is not "
                        "measured yet (default 1000; 0: no time buffer; once measured, "
                        "a vGPU's own gaps size it)")
    g.add_argument("--period-ms", type=int, default=None,
                   help="credit replenishment period (default 30, as Gdev)")
    g = p.add_argument_group("authentication of tcp endpoints (CurveZMQ)")
    g.add_argument("--curve-secret-key", metavar="FILE",
                   help="the host's key pair (a .key_secret file from `pvgpu keygen`): every "
                        "tcp endpoint is encrypted and authenticated with CURVE")
    g.add_argument("--authorized-keys", metavar="DIR",
                   help="directory of the guests' public keys (*.key) allowed to connect over "
                        "tcp; SIGHUP re-reads it and closes the sessions of removed keys")
    g.add_argument("--insecure", action="store_true",
                   help="serve tcp endpoints without CURVE: anyone who reaches them is served, "
                        "in clear text")
    p.add_argument("--ready-file", help=argparse.SUPPRESS)
    p.add_argument("-v", "--verbose", action="store_true")

    p = sub.add_parser("keygen", help="write a CURVE key pair for a host or a guest")
    p.add_argument("directory", metavar="DIR", help="where to write (created 0700 if missing)")
    p.add_argument("--name", default="pvgpu",
                   help="file name: NAME.key (public) and NAME.key_secret (mode 0600); "
                        "default %(default)s")

    p = sub.add_parser("smi", help="the host's GPUs and sessions from its admin endpoint, "
                                   "like nvidia-smi (for the host's user)")
    _add_admin_endpoint_options(p)
    p.add_argument("-l", "--loop", type=float, metavar="SECONDS", default=None,
                   help="redraw every SECONDS until Ctrl-C")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")

    p = sub.add_parser("trace", help="start or stop an engine trace of a running host, from "
                                     "its admin endpoint (for the host's user)")
    _add_admin_endpoint_options(p)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = actions.add_parser("start", help="record what the engines run until "
                                              "`pvgpu trace stop`")
    start.add_argument("file", metavar="FILE",
                       help="where the host writes the trace (relative to this directory)")
    actions.add_parser("stop", help="stop recording; the host writes the file (Chrome/Perfetto "
                                    "trace-event JSON: open it in https://ui.perfetto.dev)")
    actions.add_parser("status", help="whether a trace is recorded, and to which file")

    p = sub.add_parser("info", help="connect as a guest and list the devices")
    _add_guest_options(p)
    p.add_argument("--vgpu", metavar="NAME", default=None,
                   help="join this vGPU of the host (default: the host assigns one)")

    p = sub.add_parser("run", help="run workloads as a guest and check them against numpy")
    p.add_argument("workloads", nargs="+", choices=("vector-add", "saxpy", "gemm"), metavar="WORKLOAD",
                   help="vector-add, saxpy or gemm (several allowed)")
    _add_guest_options(p)
    p.add_argument("--size", type=int, default=None,
                   help="elements (vector-add, saxpy) or matrix dimension (gemm)")
    p.add_argument("--device", type=int, default=0, help="device index (default 0)")
    p.add_argument("--repeat", type=int, default=1, help="run each workload this many times")
    p.add_argument("--json", action="store_true", help="print one JSON object per result")

    p = sub.add_parser("tenant", help="one guest of a shared-GPU run: a workload for S seconds, "
                                      "verified, one result line")
    p.add_argument("workload", choices=TENANT_WORKLOADS, metavar="WORKLOAD",
                   help="long (20 ms kernels back to back), short (1 ms kernels, small gaps), "
                        "copy (4 MiB copies both ways + queued kernels), mixed (random kernels "
                        "and vector adds)")
    p.add_argument("--seconds", type=float, default=5.0,
                   help="how long to run (default %(default)s); SIGTERM stops it early, "
                        "still verified and reported")
    _add_guest_options(p)
    p.add_argument("--vgpu", metavar="NAME", default=None,
                   help="bind the session to this vGPU of the host (default: the host assigns one)")
    p.add_argument("--device", type=int, default=0, help="device index (default 0)")
    p.add_argument("--seed", type=int, default=0, help="seed of the mixed workload's kernel lengths")
    p.add_argument("--kernel-us", type=int, default=None,
                   help="kernel length of long/short in µs (default 20000 / 1000)")
    p.add_argument("--name", default=None, help="session name (default tenant-WORKLOAD)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")

    p = sub.add_parser("demo", help="start a host and guests, run and verify workloads",
                       description="Without --guests, --sched or --shares: a host with two "
                                   "GPUs and two guests (one per memory model) running vector "
                                   "add and gemm. With any of them: N guests (`pvgpu tenant`, "
                                   "workloads long, short, copy, mixed in turn) bound to vGPUs "
                                   "g1..gN that split device 0 -- all on device 0 so they "
                                   "compete -- with a live utilisation table and fairness "
                                   "figures (over compute) at the end. `pvgpu demo p2p`: guest "
                                   "A exports a buffer it computed on GPU 0, guest B imports "
                                   "it on GPU 1 and consumes it, on a host with peer-to-peer "
                                   "(--topology switch) and on one without (sockets).")
    p.add_argument("which", nargs="?", choices=("pair", "p2p"), default=None,
                   help="pair: the two-guest demo (the default without vGPU options); p2p: a "
                        "buffer shared between two guests on two GPUs, with and without "
                        "peer-to-peer")
    p.add_argument("--vram", default="512M", help="VRAM per device for the demo host")
    p.add_argument("--guests", type=int, default=None, metavar="N",
                   help="vGPU demo: N guests and vGPUs, 1..8 (default 4, or one per --shares)")
    p.add_argument("--sched", choices=("fifo", "credit", "band"), default=None,
                   help="vGPU demo: the host's scheduling policy (default band)")
    p.add_argument("--shares", metavar="P,P,...", default=None,
                   help="vGPU demo: compute shares in percent, one per vGPU (default equal: "
                        "100//N each); copy and memory shares stay equal")
    p.add_argument("--seconds", type=float, default=10.0,
                   help="vGPU demo: how long every guest runs (default %(default)s)")
    p.add_argument("--plot", metavar="DIR", default=None,
                   help="vGPU demo: also draw each guest's utilisation over time as "
                        "DIR/demo.png (needs pvgpu[plot])")

    p = sub.add_parser("bench", help="measure hot paths against this machine's limits, or "
                                     "the GPU scheduler's fairness (`bench sched`)")
    p.add_argument("which", nargs="?",
                   choices=("hotpaths", "sched", "copies", "dataflow", "p2p", "ptx", "jobs",
                            "faults", "soak", "fuzz"),
                   default="hotpaths",
                   help="hotpaths (default): copies, round trip, kernels against the machine's "
                        "limits; sched: Gdev's fairness experiment under each policy, four "
                        "fair vGPUs, copy/compute overlap; copies: pinned vs pageable vs "
                        "unpipelined copies 1 KiB..256 MiB against memcpy, chunk-size sweep, "
                        "small-copy crossover; dataflow: Gdev's dataflow, buffers passed "
                        "between contexts and guests through shared device memory vs "
                        "through the host; p2p: GPU-to-GPU copies of 16..256 MiB, "
                        "peer-to-peer vs staged through pinned host memory vs through the "
                        "guest, against memcpy; ptx: the SMs' lane-instructions/s, PTX "
                        "vector_add/saxpy/tiled SGEMM/shuffle reduction against numpy and the "
                        "built-in kernels; jobs: the fixed cost of a job: async tiny "
                        "launches/s, launch + synchronize and a 4 KiB copy against a bare "
                        "zmq round trip, 8 guests x 2,000 mixed operations, per-job cost "
                        "of an in-process KMD against a bare thread handoff; faults: how fast "
                        "a SIGKILLed guest is reclaimed (mid-transfer, mid-kernel) and a "
                        "guest blocked in a call raises after its host's SIGKILL or SIGTERM, "
                        "10 repetitions, median and max against the targets; soak: the host's RSS "
                        "after each round of 8 guests x 2,000 mixed operations; fuzz: a "
                        "structure-aware fuzzer of the control channel, the device commands "
                        "and the descriptor chains against a host it starts (exit 1 on a "
                        "crash, hang or traceback)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    p.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    p.add_argument("--plot", metavar="DIR", default=None,
                   help="sched, copies: also draw the results as a PNG in DIR (sched.png: "
                        "utilisation per vGPU over time; copies.png: bandwidth against size); "
                        "needs pvgpu[plot]")
    p.add_argument("--cases", type=int, default=10_000,
                   help="fuzz: how many cases (default %(default)s)")
    p.add_argument("--seed", type=int, default=1,
                   help="fuzz: the seed; a run is reproduced by its seed (default %(default)s)")
    p.add_argument("--seconds", type=float, default=None,
                   help="sched: measured seconds per run (default 20, 1.5 with --quick)")
    p.add_argument("--short-us", type=int, default=1000,
                   help="sched: kernel length of the short tenant in µs (default %(default)s)")
    p.add_argument("--policies", default="fifo,credit,band",
                   help="sched: policies of the unfair two-vGPU run (default %(default)s)")
    p.add_argument("--parts", default="alone,unfair,fair,overlap",
                   help="sched: which runs (default %(default)s)")
    p.add_argument("--time-buffer-us", type=int, default=None,
                   help="sched: the hosts' BAND time buffer (default: the host's, Gdev's 500)")
    p.add_argument("--sizes", default=None, metavar="MiB,...",
                   help="p2p: copy sizes in MiB (default 16,64,256; 16,64 with --quick)")
    p.add_argument("--rounds", type=int, default=5,
                   help="soak: rounds of 8 guests x 2,000 mixed operations (default %(default)s)")
    p.add_argument("--workloads", action="store_true",
                   help="soak: also run the `pvgpu run` workloads in both memory models each round")

    p = sub.add_parser("conformance", help="run the protocol conformance checks of spec/pvgpu.md "
                                           "against a host (ours or another implementation)",
                       description="Runs the black-box checks of spec/pvgpu.md against the "
                                   "host at ENDPOINT, speaking only the wire protocol: one line "
                                   "per check with its clause IDs (PASS, FAIL, or SKIP with the "
                                   "reason), then a summary. Exit status 0 only if no check "
                                   "failed.")
    p.add_argument("--endpoint", metavar="ENDPOINT",
                   help="the host under test: ipc://PATH or tcp://HOST:PORT (required but "
                        "with --list)")
    p.add_argument("--memory", choices=wire.MEMORY_MODELS, action="append", default=None,
                   help="memory model of the sessions (repeatable; default: both). shared "
                        "needs the host on this machine; against a remote host use inline")
    p.add_argument("--clauses", metavar="PATTERN", default=None,
                   help="only the checks of clauses matching PATTERN (fnmatch, any case; "
                        "comma-separated: CTL-HELLO-*,VQ-*); a check name matches too")
    p.add_argument("--json", metavar="FILE", default=None,
                   help="also write the results as JSON to FILE (- : to stdout, the lines "
                        "then go to stderr)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="the longest a check may take, and any wait for the host in it; a "
                        "silent host fails with 'no answer within S s' (default %(default)s)")
    _add_key_options(p)
    p.add_argument("--list", action="store_true", help="list the selected checks, run nothing")
    p.add_argument("-v", "--verbose", action="store_true", help="print each failure's traceback")
    for p in sub.choices.values():
        _add_common_options(p, top=False)
    return ap


def main(argv=None) -> int:
    args = None
    try:
        args = build_parser().parse_args(argv)
        if args.log_level:
            logging.basicConfig(level=args.log_level,
                                format="%(asctime)s %(name)s %(levelname)s %(message)s")
        code = {"host": cmd_host, "info": cmd_info, "run": cmd_run, "demo": cmd_demo,
                "bench": cmd_bench, "tenant": cmd_tenant, "keygen": cmd_keygen,
                "conformance": cmd_conformance, "smi": cmd_smi,
                "trace": cmd_trace}[args.command](args)
        sys.stdout.flush()  # a reader gone away (`| head`) shows here, not at exit
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _discard_stdout()
        return 1
    except Exception as e:
        if args is None or args.debug:
            raise
        return report_error(args.command, e)


def _discard_stdout() -> None:
    """The reader of stdout went away: what is still buffered goes nowhere, silently
    (else the interpreter's last flush would complain)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def report_error(command: str, exc: Exception) -> int:
    """Print `exc` as one line and a hint on stderr -> the exit status: 2 for an error in
    what the user asked, 1 for a failure of the command (or of pvgpu itself)."""
    from pvgpu.procs import HostStartError
    from pvgpu.transport.errors import PvgpuError
    text = str(exc) or type(exc).__name__
    hint = getattr(exc, "hint", None)
    code = 2
    if isinstance(exc, (UserError, HostStartError)):
        pass
    elif isinstance(exc, PvgpuError):  # a bad value (a key file...) or a failure
        if not isinstance(exc, ValueError):
            text, code = f"{type(exc).__name__}: {text}", 1
    elif isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno == errno.ENOMEM):
        text = f"out of memory: {text}"
        hint = "ask for less (a smaller --vram, fewer --gpus)"
    elif isinstance(exc, (ValueError, OSError)):  # what was asked cannot be
        pass
    else:
        text, code = f"internal error: {type(exc).__name__}: {text}", 1
        hint = f"`pvgpu --debug {command} ...` shows the traceback; please report it"
    print(f"pvgpu {command}: {text}", file=sys.stderr)
    if hint:
        print(f"  hint: {hint}", file=sys.stderr)
    return code


def cmd_smi(args) -> int:
    from pvgpu import smi
    if args.loop is not None and args.loop <= 0:
        print("pvgpu smi: --loop needs a positive number of seconds", file=sys.stderr)
        return 2
    return smi.run(args.endpoint, args.admin_endpoint, loop=args.loop, as_json=args.json)


def cmd_trace(args) -> int:
    from pvgpu import trace_ctl
    return trace_ctl.run(args.action, getattr(args, "file", None), args.endpoint,
                         args.admin_endpoint)


def cmd_host(args) -> int:
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from pvgpu.host.kmd.trace import TraceError
    from pvgpu.host.config import check_vram
    from pvgpu.host.main import run_host
    from pvgpu.transport.channel import ChannelError
    try:
        endpoints = list(args.listen) if args.no_default else [_default_ep(), *args.listen]
    except ChannelError as e:  # the default endpoint's directory is refused
        print(f"pvgpu host: {e}", file=sys.stderr)
        return 2
    if not endpoints:
        print("pvgpu host: --no-default needs at least one --listen ENDPOINT", file=sys.stderr)
        return 2
    try:
        check_vram(args.vram, args.gpus)
        sched = sched_config(args)
        curve = host_keys(args, endpoints)
    except ValueError as e:
        print(f"pvgpu host: {e}", file=sys.stderr)
        return 2
    try:
        return run_host(endpoints, vram_size=args.vram, heartbeat_ms=args.heartbeat_ms,
                        num_gpus=args.gpus, max_mem_size=args.max_guest_mem,
                        ready_file=args.ready_file, sched=sched,
                        max_evicted_bytes=args.max_evicted, topology=args.topology, curve=curve,
                        admin_endpoint=args.admin_endpoint,
                        trace=args.trace)
    except ChannelError as e:  # e.g. an endpoint directory refused, a port in use
        busy = "another process is serving it" in str(e) or "in use" in str(e)
        raise UserError(str(e), "stop the host serving it, or serve other endpoints: "
                                "pvgpu host --no-default --listen ENDPOINT" if busy else None)
    except TraceError as e:  # --trace FILE cannot be written
        raise UserError(str(e), None)


def host_keys(args, endpoints):
    """The host's CURVE keys (pvgpu.transport.curve.ServerKeys) or None; ValueError if tcp is
    asked for without keys and without --insecure (spec CTL-AUTH-3)."""
    from pvgpu.transport.curve import ServerKeys
    if (args.curve_secret_key is None) != (args.authorized_keys is None):
        raise ValueError("--curve-secret-key and --authorized-keys go together")
    tcp = [ep for ep in endpoints if ep.startswith("tcp://")]
    if args.curve_secret_key is not None:
        if args.insecure:
            raise ValueError("--insecure and CURVE keys exclude each other")
        return ServerKeys.load(args.curve_secret_key, args.authorized_keys)
    if tcp and not args.insecure:
        raise ValueError(f"refusing to serve {' '.join(tcp)} without authentication: give "
                         "--curve-secret-key FILE --authorized-keys DIR (keys from `pvgpu "
                         "keygen`), or --insecure to let anyone who reaches it in, unencrypted")
    if tcp:
        logging.getLogger("pvgpu.host").warning(
            "--insecure: %s serve(s) anyone who reaches it, without authentication or "
            "encryption", " ".join(tcp))
    return None


def cmd_keygen(args) -> int:
    from pvgpu.transport.curve import CurveKeyError, read_key_file, write_keypair
    try:
        public, secret = write_keypair(args.directory, args.name)
    except (CurveKeyError, OSError) as e:
        print(f"pvgpu keygen: {e}", file=sys.stderr)
        return 2
    print(f"public key {public}  (fingerprint {read_key_file(public).fingerprint})\n"
          f"secret key {secret}  (mode 0600: keep it)")
    return 0


def _layouts():
    from pvgpu.host.hw.pcie import LAYOUTS
    return tuple(LAYOUTS)


def sched_config(args):
    """The host's SchedConfig from --vgpu-config, then the command-line overrides."""
    from pvgpu.host.config import SchedConfig, load_config, parse_vgpu
    cfg = load_config(args.vgpu_config) if args.vgpu_config else SchedConfig()
    if args.sched:
        cfg.policy = args.sched
    for key in ("job_timeout_ms", "hw_limit", "time_buffer_us", "period_ms"):
        if getattr(args, key) is not None:
            setattr(cfg, key, getattr(args, key))
    if args.vgpu:
        cfg.vgpus = [parse_vgpu(v) for v in args.vgpu]
    return cfg.validate()


def _connect(args):
    """A guest connection as the command's options say; UserError if there is none."""
    from pvgpu import guest
    other = "or pass --connect ENDPOINT (or set PVGPU_ENDPOINT) to reach another host"
    try:
        return guest.connect(args.connect, memory=args.memory, mem_size=args.mem_size,
                             vgpu=getattr(args, "vgpu", None), server_key=args.server_key,
                             client_key=args.client_key)
    except guest.AuthenticationError as e:
        raise UserError(f"the host did not accept this guest: {e}",
                        "check --server-key and --client-key ($PVGPU_SERVER_KEY, "
                        "$PVGPU_CLIENT_KEY)") from e
    except guest.HostNotFound as e:
        raise UserError(str(e), other) from e
    except guest.HostLost as e:
        raise UserError(f"cannot reach a host: {e}", f"start one with `pvgpu host`, {other}") from e
    except guest.ControlError as e:  # e.g. hello refused: an unknown --vgpu
        raise UserError(f"the host refused the session: {e}") from e
    except (guest.PvgpuError, ValueError) as e:  # a bad endpoint, a key that cannot be read
        bare = args.connect and "://" not in args.connect
        raise UserError(str(e), f"did you mean tcp://{args.connect}?" if bare else None) from e


def cmd_info(args) -> int:
    with _connect(args) as conn:
        v = conn.vgpu
        vgpu = (f"  vGPU {v['name']} (compute {v['compute']}%, copy {v['copy']}%, mem {v['mem']}%)"
                if v else "")
        print(f"host {conn.endpoint}  session {conn.session.session_id}  memory model "
              f"{conn.memory_model}{vgpu}")
        for dev in conn.devices:
            info = dev.info()
            print(f"  device {dev.index}: {dev.name}  VRAM {dev.vram_size >> 20} MiB "
                  f"({info['vram_free'] >> 20} MiB free)  features {','.join(dev.features)}")
            for peer in conn.devices:
                if peer is not dev:
                    p = dev.peer_info(peer)
                    how = (f"peer-to-peer ({p['link']}, {p['distance']} PCIe hops)" if p["p2p"]
                           else "no peer-to-peer: shared buffers bounce through system memory")
                    print(f"    to device {peer.index}: {how}")
    return 0


def cmd_run(args) -> int:
    from pvgpu.workloads import run_workload
    failures = 0
    with _connect(args) as conn:
        if not 0 <= args.device < len(conn.devices):
            print(f"pvgpu: no device {args.device} (the host has {len(conn.devices)})", file=sys.stderr)
            return 2
        dev = conn.devices[args.device]
        with dev.create_context("pvgpu-run") as ctx:
            for name in args.workloads:
                for i in range(args.repeat):
                    r = run_workload(ctx, name, args.size, seed=i)
                    r.update(device=dev.index, memory=conn.memory_model)
                    failures += not r["ok"]
                    if args.json:
                        print(json.dumps(r), flush=True)
                    else:
                        print(f"{name:<10} size {r['size']:>9}  device {dev.index}  {conn.memory_model:<6} "
                              f"{'OK' if r['ok'] else 'MISMATCH'}  max|err| {r['max_err']:.3g}  "
                              f"{r['seconds'] * 1e3:8.1f} ms", flush=True)
    return 1 if failures else 0


def cmd_tenant(args) -> int:
    from pvgpu import guest
    from pvgpu.tenant import run
    name = args.name or f"tenant-{args.workload}"
    stop = []
    handler = lambda *_: stop.append(True)  # noqa: E731 -- finish the iteration, then report
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    bind = {"vgpu": args.vgpu} if args.vgpu is not None else {}
    try:
        conn = guest.connect(args.connect, memory=args.memory, mem_size=args.mem_size, name=name,
                             server_key=args.server_key, client_key=args.client_key, **bind)
    except ValueError as e:  # a key that cannot be read
        print(f"pvgpu tenant: {e}", file=sys.stderr)
        return 2
    except guest.HostLost as e:
        print(f"pvgpu tenant: cannot reach a host: {e}", file=sys.stderr)
        return 2
    except guest.PvgpuError as e:  # e.g. the host has no such vGPU
        print(f"pvgpu tenant: the host refused the session: {e}", file=sys.stderr)
        return 2
    vgpu = conn.vgpu or {}
    r = {"workload": args.workload, "verified": False}
    try:
        with conn:
            if not 0 <= args.device < len(conn.devices):
                print(f"pvgpu tenant: no device {args.device} (the host has {len(conn.devices)})",
                      file=sys.stderr)
                return 2
            dev = conn.devices[args.device]
            with dev.create_context(name) as ctx:
                r = run(ctx, args.workload, args.seconds, seed=args.seed, stop=lambda: bool(stop),
                        kernel_us=args.kernel_us)
    except guest.PvgpuError as e:
        r.update(verified=False, error=f"{type(e).__name__}: {e}")
    r.update(name=name, vgpu=vgpu.get("name", args.vgpu), shares=vgpu or None, device=args.device,
             memory=args.memory, pid=os.getpid())
    if args.json:
        print(json.dumps(r), flush=True)
    else:
        print(f"tenant {name}: {r['workload']} on vGPU {r['vgpu']} device {r['device']}: "
              f"{r.get('iterations', 0)} iterations, {r.get('kernels', 0)} kernels in "
              f"{r.get('seconds', 0):.1f}s -- {'verified' if r['verified'] else 'NOT verified'}"
              + (f" ({r['error']})" if "error" in r else ""), flush=True)
    return 0 if r["verified"] else 1


def cmd_demo(args) -> int:
    from pvgpu import demo
    sharing = not (args.guests is None and args.sched is None and args.shares is None)
    if args.which is not None and sharing:
        print(f"pvgpu demo {args.which}: --guests, --sched and --shares are options of the vGPU "
              "demo (`pvgpu demo --guests N`)", file=sys.stderr)
        return 2
    if args.plot is not None and not sharing:
        print("pvgpu demo: --plot draws the vGPU demo (`pvgpu demo --guests N --plot DIR`)",
              file=sys.stderr)
        return 2
    if args.plot is not None and not _plots_available("pvgpu demo"):
        return 2
    if args.which == "p2p":
        return demo.run_p2p(vram=args.vram)
    if not sharing:
        return demo.run_pair(vram=args.vram)
    return demo.run_sharing(args.guests, sched=args.sched or "band", seconds=args.seconds,
                            vram=args.vram, shares=args.shares, plot_dir=args.plot)


PLOTTED_BENCHES = ("sched", "copies")


def _plots_available(command: str) -> bool:
    """matplotlib is there (checked before a long run); else one line and False."""
    from pvgpu import plots
    try:
        plots.require()
    except plots.PlotUnavailable as e:
        print(f"{command}: {e}", file=sys.stderr)
        return False
    return True


def cmd_bench(args) -> int:
    if args.plot is not None and args.which not in PLOTTED_BENCHES:
        print(f"pvgpu bench {args.which}: --plot draws {' and '.join(PLOTTED_BENCHES)} only",
              file=sys.stderr)
        return 2
    if args.plot is not None and not _plots_available(f"pvgpu bench {args.which}"):
        return 2
    if args.which == "sched":
        from pvgpu.bench.sched import run_bench as run_sched
        return run_sched(seconds=args.seconds, policies=args.policies.split(","),
                         json_path=args.json, quick=args.quick, parts=args.parts.split(","),
                         time_buffer_us=args.time_buffer_us, short_us=args.short_us,
                         plot_dir=args.plot)
    if args.which == "dataflow":
        from pvgpu.bench.dataflow import run_bench as run_dataflow
        return run_dataflow(json_path=args.json, quick=args.quick)
    if args.which == "p2p":
        from pvgpu.bench.p2p import parse_sizes, run_bench as run_p2p
        try:
            sizes = parse_sizes(args.sizes)
        except ValueError as e:
            print(f"pvgpu bench p2p: {e}", file=sys.stderr)
            return 2
        return run_p2p(json_path=args.json, quick=args.quick, sizes_mib=sizes)
    if args.which == "ptx":
        from pvgpu.bench.ptx import run_bench as run_ptx
        run_ptx(json_path=args.json, quick=args.quick)
        return 0
    if args.which == "jobs":
        from pvgpu.bench.jobs import run_bench as run_jobs
        run_jobs(json_path=args.json, quick=args.quick)
        return 0
    if args.which == "faults":
        from pvgpu.bench.faults import run_bench as run_faults
        results = run_faults(json_path=args.json, quick=args.quick)
        return 0 if all(r["met"] for r in results.values()) or args.quick else 1
    if args.which == "soak":
        from pvgpu.bench.soak import run_bench as run_soak
        run_soak(rounds=2 if args.quick else args.rounds, ops=500 if args.quick else 2000,
                 workloads=args.workloads, json_path=args.json)
        return 0
    if args.which == "fuzz":
        from pvgpu.bench.fuzz.runner import run_bench as run_fuzz
        return run_fuzz(cases=args.cases, seed=args.seed, json_path=args.json)
    if args.which == "copies":
        from pvgpu.bench.copies import run_bench as run_copies
        return run_copies(json_path=args.json, quick=args.quick, plot_dir=args.plot)
    from pvgpu.bench.hotpaths import run_bench
    return run_bench(json_path=args.json, quick=args.quick)


def cmd_conformance(args) -> int:
    from pvgpu.conformance import Target, select
    from pvgpu.conformance.runner import as_json, cases, run, summary
    patterns = [p.strip() for p in (args.clauses or "").split(",") if p.strip()]
    checks = select(patterns)
    if not checks:
        print(f"pvgpu conformance: no check of a clause matching {args.clauses!r}", file=sys.stderr)
        return 2
    memories = tuple(dict.fromkeys(args.memory or wire.MEMORY_MODELS))
    out = sys.stderr if args.json == "-" else sys.stdout
    if args.list:
        for check, memory in cases(checks, memories):
            print(f"{' '.join(check.clauses)}  {check.name}" + (f"[{memory}]" if memory else ""),
                  file=out)
        return 0
    if not args.endpoint:
        print("pvgpu conformance: --endpoint ENDPOINT is required (the host to check)", file=sys.stderr)
        return 2
    target = Target(args.endpoint, memories=memories, timeout=args.timeout,
                    server_key=args.server_key, client_key=args.client_key)
    try:
        target.curve_for(args.endpoint)
    except ValueError as e:  # pvgpu.transport.curve.CurveKeyError: a key file that is not one
        print(f"pvgpu conformance: {e}", file=sys.stderr)
        return 2

    def report(result):
        print(result.line(), file=out, flush=True)
        if args.verbose and result.detail:
            print("    " + result.detail.rstrip().replace("\n", "\n    "), file=out, flush=True)
    results = run(target, checks, report=report)
    s = summary(results)
    print(f"{s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped "
          f"({s['total']} runs of {len(checks)} checks) against {args.endpoint}", file=out)
    if args.json:
        text = json.dumps(as_json(target, results, patterns), indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    return 1 if s["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
