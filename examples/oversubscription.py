"""Oversubscribed VRAM: two contexts together allocate more than the device has. The host's
KMD evicts the idle context's buffers to host memory (the GPU keeps reaching them through
SYSTEM page-table entries) and brings them back when it can; every result stays right.

    python examples/oversubscription.py            # starts a host of its own with 32 MiB of VRAM
    pvgpu host --vram 32M &
    python examples/oversubscription.py ENDPOINT   # or: against a (small) host of yours
"""

import sys
import tempfile

import numpy as np

import pvgpu
from pvgpu.procs import HostProcess

CHUNK = 1 << 20  # float32 elements per buffer: 4 MiB


def show(when: str, dev) -> None:
    mem = dev.stats()["mem"]
    print(f"{when}: VRAM free {mem['vram_free'] >> 20} of {mem['vram_size'] >> 20} MiB, "
          f"evicted now {mem['evicted_bytes'] >> 20} MiB; so far {mem['evictions']} evictions "
          f"({mem['bytes_evicted'] >> 20} MiB), {mem['restores']} restores")
    for ctx_id, c in sorted(mem["contexts"].items()):
        print(f"    context {ctx_id} {c['name']!r}: {c['resident_bytes'] >> 20} MiB in VRAM, "
              f"{c['evicted_bytes'] >> 20} MiB in host memory")


def run(endpoint: str) -> None:
    rng = np.random.default_rng(3)
    with pvgpu.connect(endpoint) as conn:
        dev = conn.devices[0]
        vram = dev.stats()["mem"]["vram_size"]
        count = max(2, int(0.75 * vram) // (4 * CHUNK))  # each context: 3/4 of VRAM
        print(f"device 0 has {vram >> 20} MiB of VRAM; two contexts allocate "
              f"{2 * count * 4 * CHUNK >> 20} MiB")
        with dev.create_context("first") as first, dev.create_context("second") as second:
            data = [rng.random(CHUNK, dtype=np.float32) for _ in range(count)]
            arrays = [first.to_device(d) for d in data]
            show("first context allocated", dev)

            more = [second.empty(CHUNK) for _ in range(count)]  # does not fit beside them
            for a in more:
                second.launch("fill", CHUNK // 256, 256, (a, 1.0, CHUNK))
            second.synchronize()
            show("second context allocated", dev)
            assert dev.stats()["mem"]["evictions"] > 0, "nothing was evicted"

            for a in arrays:  # the first context's buffers, wherever they are now
                first.launch("scale", CHUNK // 256, 256, (a, a, 2.0, CHUNK))
            for a, d in zip(arrays, data):
                np.testing.assert_array_equal(a.get(), 2 * d)
            assert all(np.all(a.get() == 1.0) for a in more)
            show("both contexts used their buffers", dev)
    print("every buffer of both contexts holds the right values")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        run(argv[0])
        return
    with tempfile.TemporaryDirectory(prefix="pvgpu-example-") as d:
        with HostProcess([f"ipc://{d}/host.sock"], vram="32M") as host:
            run(host.endpoint)


if __name__ == "__main__":
    main()
