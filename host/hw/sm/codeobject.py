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

Validation is cached by the object's bytes (COBJ-VALID-5): ModuleCache keeps, for the
BLAKE2b digest of recently launched objects, the checked header and, per entry, either
the decoded Program (program.py) or the fault it gives. Both are stored relative to the
object's start, so the same bytes loaded at another VA reuse them. The object is still
read through the MMU at every launch (COBJ-LOAD-2: the device reads it when the launch
starts); only the checking and decoding are saved. The cache holds at most
CACHE_MODULES objects and CACHE_BYTES bytes of them, least recently used first out.
"""

from __future__ import annotations

import collections
import hashlib
import struct
import threading
from dataclasses import dataclass

import numpy as np

from pvgpu.spec import isa
from pvgpu.spec.kernels import ACCESS_EXEC

CACHE_MODULES = 64
CACHE_BYTES = 256 << 20

_HEADER = struct.Struct(isa.COBJ_HEADER_FORMAT)
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


def fetch(mmu, vmid: int, object_va: int) -> np.ndarray:
    """Read the whole object with EXEC permission (COBJ-VALID-1) -> a private copy.

    Raises MmuFault (a page without EXEC) or CodeFault (a header too bad to size it)."""
    head = _gather(mmu.translate(vmid, object_va, isa.COBJ_HEADER_SIZE, ACCESS_EXEC))
    fields = dict(zip(isa.COBJ_HEADER_FIELDS, _HEADER.unpack(head.tobytes())))
    size = fields["size"]
    if (fields["magic"] != isa.COBJ_MAGIC or fields["version"] != isa.COBJ_VERSION
            or not isa.COBJ_HEADER_SIZE <= size <= isa.COBJ_MAX_SIZE):
        raise CodeFault(object_va, isa.COBJ_ERR_HEADER,
                        f"magic {fields['magic']!r} version {fields['version']} size {size}")
    return _gather(mmu.translate(vmid, object_va, size, ACCESS_EXEC)).copy()


def _gather(extents: list) -> np.ndarray:
    if len(extents) == 1:
        return extents[0]
    return np.concatenate(extents)


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
    """One checked object (by digest): its header and, per entry, Program or fault."""

    def __init__(self, digest: bytes, size: int, header: Header | None, fault: _RelFault | None):
        self.digest = digest
        self.size = size
        self.header = header
        self.fault = fault  # the header's fault, if any
        self.entries: dict = {}  # index -> Program or _RelFault
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

    def module(self, raw: np.ndarray) -> Module:
        digest = hashlib.blake2b(raw, digest_size=32).digest()
        with self._lock:
            mod = self._modules.get(digest)
            if mod is not None:
                self._modules.move_to_end(digest)
                self.hits += 1
                return mod
            self.misses += 1
        try:
            header, fault = check_header(raw), None
        except _RelFault as f:
            header, fault = None, f
        mod = Module(digest, raw.shape[0], header, fault)
        with self._lock:
            old = self._modules.pop(digest, None)
            if old is not None:
                self._bytes -= old.size
            self._modules[digest] = mod
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
