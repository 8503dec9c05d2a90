"""A kick runs at most one queue size of chains (host/backend/device.py `process_queue`,
vhost's weight, spec VQ-ORDER-4); the rest run at the I/O loop's next turns, each after
the messages that came meanwhile, without another kick.

A polling guest adds chains while the device executes the ones before (shared memory):
without a weight one kick ran them all, and the loop answered no ping and served no other
session until the guest stopped launching, for seconds under load. The driver here adds a
chain for every one the device executes, from inside the device's execution, which is
what a guest on another CPU does."""

import pytest

from pvgpu.spec import wire
from pvgpu.transport import codec
from pvgpu.transport.memory import SharedGuestMemory

from test_backend import cmd
from test_backend_fence_completion import MEM, SharedGuest, backend  # noqa: F401 (fixture)

QSIZE = 16
TOTAL = 10 * QSIZE  # chains the driver adds in all


class RefillingGuest(SharedGuest):
    """Adds NOPs whenever descriptors are free, until TOTAL have been added."""

    def __init__(self, backend, mem):
        super().__init__(backend, mem)
        self.added = 0
        self.completed = 0

    def refill(self) -> None:
        self.completed += len(self.queue.pop_used())
        nop = cmd(wire.CMD_NOP)
        while self.added < TOTAL and self.queue.num_free >= 2:
            at = (1 << 20) + 8192 * (self.added % (2 * QSIZE))
            self.mem.write(at, nop)
            self.queue.add_chain([(at, len(nop))], [(at + 4096, wire.MIN_RESPONSE_SIZE)])
            self.added += 1


@pytest.fixture
def guest(backend):  # noqa: F811 (the fixture imported above)
    with SharedGuestMemory.create(MEM) as mem:
        g = RefillingGuest(backend, mem)
        g.init(qsize=QSIZE)
        yield g
        backend.close_session(backend.sessions[g.peer], "test over")


def executed(backend, g) -> int:
    return backend.sessions[g.peer].devices[0].stats["chains"]


def test_a_queue_the_driver_keeps_filling_yields_to_the_loop_each_queue_size(backend, guest):
    # [VQ-ORDER-4] at most Q chains a turn, the rest at later turns without a kick
    dev = backend.sessions[guest.peer].devices[0]
    execute = dev.compute.execute

    def execute_while_the_driver_refills(command, writer):
        result = execute(command, writer)
        guest.refill()
        return result

    dev.compute.execute = execute_while_the_driver_refills
    start = executed(backend, guest)
    guest.refill()
    backend.handle(guest.peer, codec.encode({"op": wire.OP_KICK, "dev": 0, "queue": 0}), 0.0)
    assert executed(backend, guest) - start == QSIZE  # one weight, not every chain added
    assert guest.added > QSIZE  # the driver did add more meanwhile

    ping = backend.handle(guest.peer, codec.encode({"op": wire.OP_PING, "seq": 99}), 0.0)
    assert [codec.decode(f)[0]["seq"] for _p, f in ping] == [99]  # the loop's turn came

    turns = 0
    while executed(backend, guest) - start < TOTAL:
        before = executed(backend, guest)
        backend.run_completions()  # one turn of the loop: no kick
        assert 0 < executed(backend, guest) - before <= QSIZE
        turns += 1
        assert turns <= TOTAL
    guest.refill()
    assert guest.completed == TOTAL and guest.added == TOTAL
    backend.run_completions()
    assert executed(backend, guest) - start == TOTAL and dev.stats["requeues"] >= TOTAL // QSIZE - 1
