"""pvgpu.cuda's unified addressing bookkeeping without a host: the interval map of live
allocations, host buffers given as pointers, how an address is resolved, the address a
kernel gets for it, and the slots of the device address space."""

import ctypes

import numpy as np
import pytest

from pvgpu.cuda import _memory, _state, handles
from pvgpu.cuda._errors import CudaError
from pvgpu.cuda._memory import DEVICE, MANAGED, PINNED, IntervalMap, Memory, Span
from pvgpu.spec import wire


def test_interval_map_finds_by_any_address_inside_and_refuses_overlaps():
    m = IntervalMap()
    a, b = Span(DEVICE, 0x1000, 0x100), Span(DEVICE, 0x3000, 0x1000)
    m.add(0x1000, a)
    m.add(0x3000, b)
    assert m.find(0x1000) == (a, 0) and m.find(0x10FF) == (a, 0xFF)
    assert m.find(0x1100) == (None, 0) and m.find(0xFFF) == (None, 0)
    assert m.find(0x3FFF) == (b, 0xFFF)
    for start, size in ((0x10F0, 0x20), (0x0F00, 0x200), (0x2F00, 0x101), (0x3800, 1)):
        with pytest.raises(CudaError):
            m.add(start, Span(DEVICE, start, size))
    m.add(0x1100, Span(DEVICE, 0x1100, 0x1F00))  # touching both neighbours is fine
    m.remove(0x1000)
    assert m.find(0x1000) == (None, 0) and len(m) == 2


def test_host_buffers():
    arr = np.arange(10, dtype=np.int32)
    addr, n, view = _memory.host_buffer(arr, writable=True)
    assert addr == arr.ctypes.data and n == 40 and view.dtype == np.uint8 and view.size == 40
    ct = (ctypes.c_float * 4)()
    addr, n, view = _memory.host_buffer(ct, writable=True)
    assert addr == ctypes.addressof(ct) and n == 16
    view[:] = 0xFF  # a view of the ctypes memory itself
    assert np.isnan(ct[0])
    ba = bytearray(8)
    assert _memory.host_buffer(ba, True)[1] == 8
    assert _memory.host_buffer(b"abcd", False)[1] == 4
    with pytest.raises(CudaError):
        _memory.host_buffer(b"abcd", True)  # read-only
    with pytest.raises(CudaError):
        _memory.host_buffer(arr[::2], False)  # not contiguous
    ro = np.zeros(4)
    ro.flags.writeable = False
    with pytest.raises(CudaError):
        _memory.host_buffer(ro, True)
    assert _memory.host_buffer(0x1234, False) == (0x1234, None, None)
    assert _memory.host_buffer(ctypes.c_void_p(0x99), False) == (0x99, None, None)
    assert _memory.host_buffer(handles.CUdeviceptr(5), False) == (5, None, None)
    with pytest.raises(TypeError):
        _memory.host_buffer("text", False)


class FakeDevice:
    def __init__(self, index):
        self.index = index


class FakeCtx:
    def __init__(self, index, peers=()):
        self.device, self.peers, self.destroyed, self.id = FakeDevice(index), set(peers), False, index


class FakeFacade:
    mappable = True

    def __init__(self, current=None):
        self._current = current
        self.objects = {}

    def current(self, required=True):
        return self._current


def _memory_with_spans():
    c0, c1 = FakeCtx(0), FakeCtx(1)
    f = FakeFacade(c0)
    mem = Memory(f)
    d0 = Span(DEVICE, 0x1_0000_0000, 0x1000, c0)
    d1 = Span(DEVICE, 0x3_0000_0000, 0x1000, c1)
    pinned = Span(PINNED, 0x7FAA_0000_0000, 0x2000, gpa=0x10000)
    managed = Span(MANAGED, 0x7FAA_0001_0000, 0x100, gpa=0x40000)
    for s in (d0, d1):
        mem.device.add(s.base, s)
    for s in (pinned, managed):
        mem.host.add(s.base, s)
        mem.window.add(s.window_va, s)
    return f, mem, (c0, c1), (d0, d1, pinned, managed)


def test_addresses_resolve_to_device_pinned_or_pageable_memory():
    f, mem, (c0, c1), (d0, d1, pinned, managed) = _memory_with_spans()
    w = mem.where(0x3_0000_0010)
    assert w.on_device and w.span is d1 and w.offset == 0x10 and w.ctx is c1
    w = mem.where(0x7FAA_0000_0100)
    assert not w.on_device and w.span is pinned and w.offset == 0x100
    w = mem.where(wire.GUEST_WINDOW_VA + 0x10000 + 8)  # a pinned block's device address
    assert not w.on_device and w.span is pinned and w.address == pinned.base + 8
    w = mem.where(0x5555_0000)  # in nothing: pageable host memory
    assert not w.on_device and w.span is None and w.address == 0x5555_0000
    w = mem.where(0x5555_0000, device=True)  # named a device pointer: a VA of the current context
    assert w.on_device and w.ctx is c0 and w.span is None
    with pytest.raises(CudaError):
        mem.where(0x1_0000_0000, device=False)  # a device address given as host memory
    arr = np.zeros(4)
    w = mem.where(arr)  # a buffer is host memory
    assert not w.on_device and w.view is not None and w.limit == 32
    f.mappable = False
    with pytest.raises(CudaError):
        mem.where(pinned.base, device=True)  # the inline model cannot reach host memory


def test_the_address_a_kernel_gets():
    f, mem, (c0, c1), (d0, d1, pinned, managed) = _memory_with_spans()
    assert mem.kernel_pointer(c0, d0.base + 4) == d0.base + 4  # its own memory
    assert mem.kernel_pointer(c0, d1.base) == d1.base  # another device's, no peer access
    assert mem.kernel_pointer(c0, pinned.base + 4) == wire.GUEST_WINDOW_VA + 0x10000 + 4
    assert mem.kernel_pointer(c0, managed.base) == wire.GUEST_WINDOW_VA + 0x40000
    assert mem.kernel_pointer(c0, pinned.window_va) == pinned.window_va
    assert mem.kernel_pointer(c0, 12345) == 12345  # a number that is no address
    imported = []

    class Import:
        ptr = 0x9_0000_0000

    def fake_import(span, ctx):
        imported.append((span, ctx))
        return Import
    mem.imported = fake_import
    c0.peers.add(1)
    assert mem.kernel_pointer(c0, d1.base + 0x20) == 0x9_0000_0020
    assert imported == [(d1, c0)]
    f.mappable = False
    assert mem.kernel_pointer(c0, pinned.base) == pinned.base


def test_slots_are_disjoint_ranges_of_the_user_address_space():
    ranges = [_state.slot_range(s) for s in range(_state.SLOT_COUNT)]
    assert ranges[0][0] == wire.VA_USER_BASE and ranges[-1][1] <= wire.VA_USER_LIMIT
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert _state.SLOT_COUNT >= 32


def test_host_ranges_are_reserved_only_where_nothing_lives():
    hr = _state._HostRanges()
    if hr._libc is None:  # no mmap to ask: every slot is taken as free
        assert hr.reserve(0x1000_0000_0000, 1 << 20)
        return
    buf = np.zeros(1 << 20, np.uint8)
    page = buf.ctypes.data & ~0xFFF
    assert not hr.reserve(page, 1 << 12)  # this process's own memory is there
    start = _state.slot_range(_state.SLOT_COUNT - 1)[0]
    if hr.reserve(start, 1 << 20):
        assert hr.reserve(start, 1 << 20)  # held: asking again is fine
        assert start in hr.held
