"""CMD, FENCE, KRN and ERR: device commands and responses (spec/pvgpu.md §6-§9).

The control header, every command code and body format, every response code and body
format, the errors, the limits a command is checked against, the device virtual-address
layout of a context (§6.3), and the built-in kernel library (§8). The kernel table and the
fault access bits are the hardware's kernel ABI: they live in spec/kernels.py, which the
hardware imports, and are re-exported here because LAUNCH and RESP_ERR_PAGE_FAULT carry
them.
"""

from __future__ import annotations

import struct

from pvgpu.spec.kernels import (ACCESS_EXEC, ACCESS_NAMES, ACCESS_READ, ACCESS_WRITE,  # noqa: F401
                          ARG_F32, ARG_PTR, ARG_U32, BUILTIN_KERNELS, BURN_FOREVER, ELEM_F32,
                          KERNEL_BURN, KERNEL_FILL, KERNEL_GEMM, KERNEL_REDUCE_SUM,
                          KERNEL_RELU, KERNEL_SAXPY, KERNEL_SCALE, KERNEL_SOFTMAX,
                          KERNEL_VECTOR_ADD, KERNEL_WRITTEN_ARGS, KERNELS_BY_NAME,
                          KernelSignature)

CTRL_HDR_FORMAT = "<IIQIB3x"  # type, flags, fence_id, ctx_id, ring_idx, pad[3]
CTRL_HDR_SIZE = 24
FLAG_FENCE = 1
FLAG_INFO_RING_IDX = 2

# Commands: 0x04xx, clear of virtio-gpu's 0x01xx-0x03xx.
CMD_NOP = 0x0400
CMD_GET_DEVICE_INFO = 0x0401
CMD_GET_STATS = 0x0402
CMD_CTX_CREATE = 0x0410
CMD_CTX_DESTROY = 0x0411
# CTX_CREATE flags: bits 0-1 select the scheduling priority of the context's jobs
CTX_FLAG_PRIORITY_MASK = 0x3
CTX_PRIORITY_NORMAL = 0
CTX_PRIORITY_LOW = 1
CTX_PRIORITY_HIGH = 2
CTX_PRIORITY_NAMES = {CTX_PRIORITY_NORMAL: "normal", CTX_PRIORITY_LOW: "low",
                      CTX_PRIORITY_HIGH: "high"}
CMD_CTX_SYNC = 0x0412
CMD_MEM_ALLOC = 0x0420
CMD_MEM_FREE = 0x0421
MEM_ALLOC_FLAG_EXEC = 1  # MEM_ALLOC flags: map the allocation executable too (code objects)
CMD_COPY_H2D = 0x0430
CMD_COPY_D2H = 0x0431
CMD_COPY_D2D = 0x0432
CMD_LAUNCH = 0x0440
CMD_LAUNCH_CODE = 0x0441  # launch an entry of a code object (spec §6.5.32, spec/isa.md)
CMD_LAUNCH_BATCH = 0x0442  # several built-in launches in one request (spec §6.5.33)
CMD_EVENT_RECORD = 0x0450
CMD_EVENT_WAIT = 0x0451
CMD_EVENT_QUERY = 0x0452
CMD_EVENT_DESTROY = 0x0453
CMD_EVENT_EXPORT = 0x0454
CMD_EVENT_IMPORT = 0x0455
# Shared device memory (spec §6.5.19-§6.5.24, §6.6): Gdev's gshmget/gshmat/gshmdt/gshmctl
CMD_SHM_GET = 0x0460
CMD_SHM_ATTACH = 0x0461
CMD_SHM_DETACH = 0x0462
CMD_SHM_CONTROL = 0x0463
CMD_SHM_EXPORT = 0x0464
CMD_SHM_IMPORT = 0x0465
SHM_KEY_PRIVATE = 0  # SHM_GET key 0: always a new segment that no key names (IPC_PRIVATE)
SHM_ATTACH_RDONLY = 1  # SHM_ATTACH flags: map read-only (SHM_RDONLY)
SHM_CTL_RMID = 0  # SHM_CONTROL cmd: mark for removal (IPC_RMID)
SHM_CTL_STAT = 1  # SHM_CONTROL cmd: describe (IPC_STAT); response RESP_SHM_STAT_FORMAT
SHM_FLAG_CREATED = 1  # RESP_OK_SHM flags: this SHM_GET allocated the segment
SHM_STAT_REMOVED = 1  # RESP_OK_SHM_STAT flags: marked for removal
SHM_STAT_CREATOR = 2  # ... this session created it
MAX_SHM_IDS = 1024  # live segment ids per session and device
# Explicit VA management (spec §6.5.25-§6.5.28, §6.7): cuMemAddressReserve / cuMemMap /
# cuMemSetAccess / cuMemUnmap / cuMemAddressFree
CMD_VA_RESERVE = 0x0470
CMD_VA_RELEASE = 0x0471
CMD_MEM_MAP = 0x0472
CMD_MEM_UNMAP = 0x0473
MEM_MAP_ACCESS_READ = 1  # MEM_MAP flags: READ alone (read-only) or READ | WRITE
MEM_MAP_ACCESS_WRITE = 2
MAX_VA_ALIGN = 1 << 30  # the largest VA_RESERVE alignment
MAX_VA_RESERVATIONS = 1024  # live reservations per context
MAX_VA_MAPPINGS = 4096  # live MEM_MAP mappings per context
# Buffer sharing between devices and guests (spec §6.5.29-§6.5.31, §12): DRM PRIME
CMD_RESOURCE_EXPORT = 0x0480
CMD_RESOURCE_IMPORT = 0x0481
CMD_RESOURCE_REVOKE = 0x0482
IMPORT_FLAG_PEER2PEER = 1  # RESOURCE_IMPORT flags: the importer accepts peer-to-peer access
IMPORT_PLACEMENT_LOCAL = 0  # RESP_OK_IMPORT placement: the importing device's own VRAM
IMPORT_PLACEMENT_PEER = 1  # the exporting device's VRAM, through its PCIe BAR (P2P)
IMPORT_PLACEMENT_SYSTEM = 2  # system memory: migrated there, both devices use it there
IMPORT_PLACEMENT_NAMES = {IMPORT_PLACEMENT_LOCAL: "local", IMPORT_PLACEMENT_PEER: "peer",
                          IMPORT_PLACEMENT_SYSTEM: "system"}
MAX_RESOURCE_EXPORTS = 1024  # live exports per session; exporting more withdraws the oldest
MAX_IMPORTS = 1024  # live imports per context

# Responses: OK 0x11xx, errors 0x12xx (virtio-gpu codes kept, compute from 0x1180/0x1280)
RESP_OK_NODATA = 0x1100
RESP_OK_DEVICE_INFO = 0x1180
RESP_OK_MEM_ALLOC = 0x1181
RESP_OK_EVENT = 0x1182
RESP_OK_EVENT_HANDLE = 0x1183
RESP_OK_STATS = 0x1184
RESP_OK_SHM = 0x1190  # SHM_GET, SHM_IMPORT
RESP_OK_SHM_ATTACH = 0x1191
RESP_OK_SHM_HANDLE = 0x1192
RESP_OK_SHM_STAT = 0x1193
RESP_OK_VA = 0x11A0  # VA_RESERVE
RESP_OK_EXPORT = 0x11B0  # RESOURCE_EXPORT
RESP_OK_IMPORT = 0x11B1  # RESOURCE_IMPORT
RESP_ERR_UNSPEC = 0x1200
RESP_ERR_OUT_OF_MEMORY = 0x1201
RESP_ERR_INVALID_RESOURCE_ID = 0x1203
RESP_ERR_INVALID_CONTEXT_ID = 0x1204
RESP_ERR_INVALID_PARAMETER = 0x1205
RESP_ERR_UNKNOWN_COMMAND = 0x1280
RESP_ERR_SHORT_COMMAND = 0x1281
RESP_ERR_PAGE_FAULT = 0x1282
RESP_ERR_INVALID_KERNEL = 0x1283
RESP_ERR_INVALID_ADDRESS = 0x1284  # VA_RELEASE/MEM_MAP/MEM_UNMAP: no such reservation/mapping,
# outside a reservation, overlap (untranslatable addresses of other commands are page faults)
RESP_ERR_DEVICE_LOST = 0x1285  # reserved for recovery (later versions)
RESP_ERR_CONTEXT_LOST = 0x1286  # the context was found guilty of a hang; it takes no more work
RESP_ERR_JOB_TIMEOUT = 0x1287  # the job ran past the host's timeout and was stopped
RESP_ERR_INVALID_EVENT = 0x1288  # event id 0 or unknown; export handle unknown or wrong token
RESP_ERR_INVALID_SEGMENT = 0x1289  # shared segment id unknown, removed, or not attached here
RESP_ERR_PERMISSION = 0x128A  # not the segment's creator; SHM_IMPORT handle/token not valid
RESP_ERR_ILLEGAL_CODE = 0x128B  # LAUNCH_CODE: the device refused the code object or the
# launch (info0 = VA of the offending record, info1 = the reason, spec/isa.py COBJ_ERR_*)
RESP_ERR_LIMIT = 0x128C  # a per-session or per-context count of spec §10.3 reached

RESP_NAMES = {
    RESP_OK_NODATA: "OK_NODATA",
    RESP_OK_DEVICE_INFO: "OK_DEVICE_INFO",
    RESP_OK_MEM_ALLOC: "OK_MEM_ALLOC",
    RESP_OK_EVENT: "OK_EVENT",
    RESP_OK_EVENT_HANDLE: "OK_EVENT_HANDLE",
    RESP_OK_STATS: "OK_STATS",
    RESP_OK_SHM: "OK_SHM",
    RESP_OK_SHM_ATTACH: "OK_SHM_ATTACH",
    RESP_OK_SHM_HANDLE: "OK_SHM_HANDLE",
    RESP_OK_SHM_STAT: "OK_SHM_STAT",
    RESP_OK_VA: "OK_VA",
    RESP_OK_EXPORT: "OK_EXPORT",
    RESP_OK_IMPORT: "OK_IMPORT",
    RESP_ERR_UNSPEC: "ERR_UNSPEC",
    RESP_ERR_OUT_OF_MEMORY: "ERR_OUT_OF_MEMORY",
    RESP_ERR_INVALID_RESOURCE_ID: "ERR_INVALID_RESOURCE_ID",
    RESP_ERR_INVALID_CONTEXT_ID: "ERR_INVALID_CONTEXT_ID",
    RESP_ERR_INVALID_PARAMETER: "ERR_INVALID_PARAMETER",
    RESP_ERR_UNKNOWN_COMMAND: "ERR_UNKNOWN_COMMAND",
    RESP_ERR_SHORT_COMMAND: "ERR_SHORT_COMMAND",
    RESP_ERR_PAGE_FAULT: "ERR_PAGE_FAULT",
    RESP_ERR_INVALID_KERNEL: "ERR_INVALID_KERNEL",
    RESP_ERR_INVALID_ADDRESS: "ERR_INVALID_ADDRESS",
    RESP_ERR_DEVICE_LOST: "ERR_DEVICE_LOST",
    RESP_ERR_CONTEXT_LOST: "ERR_CONTEXT_LOST",
    RESP_ERR_JOB_TIMEOUT: "ERR_JOB_TIMEOUT",
    RESP_ERR_INVALID_EVENT: "ERR_INVALID_EVENT",
    RESP_ERR_INVALID_SEGMENT: "ERR_INVALID_SEGMENT",
    RESP_ERR_PERMISSION: "ERR_PERMISSION",
    RESP_ERR_ILLEGAL_CODE: "ERR_ILLEGAL_CODE",
    RESP_ERR_LIMIT: "ERR_LIMIT",
}


def is_error_response(resp_type: int) -> bool:
    return 0x1200 <= resp_type <= 0x12FF


# Command bodies (after the 24-byte header). Field names in the spec tables.
CMD_BODY_FORMATS = {
    CMD_NOP: "<",
    CMD_GET_DEVICE_INFO: "<",
    CMD_GET_STATS: "<",  # response: RESP_STATS_FORMAT, then the msgpack map
    CMD_CTX_CREATE: "<I32s",  # flags (CTX_FLAG_*), debug name
    CMD_CTX_DESTROY: "<",
    CMD_CTX_SYNC: "<",
    CMD_MEM_ALLOC: "<IIQ",  # resource_id, flags (0), size
    CMD_MEM_FREE: "<I4x",  # resource_id
    CMD_COPY_H2D: "<QQ",  # dst_va, size; data: the rest of the readable part
    CMD_COPY_D2H: "<QQ",  # src_va, size; data: the writable part after the response
    CMD_COPY_D2D: "<QQQ",  # src_va, dst_va, size
    CMD_LAUNCH: "<I3I3II",  # kernel_id, grid[3], block[3], nargs; then nargs x le64 args
    # object_va, entry_va, grid[3], block[3], dyn_shared, param_size; then param_size bytes
    CMD_LAUNCH_CODE: "<QQ3I3III",
    CMD_LAUNCH_BATCH: "<I4x",  # count; then count launch records (LAUNCH_RECORD_FORMAT + args)
    CMD_EVENT_RECORD: "<I4x",  # event_id
    CMD_EVENT_WAIT: "<I4x",  # event_id
    CMD_EVENT_QUERY: "<I4x",  # event_id; response RESP_EVENT_FORMAT
    CMD_EVENT_DESTROY: "<I4x",  # event_id
    CMD_EVENT_EXPORT: "<I4x",  # event_id; response RESP_EVENT_HANDLE_FORMAT
    CMD_EVENT_IMPORT: "<I4xQQ",  # event_id, handle_id, token
    CMD_SHM_GET: "<QQI4x",  # key, size, flags (0); response RESP_SHM_FORMAT
    CMD_SHM_ATTACH: "<II",  # shm_id, flags (SHM_ATTACH_*); response RESP_SHM_ATTACH_FORMAT
    CMD_SHM_DETACH: "<I4x",  # shm_id
    CMD_SHM_CONTROL: "<II",  # shm_id, cmd (SHM_CTL_*)
    CMD_SHM_EXPORT: "<I4x",  # shm_id; response RESP_SHM_HANDLE_FORMAT
    CMD_SHM_IMPORT: "<QQ",  # handle_id, token; response RESP_SHM_FORMAT
    CMD_VA_RESERVE: "<QQ",  # size, alignment (0: PAGE_SIZE); response RESP_VA_FORMAT
    CMD_VA_RELEASE: "<Q",  # va (of the reservation)
    CMD_MEM_MAP: "<QQQII",  # va, offset, size, resource_id, flags (MEM_MAP_ACCESS_*)
    CMD_MEM_UNMAP: "<Q",  # va (of the mapping)
    CMD_RESOURCE_EXPORT: "<I4x",  # resource_id; response RESP_EXPORT_FORMAT
    CMD_RESOURCE_IMPORT: "<QQII",  # handle_id, token, resource_id, flags (IMPORT_FLAG_*)
    CMD_RESOURCE_REVOKE: "<Q",  # handle_id
}
CMD_BODY_SIZES = {k: struct.calcsize(v) for k, v in CMD_BODY_FORMATS.items()}
CMD_NAMES = {
    CMD_NOP: "NOP",
    CMD_GET_DEVICE_INFO: "GET_DEVICE_INFO",
    CMD_GET_STATS: "GET_STATS",
    CMD_CTX_CREATE: "CTX_CREATE",
    CMD_CTX_DESTROY: "CTX_DESTROY",
    CMD_CTX_SYNC: "CTX_SYNC",
    CMD_MEM_ALLOC: "MEM_ALLOC",
    CMD_MEM_FREE: "MEM_FREE",
    CMD_COPY_H2D: "COPY_H2D",
    CMD_COPY_D2H: "COPY_D2H",
    CMD_COPY_D2D: "COPY_D2D",
    CMD_LAUNCH: "LAUNCH",
    CMD_LAUNCH_CODE: "LAUNCH_CODE",
    CMD_LAUNCH_BATCH: "LAUNCH_BATCH",
    CMD_EVENT_RECORD: "EVENT_RECORD",
    CMD_EVENT_WAIT: "EVENT_WAIT",
    CMD_EVENT_QUERY: "EVENT_QUERY",
    CMD_EVENT_DESTROY: "EVENT_DESTROY",
    CMD_EVENT_EXPORT: "EVENT_EXPORT",
    CMD_EVENT_IMPORT: "EVENT_IMPORT",
    CMD_SHM_GET: "SHM_GET",
    CMD_SHM_ATTACH: "SHM_ATTACH",
    CMD_SHM_DETACH: "SHM_DETACH",
    CMD_SHM_CONTROL: "SHM_CONTROL",
    CMD_SHM_EXPORT: "SHM_EXPORT",
    CMD_SHM_IMPORT: "SHM_IMPORT",
    CMD_VA_RESERVE: "VA_RESERVE",
    CMD_VA_RELEASE: "VA_RELEASE",
    CMD_MEM_MAP: "MEM_MAP",
    CMD_MEM_UNMAP: "MEM_UNMAP",
    CMD_RESOURCE_EXPORT: "RESOURCE_EXPORT",
    CMD_RESOURCE_IMPORT: "RESOURCE_IMPORT",
    CMD_RESOURCE_REVOKE: "RESOURCE_REVOKE",
}
LAUNCH_ARG_SIZE = 8
MAX_KERNEL_ARGS = 16
MAX_GRID_DIM = 1 << 31
MAX_BLOCK_THREADS = 1024
# a LAUNCH_BATCH record: a LAUNCH body, then its nargs x le64 args (spec §6.5.33)
LAUNCH_RECORD_FORMAT = CMD_BODY_FORMATS[CMD_LAUNCH]
LAUNCH_RECORD_SIZE = struct.calcsize(LAUNCH_RECORD_FORMAT)
MAX_BATCH_LAUNCHES = 256  # records in one LAUNCH_BATCH
# LAUNCH_CODE's limits on parameter bytes and shared memory are spec/isa.py's
# MAX_PARAM_SIZE and MAX_DYNAMIC_SHARED (the ISA's numbers live there)

# Response bodies (after the 24-byte header).
RESP_DEVICE_INFO_FORMAT = "<QQQI4x32s"  # vram_size, vram_free, max_alloc, num_contexts, name
RESP_MEM_ALLOC_FORMAT = "<QQ"  # va, size (rounded to pages)
# status, error (a RESP_ERR_* code or 0), timestamp_ns, info0, info1 (of the error)
RESP_EVENT_FORMAT = "<IIQQI4x"
RESP_EVENT_HANDLE_FORMAT = "<QQ"  # handle_id, token
RESP_SHM_FORMAT = "<IIQ"  # shm_id, flags (SHM_FLAG_*), size (rounded to pages)
RESP_SHM_ATTACH_FORMAT = "<QQ"  # va, size
RESP_SHM_HANDLE_FORMAT = "<QQ"  # handle_id, token
RESP_SHM_STAT_FORMAT = "<QQII"  # size, va (in hdr.ctx_id, or 0), nattach, flags (SHM_STAT_*)
RESP_VA_FORMAT = "<QQ"  # va, size (rounded to pages) of a VA_RESERVE
RESP_EXPORT_FORMAT = "<QQQ"  # handle_id, token, size (rounded to pages)
RESP_IMPORT_FORMAT = "<QQI4x"  # va, size, placement (IMPORT_PLACEMENT_*)
RESP_STATS_FORMAT = "<I4x"  # length of the msgpack map that follows the body
RESP_STATS_SIZE = struct.calcsize(RESP_STATS_FORMAT)
RESP_ERROR_FORMAT = "<QII"  # info0 (e.g. fault address), info1 (e.g. access), message_len
RESP_ERROR_SIZE = struct.calcsize(RESP_ERROR_FORMAT)
MAX_ERROR_MESSAGE = 200
# Every request chain offers at least this many writable bytes for its response.
MIN_RESPONSE_SIZE = CTRL_HDR_SIZE + RESP_ERROR_SIZE + MAX_ERROR_MESSAGE

# EVENT_QUERY status (RESP_EVENT_FORMAT `status`)
EVENT_STATUS_PENDING = 0  # some captured work has not completed
EVENT_STATUS_COMPLETE = 1  # all captured work completed without error
EVENT_STATUS_ERROR = 2  # all captured work completed; some of it failed (`error`, info0/1)
EVENT_STATUS_NAMES = {EVENT_STATUS_PENDING: "pending", EVENT_STATUS_COMPLETE: "complete",
                      EVENT_STATUS_ERROR: "error"}
# Per-session limits (spec §10.3); reaching one is RESP_ERR_LIMIT
MAX_CONTEXTS = 32  # live contexts per session and device
MAX_EVENTS = 4096  # live event ids per session and device
MAX_EVENT_EXPORTS = 1024  # live exports per session; exporting more withdraws the oldest
STATS_BUFFER_SIZE = 64 << 10  # a writable size a driver may offer GET_STATS (a hint)

PAGE_SIZE = 4096
# Device virtual address layout of every context (spec §6.3).
VA_USER_BASE = 1 << 32  # MEM_ALLOC addresses start here; VA 0 is never mapped
VA_USER_LIMIT = 0x7F00_0000_0000
# The session's whole guest memory is mapped read/write at GUEST_WINDOW_VA + gpa in every
# context ("mapped host memory"): the copy engine DMAs to and from guest buffers through
# it, and a kernel may take a pointer into it.
GUEST_WINDOW_VA = 0x7F00_0000_0000


def pack_ctrl_hdr(type_: int, flags: int = 0, fence_id: int = 0, ctx_id: int = 0,
                  ring_idx: int = 0) -> bytes:
    return struct.pack(CTRL_HDR_FORMAT, type_, flags, fence_id, ctx_id, ring_idx)


def unpack_ctrl_hdr(buf) -> tuple:
    """-> (type, flags, fence_id, ctx_id, ring_idx)"""
    return struct.unpack_from(CTRL_HDR_FORMAT, buf, 0)


assert struct.calcsize(CTRL_HDR_FORMAT) == CTRL_HDR_SIZE
