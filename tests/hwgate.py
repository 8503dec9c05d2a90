"""Gates in hardware: jobs that stay on the GPU until the test opens them.

A gate (tests/unit/host/kmd/conftest.py) keeps a job queued; some checks need a job that
is on the hardware -- handed to the ring, counted busy, its context not evictable -- for
as long as the test says, however loaded the machine. `SpinGates` gives a KMD context
code launches that spin on a flag each in host memory mapped into the context
(pvgpu/conformance/codeobj.py wait_flag); open(i) writes flag i and the launch completes.
"""

import struct

import numpy as np

from pvgpu.conformance import codeobj

# where the flags (and the code, on its way to VRAM) are mapped: far from the guest window
# and from where the VA allocator puts buffers
FLAGS_VA = 1 << 44
DEADLINE = 60.0  # seconds; generous, only so that a broken device fails instead of hanging


class SpinGates:
    """Context `ctx` of `kmd` with the wait_flag code loaded; close() submits a gated job."""

    def __init__(self, kmd, ctx):
        self.ctx = ctx
        self.host = np.zeros(1 << 16, np.uint8)
        ctx.map_system(kmd.dma_map(self.host), FLAGS_VA)
        obj = codeobj.wait_flag()
        code = ctx.alloc(len(obj), executable=True)
        self.host[4096:4096 + len(obj)] = np.frombuffer(obj, np.uint8)
        f = ctx.submit_copy(FLAGS_VA + 4096, code.va, len(obj))
        assert f.wait(DEADLINE) and f.error is None, f.error
        self.entry = (code.va, codeobj.entry_va(code.va, obj))
        self.fences = []

    def close(self, timeline: int = 0):
        """Submit a job that spins until open(i) (i: its index); -> its fence, once the job
        is on the hardware."""
        i = len(self.fences)
        fence = self.ctx.submit_launch_code(*self.entry, 1, 1, 0,
                                            struct.pack("<Q", FLAGS_VA + 4 * i),
                                            timeline=timeline)
        self.fences.append(fence)
        assert fence.job.scheduled.wait(DEADLINE)
        return fence

    def open(self, i: int = 0, wait: bool = True) -> None:
        self.host[4 * i:4 * i + 4] = 1
        if wait:
            f = self.fences[i]
            assert f.wait(DEADLINE) and f.error is None, f.error

    def open_all(self) -> None:
        self.host[:4 * max(len(self.fences), 1)] = 1
