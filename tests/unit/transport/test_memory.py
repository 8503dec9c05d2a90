"""Guest memory models: ranges, scalars, dirty tracking, patches, POSIX shared memory."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pvgpu.transport.errors import GuestMemoryError
from pvgpu.transport import memory as memory_mod
from pvgpu.transport.memory import GuestMemory, InlineGuestMemory, SharedGuestMemory

SIZE = 4096


# ---------------------------------------------------------------- GuestMemory
def test_bytearray_backing_is_shared_not_copied():
    backing = bytearray(SIZE)
    mem = GuestMemory(backing)
    mem.write(10, b"abc")
    assert backing[10:13] == b"abc"
    backing[100] = 7
    assert mem.read(100, 1) == b"\x07"
    assert mem.size == SIZE and mem.buf.dtype == np.uint8 and mem.buf.ndim == 1


def test_numpy_backing_is_used_as_is():
    arr = np.zeros(SIZE, dtype=np.uint8)
    mem = GuestMemory(arr)
    assert mem.buf is arr
    mem.write_u32(8, 0xDEADBEEF)
    assert arr[8:12].tobytes() == b"\xef\xbe\xad\xde"


def test_size_backing_is_zeroed():
    mem = GuestMemory(SIZE)
    assert mem.size == SIZE and not mem.buf.any()


@pytest.mark.parametrize("bad", [
    np.zeros(4, dtype=np.uint16), np.zeros((2, 2), dtype=np.uint8), bytes(4), True, -1,
])
def test_bad_backing_rejected(bad):
    with pytest.raises((ValueError, TypeError)):
        GuestMemory(bad)


@pytest.mark.parametrize("gpa,n,ok", [
    (0, 0, True), (0, SIZE, True), (SIZE, 0, True), (SIZE - 1, 1, True),
    (SIZE, 1, False), (SIZE - 1, 2, False), (-1, 1, False), (0, -1, False),
    (0, SIZE + 1, False), (2**64 - 1, 2, False), (1, 2**64 - 1, False), (2**70, 0, False),
])
def test_check_range(gpa, n, ok):
    mem = GuestMemory(SIZE)
    assert mem.check_range(gpa, n) is ok


def test_out_of_range_access_raises():
    mem = GuestMemory(SIZE)
    for call in (lambda: mem.read(SIZE - 1, 2), lambda: mem.write(SIZE - 2, b"abc"),
                 lambda: mem.view(-1, 4), lambda: mem.view(0, SIZE + 1),
                 lambda: mem.read_u16(SIZE - 1), lambda: mem.read_u32(SIZE - 3),
                 lambda: mem.read_u64(SIZE - 7), lambda: mem.write_u16(-2, 0),
                 lambda: mem.write_u32(SIZE, 0), lambda: mem.write_u64(SIZE - 4, 0),
                 lambda: mem.read_u16(-1)):
        with pytest.raises(GuestMemoryError):
            call()


def test_scalars_are_little_endian_and_round_trip():
    mem = GuestMemory(SIZE)
    mem.write_u16(SIZE - 2, 0xBEEF)
    mem.write_u32(0, 0x01020304)
    mem.write_u64(16, 0x1122334455667788)
    assert mem.read(SIZE - 2, 2) == b"\xef\xbe"
    assert mem.read(0, 4) == b"\x04\x03\x02\x01"
    assert mem.read_u16(SIZE - 2) == 0xBEEF
    assert mem.read_u32(0) == 0x01020304
    assert mem.read_u64(16) == 0x1122334455667788
    assert mem.read_u32(16) == 0x55667788


def test_view_is_writable_zero_copy():
    mem = GuestMemory(SIZE)
    v = mem.view(100, 8)
    v[:] = np.arange(8, dtype=np.uint8)
    assert mem.read(100, 8) == bytes(range(8))
    mem.write(100, b"\xff")
    assert v[0] == 0xFF


def test_write_accepts_numpy_of_any_dtype_and_memoryview():
    mem = GuestMemory(SIZE)
    f = np.array([1.5, -2.0], dtype=np.float32)
    assert mem.write(0, f) == 8
    assert np.frombuffer(mem.read(0, 8), dtype=np.float32).tolist() == [1.5, -2.0]
    strided = np.arange(10, dtype=np.uint8)[::2]
    mem.write(32, strided)
    assert mem.read(32, 5) == bytes([0, 2, 4, 6, 8])
    mem.write(64, memoryview(b"xyz"))
    assert mem.read(64, 3) == b"xyz"


def test_plain_memory_tracks_nothing():
    mem = GuestMemory(SIZE)
    mem.write(0, b"abc")
    mem.mark_dirty(0, 3)
    assert mem.take_dirty() == []


# ---------------------------------------------------------------- InlineGuestMemory
def test_inline_writes_mark_dirty_views_do_not():
    mem = InlineGuestMemory(SIZE)
    mem.write(100, b"abcd")
    mem.write_u16(10, 1)
    mem.write_u32(20, 1)
    mem.write_u64(40, 1)
    mem.view(1000, 16)[:] = 1
    mem.write(500, b"")  # empty writes leave no range
    assert mem.take_dirty() == [(10, 2), (20, 4), (40, 8), (100, 4)]
    assert mem.take_dirty() == []
    mem.view(1000, 16)[:] = 2
    mem.mark_dirty(1000, 16)
    mem.mark_dirty(0, 0)
    assert mem.take_dirty() == [(1000, 16)]


def test_inline_mark_dirty_checks_range():
    mem = InlineGuestMemory(SIZE)
    with pytest.raises(GuestMemoryError):
        mem.mark_dirty(SIZE - 1, 2)


def test_take_dirty_merges_adjacent_overlapping_contained():
    mem = InlineGuestMemory(SIZE)
    for gpa, n in [(50, 10), (0, 10), (10, 5), (52, 3), (58, 10), (200, 1), (100, 1), (101, 1)]:
        mem.mark_dirty(gpa, n)
    assert mem.take_dirty() == [(0, 15), (50, 18), (100, 2), (200, 1)]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 255), st.integers(0, 16)), max_size=40))
def test_take_dirty_covers_exactly_the_written_bytes(ranges):
    # [MEM-INLINE-2] every byte the driver changed is in the ranges it sends
    mem = InlineGuestMemory(512)
    expected = np.zeros(512, dtype=bool)
    for gpa, n in ranges:
        mem.mark_dirty(gpa, n)
        expected[gpa:gpa + n] = True
    merged = mem.take_dirty()
    got = np.zeros(512, dtype=bool)
    for gpa, n in merged:
        assert n > 0
        got[gpa:gpa + n] = True
    assert np.array_equal(got, expected)
    # sorted, disjoint and not adjacent (adjacent ones are merged)
    for (a, an), (b, _) in zip(merged, merged[1:]):
        assert a + an < b
    assert mem.take_dirty() == []


def test_apply_patches_writes_without_marking_dirty():
    mem = InlineGuestMemory(SIZE)
    frames = [b"hello", memoryview(b"XY"), np.arange(3, dtype=np.uint8)]
    mem.apply_patches([[0, 0], [100, 1], [SIZE - 3, 2], (200, 0)], frames)
    assert mem.read(0, 5) == b"hello"
    assert mem.read(100, 2) == b"XY"
    assert mem.read(SIZE - 3, 3) == bytes([0, 1, 2])
    assert mem.read(200, 5) == b"hello"
    assert mem.take_dirty() == []


@pytest.mark.parametrize("patches,match", [
    ([[0, 2]], "frame index 2 out of range"),
    ([[0, -1]], "frame index -1"),
    ([[True, 0]], "integers"),
    ([[0, False]], "integers"),
    ([[0.0, 0]], "integers"),
    ([["0", 0]], "integers"),
    ([[SIZE - 4, 0]], "outside guest memory"),
    ([[-1, 0]], "outside guest memory"),
    ([[2**64 - 2, 0]], "outside guest memory"),
    ([[0]], "expected"),
    ([[0, 0, 0]], "expected"),
    ([5], "expected"),
    ({"gpa": 0}, "list"),
])
def test_apply_patches_rejects_bad_patch_and_writes_nothing(patches, match):
    mem = InlineGuestMemory(SIZE)
    frames = [b"12345", b"ab"]
    # A valid patch comes first: all-or-nothing means it must not be applied either.
    if isinstance(patches, list):
        patches = [[64, 1]] + patches
    with pytest.raises(GuestMemoryError, match=match):
        mem.apply_patches(patches, frames)
    assert not mem.buf.any()


def test_apply_patches_rejects_non_buffer_frame():
    mem = InlineGuestMemory(SIZE)
    with pytest.raises(GuestMemoryError, match="not a byte buffer"):
        mem.apply_patches([[0, 0]], [12345])


def test_inline_pair_converges_through_patches():
    # [MEM-INLINE-2] [MEM-INLINE-3] patches both ways leave driver memory and mirror equal
    guest, host = InlineGuestMemory(SIZE), InlineGuestMemory(SIZE)
    guest.write(0, b"request")
    guest.write_u16(1000, 9)
    ranges = guest.take_dirty()
    host.apply_patches([[g, i] for i, (g, _) in enumerate(ranges)],
                       [guest.read(g, n) for g, n in ranges])
    host.write(2000, b"response")
    ranges = host.take_dirty()
    guest.apply_patches([[g, i] for i, (g, _) in enumerate(ranges)],
                        [host.read(g, n) for g, n in ranges])
    assert np.array_equal(guest.buf, host.buf)
    assert guest.take_dirty() == [] and host.take_dirty() == []


# ---------------------------------------------------------------- SharedGuestMemory
def _shm_exists(name):
    return os.path.exists(os.path.join("/dev/shm", name))


@pytest.fixture
def guest_shm():
    mem = SharedGuestMemory.create(1 << 16, sealed=False)
    yield mem
    mem.close()


def test_shared_create_attach_visible_both_ways(guest_shm):
    # [MEM-SHARED-2] both sides read and write the same memory in place
    name = guest_shm.name
    assert name.startswith(f"pvgpu-{os.getpid()}-")
    assert _shm_exists(name)
    assert guest_shm.size == 1 << 16 and not guest_shm.buf.any()
    guest_shm.write(100, b"from guest")
    host = SharedGuestMemory.attach(name, 1 << 16, require_sealed=False)
    try:
        assert not _shm_exists(name)  # the host unlinked the name at once
        assert host.read(100, 10) == b"from guest"
        host.write_u64(4096, 0xABCDEF)
        assert guest_shm.read_u64(4096) == 0xABCDEF
        host.view(8000, 4)[:] = 9
        assert guest_shm.read(8000, 4) == b"\x09" * 4
        assert host.take_dirty() == []
    finally:
        host.close()
    # the guest mapping outlives the host's
    assert guest_shm.read(100, 10) == b"from guest"


def test_shared_second_attach_fails_after_unlink(guest_shm):
    SharedGuestMemory.attach(guest_shm.name, 1 << 16, require_sealed=False).close()
    with pytest.raises(GuestMemoryError, match="cannot open"):
        SharedGuestMemory.attach(guest_shm.name, 1 << 16, require_sealed=False)


def test_shared_attach_with_slash_prefix_and_smaller_size(guest_shm):
    host = SharedGuestMemory.attach("/" + guest_shm.name, 4096, require_sealed=False)
    assert host.size == 4096
    host.close()


def test_shared_attach_larger_than_segment_fails(guest_shm):
    with pytest.raises(GuestMemoryError, match="fewer than"):
        SharedGuestMemory.attach(guest_shm.name, (1 << 16) + 1, require_sealed=False)


@pytest.mark.parametrize("name", ["../etc/passwd", "pvgpu-a/b", "other-1-ab", "", "pvgpu-", 7])
def test_shared_attach_rejects_bad_names(name):
    with pytest.raises(GuestMemoryError, match="invalid shared-memory name"):
        SharedGuestMemory.attach(name, 4096, require_sealed=False)


@pytest.mark.parametrize("size", [0, -1, True, 1.5])
def test_shared_create_rejects_bad_size(size):
    with pytest.raises(GuestMemoryError):
        SharedGuestMemory.create(size)


def test_shared_guest_close_unlinks_unattached_segment():
    mem = SharedGuestMemory.create(4096, sealed=False)
    name = mem.name
    assert _shm_exists(name)
    mem.close()
    assert not _shm_exists(name) and mem.closed
    mem.close()  # idempotent
    with pytest.raises(GuestMemoryError):
        SharedGuestMemory.attach(name, 4096, require_sealed=False)


def test_shared_guest_close_after_host_unlinked_is_quiet(guest_shm):
    host = SharedGuestMemory.attach(guest_shm.name, 1 << 16, require_sealed=False)
    guest_shm.close()  # the name is already gone: no error
    host.close()


def test_shared_close_with_live_views_is_graceful():
    mem = SharedGuestMemory.create(4096, sealed=False)
    v = mem.view(0, 16)
    whole = mem.buf
    v[:] = 3
    mem.close()  # views still alive: unmapping is deferred, nothing raised
    assert mem.closed and mem.size == 0
    assert v[0] == 3 and whole[1] == 3  # the views still see the mapping
    with pytest.raises(GuestMemoryError):
        mem.read(0, 1)
    del v, whole  # now the mapping goes away with the last view


def test_shared_context_manager():
    with SharedGuestMemory.create(4096) as mem:
        name = mem.name
        mem.write(0, b"x")
    assert mem.closed and not _shm_exists(name)


# ------------------------------------------------- sealed memfd (the default on Linux)
def test_linux_has_sealable_memfd():
    assert memory_mod.HAVE_MEMFD  # pvgpu's shared model relies on it on Linux hosts


def test_sealed_memfd_is_the_default_and_shared_both_ways():
    guest = SharedGuestMemory.create(1 << 16)
    try:
        assert guest.name == f"/proc/{os.getpid()}/fd/{guest._fd}"
        host = SharedGuestMemory.attach(guest.name, 1 << 16)
        guest.write(100, b"from guest")
        host.write_u64(4096, 0xABCDEF)
        assert host.read(100, 10) == b"from guest" and guest.read_u64(4096) == 0xABCDEF
        host.close()
    finally:
        guest.close()
    assert guest._fd is None


def test_a_guest_cannot_shrink_or_grow_memory_the_host_mapped():
    # [CTL-MEMTABLE-4] the driver's memfd is sealed (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
    # [MEM-SHARED-4] the driver cannot shrink the object: it is sealed
    guest = SharedGuestMemory.create(1 << 16)
    host = SharedGuestMemory.attach(guest.name, 1 << 16)
    try:
        for size in (0, 4096, 1 << 20):
            with pytest.raises(PermissionError):
                os.ftruncate(guest._fd, size)
        host.buf[-1] = 7  # the last page is still there: no SIGBUS
        assert guest.buf[-1] == 7
    finally:
        host.close()
        guest.close()


def test_host_refuses_unsealed_memory():
    fd = os.memfd_create("pvgpu-unsealed", os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, 1 << 16)
        with pytest.raises(GuestMemoryError, match="F_SEAL_SHRINK"):
            SharedGuestMemory.attach(f"/proc/{os.getpid()}/fd/{fd}", 1 << 16)
    finally:
        os.close(fd)
    posix = SharedGuestMemory.create(4096, sealed=False)
    try:
        with pytest.raises(GuestMemoryError, match="not a sealed memfd"):
            SharedGuestMemory.attach(posix.name, 4096)
    finally:
        posix.close()
    with open(__file__, "rb") as f:  # a path of the right shape that is not a memfd
        with pytest.raises(GuestMemoryError, match="not a sealable memfd"):
            SharedGuestMemory.attach(f"/proc/{os.getpid()}/fd/{f.fileno()}", 16)
    with pytest.raises(GuestMemoryError, match="cannot open"):
        SharedGuestMemory.attach(f"/proc/{os.getpid()}/fd/99999", 4096)


def test_sealed_attach_checks_size():
    guest = SharedGuestMemory.create(1 << 16)
    try:
        with pytest.raises(GuestMemoryError, match="fewer than"):
            SharedGuestMemory.attach(guest.name, (1 << 16) + 4096)
    finally:
        guest.close()


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_attach_looks_before_it_opens_for_io(kind, tmp_path):
    """A /proc/<pid>/fd/<n> path may name any descriptor of any process: opening a FIFO or
    a device read/write has effects (or blocks), so attach refuses what is not a regular
    memory file without opening it for I/O (spec CTL-MEMTABLE-3)."""
    fds = []
    if kind == "fifo":
        fds = list(os.pipe())
    elif kind == "device":
        fds = [os.open("/dev/null", os.O_RDONLY)]
    else:
        fds = [os.open(tmp_path, os.O_RDONLY)]
    try:
        with pytest.raises(GuestMemoryError, match="not a memory file"):
            SharedGuestMemory.attach(f"/proc/{os.getpid()}/fd/{fds[0]}", 4096)
    finally:
        for fd in fds:
            os.close(fd)
