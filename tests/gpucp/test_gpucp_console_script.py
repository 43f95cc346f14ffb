"""The installed ``gpucp`` console script, run as a process against the live server."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from gpucp_support import World

from controlplane.reservations.models import Reservation


def gpucp_script() -> str:
    # The script pip installed beside this interpreter (pyproject.toml, [project.scripts]).
    found = shutil.which("gpucp", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail("the gpucp console script is not installed: pip install -e .", pytrace=False)
    return found


def run(args: list[str], config_home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCP_")}
    env["XDG_CONFIG_HOME"] = str(config_home)
    return subprocess.run(
        [gpucp_script(), *args], env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )


def test_the_console_script_logs_in_books_and_reports_exit_codes(world: World, config_home: Path):
    login = run(["login", "--server", world.url, "--token", world.token], config_home)
    assert login.returncode == 0, login.stderr
    path = config_home / "gpucp" / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    me = run(["--json", "whoami"], config_home)
    assert me.returncode == 0, me.stderr
    assert json.loads(me.stdout)["username"] == "alice"

    booked = run(
        ["--json", "book", "--model", "H100-80GB", "--hours", "1", "--image", "gpucp-busybox:test", "--", "true"],
        config_home,
    )
    assert booked.returncode == 0, booked.stderr
    assert Reservation.objects.get().public_id == uuid.UUID(json.loads(booked.stdout)["id"])

    missing = run(["show", str(uuid.uuid4())], config_home)
    assert (missing.returncode, missing.stdout) == (4, "")
    assert "(not_found)" in missing.stderr

    assert run(["book", "--no-such-option"], config_home).returncode == 2
    assert run(["logout"], config_home).returncode == 0
    assert run(["whoami"], config_home).returncode == 3


def test_python_dash_m_gpucp_is_the_same_command(config_home: Path):
    env = {**os.environ, "XDG_CONFIG_HOME": str(config_home)}
    result = subprocess.run(
        [sys.executable, "-m", "gpucp", "--version"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    assert result.stdout.strip() == "gpucp, version 0.1.0"
