"""Who gets in (DESIGN invariant 11): a listed key, for its own reservation, inside the window, to a running
container. Every refusal tells the tenant why in a banner the OpenSSH client prints."""

from __future__ import annotations

import stat
import subprocess

import asyncssh
import pytest

from nodeagent.gateway import SshGateway
from nodeagent.gateway.hostkey import HOST_KEY_FILE, HostKeyError, load_or_create, public_line
from nodeagent.gateway.table import when

from .support import OpenSsh

pytestmark = [pytest.mark.docker, pytest.mark.faults]


def refused(result: subprocess.CompletedProcess[bytes], banner: str) -> None:
    err = result.stderr.decode()
    assert result.returncode == 255, err
    assert banner in err, err
    assert "Permission denied (publickey)" in err
    assert result.stdout == b""


def test_a_key_of_another_reservation_is_refused(world):  # type: ignore[no-untyped-def]
    refused(
        world.ssh.ssh(world.keys["carol"], "res-a", "echo in"),
        "gpucp: this key is not authorized for reservation res-a (the keys of its project's owners and members are)",
    )
    refused(world.ssh.ssh(world.keys["alice"], "res-b", "echo in"), "not authorized for reservation res-b")


def test_a_key_listed_nowhere_is_refused(world):  # type: ignore[no-untyped-def]
    # A viewer's key, or another project's, is simply not in the reservation's ssh_keys.
    refused(world.ssh.ssh(world.keys["mallory"], "res-a", "echo in"), "not authorized for reservation res-a")


def test_before_the_window_opens_the_banner_says_when_it_does(world):  # type: ignore[no-untyped-def]
    start = world.specs["c"].window_start
    refused(
        world.ssh.ssh(world.keys["alice"], "res-c", "echo in"),
        f"gpucp: reservation res-c has not started; its window opens at {when(start)}",
    )


def test_after_the_window_end_the_banner_says_when_it_closed(world):  # type: ignore[no-untyped-def]
    end = world.specs["d"].window_end
    refused(
        world.ssh.ssh(world.keys["alice"], "res-d", "echo in"),
        f"gpucp: reservation res-d has ended; its window closed at {when(end)}",
    )


def test_an_open_window_without_a_running_container_is_refused(world):  # type: ignore[no-untyped-def]
    refused(
        world.ssh.ssh(world.keys["alice"], "res-f", "echo in"),
        "gpucp: the container of reservation res-f is not running on this server",
    )


@pytest.mark.parametrize("user", ["root", "res-unknown", "proj-a", "launch-a"])
def test_a_user_that_is_no_reservation_here_gets_no_shell(world, user):  # type: ignore[no-untyped-def]
    refused(world.ssh.ssh(world.keys["alice"], user, "echo in"), f"gpucp: no reservation {user} runs on this server")


def test_only_public_key_authentication_is_offered(world):  # type: ignore[no-untyped-def]
    result = world.ssh.ssh(
        world.keys["alice"],
        "res-a",
        "echo in",
        "-o", "PreferredAuthentications=password,keyboard-interactive",
        "-o", "PubkeyAuthentication=no",
    )  # fmt: skip
    assert result.returncode == 255
    assert "Permission denied (publickey)" in result.stderr.decode()


def test_a_stopped_reservation_lets_nobody_in(world):  # type: ignore[no-untyped-def]
    specs = list(world.specs.values())
    world.gateway.update(specs, [world.specs["b"].launch_id], world.clock())
    try:
        refused(world.ssh.ssh(world.keys["carol"], "res-b", "echo in"), "no reservation res-b runs on this server")
    finally:
        world.gateway.update(specs, [], world.clock())
    assert world.ssh.ssh(world.keys["carol"], "res-b", "echo in").stdout == b"in\n"


def test_the_host_key_is_kept_across_a_restart_and_the_known_hosts_line_stays_true(world, tmp_path):  # type: ignore[no-untyped-def]
    key_file = world.directory / "agent-state" / HOST_KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    saved = key_file.read_bytes()
    first = world.gateway.host_key_line
    assert first.startswith("ssh-ed25519 ") and len(first.split()) == 2
    assert world.gateway.facts().host_key == first and world.gateway.facts().port == world.gateway.port
    again = SshGateway(
        state_dir=key_file.parent, node=world.node, docker_client=world.client, bind=("127.0.0.1", 0), clock=world.clock
    )
    again.start()
    try:
        assert again.host_key_line == first
        assert key_file.read_bytes() == saved
        again.update(list(world.specs.values()), [], world.clock())
        trusting = OpenSsh(port=again.port, host_key_line=first, directory=tmp_path)
        assert trusting.ssh(world.keys["alice"], "res-a", "echo in").stdout == b"in\n"
        # The client really checks the line: with another key's line it refuses the server.
        other = public_line(asyncssh.generate_private_key("ssh-ed25519"))
        (tmp_path / "other").mkdir()
        doubting = OpenSsh(port=again.port, host_key_line=other, directory=tmp_path / "other")
        result = doubting.ssh(world.keys["alice"], "res-a", "echo in")
        assert result.returncode == 255 and b"Host key verification failed" in result.stderr
    finally:
        again.close()


def test_an_unreadable_host_key_is_never_replaced_silently(tmp_path):  # type: ignore[no-untyped-def]
    (tmp_path / HOST_KEY_FILE).write_text("not a key\n")
    with pytest.raises(HostKeyError, match="move it aside"):
        load_or_create(tmp_path)
    assert (tmp_path / HOST_KEY_FILE).read_text() == "not a key\n"
