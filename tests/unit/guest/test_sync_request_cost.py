"""What a synchronous request costs the guest on its critical path, counted in Python
function calls (which do not depend on the machine or its load): from the call to the
kick leaving on the channel's socket, and from the used entry being there to the call
returning; for the driver's `call` and for the API's NOP, launch + synchronize and small
host->device copy. The real API objects, FrontendSession, driver and GuestChannel in the
shared memory model; the device is in this process and answers every chain as the kick
leaves, its own work not counted (it is the host's), so the wait's first look finds the
answer."""

import sys

import numpy as np
import pytest
import zmq

from anymachine import python_calls

from pvgpu.guest.api.connection import Connection
from pvgpu.guest.api.context import Context
from pvgpu.guest.frontend.driver import VirtioGpuDriver, command
from pvgpu.guest.frontend.heap import GuestHeap
from pvgpu.guest.frontend.session import FrontendSession
from pvgpu.spec import wire
from pvgpu.transport.channel import GuestChannel
from pvgpu.transport.memory import GuestMemory

from test_kick_policy import MEM, OK, LoopbackChannel

# drv.call of a NOP, all of it: submit, kick, send, the wait's first look, the response
SYNC_NOP_CALLS = 58  # 73 before issue 12's guest pass
# the API's, all of it, from the public call to its return
API_NOP_CALLS = 62  # dev.nop(); 81 before issue 12's guest pass
# ctx.launch("fill", ...) + ctx.synchronize(), its batch sent fenced as the sync point
# (launch_batch.py); 167 before, 126 with the batch and a CTX_SYNC; +3 (112 before) for the
# driver's timelines (timelines.py): told of the fenced batch, then of its answer (the
# response type read and handed over), so that a context whose other streams are clean
# syncs on its fenced batch too
API_LAUNCH_SYNC_CALLS = 115
# ctx.copy_h2d of 4 KiB (one bounce chunk); 113 before; +3 (94 before) for the driver's
# timelines: a COPY_H2D is work and a sync point of its timeline, told of both ways
API_H2D_4K_CALLS = 97


class SharedLoopback(LoopbackChannel):
    """Control requests of the loopback channel; the device writes guest memory itself."""

    def __init__(self, mem):
        super().__init__()
        self.mirror = mem  # the shared model: one memory, both sides


@pytest.fixture
def shared_session():
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind("inproc://sync-cost")
    s = FrontendSession.__new__(FrontendSession)
    s.endpoint, s.memory, s.inline, s.timeout = "loopback", wire.MEMORY_SHARED, False, 5.0
    s.mem, s.devices, s.closed, s.host_lost = GuestMemory(MEM), [], False, False
    s._wait_ewma, s._kind_waits, s._kicks = 0.0, {}, {}
    s.channel = SharedLoopback(s.mem)
    drv = VirtioGpuDriver(s, 0, {}, base=0)
    drv.initialize()
    s.devices.append(drv)
    s.heap = GuestHeap(VirtioGpuDriver.area_size(), MEM - VirtioGpuDriver.area_size(),
                       align=4096)
    device_queue = s.channel.device_queue
    s.channel = GuestChannel("inproc://sync-cost", heartbeat_ms=0, context=ctx)
    kick = s.kick

    def kick_and_answer(dev, queue=wire.CONTROLQ):
        kick(dev, queue)  # the real kick: onto the socket
        profile = sys.getprofile()  # the device's work is the host's: not counted
        sys.setprofile(None)
        assert router.recv_multipart()[1:]  # the kick, received
        while (chain := device_queue.pop()) is not None:
            chain.write(s.mem, 0, OK)
            device_queue.add_used(chain.head, len(OK))
        sys.setprofile(profile)

    s.kick = kick_and_answer
    yield s
    s.channel.close()
    router.close(linger=0)
    ctx.term()


def test_a_synchronous_nop_costs_the_guest_few_calls(shared_session):
    drv = shared_session.devices[0]
    cmd = command(wire.CMD_NOP)
    for _ in range(3):  # warm: the encoded kick, the wait estimate
        assert drv.call(cmd) == (wire.RESP_OK_NODATA, b"")
    calls = python_calls(lambda: drv.call(cmd))
    assert calls <= SYNC_NOP_CALLS, calls


def _warm_calls(fn) -> int:
    for _ in range(3):  # warm: the encoded kick, the staging chunk, the wait estimates
        fn()
    return python_calls(fn)


def test_the_apis_synchronous_requests_cost_the_guest_few_calls(shared_session):
    dev = Connection(shared_session).devices[0]
    ctx = Context(dev, 1)  # its CTX_CREATE is not what is counted
    assert dev.driver.batcher is not None  # launches go into a LAUNCH_BATCH
    host = np.ones(1024, np.float32)
    nop = _warm_calls(dev.nop)
    launch_sync = _warm_calls(lambda: (ctx.launch("fill", 1, 256, (1 << 20, 1.0, 256)),
                                       ctx.synchronize()))
    h2d = _warm_calls(lambda: ctx.copy_h2d(1 << 20, host))
    assert dev.driver.batcher.sent >= 4  # each launch went out in its own batch
    assert nop <= API_NOP_CALLS, (nop, launch_sync, h2d)
    assert launch_sync <= API_LAUNCH_SYNC_CALLS, launch_sync
    assert h2d <= API_H2D_4K_CALLS, h2d
