"""bench/fuzz/shapes.py: a request split by any shape is still the same request to the
device (spec VQ-DESC-3): transport/chain.py reads back the same readable bytes and the
same writable length from a chain built of the pieces, direct or through an indirect table."""

import random

from hypothesis import given, strategies as st

from pvgpu.bench.fuzz import shapes
from pvgpu.transport.memory import GuestMemory
from pvgpu.transport.virtqueue import DeviceQueue, DriverQueue, VirtqLayout

MEM = 1 << 20
READ, WRITE, TABLE, LIMIT = 0x10000, 0x50000, 0x90000, 0x8000


@given(seed=st.integers(0, 2**32), n=st.integers(0, 9000), wlen=st.integers(0, 9000),
       indirect=st.booleans())
def test_a_shaped_request_reads_back_whole(seed, n, wlen, indirect):
    rng = random.Random(seed)
    shape = shapes.random_shape(rng)
    data = bytes(rng.getrandbits(8) for _ in range(n))
    rd, wr = shapes.segments(rng, shape, data, READ, wlen, WRITE, LIMIT)
    assert b"".join(d for _g, d in rd) == data and sum(n for _g, n in wr) == wlen
    assert all(READ <= g and g + len(d) <= READ + max(LIMIT, n) for g, d in rd)
    assert all(g == WRITE + sum(n for _g, n in wr[:i]) or n == 0 for i, (g, n) in enumerate(wr))
    mem = GuestMemory(MEM)
    layout = VirtqLayout.at(0x1000, 64)
    drv = DriverQueue(mem, layout, indirect=indirect)
    for g, d in rd:
        mem.write(g, d)
    segs = [(g, len(d)) for g, d in rd]
    if not segs and not wr:
        wr = [(WRITE, 0)]
    drv.add_chain(segs, wr, indirect_table=TABLE if indirect and shape.indirect else None)
    chain = DeviceQueue(mem, layout, indirect=indirect).pop()
    assert chain.read(mem, 0, chain.readable_len) == data
    assert chain.writable_len == wlen


def test_shapes_are_a_function_of_the_seed():
    assert [shapes.random_shape(random.Random(s)) for s in range(50)] == \
        [shapes.random_shape(random.Random(s)) for s in range(50)]
