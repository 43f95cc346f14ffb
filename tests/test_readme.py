"""The README's first booking, run as written against a live ``manage.py runsystem``.

The blocks marked ``<!-- readme-walkthrough: ... -->`` are read out of README.md and run with bash; the only
changes are the ones the README asks of its reader: alice's printed password in place of ``PASSWORD``, and
the token the README shows once pasted in place of ``gcp_...``. The server's address comes in as
``GPUCP_SERVER``, which the block reads. The booking command runs twice and books once; then the reservation
is extended and cancelled by the README's own commands.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import service_missing
from tests.runsystem_support import ROOT, RunningSystem

pytestmark = pytest.mark.slow

README = ROOT / "README.md"
PASSWORD = "alice-readme-password"
TOKEN_LINE = 'H="Authorization: Bearer gcp_..."'


def readme_block(name: str) -> str:
    """The shell block after the marker ``<!-- readme-walkthrough: NAME ... -->``."""
    text = README.read_text()
    found = re.search(rf"<!-- readme-walkthrough: {re.escape(name)}\b.*?-->\n```sh\n(.*?)\n```", text, re.S)
    assert found, f"README.md has no block marked readme-walkthrough: {name}"
    return found[1] + "\n"


def first_booking_parts() -> tuple[str, str]:
    """The first-booking block, split where the reader pastes the token: (before, from there on)."""
    block = readme_block("first-booking")
    lines = block.splitlines(keepends=True)
    at = next((i for i, line in enumerate(lines) if line.startswith(TOKEN_LINE)), None)
    assert at is not None, f"the first-booking block has no line starting {TOKEN_LINE!r}"
    return "".join(lines[:at]), "".join(lines[at:])


def bash(script: str, *, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        ["bash", "-eo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"exit {done.returncode}\n--- script\n{script}\n--- out\n{done.stdout}\n{done.stderr}"
    return done.stdout


def json_lines(out: str) -> list[dict]:
    """Each JSON object curl printed (the commands print one per answer, some without a newline)."""
    decoder, found, i = json.JSONDecoder(), [], 0
    while (i := out.find("{", i)) != -1:
        try:
            value, end = decoder.raw_decode(out, i)
        except ValueError:
            i += 1
            continue
        found.append(value)
        i = end
    return found


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from django.db import connection

    if connection.vendor != "sqlite":
        pytest.skip("starts a system of its own on SQLite; runs once, in the SQLite leg")
    if not shutil.which("curl"):
        service_missing("curl (the README's commands use it)")
    running = RunningSystem(tmp_path_factory.mktemp("readme-var"), extra_env={"DEMO_TENANT_PASSWORD": PASSWORD})
    try:
        running.wait_for(r"agents up", timeout=180)
        yield f"http://127.0.0.1:{running.port}"
    finally:
        running.stop()


def test_the_readme_first_booking_runs_as_written_and_a_retry_books_nothing_new(system, tmp_path):
    before, after = first_booking_parts()
    assert "PASSWORD" in before and "gcp_..." in after
    assert "$(date" not in after.split("tee first.json")[0], "the booking command must be the same on every run"
    # The venv's python3 first, as `make run` leaves it; the server's address as the block reads it.
    env = {**os.environ, "GPUCP_SERVER": system, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}

    login = bash(before.replace("PASSWORD", PASSWORD), cwd=tmp_path, env=env)
    token = next(o["token"] for o in json_lines(login) if "token" in o)
    assert token.startswith("gcp_")
    # The reader keeps B from the block's first line; the rest runs as they would paste it.
    env["B"] = system
    rest = after.replace("gcp_...", token)

    first = bash(rest, cwd=tmp_path, env=env)
    booked = json_lines(first)[0]
    assert booked.get("state") == "scheduled", first
    assert booked["spec"] == {
        "gpu_model": "H100-80GB",
        "min_memory_mib": None,
        "gpu_count": 2,
        "whole_servers": None,
        "mig_profile": None,
    }

    # Run unchanged a while later, in the same shell as the reader would, and on to the second block: `now` is
    # later, the request is the same, nothing new is booked; then extend and cancel with the B, H and ID set.
    again = json_lines(bash(rest + readme_block("commands"), cwd=tmp_path, env=env))
    assert again[0]["id"] == booked["id"]
    extended, cancelled = again[-2], again[-1]
    assert extended["id"] == cancelled["id"] == booked["id"]
    assert extended["ends_at"] > booked["ends_at"]
    assert cancelled["state"] in {"cancelled", "ending", "completed"}, cancelled

    listing = bash(
        f'curl -s -H "Authorization: Bearer {token}" "$B/api/v1/reservations/?project=demo&limit=500"',
        cwd=tmp_path,
        env=env,
    )
    named_first = [r for r in json.loads(listing)["results"] if r["name"] == "first"]
    assert [r["id"] for r in named_first] == [booked["id"]]
