"""ipc endpoints live in directories no other user can write in ([CTL-ENDPOINT-2])."""

from __future__ import annotations

import os
import stat

import pytest

from pvgpu.spec.wire import DEFAULT_ENDPOINT_NAME
from pvgpu.transport import channel as channel_mod
from pvgpu.transport.channel import ChannelError, HostChannel, default_endpoint, private_directory


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_host_creates_a_missing_endpoint_directory_0700(tmp_path):
    # [CTL-ENDPOINT-2]
    d = tmp_path / "run"
    host = HostChannel([f"ipc://{d}/host.sock"])
    try:
        assert _mode(d) == 0o700 and (d / "host.sock").exists()
    finally:
        host.close()


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o722])
def test_the_host_refuses_a_directory_others_may_write_in(tmp_path, mode):
    # [CTL-ENDPOINT-2]
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(mode)
    with pytest.raises(ChannelError, match="lets other users write"):
        HostChannel([f"ipc://{d}/host.sock"])
    assert list(d.iterdir()) == [] and _mode(d) == mode  # nothing bound, nothing changed


def test_the_host_refuses_a_directory_of_another_user(tmp_path, monkeypatch):
    # [CTL-ENDPOINT-2]
    d = tmp_path / "theirs"
    d.mkdir(0o700)
    monkeypatch.setattr(channel_mod.os, "getuid", lambda: os.stat(d).st_uid + 1)
    with pytest.raises(ChannelError, match="belongs to uid"):
        HostChannel([f"ipc://{d}/host.sock"])
    assert list(d.iterdir()) == []


def test_the_host_refuses_a_symlinked_directory(tmp_path):
    # [CTL-ENDPOINT-2]
    real = tmp_path / "real"
    real.mkdir(0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(ChannelError, match="not a directory"):
        HostChannel([f"ipc://{link}/host.sock"])
    assert list(real.iterdir()) == []


def test_an_existing_private_directory_is_served_and_left_as_it_is(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    d.chmod(0o755)  # readable by others, writable by nobody else: the user's choice
    host = HostChannel([f"ipc://{d}/host.sock"])
    host.close()
    assert _mode(d) == 0o755


def test_the_default_directory_is_refused_if_someone_else_made_it(tmp_path, monkeypatch):
    """/tmp/pvgpu-<uid> is a name anyone can take first: it is used only if it is ours."""
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(channel_mod.tempfile, "gettempdir", lambda: str(tmp_path))
    uid = os.stat(tmp_path).st_uid + 1
    monkeypatch.setattr(channel_mod.os, "getuid", lambda: uid)
    squatted = tmp_path / f"pvgpu-{uid}"
    squatted.mkdir(0o700)  # made by "another user": owned by the real uid, not `uid`
    with pytest.raises(ChannelError, match="belongs to uid"):
        default_endpoint()


def test_the_default_directory_is_refused_if_it_is_a_symlink(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(channel_mod.tempfile, "gettempdir", lambda: str(tmp_path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(0o700)
    (tmp_path / f"pvgpu-{os.getuid()}").symlink_to(elsewhere)
    with pytest.raises(ChannelError, match="not a directory"):
        default_endpoint()


def test_the_default_directory_is_refused_if_others_may_write_in_it(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(channel_mod.tempfile, "gettempdir", lambda: str(tmp_path))
    d = tmp_path / f"pvgpu-{os.getuid()}"
    d.mkdir()
    d.chmod(0o777)
    with pytest.raises(ChannelError, match="lets other users write"):
        default_endpoint()


def test_a_world_writable_xdg_runtime_dir_is_refused(tmp_path, monkeypatch):
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    xdg.chmod(0o777)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    with pytest.raises(ChannelError, match="lets other users write"):
        default_endpoint()
    xdg.chmod(0o700)
    assert default_endpoint() == f"ipc://{xdg}/{DEFAULT_ENDPOINT_NAME}"


def test_private_directory_creates_without_following_a_planted_symlink(tmp_path):
    # [CTL-ENDPOINT-2]
    target = tmp_path / "target"
    target.mkdir(0o700)
    planted = tmp_path / "planted"
    planted.symlink_to(target)
    with pytest.raises(ChannelError):
        private_directory(str(planted))
    fresh = tmp_path / "fresh"
    assert private_directory(str(fresh)) == str(fresh) and _mode(fresh) == 0o700
