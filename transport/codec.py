"""Control-channel codec: a message <-> a list of ZeroMQ frames (spec/pvgpu.md §2).

Pure functions, no sockets (the jupyter_client split: serialization here, I/O in
transport/channel.py).

A control message is a multipart ZeroMQ message. Frame 0 is a msgpack map; any
further frames are raw bytes that the map refers to by index (a `kick`/`call`
carries `patches`, a list of ``[gpa, frame_index]``). Bulk data is never
msgpack-encoded: ``encode`` passes extra frames through untouched, ``decode``
returns them untouched, so a numpy buffer can travel without a copy.

``decode`` is the one place where untrusted frame 0 is checked. It enforces,
in this order, and raises ``CodecError(error, message, seq)`` on the first
violation (``error`` is a ``pvgpu.spec.wire.CTL_ERR_*`` name):

  1. frame 0 is at most ``MAX_FRAME0_SIZE`` bytes and unpacks (strict map keys,
     bounded str/bin/array/map sizes) into a map           -> CTL_ERR_MALFORMED
  2. ``seq``, if present and an int (not a bool), is recovered and reported with
     every later error; otherwise ``seq`` is None and the caller drops the
     message and counts it (it cannot be answered)
  3. ``op`` is present (CTL_ERR_MISSING_FIELD) and a str (CTL_ERR_MALFORMED)
  4. requests (``REQUEST_OPS``) and replies need an int ``seq``;
     notifications (``NOTIFY_OPS``) need none; any other op -> CTL_ERR_UNKNOWN_OP
  5. every field of ``CTL_FIELDS[op]`` is present (CTL_ERR_MISSING_FIELD) with
     its type (CTL_ERR_MALFORMED); bool is not an int and int is not a bool
  6. optional fields: hello ``vgpu`` is a str; kick/call ``patches`` is a list of
     ``[gpa >= 0, frame_index]`` with ``0 <= frame_index < len(extra frames)``;
     a failed reply (``ok`` false) carries str ``error`` and ``message``
                                                            -> CTL_ERR_MALFORMED

Unknown extra fields are ignored (forward compatibility). Field contents beyond
these types (device indices, addresses, versions) are the receiver's business.
"""

from __future__ import annotations

import msgpack

from pvgpu.spec.wire import (
    CTL_ERR_MALFORMED,
    CTL_ERR_MISSING_FIELD,
    CTL_ERR_UNKNOWN_OP,
    CTL_FIELDS,
    NOTIFY_OPS,
    OP_CALL,
    OP_HELLO,
    OP_KICK,
    OP_REPLY,
    OP_SET_VRING,
    REQUEST_OPS,
)
from pvgpu.transport.errors import TransportError

# Decoder limits for frame 0 (implementation limits of this codec, not wire values:
# a frame that exceeds them is CTL_ERR_MALFORMED). They bound the memory a hostile
# frame 0 can make the unpacker allocate.
MAX_FRAME0_SIZE = 2 << 20
MAX_BIN_LEN = 1 << 20
MAX_STR_LEN = 64 << 10
MAX_ARRAY_LEN = 65536
MAX_MAP_LEN = 256
# Error-reply messages are cut to this many characters (they may quote guest input).
MAX_REPLY_MESSAGE = 1024

# Optional fields with a fixed type (pvgpu.spec.wire documents them in a comment).
_OPTIONAL_FIELDS = {OP_HELLO: (("vgpu", str),), OP_SET_VRING: (("base", int),)}
_PATCH_OPS = (OP_KICK, OP_CALL)


# Extra frames at least this large may travel zero-copy (the sender keeps the memory
# unchanged until the peer has it); smaller ones are copied when the message is built or
# sent, because ring indices and responses change under a queued message.
ZERO_COPY_MIN = 1 << 16


class CodecError(TransportError):
    """A control message that cannot be accepted.

    error:   a pvgpu.spec.wire CTL_ERR_* name, for the error reply
    message: human-readable detail
    seq:     the request's seq if it could be recovered (then the receiver answers
             with reply_error(seq, error, message)), else None (drop and count)
    """

    def __init__(self, error: str, message: str, seq: int | None = None):
        super().__init__(f"{error}: {message}")
        self.error = error
        self.message = message
        self.seq = seq


# msgpack unpacks to exact built-in types only (int, bool, str, list, dict, bytes, float,
# None), so `type(v) is t` is the whole type check: bool is not an int, int not a bool.
_MISSING = object()
_REQUEST, _NOTIFY = 1, 2
_KIND = {**{op: _REQUEST for op in REQUEST_OPS}, OP_REPLY: _REQUEST,
         **{op: _NOTIFY for op in NOTIFY_OPS}}


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def encode(msg: dict, frames=()) -> list:
    """-> [msgpack(msg), *frames]. Extra frames (bytes, memoryview, numpy buffers)
    are passed through untouched; the map refers to them by index (1-based in the
    multipart message, 0-based in `patches`, i.e. index into the extra frames)."""
    return [msgpack.packb(msg, use_bin_type=True), *frames]


def decode(frames) -> tuple:
    """[frame0, *extra] -> (msg: dict, extra_frames: list). Raises CodecError."""
    try:
        raw = frames[0]
        size = len(raw) if isinstance(raw, bytes) else memoryview(raw).nbytes
    except Exception:  # not a non-empty sequence of buffers
        raise CodecError(CTL_ERR_MALFORMED, "no frame 0 (empty or not a buffer)") from None
    if size > MAX_FRAME0_SIZE:
        raise CodecError(CTL_ERR_MALFORMED, f"frame 0 is {size} bytes (max {MAX_FRAME0_SIZE})")
    try:
        msg = msgpack.unpackb(
            raw, raw=False, strict_map_key=True, use_list=True,
            max_bin_len=MAX_BIN_LEN, max_str_len=MAX_STR_LEN,
            max_array_len=MAX_ARRAY_LEN, max_map_len=MAX_MAP_LEN, max_ext_len=MAX_BIN_LEN,
        )
    except Exception as e:  # ValueError/FormatError/StackError/ExtraData/UnicodeDecodeError...
        raise CodecError(CTL_ERR_MALFORMED, f"frame 0 is not valid msgpack: {type(e).__name__}") \
            from None
    if not isinstance(msg, dict):
        raise CodecError(CTL_ERR_MALFORMED, f"frame 0 is a {type(msg).__name__}, not a map")
    extra = list(frames[1:])

    seq = msg.get("seq")
    if type(seq) is not int:
        seq = None
    op = msg.get("op")
    if op is None:
        raise CodecError(CTL_ERR_MISSING_FIELD, "missing field 'op'", seq)
    if type(op) is not str:
        raise CodecError(CTL_ERR_MALFORMED, f"'op' must be a str, got {type(op).__name__}", seq)

    kind = _KIND.get(op)
    if kind is None:
        raise CodecError(CTL_ERR_UNKNOWN_OP, f"unknown op {_short(op)}", seq)
    if kind == _REQUEST and seq is None:
        if "seq" not in msg:
            raise CodecError(CTL_ERR_MISSING_FIELD, f"{op}: missing field 'seq'")
        raise CodecError(CTL_ERR_MALFORMED,
                         f"{op}: 'seq' must be an int, got {type(msg['seq']).__name__}")

    for name, t in CTL_FIELDS[op]:
        v = msg.get(name, _MISSING)
        if type(v) is not t:
            if v is _MISSING:
                raise CodecError(CTL_ERR_MISSING_FIELD, f"{op}: missing field {name!r}", seq)
            raise CodecError(CTL_ERR_MALFORMED,
                             f"{op}: field {name!r} must be {t.__name__}, got {type(v).__name__}",
                             seq)
        if type(v) is int and v < 0:  # CTL-MSG-5: 0 .. 2^64-1 (msgpack holds nothing larger)
            raise CodecError(CTL_ERR_MALFORMED, f"{op}: field {name!r} is {v}, outside 0 .. 2^64-1",
                             seq)
    if op in _PATCH_OPS:
        patches = msg.get("patches", _MISSING)
        if patches is not _MISSING:
            _check_patches(op, patches, len(extra), seq)
    elif op == OP_REPLY:
        if msg["ok"] is False:
            for name in ("error", "message"):
                if type(msg.get(name)) is not str:
                    raise CodecError(CTL_ERR_MALFORMED,
                                     f"failed reply: field {name!r} must be a str", seq)
    elif op in _OPTIONAL_FIELDS:
        for name, t in _OPTIONAL_FIELDS[op]:
            v = msg.get(name, _MISSING)
            if v is _MISSING:
                continue
            if type(v) is not t:
                raise CodecError(CTL_ERR_MALFORMED,
                                 f"{op}: field {name!r} must be {t.__name__}, "
                                 f"got {type(v).__name__}", seq)
            if type(v) is int and v < 0:
                raise CodecError(CTL_ERR_MALFORMED, f"{op}: field {name!r} is {v}, outside "
                                 "0 .. 2^64-1", seq)
    return msg, extra


def _check_patches(op: str, patches, nframes: int, seq) -> None:
    if type(patches) is not list:
        raise CodecError(CTL_ERR_MALFORMED, f"{op}: 'patches' must be a list", seq)
    for i, p in enumerate(patches):
        if type(p) is not list or len(p) != 2:
            raise CodecError(CTL_ERR_MALFORMED,
                             f"{op}: patch {i} must be a [gpa, frame_index] pair", seq)
        gpa, idx = p
        if type(gpa) is not int or gpa < 0:
            raise CodecError(CTL_ERR_MALFORMED,
                             f"{op}: patch {i}: gpa must be an int >= 0, got {_short(gpa)}", seq)
        if type(idx) is not int or not 0 <= idx < nframes:
            raise CodecError(CTL_ERR_MALFORMED,
                             f"{op}: patch {i}: frame index {_short(idx)} out of range "
                             f"({nframes} extra frames)", seq)


def reply_ok(seq: int, **fields) -> dict:
    """{op: reply, seq, ok: true, **fields}"""
    msg = dict(fields)
    msg.update(op=OP_REPLY, seq=seq, ok=True)
    return msg


def reply_error(seq: int, error: str, message: str) -> dict:
    """{op: reply, seq, ok: false, error, message}; message cut to MAX_REPLY_MESSAGE."""
    message = str(message)
    if len(message) > MAX_REPLY_MESSAGE:
        message = message[:MAX_REPLY_MESSAGE - 3] + "..."
    return {"op": OP_REPLY, "seq": seq, "ok": False, "error": error, "message": message}
