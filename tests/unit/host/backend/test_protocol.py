"""host/backend/protocol.py: typed commands and responses (spec §6.1, §6.2, §6.4, §6.5).

Property tests: every command encodes to exactly the bytes of its wire format
(CMD_BODY_FORMATS) and decodes back to itself, wherever the chain's descriptors split it;
every response encodes to its RESP_*_FORMAT; any byte string decodes to a command or to
the error [CMD-CHECK-1] names, never to anything else. The order of the checks and the
handler table are tested directly."""

import re
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pvgpu.host.backend import commands, protocol
from pvgpu.host.backend.errors import CommandError
from pvgpu.host.backend.protocol import COMMANDS, Header, MalformedCommand, Reader, Writer, decode
from pvgpu.spec import wire
from pvgpu.transport.chain import DescriptorChain
from pvgpu.transport.memory import InlineGuestMemory

MEM = 1 << 16
WRITABLE_AT = 1 << 15

U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)


def _codes(fmt: str) -> list:
    """Struct codes of a body format, pads dropped: "<I4xQQ" -> ["I", "Q", "Q"]."""
    out = []
    for count, code in re.findall(r"(\d*)([a-zA-Z])", fmt):
        if code == "x":
            continue
        out += [count + code] if code == "s" else [code] * int(count or 1)
    return out


def _value(code: str):
    if code == "I":
        return U32
    if code == "Q":
        return U64
    assert code.endswith("s"), code
    return st.binary(max_size=int(code[:-1])).map(lambda b: b.replace(b"\0", b"."))


headers = st.builds(Header, st.just(0), U32, U64, U32, st.integers(0, wire.MAX_RING_IDX))


@st.composite
def commands_of(draw, cls=None):
    cls = cls or draw(st.sampled_from(sorted(COMMANDS.values(), key=lambda c: c.TYPE)))
    values = tuple(draw(_value(c)) for c in _codes(wire.CMD_BODY_FORMATS[cls.TYPE]))
    return cls.from_body(draw(headers)._replace(type=cls.TYPE), values, None), values


@st.composite
def cuts(draw, n):
    """Where the driver splits n readable bytes into descriptors."""
    return sorted(set(draw(st.lists(st.integers(1, max(n - 1, 1)), max_size=4)))) if n > 1 else []


def chain_of(raw: bytes, cut_at=(), writable=wire.MIN_RESPONSE_SIZE):
    """A chain whose readable part is `raw`, split at `cut_at` into descriptors placed
    apart from each other in guest memory, and whose writable part is `writable` bytes."""
    mem = InlineGuestMemory(MEM)
    segments, pos, gpa = [], 0, 0x100
    for end in list(cut_at) + [len(raw)]:
        piece = raw[pos:end]
        if piece:
            mem.write(gpa, piece)
            segments.append((gpa, len(piece)))
            gpa += len(piece) + 0x40  # a gap: the pieces are not contiguous
        pos = end
    writable_segments = [(WRITABLE_AT, writable)] if writable else []
    return DescriptorChain(0, segments, writable_segments), mem


def decode_bytes(raw: bytes, cut_at=(), *, compute=True, batch=True):
    chain, mem = chain_of(raw, cut_at)
    return decode(Reader(chain, mem), compute=compute, batch=batch)


# ------------------------------------------------------------------ commands
@settings(max_examples=300)
@given(st.data())
def test_commands_encode_to_their_wire_format_and_decode_back(data):
    cmd, values = data.draw(commands_of())
    raw = cmd.encode()
    assert raw[:wire.CTRL_HDR_SIZE] == wire.pack_ctrl_hdr(cmd.TYPE, cmd.hdr.flags, cmd.hdr.fence_id,
                                                          cmd.hdr.ctx_id, cmd.hdr.ring_idx)
    assert raw[wire.CTRL_HDR_SIZE:] == struct.pack(wire.CMD_BODY_FORMATS[cmd.TYPE], *values)
    assert len(raw) == wire.CTRL_HDR_SIZE + wire.CMD_BODY_SIZES[cmd.TYPE]
    back = decode_bytes(raw + data.draw(st.binary(max_size=16)), data.draw(cuts(len(raw))))
    assert type(back) is type(cmd) and back == cmd
    assert back.body_values() == values


@given(st.data())
def test_launch_arguments_decode_from_any_split(data):
    # [VQ-DESC-3] a command decodes the same from any split into descriptors
    cmd, _ = data.draw(commands_of(protocol.Launch))
    args = data.draw(st.lists(U64, max_size=wire.MAX_KERNEL_ARGS))
    cmd = protocol.Launch(cmd.hdr, cmd.kernel_id, cmd.grid, cmd.block, len(args))
    raw = cmd.encode(protocol.Launch.pack_args(args))
    back = decode_bytes(raw, data.draw(cuts(len(raw))))
    assert back == cmd and back.args() == args


@given(st.data())
def test_launch_code_parameters_and_h2d_data_come_from_the_chain(data):
    params = data.draw(st.binary(max_size=300))
    cut_at = data.draw(cuts(wire.CTRL_HDR_SIZE + 48 + len(params)))
    lc = protocol.LaunchCode(Header(wire.CMD_LAUNCH_CODE), 1, 2, (1, 1, 1), (1, 1, 1), 0,
                             len(params))
    back = decode_bytes(lc.encode(params), cut_at)
    assert back.carried == len(params) and back.params() == params

    h2d = protocol.CopyH2D(Header(wire.CMD_COPY_H2D), 1 << 32, len(params))
    chain, mem = chain_of(h2d.encode(params), cut_at)
    back = decode(Reader(chain, mem))
    assert b"".join(mem.read(gpa, n) for gpa, n in back.data_extents()) == params


def test_trailing_data_that_is_missing_is_the_error_its_clause_names():
    launch = decode_bytes(protocol.Launch(Header(wire.CMD_LAUNCH), wire.KERNEL_BURN, (1, 1, 1),
                                          (1, 1, 1), 2).encode(struct.pack("<Q", 5)))
    with pytest.raises(CommandError) as e:  # [CMD-LAUNCH-1]
        launch.args()
    assert e.value.resp == wire.RESP_ERR_SHORT_COMMAND
    for nargs in (wire.MAX_KERNEL_ARGS + 1, (1 << 32) - 1):  # nargs is checked before the length
        many = decode_bytes(protocol.Launch(Header(wire.CMD_LAUNCH), wire.KERNEL_BURN, (1, 1, 1),
                                            (1, 1, 1), nargs).encode())
        with pytest.raises(CommandError) as e:
            many.args()
        assert e.value.resp == wire.RESP_ERR_INVALID_PARAMETER
    h2d = decode_bytes(protocol.CopyH2D(Header(wire.CMD_COPY_H2D), 0, 10).encode(bytes(9)))
    with pytest.raises(CommandError) as e:  # [CMD-H2D-1]
        h2d.data_extents()
    assert e.value.resp == wire.RESP_ERR_INVALID_PARAMETER


# ------------------------------------------------------------------ LAUNCH_BATCH
def batch_of(records, count=None) -> bytes:
    """A LAUNCH_BATCH request of `records`: (kernel_id, grid, block, args[, nargs])."""
    body = b""
    for r in records:
        kernel_id, grid, block, args = r[:4]
        nargs = r[4] if len(r) > 4 else len(args)
        body += struct.pack(wire.LAUNCH_RECORD_FORMAT, kernel_id, *grid, *block, nargs)
        body += struct.pack(f"<{len(args)}Q", *args)
    n = len(records) if count is None else count
    return protocol.LaunchBatch(Header(wire.CMD_LAUNCH_BATCH, 0, 0, 1, 2), n).encode(body)


def valid_records():
    kernels = list(wire.BUILTIN_KERNELS.values())
    dims = st.tuples(st.integers(1, 64), st.integers(1, 4), st.integers(1, 2))
    return st.lists(st.tuples(st.sampled_from(kernels), dims, st.sampled_from([1, 32, 256])).flatmap(
        lambda t: st.lists(U64, min_size=len(t[0].args), max_size=len(t[0].args)).map(
            lambda args: (t[0].kernel_id, t[1], (t[2], 1, 1), tuple(args)))),
        min_size=1, max_size=40)


@settings(max_examples=200)
@given(st.data())
def test_a_launch_batch_decodes_its_records_from_any_split(data):
    # [CMD-LAUNCH-BATCH-1] [VQ-DESC-3] records back to back, in any split into descriptors;
    # bytes after the last record are ignored
    records = data.draw(valid_records())
    raw = batch_of(records) + data.draw(st.binary(max_size=16))
    cmd = decode_bytes(raw, data.draw(cuts(len(raw))))
    assert type(cmd) is protocol.LaunchBatch and cmd.count == len(records)
    assert cmd.launches() == records


def _batch_error(raw: bytes) -> CommandError:
    with pytest.raises(CommandError) as e:
        decode_bytes(raw).launches()
    return e.value


def test_a_bad_launch_record_fails_the_batch_with_its_clause_and_index():
    # [CMD-LAUNCH-BATCH-1] [CMD-LAUNCH-BATCH-2]
    fill = (wire.KERNEL_FILL, (1, 1, 1), (256, 1, 1), (0x1000, 0, 256))
    ok = [fill] * 3
    for count in (0, wire.MAX_BATCH_LAUNCHES + 1):
        assert _batch_error(batch_of(ok, count)).resp == wire.RESP_ERR_INVALID_PARAMETER
    cases = [  # the bad record, placed at index 2; its error
        ((999, (1, 1, 1), (1, 1, 1), ()), wire.RESP_ERR_INVALID_KERNEL),
        ((wire.KERNEL_FILL, (1, 1, 1), (256, 1, 1), (0x1000, 0)), wire.RESP_ERR_INVALID_PARAMETER),
        ((wire.KERNEL_FILL, (0, 1, 1), (256, 1, 1), fill[3]), wire.RESP_ERR_INVALID_PARAMETER),
        ((wire.KERNEL_FILL, (1, 1, 1), (2048, 1, 1), fill[3]), wire.RESP_ERR_INVALID_PARAMETER),
        ((wire.KERNEL_FILL, (1, 1, 1), (256, 1, 1), (), wire.MAX_KERNEL_ARGS + 1),
         wire.RESP_ERR_INVALID_PARAMETER),  # nargs before the length, as LAUNCH
        ((wire.KERNEL_FILL, (1, 1, 1), (256, 1, 1), (), (1 << 32) - 1), wire.RESP_ERR_INVALID_PARAMETER),
    ]
    for bad, resp in cases:
        e = _batch_error(batch_of(ok[:2] + [bad] + ok))
        assert (e.resp, e.info0) == (resp, 2), bad
    # the readable part ends inside a record: inside its 32 bytes, or inside its arguments
    whole = batch_of(ok)
    for cut in (1, 8, 31, 32, 40):
        e = _batch_error(whole[:len(whole) - 56 + cut])
        assert (e.resp, e.info0) == (wire.RESP_ERR_SHORT_COMMAND, 2), cut
    assert _batch_error(batch_of(ok, 4)).info0 == 3  # count announces more than it carries


def test_ctx_create_name_stops_at_the_first_nul():
    raw = wire.pack_ctrl_hdr(wire.CMD_CTX_CREATE, 0, 0, 3) + struct.pack("<I32s", 2, b"ab\0cd")
    cmd = decode_bytes(raw)
    assert cmd == protocol.CtxCreate(Header(wire.CMD_CTX_CREATE, 0, 0, 3, 0), 2, b"ab")
    assert cmd.debug_name == "ab"


# ------------------------------------------------------------------ [CMD-CHECK-1] steps 1-4
requests = st.one_of(
    st.binary(max_size=96),
    st.tuples(st.sampled_from(sorted(wire.CMD_BODY_FORMATS) + [0, 0x0499]), U32, U64, U32,
              st.integers(0, 255), st.binary(max_size=72))
    .map(lambda t: wire.pack_ctrl_hdr(*t[:5]) + t[5]))


@settings(max_examples=500)
@given(requests, st.booleans(), st.booleans())
def test_any_bytes_decode_to_a_command_or_the_error_the_checks_name(raw, compute, batch):
    try:
        cmd = decode_bytes(raw, compute=compute, batch=batch)
    except MalformedCommand as e:
        if len(raw) < wire.CTRL_HDR_SIZE:
            assert e.resp == wire.RESP_ERR_SHORT_COMMAND and e.hdr == Header()
            return
        type_, _f, _fid, _ctx, ring_idx = wire.unpack_ctrl_hdr(raw)
        assert e.hdr.type == type_
        if type_ not in wire.CMD_BODY_FORMATS or (
                not compute and type_ in (wire.CMD_LAUNCH, wire.CMD_LAUNCH_CODE,
                                          wire.CMD_LAUNCH_BATCH)) or (
                not batch and type_ == wire.CMD_LAUNCH_BATCH):
            assert e.resp == wire.RESP_ERR_UNKNOWN_COMMAND
        elif len(raw) < wire.CTRL_HDR_SIZE + wire.CMD_BODY_SIZES[type_]:
            assert e.resp == wire.RESP_ERR_SHORT_COMMAND
        else:
            assert e.resp == wire.RESP_ERR_INVALID_PARAMETER and ring_idx > wire.MAX_RING_IDX
        return
    assert cmd.TYPE in wire.CMD_BODY_FORMATS and cmd.hdr.ring_idx <= wire.MAX_RING_IDX
    assert len(raw) >= wire.CTRL_HDR_SIZE + cmd.BODY.size


@pytest.mark.parametrize("type_", sorted(wire.CMD_BODY_FORMATS))
def test_each_short_body_is_a_short_command(type_):
    size = wire.CMD_BODY_SIZES[type_]
    hdr = wire.pack_ctrl_hdr(type_, wire.FLAG_FENCE, 9, 4, 2)
    for n in range(size):
        with pytest.raises(MalformedCommand) as e:
            decode_bytes(hdr + bytes(n))
        assert e.value.resp == wire.RESP_ERR_SHORT_COMMAND
        assert e.value.hdr == Header(type_, wire.FLAG_FENCE, 9, 4, 2)  # echoed ([CMD-RESP-1])
    assert decode_bytes(hdr + bytes(size)).TYPE == type_


def test_unknown_command_comes_before_short_body_and_ring_idx():
    bad_ring = wire.MAX_RING_IDX + 1
    for type_ in (0x0499, wire.CMD_LAUNCH):
        with pytest.raises(MalformedCommand) as e:
            decode_bytes(wire.pack_ctrl_hdr(type_, 0, 0, 1, bad_ring), compute=False)
        assert e.value.resp == wire.RESP_ERR_UNKNOWN_COMMAND
    with pytest.raises(MalformedCommand) as e:  # short body before ring_idx
        decode_bytes(wire.pack_ctrl_hdr(wire.CMD_MEM_FREE, 0, 0, 1, bad_ring))
    assert e.value.resp == wire.RESP_ERR_SHORT_COMMAND
    with pytest.raises(MalformedCommand) as e:
        decode_bytes(wire.pack_ctrl_hdr(wire.CMD_MEM_FREE, 0, 0, 1, bad_ring) + bytes(8))
    assert e.value.resp == wire.RESP_ERR_INVALID_PARAMETER


# ------------------------------------------------------------------ responses
RESPONSES = [protocol.OkDeviceInfo, protocol.OkMemAlloc, protocol.OkEvent,
             protocol.OkEventHandle, protocol.OkShm, protocol.OkShmAttach, protocol.OkShmHandle,
             protocol.OkShmStat, protocol.OkVa, protocol.OkExport, protocol.OkImport]


@st.composite
def responses(draw):
    cls = draw(st.sampled_from(RESPONSES))
    fmt = cls.FORMAT.format
    values = [draw(_value(c)) for c in _codes(fmt)]
    return cls(*values), fmt, values


def _encode(resp, hdr, writable=wire.MIN_RESPONSE_SIZE):
    chain, mem = chain_of(b"", writable=writable)
    used = resp.encode(Writer(chain, mem), hdr)
    return used, mem.read(WRITABLE_AT, writable)


@given(responses(), headers)
def test_responses_encode_to_their_wire_format(r, hdr):
    resp, fmt, values = r
    used, out = _encode(resp, hdr)
    size = struct.calcsize(fmt)
    assert used == wire.CTRL_HDR_SIZE + size
    assert wire.unpack_ctrl_hdr(out)[0] == resp.TYPE
    got = struct.unpack_from(fmt, out, wire.CTRL_HDR_SIZE)
    padded = [v.ljust(int(c[:-1]), b"\0") if isinstance(v, bytes) else v
              for v, c in zip(values, _codes(fmt))]
    assert list(got) == padded


@given(headers.map(lambda h: h._replace(type=wire.CMD_NOP)))
def test_the_response_header_echoes_the_request(hdr):
    """[CMD-RESP-1]."""
    used, out = _encode(protocol.OkNoData(), hdr)
    assert used == wire.CTRL_HDR_SIZE
    fenced = hdr.flags & wire.FLAG_FENCE
    assert wire.unpack_ctrl_hdr(out) == (
        wire.RESP_OK_NODATA, hdr.flags & (wire.FLAG_FENCE | wire.FLAG_INFO_RING_IDX),
        hdr.fence_id if fenced else 0, hdr.ctx_id, hdr.ring_idx)


@given(st.binary(max_size=4000), st.integers(0, 8192))
def test_stats_and_d2h_lengths(payload, copied):
    used, out = _encode(protocol.OkStats(payload), Header(wire.CMD_GET_STATS), writable=4096 + 64)
    (n,) = struct.unpack_from(wire.RESP_STATS_FORMAT, out, wire.CTRL_HDR_SIZE)
    assert n == len(payload) and used == wire.CTRL_HDR_SIZE + wire.RESP_STATS_SIZE + n
    assert out[wire.CTRL_HDR_SIZE + wire.RESP_STATS_SIZE:used] == payload
    used, _ = _encode(protocol.OkNoData(copied=copied), Header(wire.CMD_COPY_D2H))
    assert used == wire.CTRL_HDR_SIZE + copied  # [CMD-D2H-2]


@given(st.sampled_from(sorted(wire.RESP_NAMES)).filter(lambda c: c >= 0x1200), U64, U32,
       st.text(max_size=300), headers)
def test_error_responses_follow_the_error_body(code, info0, info1, message, hdr):
    """[ERR-BODY-1], [ERR-BODY-2]."""
    used, out = _encode(protocol.ErrorResponse.of(CommandError(code, message, info0, info1)), hdr)
    assert wire.unpack_ctrl_hdr(out)[0] == code
    i0, i1, n = struct.unpack_from(wire.RESP_ERROR_FORMAT, out, wire.CTRL_HDR_SIZE)
    assert (i0, i1) == (info0, info1) and n <= wire.MAX_ERROR_MESSAGE
    assert used == wire.CTRL_HDR_SIZE + wire.RESP_ERROR_SIZE + n <= wire.MIN_RESPONSE_SIZE
    start = wire.CTRL_HDR_SIZE + wire.RESP_ERROR_SIZE
    text = out[start:start + n].decode("utf-8")  # cut at a character boundary
    assert message.encode("utf-8", "replace").startswith(text.encode())
    assert n == len(message.encode("utf-8", "replace")) or n > wire.MAX_ERROR_MESSAGE - 4


def test_a_long_error_message_is_cut_between_characters():
    """[ERR-BODY-2]: a 2-byte character across the limit is left out, not cut in half."""
    message = "x" * (wire.MAX_ERROR_MESSAGE - 1) + "\u00e9"
    _used, out = _encode(protocol.ErrorResponse.of(CommandError(wire.RESP_ERR_UNSPEC, message)),
                         Header(wire.CMD_NOP))
    _i0, _i1, n = struct.unpack_from(wire.RESP_ERROR_FORMAT, out, wire.CTRL_HDR_SIZE)
    assert n == wire.MAX_ERROR_MESSAGE - 1


# ------------------------------------------------------------------ handlers
def test_every_command_has_exactly_one_handler():
    assert commands.handles.missing() == []
    with pytest.raises(ValueError):
        commands.handles(protocol.Nop)(lambda *a: None)
    table = protocol.Handlers()
    assert table.missing() == sorted(COMMANDS)


def test_needs_context_follows_the_command_table():
    """The "needs context" column of spec §6.2 ([CMD-CHECK-1] step 5)."""
    without = {wire.CMD_NOP, wire.CMD_GET_DEVICE_INFO, wire.CMD_GET_STATS, wire.CMD_CTX_CREATE,
               wire.CMD_EVENT_QUERY, wire.CMD_EVENT_DESTROY, wire.CMD_EVENT_EXPORT,
               wire.CMD_EVENT_IMPORT, wire.CMD_SHM_GET, wire.CMD_SHM_CONTROL,
               wire.CMD_SHM_EXPORT, wire.CMD_SHM_IMPORT, wire.CMD_RESOURCE_REVOKE}
    assert {t for t, cls in COMMANDS.items() if not cls.NEEDS_CONTEXT} == without
