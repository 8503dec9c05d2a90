"""The host's admin interface (spec/pvgpu.md §13): its endpoint, operations and errors.

Requests and replies are single-frame msgpack maps shaped like control-channel ones:
a request is ``{op, seq, ...}``, a reply ``{op: "reply", seq, ok: true, ...}`` or
``{op: "reply", seq, ok: false, error, message}`` (CTL-ADMIN-3).
"""

ADMIN_DIR_SUFFIX = ".admin"  # the admin directory: the host endpoint's file name + this
ADMIN_ENDPOINT_NAME = "admin.sock"  # the admin socket's file name in that directory
ADMIN_OP_STATS = "stats"  # every device and every session (CTL-ADMIN-4)
ADMIN_OP_TRACE_START = "trace_start"  # record an engine trace to {path} (CTL-ADMIN-6)
ADMIN_OP_TRACE_STOP = "trace_stop"  # stop it and write the file (CTL-ADMIN-6)
ADMIN_OP_TRACE_STATUS = "trace_status"  # whether a trace is recorded, and to where (CTL-ADMIN-6)
ADMIN_ERR_MALFORMED = "malformed"  # not a msgpack map with a str op and an int seq
ADMIN_ERR_UNKNOWN_OP = "unknown_op"  # no handler for this op
ADMIN_ERR_FAILED = "failed"  # the handler could not do it (its message says why)
MAX_ADMIN_REQUEST_SIZE = 64 << 10  # a larger request frame is malformed
