"""HostServer's trace API (host/main.py): start_trace(path) records every device's engines,
stop_trace() writes the file and returns its path; misuse raises TraceError."""

import json

import pytest

from pvgpu.host.kmd.trace import TraceError
from pvgpu.host.main import HostServer
from pvgpu.spec import kernels


@pytest.fixture
def server(tmp_endpoint):
    s = HostServer([tmp_endpoint], vram_size=32 << 20, num_gpus=2)
    s.start()
    try:
        yield s
    finally:
        s.close()


def test_start_and_stop_trace(server, tmp_path):
    path = tmp_path / "t.json"
    server.start_trace(str(path))
    assert server.trace_path == str(path) and all(k.trace is not None for k in server.kmds)
    ctx = server.kmds[1].create_context("api")
    ctx.submit_launch(kernels.KERNEL_BURN, 1, 1, [10]).wait()
    assert server.stop_trace() == str(path)
    assert server.trace_path is None and all(k.trace is None for k in server.kmds)
    events = json.loads(path.read_text())["traceEvents"]
    burns = [e for e in events if e["ph"] == "X" and e["name"] == "burn"]
    assert len(burns) == 1 and burns[0]["pid"] == 2  # gpu1
    server.start_trace(str(tmp_path / "again.json"))  # a second trace after the first
    assert server.stop_trace() == str(tmp_path / "again.json")


def test_misuse_raises_trace_error(server, tmp_path):
    with pytest.raises(TraceError, match="no trace"):
        server.stop_trace()
    with pytest.raises(TraceError, match="cannot write"):
        server.start_trace(str(tmp_path / "missing" / "t.json"))
    server.start_trace(str(tmp_path / "t.json"))
    with pytest.raises(TraceError, match="already"):
        server.start_trace(str(tmp_path / "u.json"))


def test_close_writes_an_unfinished_trace(tmp_endpoint, tmp_path):
    s = HostServer([tmp_endpoint], vram_size=32 << 20, num_gpus=1)
    s.start()
    s.start_trace(str(tmp_path / "t.json"))
    s.close()  # what SIGINT/SIGTERM end in
    assert json.loads((tmp_path / "t.json").read_text())["displayTimeUnit"] == "ms"


def test_a_trace_written_in_the_background_is_complete_after_close(tmp_endpoint, tmp_path):
    s = HostServer([tmp_endpoint], vram_size=32 << 20, num_gpus=1)
    s.start()
    try:
        s.start_trace(str(tmp_path / "t.json"))
        s.kmds[0].create_context().submit_launch(kernels.KERNEL_BURN, 1, 1, [10]).wait()
        assert s.stop_trace(background=True) == str(tmp_path / "t.json")
        assert s.kmds[0].trace is None  # recording stopped at once
    finally:
        s.close()  # waits for the writer
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert [e["name"] for e in events if e["ph"] == "X" and e["tid"] != 1] == ["burn"]
