"""pvgpu wire constants, version 0.1 — the single source of every number on the wire.

Both sides import from here; no wire number is written anywhere else. Each group
names the clause of spec/pvgpu.md that defines it:

  CTL   control channel (ZeroMQ + msgpack)          spec/pvgpu.md §2
  MEM   guest memory models                         spec/pvgpu.md §3
  VQ    split virtqueue (virtio 1.x §2.7)           spec/pvgpu.md §4
  DEV   device status, features, config, queues     spec/pvgpu.md §5
  CMD   device commands and responses               spec/pvgpu.md §6
  FENCE fences and timelines                        spec/pvgpu.md §7
  KRN   built-in kernel library                     spec/pvgpu.md §8
  ERR   error codes                                 spec/pvgpu.md §9
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# --------------------------------------------------------------------------- CTL
PROTOCOL_VERSION = (0, 1)

# Control operations (frame 0 `op`). Requests carry `seq`; notifications do not.
OP_HELLO = "hello"
OP_GET_FEATURES = "get_features"
OP_SET_FEATURES = "set_features"
OP_GET_STATUS = "get_status"
OP_SET_STATUS = "set_status"
OP_GET_CONFIG = "get_config"
OP_SET_MEM_TABLE = "set_mem_table"
OP_SET_VRING = "set_vring"
OP_ENABLE_VRING = "enable_vring"
OP_PING = "ping"
OP_BYE = "bye"
OP_REPLY = "reply"
# notifications (no seq, no reply)
OP_KICK = "kick"  # driver -> device: available-buffer notification
OP_CALL = "call"  # device -> driver: used-buffer notification
OP_CONFIG_CHANGED = "config_changed"  # device -> driver

REQUEST_OPS = frozenset({
    OP_HELLO, OP_GET_FEATURES, OP_SET_FEATURES, OP_GET_STATUS, OP_SET_STATUS,
    OP_GET_CONFIG, OP_SET_MEM_TABLE, OP_SET_VRING, OP_ENABLE_VRING, OP_PING, OP_BYE,
})
NOTIFY_OPS = frozenset({OP_KICK, OP_CALL, OP_CONFIG_CHANGED})

# Control-channel error names (reply `error`).
CTL_ERR_MALFORMED = "malformed"  # frame 0 not a map, wrong field types, bad frame index
CTL_ERR_UNKNOWN_OP = "unknown_op"
CTL_ERR_MISSING_FIELD = "missing_field"
CTL_ERR_BAD_VERSION = "bad_version"
CTL_ERR_NO_SESSION = "no_session"  # request before hello
CTL_ERR_BAD_DEVICE = "bad_device"
CTL_ERR_BAD_QUEUE = "bad_queue"
CTL_ERR_BAD_STATE = "bad_state"  # op not allowed in the device's current status
CTL_ERR_BAD_FEATURES = "bad_features"
CTL_ERR_BAD_MEMORY = "bad_memory"  # mem table / vring addresses outside guest memory
CTL_ERR_LIMIT = "limit"  # a host limit (guest memory size, sessions) exceeded

# Required fields of each message and their msgpack types (bool is not an int here).
# Optional fields: hello `vgpu` (str); kick/call `patches` (list of [gpa, frame_index],
# frame_index counting from 0 over the frames after frame 0).
CTL_FIELDS = {
    OP_HELLO: (("version", list), ("name", str), ("memory", str), ("mem_size", int)),
    OP_GET_FEATURES: (("dev", int),),
    OP_SET_FEATURES: (("dev", int), ("features", int)),
    OP_GET_STATUS: (("dev", int),),
    OP_SET_STATUS: (("dev", int), ("status", int)),
    OP_GET_CONFIG: (("dev", int),),
    OP_SET_MEM_TABLE: (("regions", list),),  # each region: {gpa, size, name}
    OP_SET_VRING: (("dev", int), ("queue", int), ("size", int), ("desc", int), ("avail", int),
                   ("used", int)),
    OP_ENABLE_VRING: (("dev", int), ("queue", int), ("enable", bool)),
    OP_PING: (),
    OP_BYE: (),
    OP_KICK: (("dev", int), ("queue", int)),
    OP_CALL: (("dev", int), ("queue", int), ("notify", bool)),
    OP_CONFIG_CHANGED: (("dev", int),),
    OP_REPLY: (("ok", bool),),
}

MEMORY_SHARED = "shared"
MEMORY_INLINE = "inline"
MEMORY_MODELS = (MEMORY_SHARED, MEMORY_INLINE)
# Shared model: the hello reply's `mem_challenge` (random bytes) must be found at this gpa
# of the memory set_mem_table names, proving the session's peer controls it.
MEM_CHALLENGE_GPA = 0
MEM_CHALLENGE_SIZE = 32

DEFAULT_HEARTBEAT_MS = 1000
HEARTBEAT_MISSES = 3  # a peer silent for this many periods is gone
DEFAULT_GUEST_MEM_SIZE = 192 << 20
MAX_GUEST_MEM_SIZE = 4 << 30
DEFAULT_ENDPOINT_NAME = "pvgpu.sock"  # under $XDG_RUNTIME_DIR (or the temp dir)

# --------------------------------------------------------------------------- VQ
VIRTQ_DESC_SIZE = 16  # le64 addr, le32 len, le16 flags, le16 next
VIRTQ_DESC_FORMAT = "<QIHH"
VIRTQ_DESC_F_NEXT = 1
VIRTQ_DESC_F_WRITE = 2
VIRTQ_DESC_F_INDIRECT = 4
VIRTQ_AVAIL_F_NO_INTERRUPT = 1
VIRTQ_USED_F_NO_NOTIFY = 1
VIRTQ_USED_ELEM_SIZE = 8  # le32 id, le32 len
VIRTQ_DESC_ALIGN = 16
VIRTQ_AVAIL_ALIGN = 2
VIRTQ_USED_ALIGN = 4
VIRTQ_MAX_SIZE = 32768
VIRTQ_MAX_INDIRECT = 65536  # entries in one indirect table
VIRTQ_MAX_CHAIN_BYTES = 1 << 32


def virtq_desc_table_size(qsize: int) -> int:
    return VIRTQ_DESC_SIZE * qsize


def virtq_avail_size(qsize: int) -> int:
    return 6 + 2 * qsize  # flags, idx, ring[Q], used_event


def virtq_used_size(qsize: int) -> int:
    return 6 + VIRTQ_USED_ELEM_SIZE * qsize  # flags, idx, ring[Q], avail_event


# --------------------------------------------------------------------------- DEV
# Device status (virtio §2.1)
STATUS_ACKNOWLEDGE = 1
STATUS_DRIVER = 2
STATUS_DRIVER_OK = 4
STATUS_FEATURES_OK = 8
STATUS_DEVICE_NEEDS_RESET = 64
STATUS_FAILED = 128

# Feature bits (virtio §6 reserved bits; device-specific bits 0..23)
VIRTIO_F_INDIRECT_DESC = 28
VIRTIO_F_EVENT_IDX = 29
VIRTIO_F_VERSION_1 = 32
PVGPU_F_COMPUTE = 0  # built-in kernel library and LAUNCH
PVGPU_F_CONTEXT_INIT = 1  # ring_idx names a timeline (virtio-gpu CONTEXT_INIT)
PVGPU_F_EVENTQ = 2  # queue 1 is the event queue (spec §5.7)

DEVICE_FEATURES = (
    (1 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_F_INDIRECT_DESC) | (1 << VIRTIO_F_EVENT_IDX)
    | (1 << PVGPU_F_COMPUTE) | (1 << PVGPU_F_CONTEXT_INIT) | (1 << PVGPU_F_EVENTQ)
)
REQUIRED_FEATURES = (1 << VIRTIO_F_VERSION_1)

FEATURE_NAMES = {
    VIRTIO_F_INDIRECT_DESC: "INDIRECT_DESC",
    VIRTIO_F_EVENT_IDX: "EVENT_IDX",
    VIRTIO_F_VERSION_1: "VERSION_1",
    PVGPU_F_COMPUTE: "COMPUTE",
    PVGPU_F_CONTEXT_INIT: "CONTEXT_INIT",
    PVGPU_F_EVENTQ: "EVENTQ",
}

VIRTIO_ID_GPU = 16
CONTROLQ = 0
EVENTQ = 1  # exists only with PVGPU_F_EVENTQ negotiated
NUM_QUEUES = 2
MAX_QUEUE_SIZE = 1024  # the device's limit for set_vring `size`
MAX_RING_IDX = 63

# Device configuration space (get_config `config`, little-endian)
#   le64 vram_size; le32 num_queues; le32 max_queue_size; le32 page_size;
#   le32 max_kernel_args; le32 device_index; le32 reserved; u8 name[32]
CONFIG_FORMAT = "<QIIIIII32s"
CONFIG_SIZE = struct.calcsize(CONFIG_FORMAT)

# --------------------------------------------------------------------------- CMD
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
MAX_EVENTS = 4096  # live event ids per session and device
MAX_EVENT_EXPORTS = 1024  # live exports per session; exporting more withdraws the oldest
STATS_BUFFER_SIZE = 64 << 10  # a writable size a driver may offer GET_STATS (a hint)

# Page-fault access kinds (RESP_ERR_PAGE_FAULT info1)
ACCESS_READ = 1
ACCESS_WRITE = 2
ACCESS_EXEC = 4
ACCESS_NAMES = {ACCESS_READ: "read", ACCESS_WRITE: "write", ACCESS_EXEC: "exec"}

# Event queue (queue EVENTQ, spec §5.7): the driver posts device-writable buffers of at
# least EVTQ_ENTRY_SIZE bytes; the device fills one per event: a control header (type,
# flags, fence_id 0, ctx_id, ring_idx of the failed job's timeline) and this body:
#   le64 seq; le64 timestamp_ns; le64 address; le32 vmid; u8 access; u8 engine; u8 pad[2];
#   le32 missed; le32 detail
EVTQ_PAGE_FAULT = 0x1400  # a job of ctx_id faulted: address/access/vmid/engine name it
EVTQ_CONTEXT_LOST = 0x1401  # ctx_id was lost (its job on `engine` ran past the timeout)
EVTQ_CODE_FAULT = 0x1402  # a code launch of ctx_id faulted: address = the offending record,
# detail = the reason (spec/isa.py COBJ_ERR_*)
EVTQ_NAMES = {EVTQ_PAGE_FAULT: "PAGE_FAULT", EVTQ_CONTEXT_LOST: "CONTEXT_LOST",
              EVTQ_CODE_FAULT: "CODE_FAULT"}
EVTQ_FLAG_MISSED = 1  # events were dropped before this one (`missed` says how many)
EVTQ_BODY_FORMAT = "<QQQIBB2xII"
EVTQ_ENTRY_SIZE = CTRL_HDR_SIZE + struct.calcsize(EVTQ_BODY_FORMAT)  # 64
MAX_PENDING_EVENTS = 64  # events the device keeps while the driver posts no buffer
EVTQ_ENGINE_NAMES = {0: "compute", 1: "copy0", 2: "copy1"}  # EVTQ `engine`

PAGE_SIZE = 4096
# Device virtual address layout of every context (spec §6.3).
VA_USER_BASE = 1 << 32  # MEM_ALLOC addresses start here; VA 0 is never mapped
VA_USER_LIMIT = 0x7F00_0000_0000
# The session's whole guest memory is mapped read/write at GUEST_WINDOW_VA + gpa in every
# context ("mapped host memory"): the copy engine DMAs to and from guest buffers through
# it, and a kernel may take a pointer into it.
GUEST_WINDOW_VA = 0x7F00_0000_0000

# --------------------------------------------------------------------------- KRN
# Argument kinds of built-in kernels; each argument occupies one le64 slot.
ARG_PTR = "ptr"  # a GPU virtual address
ARG_U32 = "u32"  # low 32 bits of the slot
ARG_F32 = "f32"  # IEEE binary32 in the low 32 bits of the slot
# Element types a pointer argument points at (numpy dtype names, little-endian).
ELEM_F32 = "float32"  # IEEE binary32, 4 bytes


@dataclass(frozen=True)
class KernelSignature:
    kernel_id: int
    name: str
    args: tuple  # of (name, kind)
    elem_types: tuple = ()  # of (name, ELEM_*): the element type of each ARG_PTR argument

    def __post_init__(self):
        ptrs = sorted(n for n, kind in self.args if kind == ARG_PTR)
        if sorted(n for n, _ in self.elem_types) != ptrs:
            raise ValueError(f"{self.name}: every pointer argument needs one element type")

    def elem_type(self, arg: str) -> str | None:
        """The element type pointer argument `arg` points at (None for other arguments)."""
        return dict(self.elem_types).get(arg)


def _kernel(kernel_id: int, name: str, args: tuple, elem: str = ELEM_F32) -> KernelSignature:
    """A signature whose pointer arguments all point at `elem` elements."""
    return KernelSignature(kernel_id, name, args,
                           tuple((n, elem) for n, kind in args if kind == ARG_PTR))


KERNEL_FILL = 1
KERNEL_VECTOR_ADD = 2
KERNEL_SAXPY = 3
KERNEL_SCALE = 4
KERNEL_REDUCE_SUM = 5
KERNEL_GEMM = 6
KERNEL_RELU = 7
KERNEL_SOFTMAX = 8
KERNEL_BURN = 9

BUILTIN_KERNELS = {k.kernel_id: k for k in (
    _kernel(KERNEL_FILL, "fill", (("dst", ARG_PTR), ("value", ARG_F32), ("n", ARG_U32))),
    _kernel(KERNEL_VECTOR_ADD, "vector_add",
            (("a", ARG_PTR), ("b", ARG_PTR), ("c", ARG_PTR), ("n", ARG_U32))),
    _kernel(KERNEL_SAXPY, "saxpy",
            (("alpha", ARG_F32), ("x", ARG_PTR), ("y", ARG_PTR), ("n", ARG_U32))),
    _kernel(KERNEL_SCALE, "scale",
            (("dst", ARG_PTR), ("src", ARG_PTR), ("alpha", ARG_F32), ("n", ARG_U32))),
    _kernel(KERNEL_REDUCE_SUM, "reduce_sum", (("src", ARG_PTR), ("dst", ARG_PTR), ("n", ARG_U32))),
    _kernel(KERNEL_GEMM, "gemm",
            (("a", ARG_PTR), ("b", ARG_PTR), ("c", ARG_PTR),
             ("m", ARG_U32), ("n", ARG_U32), ("k", ARG_U32))),
    _kernel(KERNEL_RELU, "relu", (("dst", ARG_PTR), ("src", ARG_PTR), ("n", ARG_U32))),
    _kernel(KERNEL_SOFTMAX, "softmax",
            (("dst", ARG_PTR), ("src", ARG_PTR), ("rows", ARG_U32), ("cols", ARG_U32))),
    _kernel(KERNEL_BURN, "burn", (("microseconds", ARG_U32),)),
)}
KERNELS_BY_NAME = {k.name: k for k in BUILTIN_KERNELS.values()}
# The pointer arguments a built-in kernel writes (the others it only reads): implicit
# synchronisation of shared buffers orders writers and readers by them (spec §12.4).
KERNEL_WRITTEN_ARGS = frozenset({"dst", "c", "y"})
BURN_FOREVER = 0xFFFFFFFF  # burn(microseconds=BURN_FOREVER) runs until the engine is reset


def pack_ctrl_hdr(type_: int, flags: int = 0, fence_id: int = 0, ctx_id: int = 0,
                  ring_idx: int = 0) -> bytes:
    return struct.pack(CTRL_HDR_FORMAT, type_, flags, fence_id, ctx_id, ring_idx)


def unpack_ctrl_hdr(buf) -> tuple:
    """-> (type, flags, fence_id, ctx_id, ring_idx)"""
    return struct.unpack_from(CTRL_HDR_FORMAT, buf, 0)


assert struct.calcsize(CTRL_HDR_FORMAT) == CTRL_HDR_SIZE
assert struct.calcsize(VIRTQ_DESC_FORMAT) == VIRTQ_DESC_SIZE
