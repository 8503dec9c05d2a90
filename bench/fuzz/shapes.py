"""Valid chains of unusual shape: how a request is split into descriptors (spec VQ-DESC-3).

The device must not assume any split of a request or response into descriptors, and must
accept zero-length descriptors and, with VIRTIO_F_INDIRECT_DESC, the whole chain in an
indirect table. `random_shape` draws such a split; `segments` lays a request out by it:
the readable bytes in pieces with gaps between them, the writable part in adjacent pieces
(so the response is still one run of bytes from its first gpa), zero-length descriptors
in between.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_PIECES = 12  # per side: a chain stays well below the queue size


@dataclass(frozen=True)
class Shape:
    read_pieces: int = 1
    write_pieces: int = 1
    gap: int = 0  # bytes left between readable pieces
    zero_len: int = 0  # zero-length descriptors added on each side
    indirect: bool = False


def random_shape(rng) -> Shape:
    return Shape(read_pieces=rng.choice((1, 2, 3, rng.randrange(1, MAX_PIECES + 1))),
                 write_pieces=rng.choice((1, 2, rng.randrange(1, MAX_PIECES + 1))),
                 gap=rng.choice((0, 1, 16, 4096)), zero_len=rng.choice((0, 0, 1, 3)),
                 indirect=rng.random() < 0.4)


def _cuts(rng, n: int, pieces: int) -> list:
    """Sizes of up to `pieces` pieces that add up to n (no piece empty)."""
    if n <= 1 or pieces <= 1:
        return [n] if n else []
    points = sorted(rng.sample(range(1, n), min(pieces - 1, n - 1)))
    return [b - a for a, b in zip([0, *points], [*points, n])]


def segments(rng, shape: Shape, readable: bytes, read_gpa: int, writable_len: int,
             write_gpa: int, limit: int) -> tuple:
    """-> (readable [(gpa, bytes)], writable [(gpa, len)]) laid out by `shape`; the
    readable pieces and their gaps stay within `limit` bytes of read_gpa (no gaps if the
    bytes alone take that much)."""
    rd, pos, gpa = [], 0, read_gpa
    gap = shape.gap if shape.gap * shape.read_pieces <= limit - len(readable) else 0
    for n in _cuts(rng, len(readable), shape.read_pieces):
        rd.append((gpa, readable[pos:pos + n]))
        pos += n
        gpa += n + gap
    wr, gpa = [], write_gpa
    for n in _cuts(rng, writable_len, shape.write_pieces):
        wr.append((gpa, n))
        gpa += n
    for _ in range(shape.zero_len):
        rd.insert(rng.randrange(len(rd) + 1), (read_gpa, b""))
        wr.insert(rng.randrange(len(wr) + 1), (write_gpa, 0))
    return rd, wr
