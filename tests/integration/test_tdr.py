"""TDR with real processes: a guest whose kernel never ends is stopped at the job timeout,
loses its context, and another guest's work on the same engine goes on (spec FENCE-LOST-*,
SCHED-TDR-1)."""

import subprocess
import sys
import textwrap

import numpy as np

from pvgpu import guest

HUNG_GUEST = textwrap.dedent("""
    import sys, pvgpu.guest as guest
    from pvgpu.spec import wire
    with guest.connect(sys.argv[1], mem_size=16 << 20, name="hung") as conn:
        ctx = conn.devices[0].create_context()
        ctx.launch("burn", 1, 1, (wire.BURN_FOREVER,))
        print("hung", flush=True)
        try:
            ctx.synchronize()
            print("no error", flush=True)
        except guest.JobTimeoutError as e:
            print("timeout:", e, flush=True)
        try:
            ctx.launch("burn", 1, 1, (1,))
            ctx.synchronize()
        except guest.ContextLostError:
            print("context lost", flush=True)
        ctx.destroy()
        print("done", flush=True)
""")


def test_a_hung_guest_does_not_stop_another_guests_work(host_factory, tmp_endpoint):
    host = host_factory([tmp_endpoint], vram="64M", extra_args=["--job-timeout-ms", "500"])
    hung = subprocess.Popen([sys.executable, "-c", HUNG_GUEST, host.endpoint],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert hung.stdout.readline().strip() == "hung"
        with guest.connect(host.endpoint, mem_size=16 << 20, name="innocent") as conn:
            ctx = conn.devices[0].create_context()
            n = 4096
            a = ctx.to_device(np.arange(n, dtype=np.float32))  # copy engines: not blocked
            b = ctx.empty(n, np.float32)
            for i in range(5):  # the compute engine: behind the hung kernel, then free
                ctx.launch("scale", (n + 255) // 256, 256, (b, a, float(i), n))
                np.testing.assert_array_equal(b.to_host(), np.arange(n, dtype=np.float32) * i)
            assert conn.devices[0].stats()["timeouts"] == 1  # the hung kernel was stopped
        out, _ = hung.communicate(timeout=30)
        assert hung.returncode == 0, out
        assert "timeout:" in out and "context lost" in out and "done" in out, out
    finally:
        if hung.poll() is None:
            hung.kill()
        hung.wait(10)
