"""bench/sm.py: its kernels are valid code objects that compute what they claim (small
sizes; the benchmark itself times large ones)."""

import struct

import numpy as np

from pvgpu.bench import sm


def test_vector_add_and_the_alu_chains_compute_their_results():
    m = sm.Machine(64 << 20)
    n = 1000
    a = np.arange(n, dtype=np.float32)
    b = np.full(n, 0.5, np.float32)
    va, vb, vc = m.alloc(a), m.alloc(b), m.alloc(np.zeros(n, np.float32))
    obj = m.alloc(sm.vector_add(), sm.EXEC)
    lanes = m.run(m.launch(obj, struct.pack("<QQQI", va, vb, vc, n), 4, 256))
    assert np.array_equal(m.view(vc, n, np.float32), a + b) and lanes > 12 * n
    x = np.linspace(0, 1, 512, dtype=np.float32)
    ref = x.astype(np.float64)
    for _ in range(16):
        ref = np.float32(ref * np.float32(0.7) + 0.25) * np.float32(0.99)
    trips = 1 + np.arange(512) % 32
    ref_div = x.astype(np.float64)
    for k in range(32):
        step = np.float32(ref_div * np.float32(0.7) + 0.25)
        for _ in range(15):
            step = np.float32(np.float32(step * np.float32(0.99)) * np.float32(0.7) + 0.25)
        ref_div = np.where(k < trips, np.float32(step * np.float32(0.99)), ref_div)
    for divergent, want in ((False, ref), (True, ref_div)):
        src, dst = m.alloc(x), m.alloc(np.zeros(512, np.float32))
        obj = m.alloc(sm.alu_chain(divergent), sm.EXEC)
        m.run(m.launch(obj, struct.pack("<QQ", src, dst), 2, 256))
        np.testing.assert_allclose(m.view(dst, 512, np.float32), want, rtol=1e-5)
