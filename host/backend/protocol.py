"""The control-queue protocol as types (spec §6): commands decoded from a chain, responses
encoded into it, and the table of handlers (crosvm's virtio/gpu/protocol.rs in spirit).

`decode(reader)` turns the readable part of a chain into one `Command` dataclass per
CMD_* code, applying the common checks of [CMD-CHECK-1] that need nothing but the bytes
and the negotiated features (steps 1-4), in the spec's order. A command's trailing data
(LAUNCH arguments, LAUNCH_CODE parameters, COPY_H2D data) stays in the chain until its
handler asks for it through the command's accessors, because the spec checks it only
after the context ([CMD-CHECK-1] step 5, [CMD-LAUNCH-1], [CMD-LAUNCH-CODE-1]).

A handler returns a `Response` (encoded by `Response.encode(writer, hdr)` into the
writable part) or a `Pending` (the response is built once KMD fences signal), or raises
CommandError, which is answered with an `ErrorResponse`. Handlers are registered per
command class with a `Handlers` table used as a decorator.

`Reader` and `Writer` present the two parts of a descriptor chain as byte streams, so
no handler does offset arithmetic over the chain; COPY_H2D data and COPY_D2H results
move by guest-physical extents (DMA), not through bytes read here.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass, field
from typing import Callable, ClassVar, NamedTuple

from pvgpu.host.backend.errors import CommandError
from pvgpu.spec import wire

_HDR = struct.Struct(wire.CTRL_HDR_FORMAT)
_ERR = struct.Struct(wire.RESP_ERROR_FORMAT)
_ARGS = [struct.Struct(f"<{n}Q") for n in range(wire.MAX_KERNEL_ARGS + 1)]
_ECHOED_FLAGS = wire.FLAG_FENCE | wire.FLAG_INFO_RING_IDX  # what a response echoes
_tuple_new = tuple.__new__  # a NamedTuple from a tuple, without its Python-level __new__


# ------------------------------------------------------------------ chain streams
class Reader:
    """The device-readable part of a chain from `offset` on (crosvm's
    descriptor_utils::Reader). `peek` and `extents` look ahead without consuming; `skip`
    consumes. Bytes fetched once are kept, so decoding a command reads guest memory once."""

    __slots__ = ("chain", "mem", "offset", "_buf", "_buf_at")

    def __init__(self, chain, mem, offset: int = 0):
        self.chain = chain
        self.mem = mem
        self.offset = offset
        self._buf = b""
        self._buf_at = 0

    @property
    def available(self) -> int:
        """Readable bytes left."""
        return max(self.chain.readable_len - self.offset, 0)

    def prefetch(self, n: int) -> bytes:
        """Fetch up to n bytes from the current offset (fewer at the chain's end)."""
        left = self.chain.readable_len - self.offset
        if n > left:
            n = max(left, 0)
        self._buf = self.chain.read(self.mem, self.offset, n) if n else b""
        self._buf_at = self.offset
        return self._buf

    def peek(self, n: int) -> bytes:
        """The next n bytes (the caller checked `available`)."""
        rel = self.offset - self._buf_at
        if rel >= 0 and rel + n <= len(self._buf):
            return self._buf[rel:rel + n]
        return self.chain.read(self.mem, self.offset, n) if n else b""

    def skip(self, n: int) -> None:
        self.offset += n

    def extents(self, n: int) -> list:
        """The guest-physical (gpa, len) pieces of the next n bytes."""
        return self.chain.readable_extents(self.offset, n)


class Writer:
    """The device-writable part of a chain: the response from offset 0 and, for COPY_D2H,
    the data right after the response header ([CMD-CHAIN-3], [CMD-CHAIN-5])."""

    __slots__ = ("chain", "mem")

    def __init__(self, chain, mem):
        self.chain = chain
        self.mem = mem

    @property
    def capacity(self) -> int:
        return self.chain.writable_len

    def write(self, data: bytes) -> int:
        return self.chain.write(self.mem, 0, data)

    def data_room(self) -> int:
        """Writable bytes for COPY_D2H data after the response header."""
        return max(self.capacity - wire.CTRL_HDR_SIZE, 0)

    def data_extents(self, n: int) -> list:
        """The guest-physical pieces of the first n data bytes after the response header."""
        return self.chain.writable_extents(wire.CTRL_HDR_SIZE, n)


# ------------------------------------------------------------------ header
class Header(NamedTuple):
    """The 24-byte control header (spec §6.2) of a request."""

    type: int = 0
    flags: int = 0
    fence_id: int = 0
    ctx_id: int = 0
    ring_idx: int = 0

    @property
    def fenced(self) -> bool:
        return bool(self.flags & wire.FLAG_FENCE)

    def encode(self) -> bytes:
        return _HDR.pack(self.type, self.flags, self.fence_id, self.ctx_id, self.ring_idx)

    def response(self, resp_type: int) -> bytes:
        """The header of the response to this request ([CMD-RESP-1])."""
        flags = self.flags
        return _HDR.pack(resp_type, flags & _ECHOED_FLAGS,
                         self.fence_id if flags & wire.FLAG_FENCE else 0, self.ctx_id,
                         self.ring_idx)


class MalformedCommand(CommandError):
    """A request that fails [CMD-CHECK-1] steps 1-4; `hdr` is what the response echoes."""

    def __init__(self, hdr: Header, resp: int, message: str):
        super().__init__(resp, message)
        self.hdr = hdr


# ------------------------------------------------------------------ commands
COMMANDS: dict = {}  # CMD_* code -> Command subclass


def command(type_: int, *, needs_context: bool = False, compute: bool = False,
            batch: bool = False, submits: bool = False):
    """Class decorator: a dataclass for command `type_` whose fields after `hdr` are its
    body fields in wire order (a tuple field takes three le32 values); `submits`: its
    handler submits a GPU job (a launch or a copy). Commands and
    responses are values: nothing changes them after they are made (slots, not frozen,
    which would cost a slow __init__ per command)."""
    def register(cls):
        cls = dataclass(slots=True)(cls)
        cls.TYPE = type_
        cls.BODY = struct.Struct(wire.CMD_BODY_FORMATS[type_])
        cls.NEEDS_CONTEXT = needs_context
        cls.COMPUTE = compute
        cls.BATCH = batch
        cls.SUBMITS = submits
        body = [f for f in dataclasses.fields(cls) if f.name not in ("hdr", "tail")]
        cls.FIELDS = tuple(f.name for f in body)
        cls.TRIPLES = tuple(i for i, f in enumerate(body) if f.type in ("tuple", tuple))
        cls.HAS_TAIL = any(f.name == "tail" for f in dataclasses.fields(cls))
        COMMANDS[type_] = cls
        return cls
    return register


@dataclass(slots=True)
class Command:
    """A decoded request: its header and typed body; `tail` reads what follows the body."""

    TYPE: ClassVar[int]
    BODY: ClassVar[struct.Struct]
    NEEDS_CONTEXT: ClassVar[bool]  # [CMD-CHECK-1] step 5, the "needs context" column
    COMPUTE: ClassVar[bool]  # exists only with PVGPU_F_COMPUTE
    BATCH: ClassVar[bool]  # ... and PVGPU_F_LAUNCH_BATCH
    SUBMITS: ClassVar[bool]  # its handler submits a GPU job
    FIELDS: ClassVar[tuple]  # body field names in wire order
    TRIPLES: ClassVar[tuple]  # indexes of the fields that take three values (grid, block)
    HAS_TAIL: ClassVar[bool]  # data follows the body

    hdr: Header

    @classmethod
    def from_body(cls, hdr: Header, values: tuple, tail: Reader | None) -> "Command":
        if cls.TRIPLES:
            values = list(values)
            for i in cls.TRIPLES:  # ascending: each earlier triple has been folded already
                values[i:i + 3] = [tuple(values[i:i + 3])]
        return cls(hdr, *values, tail) if cls.HAS_TAIL else cls(hdr, *values)

    def body_values(self) -> tuple:
        out = []
        for name in self.FIELDS:
            v = getattr(self, name)
            out += list(v) if isinstance(v, tuple) else [v]
        return tuple(out)

    def encode(self, data: bytes = b"") -> bytes:
        """The readable part a driver sends for this command, `data` after the body."""
        hdr = self.hdr._replace(type=self.TYPE)
        return hdr.encode() + self.BODY.pack(*self.body_values()) + data


@command(wire.CMD_NOP)
class Nop(Command):
    pass


@command(wire.CMD_GET_DEVICE_INFO)
class GetDeviceInfo(Command):
    pass


@command(wire.CMD_GET_STATS)
class GetStats(Command):
    pass


@command(wire.CMD_CTX_CREATE)
class CtxCreate(Command):
    flags: int
    name: bytes  # the debug name up to its first NUL

    @classmethod
    def from_body(cls, hdr, values, tail):
        flags, name = values
        return cls(hdr, flags, name.split(b"\0", 1)[0])

    @property
    def debug_name(self) -> str:
        return self.name.decode("utf-8", "replace")


@command(wire.CMD_CTX_DESTROY, needs_context=True)
class CtxDestroy(Command):
    pass


@command(wire.CMD_CTX_SYNC, needs_context=True)
class CtxSync(Command):
    pass


@command(wire.CMD_MEM_ALLOC, needs_context=True)
class MemAlloc(Command):
    resource_id: int
    flags: int
    size: int


@command(wire.CMD_MEM_FREE, needs_context=True)
class MemFree(Command):
    resource_id: int


@command(wire.CMD_COPY_H2D, needs_context=True, submits=True)
class CopyH2D(Command):
    dst_va: int
    size: int
    tail: Reader | None = field(default=None, compare=False, repr=False)

    def data_extents(self) -> list:
        """The guest-physical pieces of the `size` data bytes ([CMD-H2D-1])."""
        have = self.tail.available if self.tail is not None else 0
        if have < self.size:
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                               f"COPY_H2D of {self.size} bytes carries only {have}")
        return self.tail.extents(self.size)


@command(wire.CMD_COPY_D2H, needs_context=True, submits=True)
class CopyD2H(Command):
    src_va: int
    size: int


@command(wire.CMD_COPY_D2D, needs_context=True, submits=True)
class CopyD2D(Command):
    src_va: int
    dst_va: int
    size: int


@command(wire.CMD_LAUNCH, needs_context=True, compute=True, submits=True)
class Launch(Command):
    kernel_id: int
    grid: tuple
    block: tuple
    nargs: int
    tail: Reader | None = field(default=None, compare=False, repr=False)

    def args(self) -> list:
        """The nargs le64 argument slots ([CMD-LAUNCH-1])."""
        nargs = self.nargs
        have = self.tail.available if self.tail is not None else 0
        raw = self.tail.peek(min(have, nargs * wire.LAUNCH_ARG_SIZE)) if have else b""
        return list(unpack_args(raw, 0, len(raw), nargs))

    @staticmethod
    def pack_args(args) -> bytes:
        return struct.pack(f"<{len(args)}Q", *args)


def unpack_args(raw, pos: int, end: int, nargs: int, record: int | None = None) -> tuple:
    """The `nargs` le64 argument slots of a LAUNCH, or of a LAUNCH_BATCH's launch
    `record`, at raw[pos:end]: the count is checked first, then that the slots are all
    there ([CMD-LAUNCH-1]); raises CommandError."""
    if nargs > wire.MAX_KERNEL_ARGS:
        raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                           f"{_launch_name(record)} has {nargs} arguments "
                           f"(at most {wire.MAX_KERNEL_ARGS})")
    if pos + nargs * wire.LAUNCH_ARG_SIZE > end:
        raise CommandError(wire.RESP_ERR_SHORT_COMMAND,
                           f"{_launch_name(record)} announces {nargs} arguments but carries fewer")
    return _ARGS[nargs].unpack_from(raw, pos)


def _launch_name(record: int | None) -> str:
    return "LAUNCH" if record is None else f"launch record {record}"


def check_launch(kernel_id: int, nargs: int, grid: tuple, block: tuple) -> None:
    """A built-in launch's kernel, argument count and geometry ([CMD-LAUNCH-2],
    [CMD-LAUNCH-3]); raises CommandError."""
    sig = wire.BUILTIN_KERNELS.get(kernel_id)
    if sig is None:
        raise CommandError(wire.RESP_ERR_INVALID_KERNEL, f"no kernel with id {kernel_id}")
    if nargs != len(sig.args):
        raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                           f"kernel {sig.name} takes {len(sig.args)} arguments, got {nargs}")
    check_geometry(grid, block)


_RECORD = struct.Struct(wire.LAUNCH_RECORD_FORMAT)
_MAX_RECORD = wire.LAUNCH_RECORD_SIZE + wire.MAX_KERNEL_ARGS * wire.LAUNCH_ARG_SIZE


@command(wire.CMD_LAUNCH_BATCH, needs_context=True, compute=True, batch=True, submits=True)
class LaunchBatch(Command):
    count: int
    tail: Reader | None = field(default=None, compare=False, repr=False)

    def launches(self) -> list:
        """The `count` launch records as (kernel_id, grid, block, args), each checked as a
        LAUNCH; the first that fails fails the command, `info0` its index
        ([CMD-LAUNCH-BATCH-1], [CMD-LAUNCH-BATCH-2])."""
        count = self.count
        if not 1 <= count <= wire.MAX_BATCH_LAUNCHES:
            raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                               f"LAUNCH_BATCH of {count} launches "
                               f"(1 .. {wire.MAX_BATCH_LAUNCHES})")
        have = self.tail.available if self.tail is not None else 0
        raw = self.tail.peek(min(have, count * _MAX_RECORD)) if have else b""
        out, pos, end = [], 0, len(raw)
        for i in range(count):
            try:
                if pos + _RECORD.size > end:
                    raise CommandError(wire.RESP_ERR_SHORT_COMMAND,
                                       f"the readable part ends inside launch record {i}")
                kernel_id, gx, gy, gz, bx, by, bz, nargs = _RECORD.unpack_from(raw, pos)
                pos += _RECORD.size
                args = unpack_args(raw, pos, end, nargs, i)
                pos += nargs * wire.LAUNCH_ARG_SIZE
                grid, block = (gx, gy, gz), (bx, by, bz)
                check_launch(kernel_id, nargs, grid, block)
            except CommandError as e:
                e.info0 = i
                raise
            out.append((kernel_id, grid, block, args))
        return out


@command(wire.CMD_LAUNCH_CODE, needs_context=True, compute=True, submits=True)
class LaunchCode(Command):
    object_va: int
    entry_va: int
    grid: tuple
    block: tuple
    dyn_shared: int
    param_size: int
    tail: Reader | None = field(default=None, compare=False, repr=False)

    @property
    def carried(self) -> int:
        """Parameter bytes the chain carries after the body."""
        return self.tail.available if self.tail is not None else 0

    def params(self) -> bytes:
        """The param_size parameter bytes (the caller checked `carried`)."""
        return self.tail.peek(self.param_size)


def check_geometry(grid: tuple, block: tuple) -> None:
    """A grid dimension 0 or not less than MAX_GRID_DIM, or a block of 0 or more than
    MAX_BLOCK_THREADS threads -> INVALID_PARAMETER ([CMD-LAUNCH-3], [CMD-LAUNCH-CODE-1])."""
    if min(grid) == 0 or max(grid) >= wire.MAX_GRID_DIM:
        raise CommandError(wire.RESP_ERR_INVALID_PARAMETER, f"bad grid {tuple(grid)}")
    threads = block[0] * block[1] * block[2]
    if threads == 0 or threads > wire.MAX_BLOCK_THREADS:
        raise CommandError(wire.RESP_ERR_INVALID_PARAMETER,
                           f"block {tuple(block)} must have 1..{wire.MAX_BLOCK_THREADS} threads")


@command(wire.CMD_EVENT_RECORD, needs_context=True)
class EventRecord(Command):
    event_id: int


@command(wire.CMD_EVENT_WAIT, needs_context=True)
class EventWait(Command):
    event_id: int


@command(wire.CMD_EVENT_QUERY)
class EventQuery(Command):
    event_id: int


@command(wire.CMD_EVENT_DESTROY)
class EventDestroy(Command):
    event_id: int


@command(wire.CMD_EVENT_EXPORT)
class EventExport(Command):
    event_id: int


@command(wire.CMD_EVENT_IMPORT)
class EventImport(Command):
    event_id: int
    handle_id: int
    token: int


@command(wire.CMD_SHM_GET)
class ShmGet(Command):
    key: int
    size: int
    flags: int


@command(wire.CMD_SHM_ATTACH, needs_context=True)
class ShmAttach(Command):
    shm_id: int
    flags: int


@command(wire.CMD_SHM_DETACH, needs_context=True)
class ShmDetach(Command):
    shm_id: int


@command(wire.CMD_SHM_CONTROL)
class ShmControl(Command):
    shm_id: int
    op: int  # the wire's `cmd` field: SHM_CTL_*


@command(wire.CMD_SHM_EXPORT)
class ShmExport(Command):
    shm_id: int


@command(wire.CMD_SHM_IMPORT)
class ShmImport(Command):
    handle_id: int
    token: int


@command(wire.CMD_VA_RESERVE, needs_context=True)
class VaReserve(Command):
    size: int
    alignment: int


@command(wire.CMD_VA_RELEASE, needs_context=True)
class VaRelease(Command):
    va: int


@command(wire.CMD_MEM_MAP, needs_context=True)
class MemMap(Command):
    va: int
    offset: int
    size: int
    resource_id: int
    flags: int


@command(wire.CMD_MEM_UNMAP, needs_context=True)
class MemUnmap(Command):
    va: int


@command(wire.CMD_RESOURCE_EXPORT, needs_context=True)
class ResourceExport(Command):
    resource_id: int


@command(wire.CMD_RESOURCE_IMPORT, needs_context=True)
class ResourceImport(Command):
    handle_id: int
    token: int
    resource_id: int
    flags: int


@command(wire.CMD_RESOURCE_REVOKE)
class ResourceRevoke(Command):
    handle_id: int


assert set(COMMANDS) == set(wire.CMD_BODY_FORMATS)
# one read of guest memory takes the header, any body and a LAUNCH's arguments
_PREFETCH = (wire.CTRL_HDR_SIZE + max(wire.CMD_BODY_SIZES.values())
             + wire.MAX_KERNEL_ARGS * wire.LAUNCH_ARG_SIZE)


def decode(reader: Reader, *, compute: bool = True, batch: bool = True) -> Command:
    """The request in `reader` -> its Command; raises MalformedCommand for the first of
    [CMD-CHECK-1] steps 1-4 that fails. `compute`: PVGPU_F_COMPUTE was negotiated;
    `batch`: PVGPU_F_LAUNCH_BATCH too."""
    raw = reader.prefetch(_PREFETCH)
    if len(raw) < wire.CTRL_HDR_SIZE:
        raise MalformedCommand(Header(), wire.RESP_ERR_SHORT_COMMAND,
                               f"request of {len(raw)} bytes is shorter than the "
                               f"{wire.CTRL_HDR_SIZE}-byte header")
    hdr = _tuple_new(Header, _HDR.unpack_from(raw))
    cls = COMMANDS.get(hdr.type)
    if cls is None:
        raise MalformedCommand(hdr, wire.RESP_ERR_UNKNOWN_COMMAND,
                               f"unknown command type {hdr.type:#06x}")
    if cls.COMPUTE and not compute:
        raise MalformedCommand(hdr, wire.RESP_ERR_UNKNOWN_COMMAND,
                               f"{wire.CMD_NAMES[hdr.type]} needs PVGPU_F_COMPUTE, which was "
                               "not negotiated")
    if cls.BATCH and not batch:
        raise MalformedCommand(hdr, wire.RESP_ERR_UNKNOWN_COMMAND,
                               f"{wire.CMD_NAMES[hdr.type]} needs PVGPU_F_LAUNCH_BATCH, which "
                               "was not negotiated")
    have = len(raw) - wire.CTRL_HDR_SIZE  # the prefetch covers any body
    if have < cls.BODY.size:
        raise MalformedCommand(hdr, wire.RESP_ERR_SHORT_COMMAND,
                               f"{wire.CMD_NAMES[hdr.type]} needs {cls.BODY.size} body bytes, "
                               f"got {have}")
    if hdr.ring_idx > wire.MAX_RING_IDX:
        raise MalformedCommand(hdr, wire.RESP_ERR_INVALID_PARAMETER,
                               f"ring_idx {hdr.ring_idx} > {wire.MAX_RING_IDX}")
    values = cls.BODY.unpack_from(raw, wire.CTRL_HDR_SIZE)
    reader.offset += wire.CTRL_HDR_SIZE + cls.BODY.size
    return cls.from_body(hdr, values, reader)


# ------------------------------------------------------------------ responses
@dataclass(slots=True)
class Response:
    """A success response: its RESP_OK_* code and body (spec §6.5)."""

    TYPE: ClassVar[int] = wire.RESP_OK_NODATA
    FORMAT: ClassVar[struct.Struct | None] = None
    FIELDS: ClassVar[tuple] = ()  # the body's fields in wire order

    @property
    def type(self) -> int:
        return self.TYPE

    @property
    def data_len(self) -> int:
        """Device-written bytes that follow the response (COPY_D2H)."""
        return 0

    @property
    def body(self) -> bytes:
        if self.FORMAT is None:
            return b""
        return self.FORMAT.pack(*(getattr(self, f) for f in self.FIELDS))

    def encode(self, writer: Writer, hdr: Header) -> int:
        """Write the response to `hdr`'s request; -> the used length ([CMD-CHAIN-5])."""
        out = hdr.response(self.type) + self.body
        writer.write(out)
        return len(out) + self.data_len


def _response(type_: int, fmt: str | None = None):
    def register(cls):
        cls = dataclass(slots=True)(cls)
        cls.TYPE = type_
        cls.type = type_  # a plain class attribute: no property call per response
        cls.FORMAT = struct.Struct(fmt) if fmt is not None else None
        cls.FIELDS = tuple(f.name for f in dataclasses.fields(cls))
        return cls
    return register


@_response(wire.RESP_OK_NODATA)
class OkNoData(Response):
    copied: int = 0  # COPY_D2H: data bytes written after the response header

    body = b""

    @property
    def data_len(self) -> int:
        return self.copied


@_response(wire.RESP_OK_DEVICE_INFO, wire.RESP_DEVICE_INFO_FORMAT)
class OkDeviceInfo(Response):
    vram_size: int
    vram_free: int
    max_alloc: int
    num_contexts: int
    name: bytes


@_response(wire.RESP_OK_MEM_ALLOC, wire.RESP_MEM_ALLOC_FORMAT)
class OkMemAlloc(Response):
    va: int
    size: int


@_response(wire.RESP_OK_EVENT, wire.RESP_EVENT_FORMAT)
class OkEvent(Response):
    status: int
    error: int
    timestamp_ns: int
    info0: int
    info1: int


@_response(wire.RESP_OK_EVENT_HANDLE, wire.RESP_EVENT_HANDLE_FORMAT)
class OkEventHandle(Response):
    handle_id: int
    token: int


@_response(wire.RESP_OK_STATS, wire.RESP_STATS_FORMAT)
class OkStats(Response):
    payload: bytes  # the msgpack map

    @property
    def body(self) -> bytes:
        return self.FORMAT.pack(len(self.payload)) + self.payload


@_response(wire.RESP_OK_SHM, wire.RESP_SHM_FORMAT)
class OkShm(Response):
    shm_id: int
    flags: int
    size: int


@_response(wire.RESP_OK_SHM_ATTACH, wire.RESP_SHM_ATTACH_FORMAT)
class OkShmAttach(Response):
    va: int
    size: int


@_response(wire.RESP_OK_SHM_HANDLE, wire.RESP_SHM_HANDLE_FORMAT)
class OkShmHandle(Response):
    handle_id: int
    token: int


@_response(wire.RESP_OK_SHM_STAT, wire.RESP_SHM_STAT_FORMAT)
class OkShmStat(Response):
    size: int
    va: int
    nattach: int
    flags: int


@_response(wire.RESP_OK_VA, wire.RESP_VA_FORMAT)
class OkVa(Response):
    va: int
    size: int


@_response(wire.RESP_OK_EXPORT, wire.RESP_EXPORT_FORMAT)
class OkExport(Response):
    handle_id: int
    token: int
    size: int


@_response(wire.RESP_OK_IMPORT, wire.RESP_IMPORT_FORMAT)
class OkImport(Response):
    va: int
    size: int
    placement: int


@dataclass(slots=True)
class ErrorResponse(Response):
    """An error response (spec §6.4): RESP_ERR_* code, details and a message."""

    resp: int = wire.RESP_ERR_UNSPEC
    info0: int = 0
    info1: int = 0
    message: str = ""

    @classmethod
    def of(cls, e: CommandError) -> "ErrorResponse":
        return cls(e.resp, e.info0, e.info1, e.message)

    @property
    def type(self) -> int:
        return self.resp

    @property
    def body(self) -> bytes:
        msg = self.message.encode("utf-8", "replace")
        if len(msg) > wire.MAX_ERROR_MESSAGE:  # [ERR-BODY-2]: cut at a character boundary
            msg = msg[:wire.MAX_ERROR_MESSAGE].decode("utf-8", "ignore").encode()
        return _ERR.pack(self.info0 & (2**64 - 1), self.info1 & 0xFFFFFFFF, len(msg)) + msg


@dataclass
class Pending:
    """A command answered later: once every KMD fence in `fences` has signalled, `finish`
    runs on the backend thread and returns the Response (or raises CommandError)."""

    fences: list
    finish: Callable[[], Response]


# ------------------------------------------------------------------ handlers
class Handlers:
    """Command class -> handler; `@handlers(CmdClass)` registers a method
    `handler(self, cmd, ctx, writer) -> Response | Pending` (ctx: the command's context
    when it needs one, else None)."""

    def __init__(self):
        self.by_type: dict = {}  # CMD_* code -> handler

    def __call__(self, cls):
        def register(fn):
            if cls.TYPE in self.by_type:
                raise ValueError(f"a second handler for {wire.CMD_NAMES[cls.TYPE]}")
            self.by_type[cls.TYPE] = fn
            return fn
        return register

    def __getitem__(self, cmd: Command):
        return self.by_type[cmd.TYPE]

    def missing(self) -> list:
        """Command codes without a handler."""
        return sorted(set(COMMANDS) - set(self.by_type))
