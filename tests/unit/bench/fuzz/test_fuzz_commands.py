"""bench/fuzz/commands.py: a valid instance of every command of spec §6.5 built from
spec/wire, the code object compiled from PTX, and mutations that are a function of their
seed and reach every kind."""

import random
import struct
from collections import Counter

from pvgpu.bench.fuzz import commands
from pvgpu.guest.jit.codeobject import read_code_object
from pvgpu.spec import wire

TARGET = commands.Target(ctx=1, va=1 << 32, obj_va=(1 << 32) + (1 << 16), entry_va=(1 << 32) + (1 << 16) + 96,
                         event=7, shm_id=1, reservation=1 << 40, export=(5, 99))


def test_every_command_has_a_valid_seed():
    assert commands.COMMANDS == sorted(wire.CMD_NAMES)
    for t in commands.COMMANDS:
        c = commands.seed(random.Random(t), TARGET, t)
        raw = c.readable()
        hdr = struct.unpack_from(wire.CTRL_HDR_FORMAT, raw)
        assert hdr[0] == t and len(raw) == wire.CTRL_HDR_SIZE + wire.CMD_BODY_SIZES[t] + len(c.extra)
        if t == wire.CMD_LAUNCH:
            assert c.body[0] != wire.KERNEL_BURN  # a valid case must not run for ever
            assert len(c.extra) == 8 * c.body[-1]


def test_fields_of_every_body_format():
    for fmt in wire.CMD_BODY_FORMATS.values():
        fl = commands.fields(fmt)
        pads = sum(int(n or 1) for n, ch in __import__("re").findall(r"(\d*)(x)", fmt))
        assert sum(size for _o, size, _c in fl) + pads == struct.calcsize(fmt)
    assert [c for _o, _s, c in commands.fields(wire.CMD_BODY_FORMATS[wire.CMD_CTX_CREATE])] == ["I", "s"]


def test_the_code_object_compiles_and_its_entry_is_found():
    obj, entry_off = commands.code_object()
    cobj = read_code_object(obj)
    assert cobj.entry_offset(0) == entry_off and 0 < entry_off < len(obj)
    assert [e.name for e in cobj.entries] == ["fuzz_store"]


def test_cases_are_a_function_of_the_seed_and_reach_every_kind():
    names = Counter()
    for seed in range(800):
        a = commands.fuzz_case(random.Random(seed), TARGET)
        b = commands.fuzz_case(random.Random(seed), TARGET)
        assert a == b
        assert len(a.readable) <= 0x40000 and a.writable_len <= 0x40000
        names[a.name] += 1
    assert set(names) == {"valid", "field", "field2", "header_type", "header", "truncate", "pad",
                          "writable", "flip", "code_object", "params"}


def test_a_damaged_code_object_is_restored_after_its_launch():
    rng = random.Random(0)
    while True:
        case = commands.fuzz_case(rng, TARGET)
        if case.name == "code_object":
            break
    obj, _ = commands.code_object()
    (restore, _n), = case.after
    assert restore.endswith(obj)
    assert struct.unpack_from("<QQ", restore, wire.CTRL_HDR_SIZE) == (TARGET.obj_va, len(obj))
