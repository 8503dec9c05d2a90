"""ContextLimits (host/kmd/limits.py): what bounds a context is a parameter of the KMD, not
the guest wire. A context gets its creator's limits (create_context(limits=...)), else its
device's (KmdDevice(limits=...)), else what the hardware allows."""

import dataclasses

import pytest

from pvgpu.host.backend.limits import GUEST_CONTEXT_LIMITS
from pvgpu.host.hw import packets, regs
from pvgpu.host.kmd import InvalidArgument, OutOfMemory
from pvgpu.host.kmd.errors import LimitReached
from pvgpu.host.kmd.limits import ContextLimits
from pvgpu.spec import wire

P = regs.PAGE_SIZE


def test_without_limits_a_context_has_the_hardware_va_space(make_dev):
    dev = make_dev(limits=None)
    ctx = dev.create_context()
    assert ctx.limits == ContextLimits()
    assert ctx.vm.va.holes() == [(P, 1 << regs.VA_BITS)]  # all of it but page 0
    assert ctx.limits.max_kernel_args == packets.MAX_LAUNCH_ARGS
    # the KMD passes it on (the hardware then refuses fill with 17 arguments)
    f = ctx.submit_launch(wire.KERNEL_FILL, (1,), (1,), [0] * (wire.MAX_KERNEL_ARGS + 1))
    assert f.wait(5) and f.error is not None


def test_a_context_takes_its_creators_limits_over_the_devices(make_dev):
    dev = make_dev()  # the guests' limits for every context
    tight = dataclasses.replace(GUEST_CONTEXT_LIMITS, max_kernel_args=2, max_va_reservations=1,
                                max_va_align=1 << 21)
    ctx, other = dev.create_context(limits=tight), dev.create_context()
    assert ctx.limits is tight and other.limits is GUEST_CONTEXT_LIMITS
    with pytest.raises(InvalidArgument, match="max 2"):
        ctx.submit_launch(wire.KERNEL_FILL, (1,), (1,), [0, 0, 0])
    with pytest.raises(InvalidArgument, match="alignment"):
        ctx.reserve_va(P, 1 << 22)
    ctx.reserve_va(P, 1 << 21)
    with pytest.raises(LimitReached, match="1 VA reservations"):
        ctx.reserve_va(P)
    other.reserve_va(P, 1 << 22)
    other.reserve_va(P)


def test_the_user_va_range_bounds_allocations_and_reservations(make_dev):
    dev = make_dev(limits=None)
    small = ContextLimits(va_base=1 << 30, va_limit=(1 << 30) + 16 * P)
    ctx = dev.create_context(limits=small)
    bo = ctx.alloc(4 * P)
    assert small.va_base <= bo.va < small.va_limit
    with pytest.raises(InvalidArgument):
        ctx.reserve_va(32 * P)  # larger than the whole range
    with pytest.raises(OutOfMemory):
        ctx.alloc(16 * P)


@pytest.mark.parametrize("bad", [
    dict(va_base=0), dict(va_base=P + 1), dict(va_base=2 * P, va_limit=P),
    dict(va_limit=(1 << regs.VA_BITS) + P), dict(max_imports=0), dict(max_va_mappings=-1),
    dict(max_va_reservations=True), dict(max_va_align=1.5),
    dict(max_kernel_args=packets.MAX_LAUNCH_ARGS + 1)])
def test_bad_limits_are_refused(bad):
    with pytest.raises(ValueError):
        ContextLimits(**bad)


def test_the_guest_limits_are_the_wires():
    g = GUEST_CONTEXT_LIMITS
    assert (g.va_base, g.va_limit, g.max_va_align) == (wire.VA_USER_BASE, wire.VA_USER_LIMIT,
                                                      wire.MAX_VA_ALIGN)
    assert (g.max_va_reservations, g.max_va_mappings, g.max_imports, g.max_kernel_args) == (
        wire.MAX_VA_RESERVATIONS, wire.MAX_VA_MAPPINGS, wire.MAX_IMPORTS, wire.MAX_KERNEL_ARGS)
