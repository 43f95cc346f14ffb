"""``gpucp ssh`` against a live server: the host key it writes, the ssh command it builds, and its refusals.

The whole path through a real gateway and OpenSSH is tests/e2e/test_ssh_access.py; these cover what the CLI
decides on its own."""

from __future__ import annotations

import json
import os
import stat
import uuid
from pathlib import Path

from gpucp_support import Gpucp, World

from tests.access.test_connect import HOST_KEY, running, with_gateway
from tests.dispatch.support import book
from tests.factories import UserFactory
from tests.reservations.fleet import project


def test_ssh_writes_the_known_hosts_line_and_prints_a_strict_command(gpucp: Gpucp, world: World, config_home: Path):
    srv = with_gateway(world.server, port=2201, address="10.9.8.7")
    r = book(world.project, world.model)
    running(r, srv)
    result = gpucp("ssh", "--print", str(r.public_id), "-L", "8888:localhost:8888", "--", "nvidia-smi", "-L")
    assert result.exit_code == 0, result.output
    known = config_home / "gpucp" / "known_hosts"
    assert known.read_text() == f"[10.9.8.7]:2201 {HOST_KEY}\n"
    assert stat.S_IMODE(os.stat(known).st_mode) == 0o600
    assert result.stdout.split() == [
        "ssh", "-p", "2201", "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes",
        "-L", "8888:localhost:8888", f"{r.public_id}@10.9.8.7", "--", "nvidia-smi", "-L",
    ]  # fmt: skip


def test_a_new_host_key_replaces_the_old_one_for_that_host_only(gpucp: Gpucp, world: World, config_home: Path):
    known = config_home / "gpucp" / "known_hosts"
    known.parent.mkdir(parents=True)
    known.write_text("[10.9.8.7]:2201 ssh-ed25519 AAAAold\nother.example ssh-ed25519 AAAAkeep\n")
    srv = with_gateway(world.server, port=2201, address="10.9.8.7")
    r = book(world.project, world.model)
    running(r, srv)
    assert gpucp("ssh", "--print", str(r.public_id)).exit_code == 0
    assert known.read_text().splitlines() == ["other.example ssh-ed25519 AAAAkeep", f"[10.9.8.7]:2201 {HOST_KEY}"]


def test_ssh_json_gives_the_argv_and_the_access_entry(gpucp: Gpucp, world: World):
    srv = with_gateway(world.server)
    r = book(world.project, world.model)
    running(r, srv)
    result = gpucp("--json", "ssh", "--print", "-i", "/k/id", str(r.public_id))
    data = json.loads(result.stdout)
    assert data["access"]["user"] == str(r.public_id)
    assert data["argv"][-1] == f"{r.public_id}@10.1.2.3" and ["-i", "/k/id"] == data["argv"][7:9]


def test_a_reservation_not_running_yet_is_refused_with_the_reason(gpucp: Gpucp, world: World):
    with_gateway(world.server)
    r = book(world.project, world.model, start_in=3600)
    result = gpucp("ssh", str(r.public_id))
    assert result.exit_code == 1
    assert result.stderr == "gpucp: SSH opens when the window starts and the container runs. (not_ready)\n"


def test_another_tenants_reservation_is_not_found(gpucp: Gpucp, world: World):
    other = project(owner=UserFactory())
    r = book(other, world.model)
    assert gpucp("ssh", str(r.public_id)).exit_code == 4
    assert gpucp("ssh", str(uuid.uuid4())).exit_code == 4


def test_a_server_it_does_not_run_on_is_a_usage_error(gpucp: Gpucp, world: World):
    srv = with_gateway(world.server)
    r = book(world.project, world.model)
    running(r, srv)
    result = gpucp("ssh", "--server", "elsewhere", str(r.public_id))
    assert result.exit_code == 2 and "not on elsewhere" in result.output


def test_a_missing_ssh_binary_is_named(gpucp: Gpucp, world: World, monkeypatch):  # type: ignore[no-untyped-def]
    srv = with_gateway(world.server)
    r = book(world.project, world.model)
    running(r, srv)
    monkeypatch.setenv("GPUCP_SSH", "no-such-ssh-binary")
    result = gpucp("ssh", str(r.public_id))
    assert result.exit_code == 2 and "install the OpenSSH client" in result.output
