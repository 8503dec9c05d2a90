"""What an asynchronous launch costs the guest: a built-in one (guest/api/launch.py), its
record written into the open LAUNCH_BATCH, and one of a loaded module's kernels
(guest/api/module.py), alone and with a synchronize, counted in Python function calls
(which do not depend on the machine or its load). The real API objects and driver over
test_sync_request_cost's in-process device."""

import numpy as np
import pytest

from anymachine import python_calls

from pvgpu.conformance import codeobj
from pvgpu.guest.api.array import DeviceArray
from pvgpu.guest.api.connection import Connection
from pvgpu.guest.api.context import Context
from pvgpu.guest.api.module import CodeObject, Function, Module
from pvgpu.spec import isa

from test_sync_request_cost import shared_session  # noqa: F401  (the fixture)

LAUNCH_CALLS = 23  # a launch into the open batch; 28 before issue 12's guest pass


def test_an_asynchronous_launch_costs_few_calls(shared_session):  # noqa: F811
    dev = Connection(shared_session).devices[0]
    ctx = Context(dev, 1)  # its CTX_CREATE is not what is counted
    batcher = dev.driver.batcher

    def launch():
        ctx.launch("fill", 1, 256, (1 << 20, 1.0, 256))
    launch()  # opens the batch
    calls = [python_calls(launch) for _ in range(3)]
    assert batcher.open is not None and batcher.open.count == 4  # all in the one batch
    assert max(calls) <= LAUNCH_CALLS, calls
    ctx.synchronize()


# an asynchronous launch of one's own kernel (guest/api/module.py, params.py): a pointer, a
# float and a count marshalled by the entry's parameter table, one LAUNCH_CODE chain, held
# by the driver while the one before it goes out (VirtioGpuDriver.hold): 50 counted and 1
# to spare, 1 of them telling the driver's timelines about it (timelines.py; 49 before, 47
# when each was submitted at once; 123 before issue 12's pass)
CODE_LAUNCH_CALLS = 51


@pytest.fixture
def scale(shared_session):  # noqa: F811
    """A context, a loaded module's `scale` kernel in it (a trap: the device is a loopback)
    and an array for it."""
    ctx = Context(Connection(shared_session).devices[0], 1)
    cobj = CodeObject(codeobj.build([codeobj.Entry(
        "scale", codeobj.trap_code(), params=((0, 8, 8, isa.TYPE_U64), (8, 4, 4, isa.TYPE_F32),
                                              (12, 4, 4, isa.TYPE_U32)), param_size=16)]))
    module = Module.__new__(Module)  # loaded as if by Context.load_module, without a device
    module.context, module._conn_lock, module._releases = ctx, ctx._conn_lock, ctx._releases
    module._cobj, module.loaded = cobj, True
    module._object = DeviceArray(ctx, 0, 1 << 20, (4096,), np.uint8)
    return ctx, Function(module, cobj.entries["scale"]), DeviceArray(ctx, 0, 2 << 20, (256,),
                                                                      np.float32)


def test_an_asynchronous_code_launch_costs_few_calls(scale):
    ctx, fn, x = scale

    def launch():
        fn.launch(1, 256, (x, 2.0, 256))
    launch()
    calls = [python_calls(launch) for _ in range(3)]
    assert max(calls) <= CODE_LAUNCH_CALLS, calls
    ctx.synchronize()


# a code launch + ctx.synchronize() (cuLaunchKernel + cuCtxSynchronize), the launch held by
# the driver and sent fenced as the sync point (VirtioGpuDriver.hold): one chain, 116
# counted and 2 to spare: 3 of them the driver's timelines (timelines.py) being told of the
# launch and of its answer, which lets a context with other, clean streams sync on it too
# (113 before; 136 with the LAUNCH_CODE and a CTX_SYNC)
CODE_LAUNCH_SYNC_CALLS = 118


def test_a_code_launch_and_synchronize_cost_few_calls(scale):
    ctx, fn, x = scale

    def launch_sync():
        fn.launch(1, 256, (x, 2.0, 256))
        ctx.synchronize()
    for _ in range(3):  # warm: the encoded kick, the wait estimates
        launch_sync()
    calls = python_calls(launch_sync)
    assert calls <= CODE_LAUNCH_SYNC_CALLS, calls
