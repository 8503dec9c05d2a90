"""pvgpu/cli.py: argument parsing (the commands themselves run in tests/integration)."""

import argparse

import pytest

from pvgpu.cli import build_parser, parse_size


@pytest.mark.parametrize("text,value", [("4096", 4096), ("512M", 512 << 20), ("1G", 1 << 30),
                                        ("2GiB", 2 << 30), ("64k", 64 << 10), (" 8 M ", 8 << 20)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "lots", "1.5G", "-1M", "12X"])
def test_parse_size_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


def test_defaults_and_repeatable_listen():
    a = build_parser().parse_args(["host", "--listen", "tcp://127.0.0.1:1", "--listen", "ipc:///tmp/x"])
    assert a.listen == ["tcp://127.0.0.1:1", "ipc:///tmp/x"] and a.vram == 1 << 30 and a.gpus == 2
    assert not a.no_default and build_parser().parse_args(["host", "--no-default"]).no_default
    a = build_parser().parse_args(["run", "gemm", "saxpy", "--memory", "inline", "--size", "9"])
    assert a.workloads == ["gemm", "saxpy"] and a.memory == "inline" and a.size == 9
    assert a.mem_size == 192 << 20 and a.connect is None


def test_keygen_writes_a_pair(tmp_path, capsys):
    from pvgpu.cli import main
    from pvgpu.transport.curve import read_secret_key
    assert main(["keygen", str(tmp_path / "k"), "--name", "g1"]) == 0
    pair = read_secret_key(str(tmp_path / "k" / "g1.key_secret"))
    assert pair.fingerprint in capsys.readouterr().out
    assert main(["keygen", str(tmp_path / "k"), "--name", "g1"]) == 2  # never overwrites


def test_host_tcp_policy(tmp_path):
    """tcp needs CURVE keys or --insecure (CTL-AUTH-3); ipc needs neither."""
    from pvgpu.cli import host_keys
    from pvgpu.transport.curve import write_keypair
    _pub, secret = write_keypair(str(tmp_path), "host")
    (tmp_path / "auth").mkdir()
    parse = build_parser().parse_args
    tcp, ipc = ["tcp://127.0.0.1:1"], ["ipc:///tmp/x"]
    assert host_keys(parse(["host"]), ipc) is None
    with pytest.raises(ValueError, match="--insecure"):
        host_keys(parse(["host"]), tcp)
    assert host_keys(parse(["host", "--insecure"]), tcp) is None
    keys = host_keys(parse(["host", "--curve-secret-key", secret, "--authorized-keys",
                            str(tmp_path / "auth")]), tcp)
    assert keys.pair.secret is not None and len(keys.authorized) == 0
    with pytest.raises(ValueError, match="go together"):
        host_keys(parse(["host", "--curve-secret-key", secret]), tcp)
    with pytest.raises(ValueError, match="exclude"):
        host_keys(parse(["host", "--insecure", "--curve-secret-key", secret,
                         "--authorized-keys", str(tmp_path / "auth")]), tcp)


def test_guest_key_options():
    a = build_parser().parse_args(["info", "--server-key", "h.key", "--client-key", "g.key_secret"])
    assert (a.server_key, a.client_key) == ("h.key", "g.key_secret")
    assert build_parser().parse_args(["tenant", "copy"]).server_key is None


def test_every_command_takes_log_level_and_debug_before_or_after_it():
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert set(commands) >= {"host", "info", "run", "tenant", "demo", "bench", "keygen"}
    for name, sub in commands.items():
        assert {"--log-level", "--debug"} <= set(sub._option_string_actions), name
    for argv in (["--log-level", "info", "--debug", "info"], ["info", "--log-level", "info", "--debug"]):
        a = parser.parse_args(argv)
        assert a.log_level == "INFO" and a.debug
    a = parser.parse_args(["--log-level", "error", "info"])  # the command does not reset it
    assert a.log_level == "ERROR" and not a.debug
    with pytest.raises(SystemExit):
        parser.parse_args(["info", "--log-level", "loud"])


def test_version_is_the_distributions(capsys):
    from importlib import metadata
    from pvgpu.cli import main
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"pvgpu {metadata.version('pvgpu')}"


def test_version_falls_back_to_the_packages(monkeypatch):
    from importlib import metadata
    import pvgpu
    from pvgpu import cli

    def missing(name):
        raise metadata.PackageNotFoundError(name)
    monkeypatch.setattr(metadata, "version", missing)
    monkeypatch.setattr(pvgpu, "__version__", "9.8.7", raising=False)
    assert cli.version() == "9.8.7"


def test_report_error_one_line_a_hint_and_the_exit_status(capsys):
    from pvgpu.cli import UserError, report_error
    from pvgpu.guest.frontend.heap import OutOfGuestMemory
    from pvgpu.transport.errors import ChannelTimeout, HostLost
    assert report_error("info", UserError("no host at X", "start one")) == 2
    assert capsys.readouterr().err == "pvgpu info: no host at X\n  hint: start one\n"
    assert report_error("host", ValueError("--vram 3: bad")) == 2
    assert capsys.readouterr().err == "pvgpu host: --vram 3: bad\n"
    assert report_error("host", OSError(12, "Cannot allocate memory")) == 2
    assert "smaller --vram" in capsys.readouterr().err
    assert report_error("run", HostLost("host at X is lost")) == 1
    assert capsys.readouterr().err == "pvgpu run: HostLost: host at X is lost\n"
    assert report_error("run", ChannelTimeout("no answer")) == 1  # a TimeoutError: an OSError
    assert capsys.readouterr().err == "pvgpu run: ChannelTimeout: no answer\n"
    assert report_error("run", OutOfGuestMemory("no 8 bytes free")) == 1  # a MemoryError
    assert capsys.readouterr().err == "pvgpu run: OutOfGuestMemory: no 8 bytes free\n"
    assert report_error("run", KeyError("x")) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "pvgpu run: internal error: KeyError: 'x'" and "--debug" in err[1]
