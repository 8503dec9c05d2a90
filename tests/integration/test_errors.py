"""Bad input through the API: each gets a clear Python exception for that guest only, and the
host, the context and other contexts carry on."""

import numpy as np
import pytest

from pvgpu import guest
from pvgpu.guest.frontend.driver import command
from pvgpu.spec import wire


def test_kernel_argument_at_unmapped_va_is_a_page_fault(conn):
    dev = conn.devices[0]
    with dev.create_context() as bad, dev.create_context() as good:
        a = good.to_device(np.ones(1000, np.float32))
        x = bad.to_device(np.ones(1000, np.float32))
        unmapped = 0x5000_0000_0000
        bad.launch("vector_add", grid=4, block=256, args=(x, x, unmapped, 1000))
        with pytest.raises(guest.PageFaultError) as ei:
            bad.synchronize()
        assert ei.value.address == unmapped and ei.value.access == "write"
        assert "page fault" in str(ei.value).lower() and hex(unmapped) in str(ei.value)
        # the faulting context and its neighbour both keep working
        bad.launch("vector_add", grid=4, block=256, args=(x, x, x, 1000))
        np.testing.assert_array_equal(x.to_host(), np.full(1000, 2, np.float32))
        good.launch("scale", grid=4, block=256, args=(a, a, 3.0, 1000))
        np.testing.assert_array_equal(a.to_host(), np.full(1000, 3, np.float32))


def test_fault_surfaces_at_the_next_copy(conn):
    with conn.devices[1].create_context() as ctx:
        x = ctx.to_device(np.zeros(16, np.float32))
        ctx.launch("fill", grid=1, block=16, args=(0x6000_0000_0000, 1.0, 16))
        with pytest.raises(guest.PageFaultError):
            x.to_host()
        assert x.to_host().sum() == 0  # reported once, then clear


def test_copy_to_unmapped_va_is_a_page_fault(conn):
    with conn.devices[0].create_context() as ctx:
        with pytest.raises(guest.PageFaultError):
            ctx.copy_h2d(0x4000_0000_0000, np.ones(100, np.float32))


def test_invalid_context_and_buffer_handles(conn):
    dev = conn.devices[0]
    ctx = dev.create_context()
    buf = ctx.empty(10)
    buf.free()
    with pytest.raises(guest.InvalidResourceError):
        ctx._free(buf.resource_id)
    ctx.destroy()
    with pytest.raises(guest.InvalidContextError):
        ctx.empty(10)
    with pytest.raises(guest.InvalidContextError):
        dev.call_raw(command(wire.CMD_CTX_DESTROY, ctx_id=12345))


def test_out_of_memory_is_an_error_not_a_crash(conn):
    with conn.devices[0].create_context() as ctx:
        with pytest.raises(guest.OutOfMemoryError):
            ctx.empty(512 << 20, np.uint8)
        held = [ctx.empty(32 << 20, np.uint8) for _ in range(6)]
        with pytest.raises(guest.OutOfMemoryError):
            [ctx.empty(32 << 20, np.uint8) for _ in range(4)]
        for h in held:
            h.free()
        ctx.empty(64 << 20, np.uint8).free()


def test_unknown_command_short_command_unknown_kernel(conn):
    drv = conn.devices[0]
    with pytest.raises(guest.UnknownCommandError):
        drv.call_raw(wire.pack_ctrl_hdr(0x0499))
    with pytest.raises(guest.ShortCommandError):
        drv.call_raw(wire.pack_ctrl_hdr(wire.CMD_MEM_ALLOC, ctx_id=1) + b"\1\0")
    with pytest.raises(guest.ShortCommandError):
        drv.call_raw(b"\0" * 10)
    with conn.devices[0].create_context() as ctx:
        bad = command(wire.CMD_LAUNCH, (99, 1, 1, 1, 1, 1, 1, 0), ctx_id=ctx.ctx_id, fence_id=5)
        with pytest.raises(guest.InvalidKernelError):
            drv.call_raw(bad)
        wrong_arity = command(wire.CMD_LAUNCH, (wire.KERNEL_FILL, 1, 1, 1, 1, 1, 1, 1),
                              ctx_id=ctx.ctx_id, extra=b"\0" * 8, fence_id=6)
        with pytest.raises(guest.InvalidParameterError):
            drv.call_raw(wrong_arity)
        with pytest.raises(guest.InvalidKernelError):
            ctx.launch("no_such_kernel", 1, 1, ())
        # the device still answers
        assert ctx.to_device(np.arange(4, dtype=np.float32)).to_host().tolist() == [0, 1, 2, 3]


def test_errors_are_wrapped_with_wire_names(conn):
    with pytest.raises(guest.DeviceError) as ei:
        conn.devices[0].call_raw(wire.pack_ctrl_hdr(0x0499))
    assert ei.value.name == "ERR_UNKNOWN_COMMAND" and ei.value.code == wire.RESP_ERR_UNKNOWN_COMMAND


@pytest.mark.parametrize("kernel,args", [
    ("gemm", lambda d: (d, d, d, 2**31, 2**31, 2**31)),
    ("softmax", lambda d: (d, d, 2**32 - 1, 2**32 - 1)),
    ("vector_add", lambda d: (d, d, d, 2**32 - 1)),
    ("reduce_sum", lambda d: (d, 2**64 - 8, 100)),
])
def test_hostile_kernel_sizes_fault_without_harm(conn, kernel, args):
    with conn.devices[0].create_context() as ctx:
        d = ctx.to_device(np.ones(1024, np.float32))
        grid = 2**31 - 1 if kernel == "vector_add" else 1
        ctx.launch(kernel, grid=grid, block=1024, args=args(d))
        with pytest.raises(guest.PageFaultError):
            ctx.synchronize()
        np.testing.assert_array_equal(d.to_host(), np.ones(1024, np.float32))
