"""The host's admin interface (spec §13): every device and every session, for the host's user.

`AdminService` serves the admin endpoint (transport/admin.py: a socket in a 0700
directory, its own thread) with a registry of operations. Built in: `stats`
([CTL-ADMIN-4]). Another part of the host adds one with

    server.admin.register("trace-start", handler)

where ``handler(request: dict) -> dict`` gets the request map (its own fields beside
`op` and `seq`) and returns the reply's fields; it runs on the admin thread, never on
the guest I/O loop, so it must only read the loop's state or take the locks the engines
take; it raises pvgpu.transport.admin.AdminRequestError(message) to answer `failed`.
"""

from __future__ import annotations

import os
import time

from pvgpu.spec import wire
from pvgpu.host.backend.stats import session_usage
from pvgpu.host.hw.regs import ENGINE_NAMES
from pvgpu.transport.admin import AdminServer


class AdminService:
    """The admin operations of one host (HostServer), served on `endpoint`."""

    def __init__(self, server, endpoint: str):
        self.server = server
        self.started = time.monotonic()
        self.handlers = {wire.ADMIN_OP_STATS: self.stats}
        self._admin = AdminServer(endpoint, self.handlers)
        self.endpoint = endpoint

    def register(self, op: str, handler) -> None:
        """Serve admin requests `op` with handler(request) -> reply fields (see above)."""
        if op in self.handlers:
            raise ValueError(f"admin operation {op!r} is already registered")
        self.handlers[op] = handler

    def stats(self, _request=None) -> dict:
        """The `stats` reply ([CTL-ADMIN-4]): `host`, `devices` (each device's full
        statistics: GET_STATS's map before CMD-STATS-4 takes the other sessions away,
        with `name` and `vram_size`) and `sessions` (every live session: `id`, `name`,
        `peer`, `key`, `vgpu`, `memory`, and per device what session_usage says)."""
        try:
            return self._stats()
        except RuntimeError:  # the I/O loop changed a dict while it was copied: once more
            return self._stats()

    def _stats(self) -> dict:
        server = self.server
        devices = []
        for kmd in server.kmds:
            d = dict(kmd.sched_stats())
            d.update(device=kmd.index, name=kmd.name, vram_size=kmd.vram_size)
            devices.append(d)
        sessions = []
        for session in list(server.backend.sessions.values()):
            if session.closed:
                continue
            usage = []
            for dev in list(session.devices):
                compute = dev.compute  # None until the device is initialised, or after a reset
                if compute is not None:
                    usage.append(session_usage(compute, devices[dev.index]["mem"]["contexts"],
                                               ENGINE_NAMES))
            sessions.append({"id": session.sid, "name": session.name,
                             "peer": session.peer_credentials, "key": session.key,
                             "vgpu": session.vgpu.name if session.vgpu is not None else "default",
                             "memory": session.memory, "mem_size": session.mem_size,
                             "devices": usage})
        return {"host": {"pid": os.getpid(), "endpoints": list(server.endpoints),
                         "uptime_s": round(time.monotonic() - self.started, 3)},
                "devices": devices, "sessions": sessions}

    def close(self) -> None:
        self._admin.close()
