"""pvgpu/streaming.py: the host process re-executes itself once with streaming copies."""

import os
import shutil
import sys

from pvgpu import cli, streaming
from pvgpu.procs import HostProcess, private_endpoint


def test_tunables_add_the_threshold_once_and_keep_the_rest():
    entry = f"{streaming.TUNABLE}={streaming.STREAM_FROM:#x}"
    assert streaming.tunables("") == entry
    assert streaming.tunables("glibc.malloc.arena_max=2") == f"glibc.malloc.arena_max=2:{entry}"
    assert streaming.tunables(entry) is None
    assert streaming.tunables(f"{streaming.TUNABLE}=0x4000:glibc.malloc.arena_max=2") is None


def test_stream_large_copies_reexecutes_the_same_command_line(monkeypatch):
    calls = []
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(os, "execve", lambda *a: calls.append(a))
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    streaming.stream_large_copies()
    [(path, argv, env)] = calls
    assert path == sys.executable and argv == sys.orig_argv
    assert env["GLIBC_TUNABLES"] == streaming.tunables("glibc.malloc.arena_max=2")
    monkeypatch.setenv("GLIBC_TUNABLES", env["GLIBC_TUNABLES"])
    streaming.stream_large_copies()  # set already: nothing to do
    assert len(calls) == 1


def test_the_host_process_runs_with_the_threshold_set():
    """`python -m pvgpu host` re-executes itself (same pid) with the threshold set; a
    call of the CLI's main in-process never does."""
    endpoint, tmpdir = private_endpoint("pvgpu-test-streaming")
    env = os.environ.pop("GLIBC_TUNABLES", None)
    try:
        host = HostProcess([endpoint], vram="64M")
    finally:
        if env is not None:
            os.environ["GLIBC_TUNABLES"] = env
    try:
        with open(f"/proc/{host.proc.pid}/environ", "rb") as f:
            environ = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        assert environ[b"GLIBC_TUNABLES"].decode() == streaming.tunables(env or "")
    finally:
        host.stop()
        shutil.rmtree(tmpdir, ignore_errors=True)


def test_main_called_in_process_does_not_reexecute(monkeypatch):
    calls = []
    monkeypatch.setattr(streaming, "stream_large_copies", lambda: calls.append(1))
    assert cli.main(["host", "--no-default"]) == 2 and calls == []  # (no endpoint: exits)
