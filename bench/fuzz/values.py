"""Interesting values: the integers at the edges of every width, wrong types, odd shapes.

`interesting(rng)` draws any value a msgpack field could hold (for control messages);
`interesting_int(rng, bits)` draws an integer that fits a struct field of that width (for
device commands), biased to the edges where range checks go wrong. 2**64 itself cannot
travel (msgpack ints and the wire's fields stop at 2**64 - 1); sums that reach it are the
chain families' business (an address near 2**64 plus a length).
"""

from __future__ import annotations

import math

EDGE_INTS = (0, 1, -1, 2, 7, 8, 15, 16, 255, 256, 4095, 4096, 4097, 0x7FFF, 0x8000, 0xFFFF,
             0x10000, 0x7FFF_FFFF, 0x8000_0000, 2**32 - 1, 2**32, 2**32 + 1, 2**48, 2**63 - 1,
             2**63, 2**64 - 1, -2**31, -2**63)


def interesting_int(rng, bits: int = 64) -> int:
    """An unsigned integer of `bits` bits, mostly from the edges."""
    mask = (1 << bits) - 1
    r = rng.random()
    if r < 0.6:
        return EDGE_INTS[rng.randrange(len(EDGE_INTS))] & mask
    if r < 0.8:
        return (1 << rng.randrange(bits)) + rng.choice((-1, 0, 1)) & mask
    return rng.getrandbits(bits)


def interesting(rng, depth: int = 0):
    """Any msgpack-encodable value: edge integers, floats (NaN, inf), bools, None, str vs
    bytes, huge strings, lists and nested maps."""
    kind = rng.randrange(12 if depth < 3 else 8)
    if kind == 0:
        return EDGE_INTS[rng.randrange(len(EDGE_INTS))]
    if kind == 1:
        return rng.getrandbits(rng.choice((8, 16, 32, 63)))
    if kind == 2:
        return rng.choice((math.nan, math.inf, -math.inf, 0.0, -0.0, 1.5, 1e308))
    if kind == 3:
        return rng.choice((True, False, None))
    if kind == 4:
        return rng.choice(("", "shared", "inline", "reply", "\x00", "é" * 3, "x" * 300))
    if kind == 5:
        return rng.choice((b"", b"\x00" * 8, b"shared",
                           bytes(rng.getrandbits(8) for _ in range(32))))
    if kind == 6:
        return "A" * rng.choice((1024, 70_000))  # beyond the codec's str bound, sometimes
    if kind == 7:
        return bytes(rng.choice((0, 4096, 1 << 20)))
    if kind == 8:
        return [interesting(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 9:
        return {str(interesting(rng, depth + 1))[:16]: interesting(rng, depth + 1)
                for _ in range(rng.randrange(4))}
    if kind == 10:
        nested = 0
        for _ in range(rng.choice((10, 100, 600))):
            nested = [nested]
        return nested
    return [[rng.randrange(1 << 20), rng.randrange(-2, 4)] for _ in range(rng.randrange(1, 5))]
