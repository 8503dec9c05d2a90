"""Control-channel cases: mutations of valid messages of a real session (spec §2).

`seed_messages(s)` lists a valid instance of every request and of `kick`, with the values of
the live session `s` (its device, features, ring layout, memory table, patches).
`mutate(rng, msg, frames)` returns the multipart frames of one case: a field set to an
interesting value, removed or added, the op or seq replaced, the patches bent, extra frames
added or dropped, or frame 0 itself truncated, bit-flipped, padded, replaced by another
msgpack value or by a header that claims huge lengths.
"""

from __future__ import annotations

import msgpack

from pvgpu.bench.fuzz.values import interesting
from pvgpu.spec import wire

OPS = sorted(wire.REQUEST_OPS | wire.NOTIFY_OPS | {wire.OP_REPLY})
# msgpack headers that announce far more data than follows (str32, bin32, array32, map32)
HUGE_HEADERS = (b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff", b"\xdd\xff\xff\xff\xff",
                b"\xdf\xff\xff\xff\xff", b"\xdf\x00\x01\x00\x00", b"\xc7\xff\x01", b"\xd9\xff")


def seed_messages(s) -> list:
    """[(msg, extra frames)] : one valid message per op, from session `s` (pvgpu.bench.fuzz.session)."""
    lay = s.layout
    out = [
        (s.hello_fields() | {"op": wire.OP_HELLO}, []),
        ({"op": wire.OP_GET_FEATURES, "dev": 0}, []),
        ({"op": wire.OP_SET_FEATURES, "dev": 0, "features": s.features}, []),
        ({"op": wire.OP_GET_STATUS, "dev": 0}, []),
        ({"op": wire.OP_SET_STATUS, "dev": 0, "status": wire.STATUS_ACKNOWLEDGE | wire.STATUS_DRIVER
          | wire.STATUS_FEATURES_OK | wire.STATUS_DRIVER_OK}, []),
        ({"op": wire.OP_GET_CONFIG, "dev": 0}, []),
        ({"op": wire.OP_SET_MEM_TABLE, "regions": [{"gpa": 0, "size": s.mem.size,
                                                   "name": getattr(s.mem, "name", "pvgpu-x")}]}, []),
        ({"op": wire.OP_SET_VRING, "dev": 0, "queue": 0, "size": lay.size, "desc": lay.desc,
          "avail": lay.avail, "used": lay.used}, []),
        ({"op": wire.OP_ENABLE_VRING, "dev": 0, "queue": 0, "enable": True}, []),
        ({"op": wire.OP_PING}, []),
        ({"op": wire.OP_BYE}, []),
    ]
    kick = {"op": wire.OP_KICK, "dev": 0, "queue": 0}
    if s.inline:  # a harmless patch: bytes of the scratch area
        kick["patches"] = [[0x1F0000, 0], [0x1F0100, 0]]
        out.append((kick, [b"\x5a" * 64]))
    else:
        out.append((kick, []))
    return out


def _pick_key(rng, msg: dict):
    keys = list(msg)
    return keys[rng.randrange(len(keys))] if keys else None


def mutate(rng, msg: dict, frames: list, seq: int) -> tuple:
    """-> (frames of the case, mutation name). Requests get `seq` before mutation."""
    msg = dict(msg)
    if msg.get("op") in wire.REQUEST_OPS:
        msg["seq"] = seq
    frames = list(frames)
    kind = rng.randrange(13)
    name = ("value", "delete", "add", "op", "seq", "nested", "patches", "frames",
            "truncate", "flip", "garbage", "not_a_map", "huge_header")[kind]
    if kind == 0:
        k = _pick_key(rng, msg)
        msg[k] = interesting(rng)
    elif kind == 1:
        k = _pick_key(rng, msg)
        msg.pop(k, None)
    elif kind == 2:
        msg[rng.choice(("x", "dev", "patches", "vgpu", "seq", "ok", "error"))] = interesting(rng)
    elif kind == 3:
        msg["op"] = rng.choice(OPS) if rng.random() < 0.7 else interesting(rng)
    elif kind == 4:
        msg["seq"] = interesting(rng)
    elif kind == 5:  # a field that should be a scalar becomes a nested structure, or vice versa
        k = _pick_key(rng, msg)
        msg[k] = {"gpa": interesting(rng), "size": interesting(rng), "name": interesting(rng)} \
            if rng.random() < 0.5 else [msg[k], [msg[k]]]
        if "regions" in msg and rng.random() < 0.5:
            msg["regions"] = [{"gpa": interesting(rng), "size": interesting(rng),
                               "name": interesting(rng)}]
    elif kind == 6:
        n = len(frames)
        msg["patches"] = rng.choice((
            [[interesting(rng), rng.randrange(-1, n + 2)]],
            [[rng.randrange(0, 1 << 22), 0]] * rng.randrange(0, 300),
            [[wire.MEM_CHALLENGE_GPA, 0], [2**64 - 1, 0]],
            [[0, 0, 0]], [0], "patches", [[True, 0]],
        ))
        if not frames and rng.random() < 0.7:
            frames = [bytes(rng.choice((1, 16, 4096, 1 << 16)))]
    elif kind == 7:
        if frames and rng.random() < 0.5:
            frames.pop(rng.randrange(len(frames)))
        else:
            frames += [bytes(rng.choice((0, 1, 64, 1 << 16, 1 << 20)))
                       for _ in range(rng.randrange(1, 4))]
    try:
        frame0 = msgpack.packb(msg, use_bin_type=True)
    except (ValueError, OverflowError, TypeError):
        frame0 = msgpack.packb({"op": wire.OP_PING, "seq": seq})
        name += "/unencodable"
    if kind == 8:
        frame0 = frame0[:rng.randrange(len(frame0))]
    elif kind == 9:
        b = bytearray(frame0)
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        frame0 = bytes(b)
    elif kind == 10:
        frame0 += bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 16)))
    elif kind == 11:
        frame0 = rng.choice((b"", b"\xc0", b"\x93\x01\x02\x03", b"\xa4ping", b"\x91" * 5000 + b"\x00",
                             msgpack.packb([msg]), msgpack.packb(1.5), b"\xc1",
                             msgpack.packb({1: 2}), msgpack.packb({b"op": b"ping", b"seq": seq})))
    elif kind == 12:
        frame0 = frame0[:rng.randrange(len(frame0))] + rng.choice(HUGE_HEADERS)
    return [frame0, *frames], name
