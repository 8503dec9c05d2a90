"""VQ: the split virtqueue (spec/pvgpu.md §4, virtio 1.x §2.7): descriptor, avail and used
ring layouts, their flags and alignments, and the sizes of one queue's rings.
"""

from __future__ import annotations

import struct

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



assert struct.calcsize(VIRTQ_DESC_FORMAT) == VIRTQ_DESC_SIZE
