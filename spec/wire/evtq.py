"""EVTQ: the event queue (spec/pvgpu.md §5.7): the entries the device writes into the
driver's buffers on queue EVENTQ for asynchronous events (page faults, lost contexts,
code faults).
"""

from __future__ import annotations

import struct

from pvgpu.spec.wire.cmd import CTRL_HDR_SIZE

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
