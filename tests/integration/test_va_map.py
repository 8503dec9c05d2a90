"""Explicit VA management through the API against a real host process (spec §6.7): a
buffer mapped read-only at a reserved VA is read by kernels through it; a `fill` and a
COPY_D2D writing through it raise PageFaultError naming that address and access "write";
a kernel writing past the end of its buffer faults too; another context keeps working."""

import numpy as np
import pytest

from pvgpu import guest
from pvgpu.spec import wire

P = wire.PAGE_SIZE
N = 4 * P // 4  # float32 elements of a 4-page buffer


def test_read_only_mapping_reads_and_faults_on_write(conn):
    dev = conn.devices[0]
    with dev.create_context() as ctx, dev.create_context() as other:
        data = np.arange(N, dtype=np.float32)
        a = ctx.to_device(data)
        r = ctx.reserve_va(8 * P, alignment=1 << 16)
        assert isinstance(r, guest.VaRange) and r.va % (1 << 16) == 0 and r.size == 8 * P
        ro = ctx.map(a, r.va + 2 * P, access="r")
        assert isinstance(ro, guest.MappedArray) and ro.readonly and ro.ptr in r
        assert ro.shape == (N,) and ro.dtype == np.float32
        # reading through the second VA works: a kernel and a copy
        out = ctx.empty(N, np.float32)
        ctx.launch("scale", N // 256, 256, (out, ro, 2.0, N))
        assert np.array_equal(out.to_host(), 2 * data)
        assert np.array_equal(ro.to_host(), data)
        # a fill writing through it faults: the address and the access are reported
        ctx.launch("fill", N // 256, 256, (ro, 1.0, N))
        with pytest.raises(guest.PageFaultError) as e:
            ctx.synchronize()
        assert e.value.address == ro.ptr and e.value.access == "write"
        # so does a COPY_D2D into it, and an H2D copy
        ctx.copy_d2d(ro.ptr + 64, out.ptr, 256)
        with pytest.raises(guest.PageFaultError) as e:
            ctx.synchronize()
        assert e.value.address == ro.ptr + 64 and e.value.access == "write"
        with pytest.raises(guest.PageFaultError):
            ro.copy_from_host(np.zeros(N, np.float32))
        assert np.array_equal(a.to_host(), data)  # nothing was written
        # another context of the same device carries on
        b = other.to_device(np.ones(N, np.float32))
        other.launch("scale", N // 256, 256, (b, b, 3.0, N))
        assert np.all(b.to_host() == 3.0)
        # a read/write mapping of part of the buffer writes the buffer itself
        rw = ctx.map(a, r.va, access="rw", offset=P, nbytes=P)
        assert rw.shape == (P // 4,)
        ctx.launch("fill", 4, 256, (rw, 7.0, P // 4))
        ctx.synchronize()
        got = a.to_host()
        assert np.all(got[P // 4:P // 2] == 7.0) and np.array_equal(got[:P // 4], data[:P // 4])
        # errors
        with pytest.raises(guest.InvalidAddressError):  # overlaps the read-only mapping
            ctx.map(a, r.va + 2 * P, access="rw", nbytes=P)
        with pytest.raises(guest.InvalidAddressError):  # outside the reservation
            ctx.map(a, r.va + 7 * P, access="rw", nbytes=2 * P)
        with pytest.raises(guest.InvalidParameterError):  # misaligned
            ctx.map(a, r.va + 100, access="rw", nbytes=P)
        with pytest.raises(guest.InvalidResourceError):
            ctx.map(99_999, r.va + 6 * P, nbytes=P)
        with pytest.raises(ValueError):
            ctx.map(a, r.va + 6 * P, access="w")
        with pytest.raises(guest.InvalidParameterError):  # still mapped elsewhere
            a.free()
        assert not a.freed
        with pytest.raises(guest.InvalidParameterError):  # the reservation has mappings
            ctx.release_va(r)
        ctx.unmap(ro)
        rw.unmap()
        with pytest.raises(guest.InvalidAddressError):
            ctx.unmap(r.va)
        # unmapped: the VA faults (read) once the unmap took effect
        with pytest.raises(guest.PageFaultError) as e:
            ctx.copy_d2h(r.va + 2 * P, np.empty(4, np.float32))
        assert e.value.address == r.va + 2 * P and e.value.access == "read"
        r.release()
        with pytest.raises(guest.InvalidAddressError):
            ctx.release_va(r.va)
        a.free()


def test_kernel_writing_past_its_buffer_faults(conn):
    dev = conn.devices[0]
    with dev.create_context() as ctx, dev.create_context() as other:
        small = ctx.empty(P // 4, np.float32)  # one page
        ctx.launch("fill", 8, 256, (small, 1.0, 2 * P // 4))  # two pages' worth
        with pytest.raises(guest.PageFaultError) as e:
            ctx.synchronize()
        assert e.value.address == small.ptr + P and e.value.access == "write"
        assert np.all(small.to_host() == 0)  # KRN-FAULT-1: output untouched
        faults = dev.stats()["faults"]  # the context is marked faulted in GET_STATS
        assert faults[ctx.ctx_id]["count"] == 1 and other.ctx_id not in faults
        assert faults[ctx.ctx_id]["last"]["address"] == small.ptr + P
        assert faults[ctx.ctx_id]["last"]["access"] == "write"
        x = other.to_device(np.arange(256, dtype=np.float32))
        other.launch("scale", 1, 256, (x, x, 2.0, 256))
        assert np.array_equal(x.to_host(), 2 * np.arange(256, dtype=np.float32))
        # the faulting context is still usable
        ctx.launch("fill", 1, 256, (small, 5.0, 256))
        assert np.all(small.to_host()[:256] == 5.0)
