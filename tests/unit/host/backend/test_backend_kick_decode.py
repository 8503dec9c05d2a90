"""A kick without patches (the shared memory model) is the same bytes every time: the
backend decodes its frame 0 once (session.py `Backend.handle`), and still serves every
kick; the cache of decoded forms is bounded, whatever encodings a guest sends."""

import msgpack

from pvgpu.spec import wire
from pvgpu.transport import codec

from test_backend import cmd
from test_device_chain_cost import guest  # noqa: F401 - the fixture: one shared-memory guest


def nops(guest, frames, n: int) -> None:
    at = 1 << 20
    guest.mem.write(at, cmd(wire.CMD_NOP))
    for _ in range(n):
        head = guest.queue.add_chain([(at, wire.CTRL_HDR_SIZE)],
                                     [(at + 4096, wire.MIN_RESPONSE_SIZE)])
        guest.backend.handle(guest.peer, frames, 0.0)
        assert [h for h, _n in guest.queue.pop_used()] == [head]


def test_a_kick_is_decoded_once(guest, monkeypatch):
    decoded = []
    decode = codec.decode
    monkeypatch.setattr(codec, "decode", lambda frames: (decoded.append(frames), decode(frames))[1])
    kick = codec.encode({"op": wire.OP_KICK, "dev": 0, "queue": 0})
    nops(guest, kick, 5)
    assert decoded == [kick]
    # a request is decoded each time (its seq changes)
    guest.request(wire.OP_PING)
    guest.request(wire.OP_PING)
    assert sum(decode(f)[0].get("op") == wire.OP_PING for f in decoded) == 2


def test_the_decoded_kicks_are_bounded(guest):
    # msgpack lets a guest spell one kick many ways (here: with a key nobody reads)
    for i in range(200):
        frame = msgpack.packb({"op": wire.OP_KICK, "dev": 0, "queue": 0, "x": i})
        nops(guest, [frame], 1)
    assert len(guest.backend._kicks) <= 64
