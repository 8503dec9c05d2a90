"""Oversubscription end to end: two guest sessions on a host with 32 MiB of VRAM, each
with 20 MiB of buffers, run kernels over their buffers in alternation. The KMD evicts the
idle session's buffer objects to host memory (their PTEs point at the host copy) and
migrates them back when it can; every result stays correct (host/kmd/device.py,
"Oversubscription")."""

import numpy as np

from pvgpu import guest

N = 1 << 20  # 4 MiB of float32 per buffer, 5 buffers = 20 MiB per session
GRID, BLOCK = N // 256, 256


def test_two_sessions_whose_working_sets_exceed_vram(host_factory, tmp_endpoint):
    # [SCHED-VGPU-5] results are the same when VRAM is oversubscribed
    host = host_factory([tmp_endpoint], vram="32M")
    rng = np.random.default_rng(7)
    with guest.connect(host.endpoint, mem_size=32 << 20) as c1, \
            guest.connect(host.endpoint, memory="inline", mem_size=32 << 20) as c2:
        sessions = []
        for i, conn in enumerate((c1, c2)):
            ctx = conn.devices[0].create_context(f"s{i}")
            data = [rng.random(N, dtype=np.float32) for _ in range(5)]
            arrays = [ctx.to_device(d) for d in data]
            sessions.append((ctx, data, arrays))
        for _round in range(3):
            for ctx, data, arrays in sessions:
                for j in range(4):
                    ctx.launch("scale", GRID, BLOCK, (arrays[j], arrays[j], 2.0, N))
                    data[j] = data[j] * np.float32(2)
                ctx.launch("vector_add", GRID, BLOCK, (arrays[0], arrays[1], arrays[4], N))
                data[4] = data[0] + data[1]
                ctx.synchronize()
                for a, d in zip(arrays, data):
                    np.testing.assert_array_equal(a.to_host(), d)
        mem = c1.devices[0].stats()["mem"]
        assert mem["evictions"] > 0 and mem["bytes_evicted"] >= 4 * N
        assert mem["vram_size"] == 32 << 20
        for ctx, _data, _arrays in sessions:
            ctx.destroy()
