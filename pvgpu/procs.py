"""Starting and reaping host and guest processes (the demo, the benchmarks and the tests).

Every process started here is killed and reaped by `stop()` / the context manager, even
when the caller fails; readiness is awaited with a deadline, never forever. A host that
exits before it is ready raises HostStartError with the host's own last words.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

from pvgpu.transport.errors import PvgpuError


class HostStartError(PvgpuError, RuntimeError):
    """The host process exited before it was ready; the message ends with its own error."""


def private_endpoint(tag: str = "pvgpu") -> tuple:
    """-> (endpoint, directory) : an ipc endpoint in a fresh private directory."""
    d = tempfile.mkdtemp(prefix=f"{tag}-")
    return f"ipc://{d}/host.sock", d


class HostProcess:
    """`pvgpu host` as a child process."""

    def __init__(self, endpoints, *, vram: str = "256M", heartbeat_ms: int | None = None,
                 extra_args=(), ready_timeout: float = 20.0, log_path: str | None = None):
        self.ready_file = tempfile.mktemp(prefix="pvgpu-ready-")
        args = [sys.executable, "-m", "pvgpu", "host", "--vram", vram, "--ready-file", self.ready_file]
        for ep in endpoints:
            args += ["--listen", ep]
        if endpoints:
            args.append("--no-default")  # a private host: leave the local endpoint alone
        if heartbeat_ms:
            args += ["--heartbeat-ms", str(heartbeat_ms)]
        extra_args = list(extra_args)
        if (any(ep.startswith("tcp://") for ep in endpoints)
                and "--curve-secret-key" not in extra_args):
            args.append("--insecure")  # a local test or benchmark host: tcp on loopback
        args += extra_args
        # without a log file the output still goes somewhere: a failed start quotes it
        self._log = open(log_path, "w+") if log_path else tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.endpoints = self._await_ready(ready_timeout)

    def _await_ready(self, timeout: float) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(self.ready_file):
                with open(self.ready_file) as f:
                    eps = f.read().split()
                os.unlink(self.ready_file)
                return eps
            if self.proc.poll() is not None:
                raise HostStartError(f"the host exited with {self.proc.returncode} before it "
                                     f"was ready: {self._last_words()}")
            time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"host not ready after {timeout}s")

    def _last_words(self) -> str:
        """The last line the host wrote (its error: argparse's, or `pvgpu host: ...`)."""
        self._log.flush()
        self._log.seek(0)
        lines = [line.strip() for line in self._log.read().splitlines() if line.strip()]
        return lines[-1] if lines else "(it wrote nothing)"

    @property
    def endpoint(self) -> str:
        return self.endpoints[0]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after `timeout`; always reaps. -> exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def run_guest(args, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """Run a guest command line (`python -m pvgpu ...`) to completion with a deadline."""
    return subprocess.run([sys.executable, "-m", "pvgpu", *args], capture_output=True, text=True,
                          timeout=timeout)


def spawn_guest(args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pvgpu", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def reap(proc: subprocess.Popen, timeout: float) -> tuple:
    """-> (returncode, output); kills the process if it overruns."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return -9, (out or "") + f"\n[killed after {timeout}s]"
    return proc.returncode, out or ""
