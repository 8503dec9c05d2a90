"""What one chain costs the host outside the KMD (host/backend/device.py process_queue and
what it calls: the chain's walk, decode, dispatch, response and used entry), counted in
Python function calls, which do not depend on the machine or its load. A NOP does no KMD
work, so its count is the backend's own per-chain overhead."""

import pytest
from anymachine import python_calls

from pvgpu.spec import wire
from pvgpu.transport import codec
from pvgpu.transport.memory import SharedGuestMemory

from test_backend import _backend, cmd
from test_backend_fence_completion import MEM, SharedGuest

CHAINS = 16
NOP_CHAIN_CALLS = 64  # per chain, the kick's share included (88 before issue 12's cuts)


@pytest.fixture
def guest():
    gen = _backend(num_gpus=1)
    backend = next(gen)
    with SharedGuestMemory.create(MEM) as mem:
        g = SharedGuest(backend, mem)
        g.init(qsize=64)
        yield g
        backend.close_session(backend.sessions[g.peer], "test over")
    gen.close()


def test_a_nop_chain_costs_the_host_few_calls(guest):
    at = 1 << 20
    guest.mem.write(at, cmd(wire.CMD_NOP))
    kick = codec.encode({"op": wire.OP_KICK, "dev": 0, "queue": 0})

    def kick_of_nops() -> int:
        heads = [guest.queue.add_chain([(at, wire.CTRL_HDR_SIZE)],
                                       [(at + 4096, wire.MIN_RESPONSE_SIZE)])
                 for _ in range(CHAINS)]
        calls = python_calls(lambda: guest.backend.handle(guest.peer, kick, 0.0))
        assert [h for h, _n in guest.queue.pop_used()] == heads
        return calls

    kick_of_nops()
    assert kick_of_nops() <= NOP_CHAIN_CALLS * CHAINS
