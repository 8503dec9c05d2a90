"""Errors of the transport layer.

The split mirrors h11/h2: a *peer* broke the protocol (``VirtqError``: the other side
wrote a malformed ring or chain; ``GuestMemoryError`` from ``apply_patches``: a peer sent
a bad patch) versus *we* were asked to do something impossible by our own caller
(``QueueFull``, ``ChainError`` on an out-of-range read/write of a chain, plain
``ValueError`` for bad arguments).

``VirtqError.clause`` is a short, stable identifier that spec/pvgpu.md cites; the backend
turns it into a failed request or DEVICE_NEEDS_RESET, never into an exception that escapes
a session. Device-side clauses (raised by ``DeviceQueue.pop``):

  VQ-AVAIL-JUMP               avail idx moved by more than Q since the device's last index
  VQ-HEAD-RANGE               head index >= Q
  VQ-NEXT-RANGE               next >= Q (direct) or >= the table's entry count (indirect)
  VQ-LOOP                     chain longer than Q (direct) or the table's entry count
  VQ-INDIRECT-NOT-NEGOTIATED  INDIRECT flag without VIRTIO_F_INDIRECT_DESC
  VQ-INDIRECT-NEXT            INDIRECT together with NEXT
  VQ-INDIRECT-NESTED          INDIRECT inside an indirect table (virtio §2.7.5.3.1)
  VQ-INDIRECT-LEN             table len 0, not a multiple of 16, or > VIRTQ_MAX_INDIRECT entries
  VQ-WRITE-ORDER              a device-readable descriptor after a device-writable one (§2.7.4.2)
  VQ-ADDR-RANGE               a buffer or indirect table outside guest memory
  VQ-CHAIN-LEN                total chain bytes >= 2**32

Driver-side clauses (raised by ``DriverQueue.pop_used``; the device broke the used ring):

  VQ-USED-JUMP                used idx moved by more than the number of chains in flight
  VQ-USED-ID                  a used element whose id is not the head of a chain in flight
  VQ-USED-LEN                 a used element whose len exceeds the chain's writable bytes
"""

from __future__ import annotations

# Device side (DeviceQueue.pop / pvgpu.transport.chain.walk_chain)
VQ_AVAIL_JUMP = "VQ-AVAIL-JUMP"
VQ_HEAD_RANGE = "VQ-HEAD-RANGE"
VQ_NEXT_RANGE = "VQ-NEXT-RANGE"
VQ_LOOP = "VQ-LOOP"
VQ_INDIRECT_NOT_NEGOTIATED = "VQ-INDIRECT-NOT-NEGOTIATED"
VQ_INDIRECT_NEXT = "VQ-INDIRECT-NEXT"
VQ_INDIRECT_NESTED = "VQ-INDIRECT-NESTED"
VQ_INDIRECT_LEN = "VQ-INDIRECT-LEN"
VQ_WRITE_ORDER = "VQ-WRITE-ORDER"
VQ_ADDR_RANGE = "VQ-ADDR-RANGE"
VQ_CHAIN_LEN = "VQ-CHAIN-LEN"
# Driver side (DriverQueue.pop_used)
VQ_USED_JUMP = "VQ-USED-JUMP"
VQ_USED_ID = "VQ-USED-ID"
VQ_USED_LEN = "VQ-USED-LEN"

DEVICE_CLAUSES = frozenset({
    VQ_AVAIL_JUMP, VQ_HEAD_RANGE, VQ_NEXT_RANGE, VQ_LOOP, VQ_INDIRECT_NOT_NEGOTIATED,
    VQ_INDIRECT_NEXT, VQ_INDIRECT_NESTED, VQ_INDIRECT_LEN, VQ_WRITE_ORDER, VQ_ADDR_RANGE,
    VQ_CHAIN_LEN,
})
DRIVER_CLAUSES = frozenset({VQ_USED_JUMP, VQ_USED_ID, VQ_USED_LEN})


class PvgpuError(Exception):
    """Base of every error pvgpu raises on purpose: the guest API's (guest/api/errors.py),
    the frontend's and the transport's. It lives here, on the lowest layer a guest
    application reaches, so that every layer above can derive from it; the guest package
    exports it as `guest.PvgpuError`."""


class TransportError(PvgpuError):
    """Base class of every error the transport raises on purpose."""


class VirtqError(TransportError):
    """The peer wrote a malformed virtqueue or descriptor chain.

    ``clause`` is one of the VQ-* identifiers above; ``message`` says what was wrong;
    ``head`` is the chain's head descriptor index when the avail entry named a valid head
    (the device may then fail just that request with ``add_used(head, 0)``), else None.
    """

    def __init__(self, clause: str, message: str, head: int | None = None):
        super().__init__(f"{clause}: {message}")
        self.clause = clause
        self.message = message
        self.head = head


class VirtqLayoutError(TransportError, ValueError):
    """A queue size or ring address that violates virtio §2.7 (size, alignment, range)."""


class GuestMemoryError(TransportError, ValueError):
    """A guest-physical range outside guest memory, a bad patch, or a shm failure."""


class ChainError(TransportError, ValueError):
    """A read, write or extent request beyond a descriptor chain's readable/writable bytes."""


class QueueFull(TransportError):
    """Not enough free descriptors for the chain; retry after pop_used()."""


class ChannelError(TransportError):
    """The control channel cannot do what was asked (closed, cannot bind, bad reply...)."""


class HostLost(ChannelError):
    """The host is gone: its connection closed, it shut down, or nothing was heard from it
    for HEARTBEAT_MISSES heartbeat periods."""


class HostNotFound(HostLost):
    """No host serves the endpoint: an ipc endpoint whose socket file does not exist.
    Start one with `pvgpu host`, or connect to the endpoint of one that runs."""


class ChannelTimeout(ChannelError, TimeoutError):
    """A wait with an explicit timeout expired (the host is still alive)."""


class AuthenticationFailed(ChannelError):
    """The connection's security handshake failed ([CTL-AUTH-6]): a client key the host
    does not accept, a wrong server key, or CURVE on one side only."""
