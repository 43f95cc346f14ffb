"""``make run`` starts quietly: no Celery banners, no root warning, no kombu hostname warning, unless asked."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from celery.platforms import ROOT_DISCOURAGED
from kombu import Connection

from controlplane.system.management.commands.runsystem import Command


def _command(monkeypatch, *, verbose: bool = False, env: str | None = None) -> Command:  # type: ignore[no-untyped-def]
    if env is None:
        monkeypatch.delenv("RUNSYSTEM_VERBOSE", raising=False)
    else:
        monkeypatch.setenv("RUNSYSTEM_VERBOSE", env)
    command = Command()
    command.verbose = verbose or (env or "").lower() in ("1", "true", "yes", "on")
    return command


def test_celery_children_start_without_their_banner(monkeypatch):
    command = _command(monkeypatch)
    for argv in (command.worker_argv(), command.beat_argv()):
        assert argv[argv.index("controlplane") + 1] == "-q"
    assert command.web_argv("127.0.0.1", 8000)[-2:] == ["--log-level", "warning"]


@pytest.mark.parametrize("how", ["flag", "env"])
def test_verbose_shows_everything(monkeypatch, how):
    command = _command(monkeypatch, verbose=how == "flag", env="1" if how == "env" else None)
    assert "-q" not in command.worker_argv() and "-q" not in command.beat_argv()
    assert "--log-level" not in command.web_argv("127.0.0.1", 8000)
    assert "superuser" not in command.child_env().get("PYTHONWARNINGS", "")


def test_runsystem_verbose_is_read_from_the_environment(monkeypatch):
    from controlplane.system.management.commands.runsystem import verbose_from_env

    monkeypatch.setenv("RUNSYSTEM_VERBOSE", "yes")
    assert verbose_from_env()
    monkeypatch.setenv("RUNSYSTEM_VERBOSE", "0")
    assert not verbose_from_env()


def _warn_as_celery_does(env: dict[str, str]) -> str:
    """Celery's own root warning, raised in a child with the given environment; what it printed."""
    code = (
        "import warnings\n"
        "from celery.exceptions import SecurityWarning\n"
        "from celery.platforms import ROOT_DISCOURAGED\n"
        "warnings.warn(SecurityWarning(ROOT_DISCOURAGED.format(uid=0, euid=0, gid=0, egid=0)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_the_root_warning_is_filtered_in_the_children_and_shown_when_verbose(monkeypatch):
    assert "superuser" in ROOT_DISCOURAGED  # the filter matches Celery's words
    quiet = _command(monkeypatch).child_env()
    assert _warn_as_celery_does(quiet) == ""
    loud = _command(monkeypatch, verbose=True).child_env()
    assert "SecurityWarning" in _warn_as_celery_does(loud)


def test_an_existing_pythonwarnings_is_kept(monkeypatch):
    monkeypatch.setenv("PYTHONWARNINGS", "error::DeprecationWarning")
    value = _command(monkeypatch).child_env()["PYTHONWARNINGS"]
    assert value.startswith("error::DeprecationWarning,ignore:")


def test_the_embedded_broker_url_names_a_host_so_kombu_does_not_warn(settings, caplog):
    if not settings.CELERY_BROKER_URL.startswith("filesystem://"):
        pytest.skip("the embedded broker only")
    with caplog.at_level(logging.WARNING, logger="kombu.connection"):
        connection = Connection(settings.CELERY_BROKER_URL, transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS)
        connection.info()
        connection.release()
    assert not [r for r in caplog.records if "No hostname" in r.getMessage()]
    assert os.path.isdir(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"])
