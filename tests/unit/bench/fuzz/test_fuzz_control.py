"""bench/fuzz/control.py and values.py: the seeds are valid messages, the mutations are a
function of their seed and reach every kind, and the codec (transport/codec.py) answers
every mutated frame with a message or a CodecError, never another exception."""

import random
from collections import Counter
from types import SimpleNamespace

import msgpack
from hypothesis import given, settings, strategies as st

from pvgpu.bench.fuzz import control
from pvgpu.bench.fuzz.values import interesting, interesting_int
from pvgpu.spec import wire
from pvgpu.transport.codec import CodecError, decode
from pvgpu.transport.memory import InlineGuestMemory
from pvgpu.transport.virtqueue import VirtqLayout


def session(inline: bool):
    mem = InlineGuestMemory(1 << 20)
    if not inline:
        mem.name = "/proc/1/fd/3"
    return SimpleNamespace(layout=VirtqLayout.at(0x1000, 64), features=wire.DEVICE_FEATURES,
                           mem=mem, inline=inline,
                           hello_fields=lambda: {"version": [0, 1], "name": "t",
                                                 "memory": "inline" if inline else "shared",
                                                 "mem_size": 1 << 20})


def cases(seed, inline):
    rng = random.Random(seed)
    seeds = control.seed_messages(session(inline))
    msg, frames = seeds[rng.randrange(len(seeds))]
    return control.mutate(rng, msg, frames, seq=seed)


def test_seed_messages_are_valid_and_cover_every_request_and_kick():
    for inline in (True, False):
        seeds = control.seed_messages(session(inline))
        ops = {m["op"] for m, _ in seeds}
        assert ops == wire.REQUEST_OPS | {wire.OP_KICK}
        for i, (msg, frames) in enumerate(seeds):
            if msg["op"] in wire.REQUEST_OPS:
                msg = dict(msg, seq=i)
            got, extra = decode([msgpack.packb(msg, use_bin_type=True), *frames])
            assert got == msg and extra == frames


def test_mutations_are_a_function_of_the_seed_and_reach_every_kind():
    names = Counter()
    for seed in range(600):
        a, b = cases(seed, seed % 2 == 0), cases(seed, seed % 2 == 0)
        assert a == b
        frames, name = a
        assert all(isinstance(f, bytes) for f in frames)
        names[name.split("/")[0]] += 1
    assert set(names) == {"value", "delete", "add", "op", "seq", "nested", "patches", "frames",
                          "truncate", "flip", "garbage", "not_a_map", "huge_header"}


@settings(max_examples=300)
@given(seed=st.integers(0, 2**40), inline=st.booleans())
def test_the_codec_answers_every_mutated_message(seed, inline):
    frames, _name = cases(seed, inline)
    try:
        msg, _extra = decode(frames)
    except CodecError as e:
        assert e.error in (wire.CTL_ERR_MALFORMED, wire.CTL_ERR_MISSING_FIELD, wire.CTL_ERR_UNKNOWN_OP)
    else:
        assert isinstance(msg, dict)


@given(seed=st.integers(0, 2**40), bits=st.sampled_from([8, 16, 32, 64]))
def test_interesting_ints_fit_their_field(seed, bits):
    v = interesting_int(random.Random(seed), bits)
    assert 0 <= v < 1 << bits


def test_interesting_values_reach_the_edges_and_every_type():
    rng = random.Random(1)
    seen = [interesting(rng) for _ in range(3000)]
    types = {type(v) for v in seen}
    assert {int, float, bool, type(None), str, bytes, list, dict} <= types
    assert {0, -1, 2**32 - 1, 2**63, 2**64 - 1} <= set(v for v in seen if type(v) is int)
