"""Shared device memory through the API against a real host process (spec §6.6): contexts of
one guest and guests of different sessions (and processes) map the same VRAM; the creator
exports, another guest imports and reads what the creator's kernel wrote; a guest without
the token is refused; removal while attached; a session that ends (bye, or killed and
reclaimed by heartbeat) detaches, and its segments are freed once nobody uses them."""

import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from pvgpu import guest
from pvgpu.spec import wire

N = 1 << 18  # 1 MiB of float32
GRID, BLOCK = N // 256, 256


def vram_free(endpoint):
    with guest.connect(endpoint, memory="inline", mem_size=1 << 20) as c:
        return c.devices[0].info()["vram_free"]


def test_contexts_of_one_guest_share_a_segment(conn):
    dev = conn.devices[0]
    with dev.create_context() as c1, dev.create_context() as c2:
        seg = c1.shm_get("pipeline", 4 * N)
        assert seg.created and seg.nbytes == 4 * N and seg.shm_id > 0
        again = c2.shm_get("pipeline")  # size 0: look up
        assert again is seg and dev.shm_get("pipeline", 4 * N).shm_id == seg.shm_id
        a1 = seg.attach(c1)
        a2 = c2.shm_attach(seg, (N,), np.float32)
        assert isinstance(a1, guest.DeviceArray) and a1.shape == (N,) and a1.ptr >= wire.VA_USER_BASE
        data = np.arange(N, dtype=np.float32)
        a1.copy_from_host(data)
        c2.launch("scale", GRID, BLOCK, (a2, a2, 2.0, N))  # in place, in the other context
        c2.synchronize()
        np.testing.assert_array_equal(a1.to_host(), 2 * data)
        info = seg.info(c2)
        assert info == {"size": 4 * N, "va": a2.ptr, "nattach": 2, "removed": False,
                        "creator": True}
        with pytest.raises(guest.InvalidParameterError):
            seg.attach(c1)  # once per context
        a2.detach()
        assert seg.info()["nattach"] == 1
        with pytest.raises(guest.InvalidSegmentError):
            c2.shm_detach(seg)  # not attached any more
        with pytest.raises(guest.InvalidParameterError):
            c1.shm_get("pipeline", 8 * N)  # size mismatch
        with pytest.raises(guest.InvalidSegmentError):
            c1.shm_get("no such key")
        with pytest.raises(ValueError):
            seg.attach(c2, (N + 1,))  # does not fit
        seg.remove()


def test_another_guest_imports_and_reads_what_the_creators_kernel_wrote(shared_host):
    with guest.connect(shared_host.endpoint, mem_size=16 << 20) as ga, \
            guest.connect(shared_host.endpoint, memory="inline", mem_size=16 << 20) as gb:
        ca, cb = ga.devices[0].create_context(), gb.devices[0].create_context()
        seg = ca.shm_get(7, 4 * N)
        a = seg.attach(ca)
        ca.launch("fill", GRID, BLOCK, (a, 3.0, N))
        ca.launch("scale", GRID, BLOCK, (a, a, 5.0, N))
        ca.synchronize()  # no implicit synchronization between guests
        handle = str(seg.export())  # what would travel to the other guest
        assert str(seg.export()) == handle
        # keys are private: B's key 7 is not A's segment
        with pytest.raises(guest.InvalidSegmentError):
            cb.shm_get(7)
        # without the token B can neither import nor name A's segment
        h = guest.ShmHandle.parse(handle)
        with pytest.raises(guest.PermissionDeniedError):
            cb.shm_import(guest.ShmHandle(h.handle_id, h.token ^ 0x5A5A))
        with pytest.raises(guest.PermissionDeniedError):
            cb.shm_import(guest.ShmHandle(h.handle_id + 1000, h.token))
        forged = guest.SharedSegment(gb.devices[0], seg.shm_id, seg.nbytes)
        with pytest.raises(guest.InvalidSegmentError):
            cb.shm_attach(forged)
        with pytest.raises(ValueError):
            cb.shm_import("shm:nonsense")
        # with it, B maps the same memory
        seg_b = cb.shm_import(handle)
        assert seg_b.imported and not seg_b.created and seg_b.nbytes == seg.nbytes
        b = seg_b.attach(cb)
        np.testing.assert_array_equal(b.to_host(), np.full(N, 15.0, np.float32))
        cb.launch("scale", GRID, BLOCK, (b, b, 2.0, N))  # B writes, A reads
        cb.synchronize()
        np.testing.assert_array_equal(a.to_host(), np.full(N, 30.0, np.float32))
        assert seg_b.info(cb)["nattach"] == 2 and not seg_b.info()["creator"]
        # only the creator removes or exports
        with pytest.raises(guest.PermissionDeniedError):
            seg_b.remove()
        with pytest.raises(guest.PermissionDeniedError):
            seg_b.export()
        # the handle is for device 0 only
        with pytest.raises(guest.PermissionDeniedError):
            gb.devices[1].shm_import(handle)
        b.detach()
        a.detach()
        seg.remove()
        with pytest.raises(guest.InvalidSegmentError):
            seg.info()  # removed and detached by all: gone


def test_removal_while_attached(conn):
    dev = conn.devices[0]
    with dev.create_context() as c1, dev.create_context() as c2:
        seg = dev.shm_get("rm", 4 * N)
        a1 = seg.attach(c1)
        a1.copy_from_host(np.full(N, 9.0, np.float32))
        seg.remove()
        seg.remove()  # no further effect
        assert seg.info(c1)["removed"] and seg.info()["nattach"] == 1
        with pytest.raises(guest.InvalidSegmentError):
            seg.attach(c2)  # no new attachments
        with pytest.raises(guest.InvalidSegmentError):
            seg.export()
        fresh = dev.shm_get("rm", 4 * N)  # the key is free at once
        assert fresh.created and fresh.shm_id != seg.shm_id
        np.testing.assert_array_equal(a1.to_host(), np.full(N, 9.0, np.float32))  # still works
        a1.detach()
        with pytest.raises(guest.InvalidSegmentError):
            seg.info()
        fresh.remove()


def test_a_session_that_ends_detaches_and_frees(shared_host):
    baseline = vram_free(shared_host.endpoint)
    with guest.connect(shared_host.endpoint, mem_size=16 << 20) as gb:
        cb = gb.devices[0].create_context()
        with guest.connect(shared_host.endpoint, memory="inline", mem_size=16 << 20) as ga:
            ca = ga.devices[0].create_context()
            seg = ca.shm_get("frames", 16 * N)
            a = seg.attach(ca)
            a.copy_from_host(np.full(4 * N, 4.0, np.float32))
            seg_b = cb.shm_import(seg.export())
            b = seg_b.attach(cb)
        # A said bye: its segment is removed, but B's attachment keeps it alive
        assert seg_b.info(cb) == {"size": 16 * N, "va": b.ptr, "nattach": 1, "removed": True,
                                  "creator": False}
        np.testing.assert_array_equal(b.to_host(), np.full(4 * N, 4.0, np.float32))
        assert vram_free(shared_host.endpoint) <= baseline - 16 * N
        b.detach()  # the last attachment: freed
        with pytest.raises(guest.InvalidSegmentError):
            seg_b.info()
    assert vram_free(shared_host.endpoint) == baseline


CHILD = textwrap.dedent("""
    import sys, time, numpy as np, pvgpu.guest as guest
    endpoint, handle, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    conn = guest.connect(endpoint, mem_size=16 << 20, heartbeat_ms=200)
    ctx = conn.devices[0].create_context()
    seg = ctx.shm_import(handle)
    arr = seg.attach(ctx)
    n = arr.size
    ctx.launch("scale", n // 256, 256, (arr, arr, 3.0, n))
    ctx.synchronize()
    print("attached", flush=True)
    if mode == "die":
        time.sleep(60)  # killed by the parent: no bye, no detach
    arr.detach()
    conn.close()
""")


def test_another_guest_process_works_in_place_and_a_killed_one_is_detached(shared_host):
    with guest.connect(shared_host.endpoint, mem_size=16 << 20) as conn:
        ctx = conn.devices[0].create_context()
        seg = ctx.shm_get(wire.SHM_KEY_PRIVATE, 4 * N)
        a = seg.attach(ctx)
        a.copy_from_host(np.arange(N, dtype=np.float32))
        handle = str(seg.export())
        child = subprocess.run([sys.executable, "-c", CHILD, shared_host.endpoint, handle, "ok"],
                               capture_output=True, text=True, timeout=60)
        assert child.returncode == 0, child.stdout + child.stderr
        np.testing.assert_array_equal(a.to_host(), 3 * np.arange(N, dtype=np.float32))
        assert seg.info()["nattach"] == 1
        # a guest process that dies while attached is reclaimed by heartbeat: detached
        proc = subprocess.Popen([sys.executable, "-c", CHILD, shared_host.endpoint, handle, "die"],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "attached"
            assert seg.info()["nattach"] == 2
            proc.kill()
            proc.wait(10)
            deadline = time.monotonic() + 15
            while seg.info()["nattach"] != 1:
                assert time.monotonic() < deadline, "the dead guest was never detached"
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        np.testing.assert_array_equal(a.to_host(), 9 * np.arange(N, dtype=np.float32))
        seg.remove()
        a.detach()


def test_dataflow_bench_smoke(shared_host):
    """`pvgpu bench dataflow` (bench/dataflow.py) runs all three parts and verifies them."""
    import json
    import os
    import tempfile
    out = tempfile.mktemp(suffix=".json")
    try:
        r = subprocess.run([sys.executable, "-m", "pvgpu.bench.dataflow", "--size-mib", "2", "--reps", "1",
                            "--endpoint", shared_host.endpoint, "--json", out],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        res = json.load(open(out))
        for part in ("chain", "tree", "processes"):
            assert res[part]["verified"] and res[part]["shm_s"] > 0 and res[part]["copy_s"] > 0
        assert res["tree"]["edges"] == 6 and res["chain"]["edges"] == 3
        for part in ("chain", "tree", "processes"):  # progress while each part runs
            assert f"  {part}: repetition 1 of 1 ...\n" in r.stdout, r.stdout
    finally:
        if os.path.exists(out):
            os.unlink(out)
