"""`pvgpu trace start FILE | stop | status`: engine traces of a running host, at run time.

The admin endpoint's `trace_start`, `trace_stop` and `trace_status` (spec [CTL-ADMIN-6];
transport/admin.py) start and stop what `pvgpu host --trace FILE` records from the start:
a Chrome/Perfetto trace-event file of what every engine ran. FILE is resolved against
this command's working directory and sent absolute; the host writes it, as the host's
user (who alone may reach the admin socket), when the trace stops, and `stop` returns
once the file is complete. A user error (no host, a trace already running, none to stop,
a file the host cannot write) is one line and a hint on stderr, exit status 2.
"""

from __future__ import annotations

import os
import sys

from pvgpu.spec import wire

STOP_TIMEOUT_S = 120.0  # writing takes about 45 µs a job: seconds for a full trace


def _fail(message: str, hint: str | None = None) -> int:
    print(f"pvgpu trace: {message}", file=sys.stderr)
    if hint:
        print(f"  hint: {hint}", file=sys.stderr)
    return 2


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


def run(action: str, path: str | None = None, endpoint: str | None = None,
        admin_endpoint: str | None = None, out=None) -> int:
    """`pvgpu trace ACTION [FILE]`: -> exit status (0; 2 with one line and a hint)."""
    from pvgpu.smi import SmiError, connect
    from pvgpu.transport.admin import AdminError
    out = out or sys.stdout
    try:
        client = connect(endpoint, admin_endpoint,
                         timeout=STOP_TIMEOUT_S if action == "stop" else 5.0)
    except SmiError as e:
        return _fail(str(e), "a host's admin endpoint is beside its ipc endpoint: "
                             "`pvgpu trace --endpoint ipc://PATH ...`")
    try:
        if action == "start":
            path = os.path.abspath(path)
            try:
                client.request(wire.ADMIN_OP_TRACE_START, path=path)
            except AdminError as e:
                status = client.request(wire.ADMIN_OP_TRACE_STATUS)
                if status["tracing"]:
                    return _fail(e.detail, "`pvgpu trace stop` writes it and ends it")
                return _fail(e.detail, "name a file in a directory the host's user may write")
            out.write(f"pvgpu trace: recording the engines; `pvgpu trace stop` writes {path}\n")
        elif action == "stop":
            try:
                reply = client.request(wire.ADMIN_OP_TRACE_STOP)
            except AdminError as e:
                tracing = client.request(wire.ADMIN_OP_TRACE_STATUS)["tracing"]
                return _fail(e.detail, None if tracing else "`pvgpu trace start FILE` starts one")
            out.write(f"pvgpu trace: wrote {reply['path']} ({_size(reply['size'])}); open it in "
                      "https://ui.perfetto.dev\n")
        else:
            status = client.request(wire.ADMIN_OP_TRACE_STATUS)
            out.write(f"pvgpu trace: recording to {status['path']}\n" if status["tracing"]
                      else "pvgpu trace: not recording\n")
        return 0
    except AdminError as e:  # no answer, or a host without trace operations
        return _fail(e.detail)
    finally:
        client.close()
