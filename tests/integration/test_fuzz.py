"""`bench fuzz` in CI: a bounded, seeded run against a real host, in both memory models.

The run must end with no crash, no hang, no undetected invalid chain and no traceback in
the host's log; a failure names the seed and the case, and rerunning
`pvgpu bench fuzz --cases N --seed S` reproduces it."""

import os

from pvgpu.bench.fuzz import chains
from pvgpu.bench.fuzz.runner import HOST_ARGS, fuzz_host, format_report
from pvgpu.bench.fuzz.session import RawSession
from pvgpu.spec import wire

SEED = int(os.environ.get("PVGPU_FUZZ_SEED", "20261124"))
CASES = 3000


def test_a_seeded_fuzz_run_finds_no_crash_hang_or_traceback(host_factory, tmp_endpoint):
    host = host_factory([tmp_endpoint], vram="256M", extra_args=HOST_ARGS)
    report = fuzz_host(host, host.log_path, CASES, SEED)
    text = format_report(report)
    print(text)
    assert report.ok and not report.failure, f"seed {SEED}:\n{text}"
    assert report.cases == CASES and report.health_checks >= CASES // 50
    kinds = {k.split(":")[0] for k in report.mutations}
    assert kinds == {"control", "fresh", "command", "chain", "lifecycle", "shape"}
    # every §4.7 family ran and was answered with DEVICE_NEEDS_RESET
    assert {k.split(":")[1] for k in report.mutations if k.startswith("chain:")} == set(chains.FAMILIES)
    assert report.classes["chain:needs_reset"] == sum(
        v for k, v in report.mutations.items() if k.startswith("chain:"))
    # the classes the oracle counts show up: control errors, dropped messages, responses
    assert {"ctl:malformed", "ctl:dropped", "fresh:ok", "fresh:no_session", "cmd:OK_NODATA",
            "cmd:used_len_0"} <= set(report.classes)
    assert any(k.startswith("cmd:ERR_") for k in report.classes)
    assert {"life:returned", "life:reset:ok", "life:bye:ok"} <= set(report.classes)
    assert report.rss_kib["peak"] >= report.rss_kib["start"] > 0
    assert set(report.models) == set(wire.MEMORY_MODELS)


def test_the_oracle_reports_a_dead_host_as_a_crash(host_factory, tmp_endpoint):
    host = host_factory([tmp_endpoint], vram="256M")
    host.kill()
    report = fuzz_host(host, host.log_path, 100, SEED)
    assert not report.ok and report.crashes and "crash" in report.failure


def test_the_oracle_reports_a_traceback_in_the_host_log(host_factory, tmp_endpoint, tmp_path):
    host = host_factory([tmp_endpoint], vram="256M")
    log = tmp_path / "host.log"  # what a host thread's uncaught exception leaves behind
    log.write_text("listening\nTraceback (most recent call last):\n  ...\nValueError: x\n")
    report = fuzz_host(host, str(log), 60, SEED)
    assert report.cases == 60 and report.tracebacks == 1
    assert not report.ok and "Traceback" in report.failure


def test_set_up_waits_for_what_abandoned_sessions_hold(host_factory, tmp_endpoint):
    """Two guests take every VMID of device 0 and hang, their connections open and silent:
    until the host reclaims them by heartbeat (CTL-HB-3) it refuses new contexts, and the
    fuzzer's set-up waits for that instead of failing the run. (A guest whose connection
    closes is reclaimed at once, CTL-HB-7: that would leave nothing to wait for.)"""
    host = host_factory([tmp_endpoint], vram="256M", extra_args=HOST_ARGS)
    hogs = [RawSession(host.endpoint, "shared").open() for _ in range(2)]
    try:
        codes = [h.command(wire.CMD_CTX_CREATE, (0, b"hog"), ctx_id=c)[0][0]
                 for h in hogs for c in range(1, 33)]
        assert wire.RESP_ERR_OUT_OF_MEMORY in codes
        report = fuzz_host(host, host.log_path, 60, SEED)
    finally:
        for h in hogs:
            h.close(bye=False)
    assert report.ok and not report.failure, format_report(report)
    assert report.classes["setup:refused"] >= 1
