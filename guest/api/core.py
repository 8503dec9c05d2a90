"""The compute API (the user-mode driver) in one namespace: connections, devices,
contexts, streams, events and device arrays, numpy in, numpy out, in the manner of CuPy /
cuda-python. Each lives in a module named after it (guest/api/connection.py, device.py,
context.py, stream.py, event.py, array.py; launches in launch.py, copies in copy.py, the
connection lock every public call takes in locking.py); this module gathers their public
names for code that reaches them as `guest.api.core.<name>`.
"""

from guest.api.array import DeviceArray, MappedArray, VaRange
from guest.api.commands import ring_command
from guest.api.connection import Connection, connect
from guest.api.context import Context
from guest.api.copy import SMALL_H2D_MAX, STAGING_CHUNK, STAGING_DEPTH, CopyPipeline
from guest.api.device import Device
from guest.api.event import Event, EventHandle
from guest.api.stream import Stream

_cmd = ring_command  # the name bench/copies.py uses

__all__ = ["Connection", "connect", "Device", "Context", "Stream", "Event", "EventHandle",
           "DeviceArray", "MappedArray", "VaRange", "CopyPipeline", "ring_command",
           "STAGING_CHUNK", "STAGING_DEPTH", "SMALL_H2D_MAX"]
