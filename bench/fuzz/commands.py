"""Device-command cases: every command of spec §6.5, built from spec/wire, then mutated.

`Target` is what a session prepared on device 0 (a context, an allocation, an executable
allocation holding a code object compiled from PTX, an event, a shared segment, a VA
reservation, an export), so that the valid instance of each command (`seed`) reaches the
deep checks, not only the first one. `mutate` bends one thing: a body field (to an edge
value of its width), the header's type, flags, fence, context or ring, the length of the
readable part (truncated, padded), the writable part (shorter than MIN_RESPONSE_SIZE, or
none), or bytes of the whole request. Code objects are fuzzed too: a launch of a
bit-flipped or truncated copy of the object (written to executable memory first), and
launches whose parameter bytes disagree with `param_size` or the entry.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from pvgpu.bench.fuzz.values import interesting_int
from pvgpu.spec import isa, wire

HDR = struct.Struct(wire.CTRL_HDR_FORMAT)
COMMANDS = sorted(wire.CMD_BODY_FORMATS)
LAUNCHABLE = sorted(k for k in wire.BUILTIN_KERNELS if k != wire.KERNEL_BURN)
_WIDTH = {"B": 8, "H": 16, "I": 32, "Q": 64, "b": 8, "h": 16, "i": 32, "q": 64}

# The kernel of the code object every session loads: out[i] = i * scale, i < n.
PTX = """
.version 7.0
.target sm_80
.address_size 64

.visible .entry fuzz_store(
    .param .u64 fuzz_store_param_0,
    .param .u32 fuzz_store_param_1,
    .param .u32 fuzz_store_param_2
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [fuzz_store_param_0];
    ld.param.u32 %r1, [fuzz_store_param_1];
    ld.param.u32 %r2, [fuzz_store_param_2];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r6, %r3, %r4, %r5;
    setp.ge.u32 %p1, %r6, %r1;
    @%p1 bra DONE;
    mul.lo.s32 %r7, %r6, %r2;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r6, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.u32 [%rd4], %r7;
DONE:
    ret;
}
"""
PARAM_SIZE = 16  # u64, u32, u32
_code_object = None


def code_object() -> tuple:
    """-> (object bytes, offset of the entry's record): compiled once per process."""
    global _code_object
    if _code_object is None:
        from pvgpu.guest.jit import compile_ptx
        from pvgpu.guest.jit.codeobject import read_code_object
        data = compile_ptx(PTX)
        _code_object = data, read_code_object(data).entry_offset(0)
    return _code_object


def fields(fmt: str) -> list:
    """The scalar fields of a struct format, as (offset, size, char), pads left out."""
    out, off = [], 0
    for count, ch in re.findall(r"(\d*)([xcbBhHiIlLqQfds?])", fmt):
        n = int(count or 1)
        size = struct.calcsize("<" + ch)
        if ch == "s":
            out.append((off, n, "s"))
            off += n
            continue
        for _ in range(n):
            if ch != "x":
                out.append((off, size, ch))
            off += size
    return out


@dataclass
class Target:
    """What the session prepared on device 0 (ids and addresses the seeds refer to)."""

    ctx: int
    va: int  # a 64 KiB allocation, resource REGION_RID
    obj_va: int  # the code object, in executable memory (resource OBJ_RID)
    entry_va: int
    event: int
    shm_id: int
    reservation: int
    export: tuple  # (handle_id, token) of the allocation


REGION_RID, OBJ_RID, REGION_SIZE = 1, 2, 1 << 16


class SetupRefused(Exception):
    """The host refused a set-up command (e.g. out of memory while other guests hold it)."""


def prepare(s) -> Target:
    """Set up the objects the seeds use, with well-formed commands on session `s`."""
    def ok(type_, body=(), ctx=0, extra=b""):
        got = s.command(type_, body, ctx_id=ctx, extra=extra)
        if got is None or wire.is_error_response(got[0][0]):
            code = got and wire.RESP_NAMES.get(got[0][0], hex(got[0][0]))
            raise SetupRefused(f"{wire.CMD_NAMES[type_]}: {code}")
        return got[1]
    ctx = 1
    ok(wire.CMD_CTX_CREATE, (0, b"fuzz"), ctx)
    va, _ = struct.unpack_from(wire.RESP_MEM_ALLOC_FORMAT,
                               ok(wire.CMD_MEM_ALLOC, (REGION_RID, 0, REGION_SIZE), ctx))
    obj, entry_off = code_object()
    obj_va, _ = struct.unpack_from(wire.RESP_MEM_ALLOC_FORMAT, ok(
        wire.CMD_MEM_ALLOC, (OBJ_RID, wire.MEM_ALLOC_FLAG_EXEC, len(obj) + 4096), ctx))
    ok(wire.CMD_COPY_H2D, (obj_va, len(obj)), ctx, obj)
    ok(wire.CMD_EVENT_RECORD, (7,), ctx)
    shm_id = struct.unpack_from(wire.RESP_SHM_FORMAT, ok(wire.CMD_SHM_GET, (0, 8192, 0), ctx))[0]
    reservation = struct.unpack_from(wire.RESP_VA_FORMAT,
                                     ok(wire.CMD_VA_RESERVE, (1 << 20, 0), ctx))[0]
    export = struct.unpack_from(wire.RESP_EXPORT_FORMAT,
                                ok(wire.CMD_RESOURCE_EXPORT, (REGION_RID,), ctx))[:2]
    return Target(ctx, va, obj_va, obj_va + entry_off, 7, shm_id, reservation, tuple(export))


@dataclass
class Command:
    type: int
    body: tuple
    ctx: int
    extra: bytes = b""
    read_back: int = 0
    flags: int = 0
    fence_id: int = 0
    ring_idx: int = 0

    def readable(self) -> bytes:
        return HDR.pack(self.type, self.flags, self.fence_id, self.ctx, self.ring_idx) \
            + struct.pack(wire.CMD_BODY_FORMATS[self.type], *self.body) + self.extra


def _launch_args(t: Target, kernel: int) -> bytes:
    out = b""
    for _name, kind in wire.BUILTIN_KERNELS[kernel].args:
        if kind == wire.ARG_PTR:
            out += struct.pack("<Q", t.va)
        elif kind == wire.ARG_F32:
            out += struct.pack("<f", 1.5) + b"\0" * 4
        else:
            out += struct.pack("<Q", 64)
    return out


def seed(rng, t: Target, type_: int) -> Command:
    """A valid instance of command `type_` against target `t`."""
    C = wire
    ctx = t.ctx
    n = rng.choice((4, 256, 4096))
    if type_ == C.CMD_CTX_CREATE:
        return Command(type_, (rng.randrange(3), b"fuzz-ctx"), rng.randrange(2, 6))
    if type_ == C.CMD_CTX_DESTROY:
        return Command(type_, (), rng.randrange(2, 6))
    if type_ == C.CMD_MEM_ALLOC:
        return Command(type_, (rng.randrange(10, 20), rng.randrange(2),
                               rng.choice((4096, 1 << 20))), ctx)
    if type_ == C.CMD_MEM_FREE:
        return Command(type_, (rng.randrange(10, 20),), ctx)
    if type_ == C.CMD_COPY_H2D:
        pattern = bytes(rng.getrandbits(8) for _ in range(min(n, 64)))
        return Command(type_, (t.va, n), ctx, pattern * (n // len(pattern)))
    if type_ == C.CMD_COPY_D2H:
        return Command(type_, (t.va, n), ctx, read_back=n)
    if type_ == C.CMD_COPY_D2D:
        return Command(type_, (t.va, t.va + REGION_SIZE // 2, n), ctx)
    if type_ == C.CMD_LAUNCH:
        k = rng.choice(LAUNCHABLE)
        args = _launch_args(t, k)
        return Command(type_, (k, 1, 1, 1, 64, 1, 1, len(args) // 8), ctx, args)
    if type_ == C.CMD_LAUNCH_BATCH:
        count = rng.randrange(1, 9)
        records = b""
        for k in (rng.choice(LAUNCHABLE) for _ in range(count)):
            args = _launch_args(t, k)
            records += struct.pack(wire.LAUNCH_RECORD_FORMAT, k, 1, 1, 1, 64, 1, 1,
                                   len(args) // 8) + args
        return Command(type_, (count,), ctx, records)
    if type_ == C.CMD_LAUNCH_CODE:
        params = struct.pack("<QII", t.va, 64, 3)
        return Command(type_, (t.obj_va, t.entry_va, 1, 1, 1, 64, 1, 1, 0, len(params)), ctx,
                       params)
    if type_ in (C.CMD_EVENT_RECORD, C.CMD_EVENT_WAIT, C.CMD_EVENT_QUERY, C.CMD_EVENT_DESTROY,
                 C.CMD_EVENT_EXPORT):
        return Command(type_, (rng.choice((t.event, t.event + 1)),), ctx)
    if type_ == C.CMD_EVENT_IMPORT:
        return Command(type_, (t.event + 2, 1, 0), ctx)
    if type_ == C.CMD_SHM_GET:
        return Command(type_, (rng.choice((0, 42)), 8192, 0), ctx)
    if type_ == C.CMD_SHM_ATTACH:
        return Command(type_, (t.shm_id, rng.randrange(2)), ctx)
    if type_ in (C.CMD_SHM_DETACH, C.CMD_SHM_EXPORT):
        return Command(type_, (t.shm_id,), ctx)
    if type_ == C.CMD_SHM_CONTROL:
        return Command(type_, (t.shm_id, rng.randrange(2)), ctx)
    if type_ == C.CMD_SHM_IMPORT:
        return Command(type_, (1, 0), ctx)
    if type_ == C.CMD_VA_RESERVE:
        return Command(type_, (1 << 16, rng.choice((0, 1 << 16))), ctx)
    if type_ == C.CMD_VA_RELEASE:
        return Command(type_, (t.reservation,), ctx)
    if type_ == C.CMD_MEM_MAP:
        return Command(type_, (t.reservation, 0, 4096, REGION_RID, rng.choice((1, 3))), ctx)
    if type_ == C.CMD_MEM_UNMAP:
        return Command(type_, (t.reservation,), ctx)
    if type_ == C.CMD_RESOURCE_EXPORT:
        return Command(type_, (REGION_RID,), ctx)
    if type_ == C.CMD_RESOURCE_IMPORT:
        return Command(type_, (*t.export, 30, rng.randrange(2)), ctx)
    if type_ == C.CMD_RESOURCE_REVOKE:
        return Command(type_, (t.export[0],), ctx)
    return Command(type_, (), ctx)  # NOP, GET_DEVICE_INFO, GET_STATS, CTX_SYNC


@dataclass
class Case:
    """One device-command case: requests sent first (well-formed), then the fuzzed one."""

    readable: bytes
    writable_len: int
    name: str
    before: tuple = ()  # (readable bytes, writable len) of well-formed requests sent first
    after: tuple = ()  # ... and after (they undo what `before` did)


def _mutate_field(rng, c: Command) -> None:
    fl = fields(wire.CMD_BODY_FORMATS[c.type])
    if not fl:
        return
    i = rng.randrange(len(fl))
    _off, size, ch = fl[i]
    body = list(c.body)
    if ch == "s":
        body[i] = bytes(rng.getrandbits(8) for _ in range(rng.randrange(size + 1)))
    else:
        v = interesting_int(rng, _WIDTH[ch])
        if ch.islower():  # a signed field: reinterpret the bits
            v -= (v >> (_WIDTH[ch] - 1)) << _WIDTH[ch]
        body[i] = v
    c.body = tuple(body)


def mutate(rng, t: Target, c: Command) -> Case:
    kind = rng.randrange(10)
    wlen = wire.MIN_RESPONSE_SIZE + c.read_back
    name = ("field", "field2", "header_type", "header", "truncate", "pad", "writable",
            "flip", "code_object", "params")[kind]
    if kind in (0, 1):
        for _ in range(kind + 1):
            _mutate_field(rng, c)
    elif kind == 2:  # another type over this body: a type confusion, or no such command
        raw = c.readable()
        new = rng.choice((rng.choice(COMMANDS), interesting_int(rng, 32),
                          0x0400 + rng.randrange(256)))
        return Case(struct.pack("<I", new) + raw[4:], wlen, name)
    elif kind == 3:
        which = rng.randrange(4)
        if which == 0:
            c.flags = interesting_int(rng, 32)
        elif which == 1:
            c.flags |= wire.FLAG_FENCE
            c.fence_id = interesting_int(rng, 64)
        elif which == 2:
            c.ctx = interesting_int(rng, 32)
        else:
            c.ring_idx = interesting_int(rng, 8)
    elif kind == 4:
        raw = c.readable()
        return Case(raw[:rng.randrange(len(raw))], wlen, name)
    elif kind == 5:
        return Case(c.readable() + bytes(rng.choice((1, 7, 64, 4096))), wlen, name)
    elif kind == 6:
        wlen = rng.choice((0, 1, wire.CTRL_HDR_SIZE, wire.MIN_RESPONSE_SIZE - 1, 1 << 17))
    elif kind == 7:
        raw = bytearray(c.readable())
        for _ in range(rng.randrange(1, 5)):
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        return Case(bytes(raw), wlen, name)
    elif kind == 8:  # launch a damaged copy of the code object
        obj, _ = code_object()
        bad = bytearray(obj)
        for _ in range(rng.randrange(1, 9)):
            bad[rng.randrange(len(bad))] = rng.getrandbits(8)
        if rng.random() < 0.2:
            bad = bad[:rng.randrange(len(bad))]
        params = struct.pack("<QII", t.va, 64, 3)
        launch = Command(wire.CMD_LAUNCH_CODE,
                         (t.obj_va, t.entry_va, 1, 1, 1, 64, 1, 1, 0, len(params)), t.ctx, params)
        damage = Command(wire.CMD_COPY_H2D, (t.obj_va, len(bad)), t.ctx, bytes(bad))
        restore = Command(wire.CMD_COPY_H2D, (t.obj_va, len(obj)), t.ctx, obj)
        return Case(launch.readable(), wlen, name, ((damage.readable(), wire.MIN_RESPONSE_SIZE),),
                    ((restore.readable(), wire.MIN_RESPONSE_SIZE),))
    else:  # parameter bytes against param_size, the entry and the geometry
        size = rng.choice((0, 1, 8, 12, PARAM_SIZE - 1, PARAM_SIZE + 4, 4096, 4097,
                           interesting_int(rng, 32)))
        given = min(rng.choice((size, PARAM_SIZE, 0)), isa.MAX_PARAM_SIZE + 8)
        grid = [rng.choice((1, 2, interesting_int(rng, 32))) for _ in range(3)] \
            if rng.random() < 0.3 else [1, 1, 1]
        block = [rng.choice((1, 32, 1024, interesting_int(rng, 32))) for _ in range(3)] \
            if rng.random() < 0.3 else [64, 1, 1]
        entry = t.entry_va if rng.random() < 0.8 else t.obj_va + rng.randrange(-64, 4096)
        c = Command(wire.CMD_LAUNCH_CODE, (t.obj_va, entry & (2**64 - 1), *grid, *block,
                                           rng.choice((0, 0, 4096, interesting_int(rng, 32))), size),
                    t.ctx, struct.pack("<QII", t.va, 64, 3).ljust(given, b"\0")[:given])
    return Case(c.readable(), wlen, name)


def fuzz_case(rng, t: Target) -> Case:
    """A seed of a random command, mutated (one case in eight is left valid)."""
    c = seed(rng, t, rng.choice(COMMANDS))
    if rng.random() < 0.125:
        return Case(c.readable(), wire.MIN_RESPONSE_SIZE + c.read_back, "valid")
    return mutate(rng, t, c)
