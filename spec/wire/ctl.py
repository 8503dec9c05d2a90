"""CTL and MEM: the control channel (spec/pvgpu.md §2) and the guest-memory models (§3).

ZeroMQ ROUTER/DEALER messages whose frame 0 is a msgpack map: the operations, their
required fields, the error names of a reply, heartbeats; and the two ways a session's
guest memory reaches the host.
"""

from __future__ import annotations

PROTOCOL_VERSION = (0, 2)

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
OP_SHUTDOWN = "shutdown"  # host -> driver: the host is stopping; the session ends (CTL-BYE-2)

REQUEST_OPS = frozenset({
    OP_HELLO, OP_GET_FEATURES, OP_SET_FEATURES, OP_GET_STATUS, OP_SET_STATUS,
    OP_GET_CONFIG, OP_SET_MEM_TABLE, OP_SET_VRING, OP_ENABLE_VRING, OP_PING, OP_BYE,
})
NOTIFY_OPS = frozenset({OP_KICK, OP_CALL, OP_CONFIG_CHANGED, OP_SHUTDOWN})

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
CTL_FIELDS: dict[str, tuple[tuple[str, type], ...]] = {
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
    OP_SHUTDOWN: (("reason", str),),
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
SHUTDOWN_LINGER_MS = 1000  # how long a stopping host lets its `shutdown` notices leave
DEFAULT_GUEST_MEM_SIZE = 192 << 20
MAX_GUEST_MEM_SIZE = 4 << 30
MAX_SESSIONS = 256  # live sessions per host; hello beyond it: CTL_ERR_LIMIT (spec §10.3)
DEFAULT_ENDPOINT_NAME = "pvgpu.sock"  # under $XDG_RUNTIME_DIR (or the temp dir)

