"""The split virtqueue between two real processes over POSIX shared memory.

Regression: ring indices must be stored and loaded as whole 16-bit words. With
struct.pack_into (which zero-fills before writing) the driver saw a transient used idx
of 0 within a few hundred completions and reported VQ-USED-JUMP.
"""

import multiprocessing as mp

from pvgpu.transport.memory import SharedGuestMemory
from pvgpu.transport.virtqueue import DeviceQueue, DriverQueue, VirtqLayout

N = 20000
QSIZE = 64


def _device(name, size, ready, done):
    mem = SharedGuestMemory.attach(name, size)
    q = DeviceQueue(mem, VirtqLayout.at(0, QSIZE), event_idx=True)
    ready.set()
    served = 0
    while served < N:
        chain = q.pop()
        if chain is None:
            continue
        q.add_used(chain.head, 4)
        served += 1
    done.set()
    mem.close()


def test_indices_never_tear_across_processes():
    mem = SharedGuestMemory.create(1 << 20)
    try:
        drv = DriverQueue(mem, VirtqLayout.at(0, QSIZE), event_idx=True)
        ctx = mp.get_context("fork")
        ready, done = ctx.Event(), ctx.Event()
        proc = ctx.Process(target=_device, args=(mem.name, mem.size, ready, done))
        proc.start()
        try:
            assert ready.wait(10)
            completed = 0
            while completed < N:
                while drv.num_free and drv.in_flight < 8 and completed + drv.in_flight < N:
                    drv.add_chain([(8192, 16)], [(16384, 16)])
                for _head, length in drv.pop_used():  # raises VirtqError on a torn index
                    assert length == 4
                    completed += 1
            assert done.wait(10)
        finally:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        assert proc.exitcode == 0
    finally:
        mem.close()
