"""The CLI's errors as a user meets them (issue cases): one line and a hint on stderr, no
traceback unless --debug, exit status 2 for what the user asked wrong; a reader of stdout
that goes away (`pvgpu info | head -2`) is no error at all. Each runs `python -m pvgpu`."""

import os
import subprocess
import sys

import pytest

from pvgpu import guest
from pvgpu.host.config import physical_memory


def pvgpu(*args, env=None, stdout=subprocess.PIPE, timeout=60):
    environ = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "pvgpu", *args], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=timeout, env=environ)


def one_error(r, *fragments):
    """r failed with exit status 2, and said so in one line (+ a hint), no traceback."""
    lines = r.stderr.splitlines()
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and 1 <= len(lines) <= 2, r.stderr
    assert len(lines) == 1 or lines[1].startswith("  hint: "), r.stderr
    for f in fragments:
        assert f in r.stderr, r.stderr
    return lines


def test_an_endpoint_without_a_scheme():
    one_error(pvgpu("info", "--connect", "localhost:5555"),
              "pvgpu info: cannot connect to localhost:5555: ", "did you mean tcp://localhost:5555?")


def test_no_host_running(tmp_path):
    ep = f"ipc://{tmp_path}/absent.sock"
    lines = one_error(pvgpu("info", "--connect", ep))
    assert lines[0] == f"pvgpu info: no host at {ep}; start one with `pvgpu host`"


def test_no_host_at_the_environments_endpoint(tmp_path):
    ep = f"ipc://{tmp_path}/absent.sock"
    one_error(pvgpu("run", "saxpy", env={"PVGPU_ENDPOINT": ep}), f"no host at {ep}")


def test_a_second_host_on_the_same_endpoint(host_factory, tmp_endpoint):
    host_factory([tmp_endpoint], vram="64M")
    one_error(pvgpu("host", "--vram", "64M", "--no-default", "--listen", tmp_endpoint),
              f"cannot bind {tmp_endpoint}: another process is serving it", "--no-default --listen")


def test_vram_not_whole_pages(tmp_endpoint):
    one_error(pvgpu("host", "--vram", "100", "--no-default", "--listen", tmp_endpoint),
              "pvgpu host: --vram 100: VRAM per device must be a positive multiple of 4 KiB")


def test_vram_more_than_the_machine_has(tmp_endpoint):
    gib = max(64, physical_memory() >> 30)  # 64G, or more on a machine that has it for 2
    one_error(pvgpu("host", "--vram", f"{gib}G", "--no-default", "--listen", tmp_endpoint),
              f"--vram {gib} GiB for 2 GPU(s)", "of host memory; this machine has")


def test_demo_shows_the_hosts_own_error():
    r = pvgpu("demo", "--vram", "abc")
    one_error(r, "before it was ready: pvgpu host: error: argument --vram: not a size: 'abc'")


def test_a_traceback_only_with_debug():
    r = pvgpu("--debug", "info", "--connect", "localhost:5555")
    assert r.returncode == 1 and "Traceback" in r.stderr and "ChannelError" in r.stderr


def test_a_reader_that_goes_away_is_no_error(shared_host):
    """`pvgpu info | head -2`: here the reader is gone before the first line is written."""
    read, write = os.pipe()
    os.close(read)
    try:
        r = pvgpu("info", "--connect", shared_host.endpoint, stdout=write)
    finally:
        os.close(write)
    assert r.stderr == "" and r.returncode == 1


def test_info_through_head(shared_host):
    r = subprocess.run(f"'{sys.executable}' -m pvgpu info --connect '{shared_host.endpoint}' "
                       "| head -1", shell=True, capture_output=True, text=True, timeout=60)
    assert r.stdout.startswith("host ") and r.stderr == ""


def test_the_environment_names_the_endpoint(shared_host, monkeypatch):
    r = pvgpu("info", env={"PVGPU_ENDPOINT": shared_host.endpoint})
    assert r.returncode == 0 and r.stdout.startswith(f"host {shared_host.endpoint} "), r.stderr
    monkeypatch.setenv("PVGPU_ENDPOINT", shared_host.endpoint)
    with guest.connect(mem_size=8 << 20) as conn:
        assert conn.endpoint == shared_host.endpoint
    with pytest.raises(guest.HostNotFound):  # an argument beats the environment
        guest.connect("ipc:///nonexistent/pvgpu.sock")
