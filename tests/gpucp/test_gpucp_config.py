"""Where the token is kept: 0600 in a 0700 directory from the first byte, replaced atomically."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gpucp import config
from gpucp.errors import ConfigError, Exit


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_file_is_0600_and_its_directory_0700_whatever_the_umask(config_home: Path):
    old = os.umask(0)  # the widest umask: every bit the code does not clear itself would show
    try:
        path = config.save(config.Config(server="http://cp.example", token="gcp_0123456789ab_secret"))
    finally:
        os.umask(old)
    assert path == config_home / "gpucp" / "config.json"
    assert mode(path) == 0o600
    assert mode(path.parent) == 0o700
    assert json.loads(path.read_text())["token"] == "gcp_0123456789ab_secret"
    # Nothing left behind from the write.
    assert sorted(p.name for p in path.parent.iterdir()) == ["config.json"]


def test_an_existing_open_directory_and_file_are_narrowed(config_home: Path):
    directory = config_home / "gpucp"
    directory.mkdir(parents=True, mode=0o755)
    os.chmod(directory, 0o755)  # noqa: S103  (the open mode the code must narrow)
    old_file = directory / "config.json"
    old_file.write_text("{}")
    os.chmod(old_file, 0o644)
    config.save(config.Config(token="gcp_0123456789ab_secret"))
    assert mode(directory) == 0o700
    # A new file renamed over the old one: the old inode's mode never held the token.
    assert mode(old_file) == 0o600


def test_saving_replaces_what_was_there_and_load_reads_it_back(config_home: Path):
    config.save(config.Config(server="http://a.example", token="gcp_aaaaaaaaaaaa_x", token_id=3, username="alice"))
    config.save(config.Config(server="http://b.example"))
    loaded = config.load()
    assert loaded == config.Config(server="http://b.example")


def test_no_file_is_an_empty_config(config_home: Path):
    assert config.load() == config.Config()


def test_a_broken_file_is_a_clear_usage_error(config_home: Path):
    (config_home / "gpucp").mkdir(parents=True)
    (config_home / "gpucp" / "config.json").write_text("{not json")
    with pytest.raises(ConfigError) as caught:
        config.load()
    assert "config.json is not valid JSON" in caught.value.message
    assert caught.value.exit_code == Exit.USAGE


def test_the_environment_overrides_what_is_stored(config_home: Path, monkeypatch: pytest.MonkeyPatch):
    stored = config.Config(server="http://stored.example", token="gcp_aaaaaaaaaaaa_stored")
    assert (config.resolve_server(stored), config.resolve_token(stored)) == (stored.server, stored.token)
    monkeypatch.setenv("GPUCP_SERVER", "https://env.example/")
    monkeypatch.setenv("GPUCP_TOKEN", "gcp_bbbbbbbbbbbb_env")
    assert config.resolve_server(stored) == "https://env.example"
    assert config.resolve_token(stored) == "gcp_bbbbbbbbbbbb_env"
    # An option given on the command line wins over both.
    assert config.resolve_server(stored, "http://option.example") == "http://option.example"


def test_with_nothing_set_the_server_is_make_runs(config_home: Path):
    assert config.resolve_server(config.Config()) == "http://127.0.0.1:8000"


def test_a_server_that_is_not_an_http_url_is_refused(config_home: Path):
    with pytest.raises(ConfigError, match="http:// or https://"):
        config.resolve_server(config.Config(), "cp.example:8000")


def test_a_relative_xdg_config_home_is_ignored(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/dir")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert config.config_dir() == tmp_path / ".config" / "gpucp"
