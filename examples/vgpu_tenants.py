"""Two tenants share GPU 0 through vGPUs: each guest joins its vGPU by name and keeps the
compute engine busy; the host's BAND scheduler gives each the share its vGPU was
configured with, and each tenant reads its own utilisation from `dev.stats()`.

    python examples/vgpu_tenants.py            # starts a host of its own with vGPUs A and B
    pvgpu host --sched band --vgpu A:compute=75,copy=50,mem=50 --vgpu B:compute=25,copy=50,mem=50 &
    python examples/vgpu_tenants.py ENDPOINT   # or: against that host
"""

import sys
import tempfile
import threading
import time

import pvgpu
from pvgpu.procs import HostProcess

VGPUS = {"A": 75, "B": 25}  # compute share of each vGPU, in percent
SECONDS = 1.5


def tenant(endpoint: str, vgpu: str, started: threading.Barrier, stop: threading.Event,
           report: dict) -> None:
    """One guest on `vgpu`: 5 ms jobs back to back until `stop`; then its view of the GPU."""
    with pvgpu.connect(endpoint, vgpu=vgpu, name=f"tenant-{vgpu}") as conn:
        dev = conn.devices[0]
        with dev.create_context(f"work-{vgpu}") as ctx:
            started.wait()
            while not stop.is_set():
                for _ in range(4):  # a few jobs queued at a time, as a real application would
                    ctx.launch("burn", grid=1, block=1, args=(5_000,))
                ctx.synchronize()
            own = dev.stats()["vgpus"][conn.vgpu["name"]]  # this tenant's vGPU
        report[vgpu] = (conn.vgpu["compute"], own["compute"]["utilisation"], own["compute"]["jobs"])


def run(endpoint: str) -> None:
    started, stop, report = threading.Barrier(len(VGPUS) + 1, timeout=30), threading.Event(), {}
    threads = [threading.Thread(target=tenant, args=(endpoint, name, started, stop, report))
               for name in VGPUS]
    for t in threads:
        t.start()
    started.wait()  # both tenants connected: now they compete
    time.sleep(SECONDS)
    stop.set()
    for t in threads:
        t.join()
    print(f"{'vGPU':4}  {'share':>5}  {'compute busy':>12}  {'jobs':>5}")
    for name, (share, util, jobs) in sorted(report.items()):
        print(f"{name:4}  {share:>4}%  {util:>12.0%}  {jobs:>5}")
        assert jobs > 0 and util > 0, report


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        run(argv[0])
        return
    with tempfile.TemporaryDirectory(prefix="pvgpu-example-") as d:
        vgpus = [a for name, share in VGPUS.items()
                 for a in ("--vgpu", f"{name}:compute={share},copy=50,mem=50")]
        with HostProcess([f"ipc://{d}/host.sock"], vram="64M",
                         extra_args=["--sched", "band", *vgpus]) as host:
            run(host.endpoint)


if __name__ == "__main__":
    main()
