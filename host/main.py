"""The host backend process: emulated GPUs, their KMDs, the virtio backend and the I/O loop.

The loop is single-threaded and thin: it waits on the ROUTER sockets and on a wakeup
pipe that engine threads write when a fence signals, hands messages to the sans-IO
`Backend`, and sends what it returns. Heartbeat expiry runs on a timer; a connection the
channel sees close has its session reclaimed at once. SIGINT/SIGTERM stop it cleanly:
every session is sent `shutdown` (spec [CTL-BYE-2]), then sessions are reclaimed, engines
stopped, and the sockets closed once the notices have left (SHUTDOWN_LINGER_MS at most).
With CURVE keys (spec §2.13) SIGHUP re-reads the authorized-keys directory on the loop's
next turn and closes the sessions of keys no longer listed. The admin endpoint (spec §13,
host/admin.py) is served by a thread of its own, beside the loop, never in it.

Engine traces (`pvgpu host --trace FILE`, or start_trace/stop_trace at run time): the
devices record what their engines ran in memory (host/kmd/trace.py), and stop_trace(), or
the shutdown after SIGINT/SIGTERM, writes the Chrome/Perfetto trace file. A host killed
with SIGKILL writes nothing: the records die with the process.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from pvgpu.spec import wire
from pvgpu.host.backend.session import Backend
from pvgpu.host.hw.gpu import Platform
from pvgpu.host.hw.pcie import DEFAULT_LAYOUT
from pvgpu.host.config import SchedConfig
from pvgpu.host.kmd.device import KmdDevice
from pvgpu.host.admin import AdminService
from pvgpu.transport.admin import default_admin_endpoint
from pvgpu.host.kmd.trace import TraceError, TraceRecorder
from pvgpu.transport.channel import HostChannel, default_endpoint

log = logging.getLogger("pvgpu.host")

DEFAULT_VRAM = 1 << 30


class HostServer:
    def __init__(self, endpoints=None, *, vram_size: int = DEFAULT_VRAM, num_gpus: int = 2,
                 heartbeat_ms: int = wire.DEFAULT_HEARTBEAT_MS,
                 max_mem_size: int = wire.MAX_GUEST_MEM_SIZE, sched: SchedConfig | None = None,
                 max_evicted_bytes: int | None = None, topology: str = DEFAULT_LAYOUT,
                 curve=None, admin_endpoint: str | None = None):
        """`admin_endpoint`: where the admin interface listens (spec §13); None: beside
        the first ipc endpoint ([CTL-ADMIN-2]), or nowhere if the host serves only tcp."""
        self.sched = (sched or SchedConfig()).validate()
        self.platform = Platform(num_gpus=num_gpus, vram_size=vram_size, topology=topology)
        # max_evicted_bytes: host memory for BOs evicted from VRAM (None: the KMD's 2x VRAM)
        self.kmds = [KmdDevice(gpu, **self.sched.kmd_kwargs(), max_evicted_bytes=max_evicted_bytes)
                     for gpu in self.platform.gpus]
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.backend = Backend(self.kmds, heartbeat_ms=heartbeat_ms, max_mem_size=max_mem_size,
                               wakeup=self._wakeup, vgpus=self.sched.vgpus)
        self.channel = HostChannel(list(endpoints or [default_endpoint()]), curve=curve)
        self.backend.credentials = self.channel.peer_credentials
        self.admin = None
        if admin_endpoint is None:
            admin_endpoint = default_admin_endpoint(self.channel.endpoints)
        if admin_endpoint is not None:
            try:
                self.admin = AdminService(self, admin_endpoint)
            except BaseException:
                self.channel.close()
                os.close(self._wake_r)
                os.close(self._wake_w)
                raise
        self._stop = False
        self._reload_keys = False
        self._trace = None  # (TraceRecorder, path) while a trace is recorded
        self._trace_writers = []  # threads of stop_trace(background=True)
        self.stop_reason = "stopped"  # the `shutdown` notices' reason

    @property
    def endpoints(self):
        return self.channel.endpoints

    def _wakeup(self) -> None:
        # Called from engine threads after they queued a completion. Always write: a
        # "wakeup already pending" flag races with the loop draining the pipe and can
        # swallow a wakeup (the loop then sleeps until its timer).
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # the pipe is full: the loop is bound to wake up anyway

    def start(self) -> None:
        for kmd in self.kmds:
            kmd.start()

    @property
    def trace_path(self) -> str | None:
        """The file of the trace being recorded, or None."""
        return self._trace[1] if self._trace is not None else None

    def start_trace(self, path: str) -> None:
        """Record the engines of every device (host/kmd/trace.py) until stop_trace(), which
        writes the trace to `path`. Raises TraceError if a trace is already being
        recorded or `path` cannot be written (checked now, not at the end)."""
        if self._trace is not None:
            raise TraceError(f"a trace is already being recorded to {self._trace[1]}")
        path = os.path.abspath(path)
        try:
            with open(f"{path}.tmp", "w"):
                pass
            os.remove(f"{path}.tmp")
        except OSError as e:
            raise TraceError(f"cannot write the trace file {path}: {e.strerror}") from None
        recorder = TraceRecorder(self.kmds)
        recorder.attach()
        self._trace = (recorder, path)

    def stop_trace(self, *, background: bool = False) -> str:
        """Stop recording and write the trace file; -> its path. Raises TraceError if
        no trace is being recorded, OSError if the file cannot be written.

        Writing takes about 45 µs of CPU a job (seconds for a full trace): from the I/O
        loop, pass background=True, and a thread writes it while the loop goes on
        serving; the file appears (renamed into place) once complete, and close() waits
        for it."""
        if self._trace is None:
            raise TraceError("no trace is being recorded")
        (recorder, path), self._trace = self._trace, None
        recorder.detach()
        if not background:
            self._write_trace(recorder, path)
            return path
        self._trace_writers = [t for t in self._trace_writers if t.is_alive()]
        writer = threading.Thread(target=self._write_trace, args=(recorder, path, True),
                                  name="trace-writer", daemon=True)
        writer.start()
        self._trace_writers.append(writer)
        return path

    @staticmethod
    def _write_trace(recorder: TraceRecorder, path: str, background: bool = False) -> None:
        try:
            jobs = recorder.write(path)
        except OSError as e:
            if not background:
                raise
            log.error("the trace could not be written to %s: %s", path, e)
            return
        log.info("trace of %d job(s) written to %s", jobs, path)

    def stop(self, reason: str = "stopped") -> None:
        """End serve() at once (safe in a signal handler: it only writes the wake pipe)."""
        self.stop_reason = reason
        self._stop = True
        try:
            self._wakeup()
        except OSError:  # closed already
            pass

    def request_key_reload(self) -> None:
        """From a signal handler: re-read the authorized keys on the loop's next turn."""
        self._reload_keys = True
        self._wakeup()

    def reload_keys(self) -> None:
        """Re-read the authorized-keys directory; close the sessions of revoked keys
        (CTL-AUTH-4). An unreadable directory keeps the keys as they were."""
        try:
            revoked = self.channel.reload_authorized_keys()
        except ValueError as e:  # pvgpu.transport.curve.CurveKeyError
            log.error("authorized keys not re-read, the old ones stay: %s", e)
            return
        print(f"pvgpu host: re-read the authorized keys: {len(self.channel.curve.authorized)} "
              f"authorized, revoked: {', '.join(sorted(revoked)) or 'none'}", flush=True)
        self.backend.revoke_keys(revoked)

    def serve(self) -> None:
        backend = self.backend
        period = backend.heartbeat_ms / 1000.0
        next_expiry = time.monotonic() + period
        while not self._stop:
            timeout = max(0.0, next_expiry - time.monotonic())
            messages, ready = self.channel.poll(int(timeout * 1000) + 1, extra_fds=(self._wake_r,))
            now = time.monotonic()
            out = []
            for peer, frames in messages:
                try:
                    out += backend.handle(peer, frames, now)
                except Exception:  # a bug must not take the host down for every guest
                    log.exception("internal error handling a message from %r", peer)
                    backend.stats["internal_errors"] += 1
            # after the messages they sent before closing (a bye, a last kick)
            for connection in self.channel.take_disconnected():
                backend.connection_closed(connection)
            if ready:
                try:
                    os.read(self._wake_r, 4096)
                except BlockingIOError:
                    pass
            if self._reload_keys:
                self._reload_keys = False
                self.reload_keys()
            if backend._completions:
                try:
                    out += backend.run_completions()
                except Exception:
                    log.exception("internal error completing held requests")
                    backend.stats["internal_errors"] += 1
            for peer, frames in out:
                self.channel.send(peer, frames)
            if now >= next_expiry:
                backend.expire(now)
                next_expiry = now + period

    def close(self) -> None:
        for peer, frames in self.backend.announce_shutdown(self.stop_reason):
            self.channel.send(peer, frames)
        self.backend.shutdown()
        for kmd in self.kmds:
            kmd.stop()
        if self._trace is not None:
            try:
                print(f"pvgpu host: trace written to {self.stop_trace()}", flush=True)
            except OSError as e:
                log.error("the trace could not be written: %s", e)
        for writer in self._trace_writers:  # stop_trace(background=True)'s files
            writer.join()
        deadline = time.monotonic() + 2
        while self.backend.pending_releases() and time.monotonic() < deadline:
            self.backend.run_completions()
            time.sleep(0.01)
        self.channel.close(linger_ms=wire.SHUTDOWN_LINGER_MS)  # the notices leave first
        if self.admin is not None:
            self.admin.close()
        os.close(self._wake_r)
        os.close(self._wake_w)


def run_host(endpoints, *, vram_size: int, heartbeat_ms: int, num_gpus: int = 2,
             max_mem_size: int = wire.MAX_GUEST_MEM_SIZE, ready_file: str | None = None,
             sched: SchedConfig | None = None, max_evicted_bytes: int | None = None,
             topology: str = DEFAULT_LAYOUT, curve=None, admin_endpoint: str | None = None,
             trace: str | None = None) -> int:
    """trace: record engine traces from the start, written to this file at shutdown."""
    server = HostServer(endpoints, vram_size=vram_size, num_gpus=num_gpus,
                        heartbeat_ms=heartbeat_ms, max_mem_size=max_mem_size, sched=sched,
                        max_evicted_bytes=max_evicted_bytes, topology=topology, curve=curve,
                        admin_endpoint=admin_endpoint)
    if trace:
        try:
            server.start_trace(trace)
        except TraceError:
            server.close()
            raise

    def on_signal(signum, _frame):
        name = signal.Signals(signum).name
        log.info("received %s, shutting down", name)
        server.stop(f"received {name}")

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    if curve is not None:
        signal.signal(signal.SIGHUP, lambda _s, _f: server.request_key_reload())
    server.start()
    try:
        for ep in server.endpoints:
            log.info("listening on %s", ep)
        print("pvgpu host: %d GPU(s), %d MiB VRAM each, PCIe topology %s; %s; listening on %s" % (
            len(server.kmds), vram_size >> 20, topology, server.sched.describe(),
            " ".join(server.endpoints)), flush=True)
        if server.admin is not None:
            print(f"pvgpu host: admin endpoint {server.admin.endpoint} (`pvgpu smi`)", flush=True)
        if curve is not None:
            print(f"pvgpu host: CURVE on tcp, host key {curve.pair.fingerprint}, "
                  f"{len(curve.authorized)} authorized key(s) in {curve.authorized.directory}",
                  flush=True)
        if ready_file:
            with open(ready_file + ".tmp", "w") as f:
                f.write("\n".join(server.endpoints))
            os.replace(ready_file + ".tmp", ready_file)
        server.serve()
    finally:
        server.close()
        jobs = sum(k.stats["jobs_submitted"] for k in server.kmds)
        print(f"pvgpu host: stopped after {server.backend.summary()}; {jobs} GPU job(s)", flush=True)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(run_host(None, vram_size=DEFAULT_VRAM, heartbeat_ms=wire.DEFAULT_HEARTBEAT_MS))
