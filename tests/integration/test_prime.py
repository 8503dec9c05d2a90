"""Buffers shared between devices and guests (spec §12) with real host and guest processes:
imports across guest processes with and without the token, both PCIe layouts giving
identical results, implicit synchronisation across the two devices, and a guest that
disappears without breaking the other."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from pvgpu.conformance.burns import with_longer_burns

from pvgpu import guest
from pvgpu.procs import reap

PEER = os.path.join(os.path.dirname(__file__), "prime_peer.py")
N = 1 << 18  # floats: 1 MiB


def peer(endpoint, handle, *extra):
    return subprocess.Popen([sys.executable, PEER, endpoint, str(handle), str(N), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def contexts(dev):
    """Contexts on a device, of every session (the host runs only this test's guests)."""
    return dev.stats()["vgpus"]["default"]["contexts"]


@pytest.mark.parametrize("topology", ["switch", "sockets"])
def test_another_guest_imports_with_the_token_only(host_factory, tmp_endpoint, topology):
    host_factory([tmp_endpoint], extra_args=["--topology", topology])
    data = np.arange(N, dtype=np.float32)
    with guest.connect(tmp_endpoint, mem_size=64 << 20) as conn:
        d0, d1 = conn.devices
        assert d0.can_access_peer(d1) == (topology == "switch")
        ctx = d0.create_context("producer")
        src = ctx.to_device(np.zeros(N, np.float32))
        ctx.launch("scale", N // 256, 256, (src, ctx.to_device(data), 1.0, N))  # produced on GPU 0
        handle = src.export()
        forged = guest.BufferHandle(handle.device, handle.handle_id, handle.token ^ 0x5A5A, handle.size)
        code, out = reap(peer(tmp_endpoint, forged), 60)
        assert code == 0 and "refused" in json.loads(out.splitlines()[-1]), out
        code, out = reap(peer(tmp_endpoint, handle), 60)
        assert code == 0, out
        got = json.loads(out.splitlines()[-1])
        assert got["placement"] == ("peer" if topology == "switch" else "system")
        # identical results on both layouts: 2 * data, summed in float64
        assert got["sum"] == float((2 * data).sum(dtype=np.float64))
        assert (got["first"], got["last"]) == (0.0, 2.0 * (N - 1))
        # the importer's write landed in the exporter's buffer
        np.testing.assert_array_equal(src.to_host(), 3 * data)
        d0.revoke(handle)
        code, out = reap(peer(tmp_endpoint, handle), 60)
        assert code == 0 and "refused" in json.loads(out.splitlines()[-1]), out


def test_a_killed_importer_and_a_departed_exporter_break_nothing(host_factory, tmp_endpoint):
    host_factory([tmp_endpoint], heartbeat_ms=200)
    data = np.arange(N, dtype=np.float32)
    with guest.connect(tmp_endpoint, mem_size=64 << 20, heartbeat_ms=200) as a:
        ctx = a.devices[0].create_context()
        src = ctx.to_device(data)
        p = peer(tmp_endpoint, src.export(), "hold")
        assert p.stdout.readline().strip() == "ready"
        assert contexts(a.devices[1]) == 1  # the importer's, holding the import
        p.kill()  # the importer disappears while holding the import
        reap(p, 10)
        # the host reclaims the silent session (3 missed heartbeats), its import with it
        deadline = time.monotonic() + 30
        while contexts(a.devices[1]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert contexts(a.devices[1]) == 0
        ctx.launch("scale", N // 256, 256, (src, src, 2.0, N))
        np.testing.assert_array_equal(src.to_host(), 2 * data)
        handle = src.export()
        with guest.connect(tmp_endpoint, mem_size=64 << 20) as b:
            bctx = b.devices[1].create_context()
            imp = bctx.import_array(handle, (N,), np.float32)
            a.close()  # the exporter goes away: the import keeps the memory
            np.testing.assert_array_equal(imp.to_host(), 2 * data)
            bctx.launch("scale", N // 256, 256, (imp, imp, 0.5, N))
            np.testing.assert_array_equal(imp.to_host(), data)
            imp.free()
            bctx.synchronize()


@pytest.mark.parametrize("memory", ["shared", "inline"])
def test_a_reader_on_one_device_waits_for_the_slow_writer_on_the_other(shared_host, memory):
    with guest.connect(shared_host.endpoint, memory=memory, mem_size=32 << 20) as conn:
        d0, d1 = conn.devices
        w, r = d0.create_context("writer"), d1.create_context("reader")
        r.enable_peer_access(d0)
        x = w.to_device(np.zeros(N, np.float32))
        imp = r.import_array(x.export(), (N,), np.float32)
        assert imp.placement == "peer"
        out = r.to_device(np.ones(N, np.float32))
        values = iter(range(7, 13))
        # PRIME-SYNC-1 orders jobs in the order the device accepted them: each side's
        # work is accepted once a later command of its device queue has been answered
        # (record_event), before the other side's is sent; the check is meaningful when
        # the first side's work was still running when the second side's was accepted

        def read_after_write(burn_us):
            value = float(next(values))
            w.launch("burn", 1, 1, (burn_us,))  # then the write, on the same stream
            w.launch("fill", N // 256, 256, (x, value, N))
            written = w.default_stream.record_event()
            r.copy_d2d(out.ptr, imp.ptr, 4 * N)  # answered "accepted"; no explicit wait
            running = written.query() is False
            np.testing.assert_array_equal(out.to_host(), np.full(N, value, np.float32))
            return running
        with_longer_burns(read_after_write)

        def write_after_read_and_write(burn_us):  # the other way round
            value = float(next(values))
            r.launch("burn", 1, 1, (burn_us,))
            r.launch("scale", N // 256, 256, (imp, imp, 2.0, N))
            scaled = r.default_stream.record_event()
            w.launch("fill", N // 256, 256, (x, value, N))
            w.default_stream.record_event()
            running = scaled.query() is False
            # the fill after the scale (the other order would leave 2 * value)
            np.testing.assert_array_equal(x.to_host(), np.full(N, value, np.float32))
            return running
        with_longer_burns(write_after_read_and_write)


def test_memcpy_peer_with_and_without_peer_access(shared_host):
    with guest.connect(shared_host.endpoint, mem_size=64 << 20) as conn:
        d0, d1 = conn.devices
        a, b = d0.create_context(), d1.create_context()
        data = np.random.default_rng(1).random(3 * N + 17).astype(np.float32)
        src, dst = a.to_device(data), b.empty(data.size)
        assert b.memcpy_peer(dst, src, stage_chunk=1 << 20) == "staged"
        np.testing.assert_array_equal(dst.to_host(), data)
        b.enable_peer_access(d0)
        dst2 = b.empty(data.size)
        assert b.memcpy_peer(dst2, src) == "peer"
        np.testing.assert_array_equal(dst2.to_host(), data)
        same = a.empty(data.size)
        session, kinds = conn.session, []
        real_wait = session.wait_for

        def wait_for(cond, timeout=None, kind=None):
            kinds.append(kind)
            return real_wait(cond, timeout, kind)
        session.wait_for = wait_for
        try:
            assert a.memcpy_peer(same, src) == "d2d"
        finally:
            del session.wait_for
        np.testing.assert_array_equal(same.to_host(), data)
        # a device copy's wait expects what earlier ones of its size class took (whether
        # it is counted depends on whether the copy was done at the wait's first look)
        assert ("d2d", data.nbytes.bit_length()) in kinds
        with pytest.raises(ValueError):
            b.memcpy_peer(dst, b.empty(10), 4096)  # more than the source holds
