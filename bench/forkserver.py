"""`pvgpu` hosts and guests forked from a server that has imported them already.

A quick `bench sched` is mostly processes starting: a `pvgpu tenant` spends about half a
second of CPU importing numpy and the guest library before it connects, a `pvgpu host`
as much importing the host, and on a loaded machine that CPU comes in slices of other
processes' time: seconds a run. `Forked(args, log_path)` runs `pvgpu ARGS` in a child of
multiprocessing's forkserver, which imported PRELOAD once: the child is what `python -m
pvgpu ARGS` would be (a session of its own, its output to log_path, its atexit handlers
and exit status), without the imports. `start()` starts the server ahead of the first
child, so that its imports overlap other work. The children are daemonic: a bench that
dies takes them with it. As in any program that uses multiprocessing's forkserver, a
script that calls this runs its own code only under `if __name__ == "__main__":` (a child
imports the main script again; `pvgpu` and `python -m pvgpu` are safe).

The server holds no threads, sockets or zmq contexts (importing creates none), so a
fork of it is as clean as a fresh interpreter.
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import sys

PRELOAD = ["pvgpu.cli", "pvgpu.tenant", "pvgpu.guest", "pvgpu.host.main"]


def _context():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def start() -> None:
    """Start the server now (it imports PRELOAD while the caller goes on)."""
    _context()
    multiprocessing.forkserver.ensure_running()


def _main(args: list, log_path: str) -> None:
    os.setsid()  # as start_new_session=True: a terminal's Ctrl-C reaches the bench only
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    from pvgpu.cli import main
    try:
        code = main(args)
    finally:
        atexit._run_exitfuncs()  # the child ends in os._exit, which would skip them
    sys.exit(code)


class Forked:
    """`pvgpu ARGS` forked from the server; output in `log_path`."""

    def __init__(self, args, log_path: str):
        self.log_path = log_path
        self.process = _context().Process(target=_main, args=(list(args), log_path), daemon=True)
        self.process.start()

    def poll(self) -> int | None:
        """The exit status (-N: killed by signal N), or None while it runs."""
        return self.process.exitcode

    def terminate(self) -> None:
        """SIGTERM, if it still runs (a tenant then finishes its iteration and reports)."""
        if self.process.exitcode is None:
            try:
                os.kill(self.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def reap(self, timeout: float) -> tuple:
        """Wait up to `timeout` s, then SIGKILL. -> (exit status, output)."""
        self.process.join(timeout)
        note = ""
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join()
            note = f"\n[killed after {timeout}s]"
        code = self.process.exitcode if not note else -9
        self.process.close()
        try:
            with open(self.log_path, errors="replace") as f:
                return code, f.read() + note
        except OSError:  # killed before it opened the file
            return code, note
