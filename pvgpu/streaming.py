"""Streaming copies in the host process: large memcpys use non-temporal stores.

The copy engines move data with numpy, i.e. glibc's memcpy. glibc writes around the CPU
caches (non-temporal stores) only from `glibc.cpu.x86_non_temporal_threshold` bytes on,
which glibc derives from the cache sizes: 192 MiB on the development machine (glibc
2.36, 32 MiB of L3). Below it, a copy that does not fit the caches reads every
destination line before writing it: 16 MiB copied at about half the streaming speed. A
DMA engine writes around the caches too, so the host streams every copy of at least
STREAM_FROM bytes: a copy engine's DMA-lane pieces (host/hw/command_processor.py) are
larger than that.

glibc reads the tunable once, when the process starts: `stream_large_copies()` re-executes
the process (same pid, same command line) with it added to GLIBC_TUNABLES, unless it is
set already (by the user, or by that re-execution). Elsewhere than Linux it does nothing.
"""

from __future__ import annotations

import os
import sys

TUNABLE = "glibc.cpu.x86_non_temporal_threshold"
STREAM_FROM = 1 << 20


def tunables(current: str) -> str | None:
    """GLIBC_TUNABLES with the streaming threshold added, or None if it is set already."""
    if TUNABLE + "=" in current:
        return None
    entry = f"{TUNABLE}={STREAM_FROM:#x}"
    return f"{current}:{entry}" if current else entry


def stream_large_copies() -> None:
    """Re-execute this process with the streaming threshold set (see the module
    docstring); returns only when there is nothing to do."""
    if not sys.platform.startswith("linux"):
        return
    value = tunables(os.environ.get("GLIBC_TUNABLES", ""))
    if value is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, dict(os.environ, GLIBC_TUNABLES=value))
