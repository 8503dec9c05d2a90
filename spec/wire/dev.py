"""DEV: the device (spec/pvgpu.md §5): its id, status bits, feature bits, queues and
configuration space.
"""

from __future__ import annotations

import struct

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
PVGPU_F_LAUNCH_BATCH = 3  # CMD_LAUNCH_BATCH (spec §6.5.33)

DEVICE_FEATURES = (
    (1 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_F_INDIRECT_DESC) | (1 << VIRTIO_F_EVENT_IDX)
    | (1 << PVGPU_F_COMPUTE) | (1 << PVGPU_F_CONTEXT_INIT) | (1 << PVGPU_F_EVENTQ)
    | (1 << PVGPU_F_LAUNCH_BATCH)
)
REQUIRED_FEATURES = (1 << VIRTIO_F_VERSION_1)

FEATURE_NAMES = {
    VIRTIO_F_INDIRECT_DESC: "INDIRECT_DESC",
    VIRTIO_F_EVENT_IDX: "EVENT_IDX",
    VIRTIO_F_VERSION_1: "VERSION_1",
    PVGPU_F_COMPUTE: "COMPUTE",
    PVGPU_F_CONTEXT_INIT: "CONTEXT_INIT",
    PVGPU_F_EVENTQ: "EVENTQ",
    PVGPU_F_LAUNCH_BATCH: "LAUNCH_BATCH",
}

# A device type of pvgpu's own, not virtio-gpu's 16 (spec §5.1): virtio-pci would carry
# it as PCI device 0x1040 + 0xB0 = 1af4:10f0, the first of QEMU's experimental IDs.
VIRTIO_ID_PVGPU = 0xB0
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
