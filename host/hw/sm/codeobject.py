"""Code objects as the device sees them: fetched through the MMU, checked, cached.

A launch names a code object by the VA of its header and an entry by the VA of its entry
record (spec/isa.md COBJ-LAUNCH-1). Before any thread runs, the device

  1. reads the header and then every byte of the object through the context's page
     tables with EXEC permission (COBJ-VALID-1): a page without EXEC is a GPU page fault
     (MmuFault, access ACCESS_EXEC, at that page) and nothing runs;
  2. checks the header (COBJ-LAYOUT-*), the entry record and its parameter records
     (COBJ-ENTRY-1, COBJ-PARAM-1) and every instruction of the entry (ISA-VALID-*,
     host/hw/sm/isa_check.py), COBJ-VALID-2;
  3. checks the launch against the entry (COBJ-VALID-3, in launch.py).

A failed check raises CodeFault(address, reason): `address` is the VA of the first
offending record (the header, the entry record, a parameter record or an instruction),
`reason` a COBJ_ERR_*. The command processor turns it into IRQ_CODE_FAULT.

Validation is cached by the object's bytes (COBJ-VALID-5): ModuleCache keeps, keyed by the
bytes of recently launched objects themselves (a dict lookup hashes them and compares
them whole on a hit, so only identical bytes share a result), the checked header and,
per entry, either the decoded Program (program.py) or the fault it gives, and the
launch shapes (block, dynamic shared memory, parameter bytes) already checked against
an entry. All are stored relative to the object's start, so the same bytes loaded at
another VA reuse them. The object is still read through the MMU at every launch
(COBJ-LOAD-2: the device reads it when the launch starts), into a bytes object (a
plain copy: numpy would release the GIL for it and wait to take it back); only the
checking and decoding are saved. The cache holds at most CACHE_MODULES objects and
CACHE_BYTES bytes of them, least recently used first out.
"""

from __future__ import annotations

import collections
import struct
import threading
from dataclasses import dataclass

import numpy as np

from pvgpu.spec import isa
from pvgpu.spec.kernels import ACCESS_EXEC

CACHE_MODULES = 64
CACHE_BYTES = 256 << 20

_HEADER = struct.Struct(isa.COBJ_HEADER_FORMAT)
_HEAD = struct.Struct(isa.COBJ_HEADER_FORMAT[:6])  # magic, version, flags, size
_ENTRY = struct.Struct(isa.COBJ_ENTRY_FORMAT)
_PARAM = struct.Struct(isa.COBJ_PARAM_FORMAT)


class CodeFault(Exception):
    """A code fault (spec/isa.md COBJ-VALID-4, ISA-OP-6 trap): internal to host/hw."""

    def __init__(self, address: int, reason: int, detail: str = ""):
        name = isa.COBJ_ERR_NAMES.get(reason, reason)
        super().__init__(f"code fault at {address:#x} ({name}){': ' + detail if detail else ''}")
        self.address = address
        self.reason = reason
        self.detail = detail


class _RelFault(Exception):
    """A fault found while checking, at an offset in the object (made a VA by the caller)."""

    def __init__(self, offset: int, reason: int, detail: str):
        super().__init__(detail)
        self.offset = offset
        self.reason = reason
        self.detail = detail

    def at(self, object_va: int) -> CodeFault:
        return CodeFault((object_va + self.offset) & 0xFFFF_FFFF_FFFF_FFFF, self.reason,
                         self.detail)


@dataclass(frozen=True)
class Header:
    fields: dict

    def __getattr__(self, name):
        try:
            return self.fields[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass(frozen=True)
class EntryRecord:
    index: int
    offset: int  # of the record in the object
    name_off: int
    name_len: int
    code_start: int
    code_count: int
    n_r32: int
    n_r64: int
    n_pred: int
    n_params: int
    params_first: int
    param_size: int
    shared_size: int
    local_size: int
    max_threads: int
    flags: int
    reserved: int

    @property
    def block_limit(self) -> int:
        return self.max_threads or isa.MAX_BLOCK_THREADS


def fetch(mmu, vmid: int, object_va: int) -> bytes:
    """Read the whole object with EXEC permission (COBJ-VALID-1) -> a private copy.

    Raises MmuFault (a page without EXEC) or CodeFault (a header too bad to size it)."""
    head = mmu.translate(vmid, object_va, isa.COBJ_HEADER_SIZE, ACCESS_EXEC)
    magic, version, _flags, size = _HEAD.unpack_from(head[0] if len(head) == 1
                                                     else b"".join(head))
    if (magic != isa.COBJ_MAGIC or version != isa.COBJ_VERSION
            or not isa.COBJ_HEADER_SIZE <= size <= isa.COBJ_MAX_SIZE):
        raise CodeFault(object_va, isa.COBJ_ERR_HEADER,
                        f"magic {magic!r} version {version} size {size}")
    return b"".join(mmu.translate(vmid, object_va, size, ACCESS_EXEC))


def check_header(raw: np.ndarray) -> Header:
    """COBJ-LAYOUT-1/2 -> Header; raises _RelFault at offset 0."""
    f = dict(zip(isa.COBJ_HEADER_FIELDS, _HEADER.unpack(raw[:isa.COBJ_HEADER_SIZE].tobytes())))

    def bad(why):
        raise _RelFault(0, isa.COBJ_ERR_HEADER, why)

    if f["magic"] != isa.COBJ_MAGIC or f["version"] != isa.COBJ_VERSION:
        bad("magic or version")
    if f["flags"] or f["reserved"]:
        bad("flags or reserved field not 0")
    size = f["size"]
    if size != raw.shape[0]:
        bad("size")
    sections = [
        ("entries", f["entries_off"], f["entry_count"] * isa.COBJ_ENTRY_SIZE),
        ("params", f["params_off"], f["param_count"] * isa.COBJ_PARAM_SIZE),
        ("symbols", f["symbols_off"], f["symbol_count"] * isa.COBJ_SYMBOL_SIZE),
        ("strtab", f["strtab_off"], f["strtab_size"]),
        ("code", f["code_off"], f["code_count"] * isa.INSTR_SIZE),
        ("data_init", f["data_init_off"], f["data_init_size"]),
        ("const_init", f["const_init_off"], f["const_init_size"]),
    ]
    spans = []
    for name, off, length in sections:
        if length == 0:
            continue  # occupies no bytes: its offset is not checked
        if off % isa.COBJ_ALIGN or off < isa.COBJ_HEADER_SIZE or off + length > size:
            bad(f"{name} section [{off}, +{length}) outside the object or misaligned")
        spans.append((off, off + length, name))
    spans.sort()
    for (_, end, name), (start, _, other) in zip(spans, spans[1:]):
        if start < end:
            bad(f"sections {name} and {other} overlap")
    if f["data_init_size"] > f["data_size"] or f["const_init_size"] > f["const_size"]:
        bad("initialised part larger than its segment")
    if (f["data_size"] == 0 and f["data_va"]) or (f["const_size"] == 0 and f["const_va"]):
        bad("address of an empty segment not 0")
    return Header(f)


def entry_index(header: Header, object_va: int, entry_va: int) -> int:
    """COBJ-VALID-2: the entry address is the address of one record of the entry table."""
    rel = (entry_va - object_va - header.entries_off) & 0xFFFF_FFFF_FFFF_FFFF
    index, rem = divmod(rel, isa.COBJ_ENTRY_SIZE)
    if rem or index >= header.entry_count:
        raise CodeFault(entry_va, isa.COBJ_ERR_ENTRY, "not an entry record of the object")
    return index


def check_entry(raw: np.ndarray, header: Header, index: int) -> EntryRecord:
    """COBJ-ENTRY-1 and COBJ-PARAM-1 -> EntryRecord; raises _RelFault."""
    off = header.entries_off + index * isa.COBJ_ENTRY_SIZE
    values = _ENTRY.unpack(raw[off:off + isa.COBJ_ENTRY_SIZE].tobytes())
    e = EntryRecord(index, off, *values)

    def bad(why, at=off):
        raise _RelFault(at, isa.COBJ_ERR_ENTRY, why)

    if e.name_off + e.name_len > header.strtab_size:
        bad("name outside the string table")
    if e.code_count == 0 or e.code_start + e.code_count > header.code_count:
        bad("code range outside the code section")
    if max(e.n_r32, e.n_r64, e.n_pred) > isa.MAX_REGS:
        bad("too many registers")
    if e.params_first + e.n_params > header.param_count:
        bad("parameters outside the parameter table")
    if e.param_size > isa.MAX_PARAM_SIZE:
        bad("parameter buffer too large")
    if e.shared_size > isa.MAX_SHARED_SIZE:
        bad("static shared memory too large")
    if e.local_size > isa.MAX_LOCAL_SIZE:
        bad("local memory too large")
    if e.max_threads > isa.MAX_BLOCK_THREADS:
        bad("max_threads too large")
    if e.flags or e.reserved:
        bad("flags or reserved field not 0")
    for i in range(e.params_first, e.params_first + e.n_params):
        poff = header.params_off + i * isa.COBJ_PARAM_SIZE
        p_off, p_size, _align, _type = _PARAM.unpack(raw[poff:poff + isa.COBJ_PARAM_SIZE].tobytes())
        if p_off + p_size > e.param_size:  # the device checks only this (COBJ-PARAM-1)
            bad(f"parameter {i - e.params_first} outside the parameter buffer", poff)
    return e


class Module:
    """One checked object (by its bytes): its header and, per entry, Program or fault."""

    MAX_CHECKED = 64  # launch shapes remembered per object (a guest may vary them freely)

    def __init__(self, data: bytes, header: Header | None, fault: _RelFault | None):
        self.raw = np.frombuffer(data, dtype=np.uint8)
        self.size = len(data)
        self.header = header
        self.fault = fault  # the header's fault, if any
        self.entries: dict = {}  # index -> Program or _RelFault
        self.checked: dict = {}  # (entry offset, block, dyn_shared, params_size) -> Program
        self.lock = threading.Lock()


class ModuleCache:
    """Checked and decoded objects by their bytes (COBJ-VALID-5), LRU-bounded."""

    def __init__(self, max_modules: int = CACHE_MODULES, max_bytes: int = CACHE_BYTES):
        self.max_modules = max_modules
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._modules: collections.OrderedDict = collections.OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def module(self, data: bytes) -> Module:
        with self._lock:
            mod = self._modules.get(data)
            if mod is not None:
                self._modules.move_to_end(data)
                self.hits += 1
                return mod
            self.misses += 1
        try:
            header, fault = check_header(np.frombuffer(data, dtype=np.uint8)), None
        except _RelFault as f:
            header, fault = None, f
        mod = Module(data, header, fault)
        with self._lock:
            old = self._modules.pop(data, None)
            if old is not None:
                self._bytes -= old.size
            self._modules[data] = mod
            self._bytes += mod.size
            while len(self._modules) > 1 and (len(self._modules) > self.max_modules
                                              or self._bytes > self.max_bytes):
                _, victim = self._modules.popitem(last=False)
                self._bytes -= victim.size
        return mod

    def __len__(self) -> int:
        return len(self._modules)

    def stats(self) -> dict:
        return {"modules": len(self._modules), "bytes": self._bytes, "hits": self.hits,
                "misses": self.misses}
