"""The guest's half of a latency trace: when the driver kicked and when its waits saw their
requests done, on the host's clock.

A host trace (`pvgpu host --trace`, host/kmd/trace.py) stamps each kick when the host's I/O
loop received it and each request when its used entry was written; between the two lies
the guest. With `PVGPU_GUEST_TRACE=FILE` in its environment, a guest session also stamps
each kick it sends and each wait of its that ends with the waited-for requests done, with
CLOCK_MONOTONIC (`time.monotonic_ns`), the clock of the host's trace on the same machine,
and writes them to FILE when the session closes. `python -m pvgpu.trace_latency TRACE
--guest FILE` then splits a request's "completed -> next kick" into the guest seeing the
completion, the guest's own work up to its next kick, and that kick's way through the
transport. A `{name}` in FILE is replaced by the session's name (one file per session).

The file (JSON): {"producer": "pvgpu guest", "session_name": NAME, "clock": "monotonic_ns",
"kicks": [ns, ...], "waits_done": [ns, ...], "dropped": N}. At most MAX_STAMPS of each
are kept (a stamp is about 40 bytes in the session until it closes); later ones are counted
in `dropped`. Without the variable a session keeps no log, and its kicks and waits check
one attribute each.
"""

from __future__ import annotations

import json
import os
import time

ENV = "PVGPU_GUEST_TRACE"
MAX_STAMPS = 1_000_000


class LatencyLog:
    def __init__(self, path: str, session_name: str, max_stamps: int = MAX_STAMPS):
        self.path = path.replace("{name}", session_name)
        self.session_name = session_name
        self.max_stamps = max_stamps
        self.kicks: list[int] = []
        self.waits_done: list[int] = []
        self.dropped = 0

    @classmethod
    def from_env(cls, session_name: str, env=os.environ) -> "LatencyLog | None":
        path = env.get(ENV)
        return cls(path, session_name) if path else None

    def kicked(self) -> None:
        self._stamp(self.kicks)

    def wait_done(self) -> None:
        self._stamp(self.waits_done)

    def _stamp(self, stamps: list) -> None:
        if len(stamps) < self.max_stamps:
            stamps.append(time.monotonic_ns())
        else:
            self.dropped += 1

    def write(self) -> str:
        """Write the log (atomically: a temporary file, then a rename); -> its path."""
        doc = {"producer": "pvgpu guest", "session_name": self.session_name,
               "clock": "monotonic_ns", "kicks": self.kicks, "waits_done": self.waits_done,
               "dropped": self.dropped}
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(tmp, self.path)
        return self.path
