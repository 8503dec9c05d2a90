"""Control-channel codec (spec/pvgpu.md §2): round trips and every CTL_ERR_* mapping."""

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pvgpu.spec.wire import (
    CTL_ERR_MALFORMED,
    CTL_ERR_MISSING_FIELD,
    CTL_ERR_UNKNOWN_OP,
    CTL_FIELDS,
    NOTIFY_OPS,
    OP_CALL,
    OP_ENABLE_VRING,
    OP_GET_STATUS,
    OP_HELLO,
    OP_KICK,
    OP_PING,
    OP_REPLY,
    OP_SET_VRING,
    REQUEST_OPS,
)
from pvgpu.transport import codec
from pvgpu.transport.codec import CodecError, decode, encode, reply_error, reply_ok

ALL_CTL_ERRORS = {CTL_ERR_MALFORMED, CTL_ERR_MISSING_FIELD, CTL_ERR_UNKNOWN_OP}
SEQ_OPS = sorted(REQUEST_OPS | {OP_REPLY})

# --------------------------------------------------------------------------- strategies

u64 = st.integers(min_value=0, max_value=2**64 - 1)
i64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
VALUE = {
    int: u64,  # CTL-MSG-5: a negative int field is malformed
    bool: st.booleans(),
    str: st.text(max_size=40),
    list: st.lists(st.one_of(i64, st.text(max_size=8), st.booleans()), max_size=6),
}


@st.composite
def valid_messages(draw):
    """(msg, extra_frames) for any op, with every required field of the right type."""
    op = draw(st.sampled_from(sorted(CTL_FIELDS)))
    msg = {"op": op}
    if op in REQUEST_OPS or op == OP_REPLY:
        msg["seq"] = draw(u64)
    for name, t in CTL_FIELDS[op]:
        msg[name] = draw(VALUE[t])
    frames = draw(st.lists(st.binary(max_size=64), max_size=4))
    if op == OP_HELLO and draw(st.booleans()):
        msg["vgpu"] = draw(st.text(max_size=10))
    if op in (OP_KICK, OP_CALL) and frames and draw(st.booleans()):
        msg["patches"] = draw(st.lists(
            st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=1).flatmap(
                lambda g: st.integers(0, len(frames) - 1).map(lambda i: [g[0], i])),
            max_size=4))
    if op == OP_REPLY and msg["ok"] is False:
        msg["error"] = draw(st.text(max_size=20))
        msg["message"] = draw(st.text(max_size=40))
    if draw(st.booleans()):  # unknown extra fields are ignored
        msg["x_extra"] = draw(VALUE[int])
    return msg, frames


def valid(op, seq=7):
    """A minimal valid message for op."""
    sample = {int: 1, bool: True, str: "s", list: [0, 1]}
    msg = {"op": op}
    if op in REQUEST_OPS or op == OP_REPLY:
        msg["seq"] = seq
    for name, t in CTL_FIELDS[op]:
        msg[name] = sample[t]
    return msg


def expect(frames, error, seq):
    with pytest.raises(CodecError) as ei:
        decode(frames)
    assert ei.value.error == error, ei.value
    assert ei.value.seq == seq, ei.value
    assert isinstance(ei.value.message, str) and ei.value.message
    return ei.value


# --------------------------------------------------------------------------- round trips

@given(valid_messages())
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_round_trip(case):
    msg, frames = case
    out = encode(msg, frames)
    assert out[1:] == frames
    got, extra = decode(out)
    assert got == msg
    assert extra == frames


def test_extra_frames_pass_through_untouched():
    arr = np.arange(1 << 18, dtype=np.uint32)
    mv = memoryview(bytearray(b"abc"))
    out = encode({"op": OP_KICK, "dev": 0, "queue": 0, "patches": [[4096, 0], [0, 1]]}, [arr, mv])
    assert out[1] is arr and out[2] is mv  # [CTL-MSG-1] bulk data travels in extra frames
    msg, extra = decode(out)
    assert extra[0] is arr and extra[1] is mv
    assert msg["patches"] == [[4096, 0], [0, 1]]


def test_decode_accepts_buffer_frames():
    raw = encode(valid(OP_GET_STATUS))[0]
    for f0 in (memoryview(raw), bytearray(raw), np.frombuffer(raw, dtype=np.uint8)):
        msg, extra = decode([f0])
        assert msg == valid(OP_GET_STATUS) and extra == []


def test_reply_helpers():
    msg, _ = decode(encode(reply_ok(5, devices=[0, 1], heartbeat_ms=1000)))
    assert msg == {"op": OP_REPLY, "seq": 5, "ok": True, "devices": [0, 1], "heartbeat_ms": 1000}
    assert reply_ok(5, op="x", ok=False)["op"] == OP_REPLY  # fields cannot override the header
    assert reply_ok(5, op="x", ok=False)["ok"] is True
    err, _ = decode(encode(reply_error(9, CTL_ERR_UNKNOWN_OP, "nope")))
    assert err == {"op": OP_REPLY, "seq": 9, "ok": False, "error": CTL_ERR_UNKNOWN_OP,
                   "message": "nope"}
    long = reply_error(1, CTL_ERR_MALFORMED, "x" * 100000)
    assert len(long["message"]) == codec.MAX_REPLY_MESSAGE


def test_codec_error_reply_round_trip():
    """What a host does with a CodecError: answer with its error name and seq."""
    e = expect(encode({"op": "frobnicate", "seq": 11}), CTL_ERR_UNKNOWN_OP, 11)
    msg, _ = decode(encode(reply_error(e.seq, e.error, e.message)))
    assert msg["seq"] == 11 and msg["error"] == CTL_ERR_UNKNOWN_OP and msg["ok"] is False


# --------------------------------------------------------------------------- frame 0 errors

@pytest.mark.parametrize("frames", [
    [],
    [b""],
    [b"\xc1"],  # a byte msgpack never uses
    [msgpack.packb({"op": OP_PING, "seq": 1})[:-1]],  # truncated
    [msgpack.packb({"op": OP_PING, "seq": 1}) + b"\xc0"],  # trailing data
    [b"\xa3\xff\xfe\xfd"],  # str that is not UTF-8
    [b"\x91" * 5000 + b"\xc0"],  # nested too deep
    [12345],  # not a buffer
    None,
], ids=["no-frames", "empty", "not-msgpack", "truncated", "extra-data", "bad-utf8", "deep",
        "not-buffer", "none"])
def test_not_msgpack_is_malformed_without_seq(frames):
    expect(frames, CTL_ERR_MALFORMED, None)


@pytest.mark.parametrize("obj", [[1, 2], "hello", 7, None, b"bytes", True, 1.5])
def test_not_a_map(obj):
    # [CTL-MSG-1] frame 0 is a msgpack map
    expect([msgpack.packb(obj, use_bin_type=True)], CTL_ERR_MALFORMED, None)


def test_non_str_map_keys_rejected():
    # [CTL-MSG-1] frame 0 is a map with string keys
    expect([msgpack.packb({1: 2, "seq": 3})], CTL_ERR_MALFORMED, None)


@pytest.mark.parametrize("what", ["frame", "str", "bin", "array", "map"])
def test_oversize(what):
    seq = 3
    if what == "frame":
        raw = msgpack.packb({"op": OP_PING, "seq": seq, "pad": b"x" * (codec.MAX_FRAME0_SIZE)},
                            use_bin_type=True)
    elif what == "str":
        raw = msgpack.packb({"op": OP_PING, "seq": seq, "pad": "x" * (codec.MAX_STR_LEN + 1)})
    elif what == "bin":
        raw = msgpack.packb({"op": OP_PING, "seq": seq, "pad": b"x" * (codec.MAX_BIN_LEN + 1)},
                            use_bin_type=True)
    elif what == "array":
        raw = msgpack.packb({"op": OP_PING, "seq": seq, "pad": [0] * (codec.MAX_ARRAY_LEN + 1)})
    else:
        big = {f"k{i}": 0 for i in range(codec.MAX_MAP_LEN + 1)}
        raw = msgpack.packb({"op": OP_PING, "seq": seq, "pad": big})
    expect([raw], CTL_ERR_MALFORMED, None)


def test_hostile_length_header_does_not_allocate():
    # array32 header claiming 2**32-1 elements, then nothing
    expect([b"\xdd\xff\xff\xff\xff"], CTL_ERR_MALFORMED, None)
    expect([b"\xdf\xff\xff\xff\xff"], CTL_ERR_MALFORMED, None)  # map32
    expect([b"\xc6\xff\xff\xff\xff"], CTL_ERR_MALFORMED, None)  # bin32


# --------------------------------------------------------------------------- op and seq

def test_op_missing():
    expect(encode({"seq": 4}), CTL_ERR_MISSING_FIELD, 4)
    expect(encode({"dev": 0}), CTL_ERR_MISSING_FIELD, None)


@pytest.mark.parametrize("op", [5, True, b"kick", [1], {"a": 1}, 1.0])
def test_op_not_str(op):
    expect(encode({"op": op, "seq": 4}), CTL_ERR_MALFORMED, 4)
    expect(encode({"op": op}), CTL_ERR_MALFORMED, None)


def test_unknown_op():
    expect(encode({"op": "frobnicate", "seq": 12}), CTL_ERR_UNKNOWN_OP, 12)
    expect(encode({"op": "frobnicate"}), CTL_ERR_UNKNOWN_OP, None)
    expect(encode({"op": "HELLO", "seq": 1}), CTL_ERR_UNKNOWN_OP, 1)  # ops are lowercase
    e = expect(encode({"op": "y" * 5000, "seq": 2}), CTL_ERR_UNKNOWN_OP, 2)
    assert len(e.message) < 200  # guest input is not echoed in full


@pytest.mark.parametrize("op", SEQ_OPS)
def test_seq_required_on_requests_and_replies(op):
    msg = valid(op)
    del msg["seq"]
    expect(encode(msg), CTL_ERR_MISSING_FIELD, None)


@pytest.mark.parametrize("bad", [True, False, "1", 1.0, [1], None, b"\x01"])
@pytest.mark.parametrize("op", SEQ_OPS)
def test_seq_wrong_type(op, bad):
    msg = valid(op)
    msg["seq"] = bad
    expect(encode(msg), CTL_ERR_MALFORMED, None)


@pytest.mark.parametrize("op", sorted(NOTIFY_OPS))
def test_notifications_need_no_seq(op):
    msg = valid(op)
    assert "seq" not in msg
    assert decode(encode(msg))[0] == msg


# --------------------------------------------------------------------------- fields

FIELD_CASES = [(op, name, t) for op in sorted(CTL_FIELDS) for name, t in CTL_FIELDS[op]]
WRONG = {
    int: [True, False, "1", 1.5, [1], None],
    bool: [1, 0, "true", None, [True]],
    str: [1, True, b"bytes", ["s"], None],
    list: ["abc", 1, {"a": 1}, b"ab", None],
}


def _seq_for(op):
    return 7 if op in REQUEST_OPS or op == OP_REPLY else None


@pytest.mark.parametrize("op,name,t", FIELD_CASES, ids=[f"{o}.{n}" for o, n, _ in FIELD_CASES])
def test_missing_field(op, name, t):
    msg = valid(op)
    del msg[name]
    e = expect(encode(msg), CTL_ERR_MISSING_FIELD, _seq_for(op))
    assert name in e.message


@pytest.mark.parametrize("op,name,t", FIELD_CASES, ids=[f"{o}.{n}" for o, n, _ in FIELD_CASES])
def test_wrong_field_type(op, name, t):
    for bad in WRONG[t]:
        msg = valid(op)
        msg[name] = bad
        e = expect(encode(msg), CTL_ERR_MALFORMED, _seq_for(op))
        assert name in e.message


INT_CASES = [c for c in FIELD_CASES if c[2] is int]


@pytest.mark.parametrize("op,name,t", INT_CASES, ids=[f"{o}.{n}" for o, n, _ in INT_CASES])
def test_negative_int_field_is_malformed(op, name, t):
    # CTL-MSG-5: an int field is 0 .. 2^64-1; msgpack can carry down to -2^63
    for bad in (-1, -(1 << 63)):
        msg = valid(op)
        msg[name] = bad
        e = expect(encode(msg), CTL_ERR_MALFORMED, _seq_for(op))
        assert name in e.message and "outside" in e.message
    msg = valid(op)
    msg[name] = (1 << 64) - 1
    assert decode(encode(msg))[0][name] == (1 << 64) - 1


def test_bool_int_confusion():
    # bool is a subclass of int in Python; not on this wire
    expect(encode({"op": OP_SET_VRING, "seq": 1, "dev": True, "queue": 0, "size": 8,
                   "desc": 0, "avail": 0, "used": 0}), CTL_ERR_MALFORMED, 1)
    expect(encode({"op": OP_ENABLE_VRING, "seq": 1, "dev": 0, "queue": 0, "enable": 1}),
           CTL_ERR_MALFORMED, 1)
    assert decode(encode({"op": OP_ENABLE_VRING, "seq": 1, "dev": 0, "queue": 0,
                          "enable": False}))[0]["enable"] is False


def test_set_vring_optional_base():
    vr = {"op": OP_SET_VRING, "seq": 1, "dev": 0, "queue": 0, "size": 8, "desc": 0, "avail": 0, "used": 0}
    assert "base" not in decode(encode(vr))[0]
    assert decode(encode(dict(vr, base=65535)))[0]["base"] == 65535
    for bad in (-1, "1", True, None):
        expect(encode(dict(vr, base=bad)), CTL_ERR_MALFORMED, 1)


def test_hello_optional_vgpu_type():
    msg = valid(OP_HELLO)
    msg["vgpu"] = "gold"
    assert decode(encode(msg))[0]["vgpu"] == "gold"
    msg["vgpu"] = 3
    expect(encode(msg), CTL_ERR_MALFORMED, 7)


def test_failed_reply_needs_error_and_message():
    ok = {"op": OP_REPLY, "seq": 3, "ok": False, "error": "bad_state", "message": "no"}
    assert decode(encode(ok))[0] == ok
    for name in ("error", "message"):
        bad = dict(ok)
        del bad[name]
        expect(encode(bad), CTL_ERR_MALFORMED, 3)
        bad[name] = 5
        expect(encode(bad), CTL_ERR_MALFORMED, 3)


# --------------------------------------------------------------------------- patches

@pytest.mark.parametrize("op", [OP_KICK, OP_CALL])
@pytest.mark.parametrize("patches,nframes", [
    ("not a list", 1),
    ({"0": 0}, 1),
    ([[0]], 1),  # not a pair
    ([[0, 0, 0]], 1),
    ([5], 1),
    ([[-1, 0]], 1),  # negative gpa
    ([[True, 0]], 1),  # bool gpa
    ([["0", 0]], 1),
    ([[0, True]], 2),  # bool index
    ([[0, 1]], 1),  # index out of range
    ([[0, -1]], 1),
    ([[0, 0]], 0),  # patches but no frames
    ([[0, 0], [8, 3]], 3),  # second patch out of range
])
def test_bad_patches(op, patches, nframes):
    msg = {"op": op, "dev": 0, "queue": 0, "patches": patches}
    if op == OP_CALL:
        msg["notify"] = True
    expect(encode(msg, [b"x"] * nframes), CTL_ERR_MALFORMED, None)
    msg["seq"] = 99  # a seq, if present, is reported
    expect(encode(msg, [b"x"] * nframes), CTL_ERR_MALFORMED, 99)


def test_good_patches():
    msg = {"op": OP_KICK, "dev": 0, "queue": 0, "patches": [[0, 0], [2**64 - 1, 1], [8, 0]]}
    assert decode(encode(msg, [b"a", b"b"]))[0] == msg
    assert decode(encode(dict(msg, patches=[]), []))[0]["patches"] == []


# --------------------------------------------------------------------------- garbage

@given(st.binary(max_size=512))
@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
def test_garbage_bytes_only_raise_codec_error(data):
    try:
        msg, extra = decode([data, b"extra"])
    except CodecError as e:
        assert e.error in ALL_CTL_ERRORS
        assert e.seq is None or isinstance(e.seq, int)
    else:
        assert isinstance(msg, dict) and extra == [b"extra"]


msgpack_values = st.recursive(
    st.none() | st.booleans() | i64 | st.floats(allow_nan=False) | st.text(max_size=10)
    | st.binary(max_size=10) | st.sampled_from(sorted(CTL_FIELDS) + ["op", "seq", "patches"]),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(["op", "seq", "dev", "queue", "ok", "patches", "enable",
                                       "version", "name", "memory", "mem_size", "error",
                                       "message", "status", "features", "regions"]),
                      inner, max_size=8),
    max_leaves=20,
)


@given(msgpack_values, st.lists(st.binary(max_size=8), max_size=3))
@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
def test_structured_garbage_only_raises_codec_error(obj, frames):
    try:
        msg, extra = decode([msgpack.packb(obj, use_bin_type=True), *frames])
    except CodecError as e:
        assert e.error in ALL_CTL_ERRORS
        if e.seq is not None:  # recovered only from a map's int seq
            assert isinstance(obj, dict) and obj.get("seq") == e.seq
            assert type(e.seq) is int
    else:
        assert msg == obj and extra == frames


@given(valid_messages(), st.data())
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_mutated_messages_only_raise_codec_error(case, data):
    msg, frames = case
    raw = bytearray(encode(msg, frames)[0])
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    try:
        decode([bytes(raw), *frames])
    except CodecError as e:
        assert e.error in ALL_CTL_ERRORS
