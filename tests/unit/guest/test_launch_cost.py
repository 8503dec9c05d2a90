"""What an asynchronous built-in launch costs the guest (guest/api/launch.py): its record
written into the open LAUNCH_BATCH, counted in Python function calls (which do not depend
on the machine or its load). The real API objects and driver over test_sync_request_cost's
in-process device."""

from anymachine import python_calls

from pvgpu.guest.api.connection import Connection
from pvgpu.guest.api.context import Context

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
