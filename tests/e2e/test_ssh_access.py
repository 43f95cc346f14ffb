"""Into a rented GPU, the whole road: a tenant's key registered through the API, a booking, two real agents
(Agent + DockerRuntime + SSH gateway + volume store, simulated GPUs) in threads talking HTTP to the live
server, and the installed `gpucp` and Debian's OpenSSH client as processes.

Covers what a tenant does (issue 11's proof): `gpucp ssh` writes the host key and gets a shell that sees
exactly the reservation's GPUs, passes exit codes back, is recorded as a session event; a viewer's key is
refused; and a file written to /workspace in one reservation is read by a later one on the other server,
which shares the volume root.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from controlplane.dispatch.models import Launch
from controlplane.inventory.choices import ServerState
from controlplane.inventory.models import Server
from controlplane.reservations.models import Reservation
from tests.e2e.fleet_support import (
    Node,
    Tenant,
    book,
    running,
    start_nodes,
    wait_for,
)
from tests.factories import UserFactory
from tests.reservations.fleet import project

pytestmark = [pytest.mark.docker, pytest.mark.faults, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def nodes(transactional_db, live_server, docker_client, tmp_path: Path, eager_celery) -> Iterator[list[Node]]:  # type: ignore[no-untyped-def]
    yield from start_nodes(live_server, docker_client, tmp_path)


@pytest.fixture
def team(nodes: list[Node], live_server: Any, tmp_path: Path) -> dict[str, Any]:
    owner, viewer, outsider = UserFactory(username="alice"), UserFactory(username="vera"), UserFactory(username="otto")
    proj = project(owner=owner, viewer=viewer, slug="demo")
    project(owner=outsider, slug="elsewhere")
    people = {name: Tenant(tmp_path / name, live_server.url, user) for name, user in
              (("alice", owner), ("vera", viewer), ("otto", outsider))}  # fmt: skip
    for tenant in people.values():
        added = tenant.gpucp("keys", "add", str(tenant.key) + ".pub")
        assert added.returncode == 0, added.stderr
    return {"project": proj, **people}


@override_settings(DISPATCH_WARN_BEFORE_S=0, DISPATCH_STOP_GRACE_S=1)
def test_gpucp_ssh_reaches_exactly_the_reservations_gpus_and_is_recorded(team: dict[str, Any]) -> None:
    alice, vera, otto = team["alice"], team["vera"], team["otto"]
    r = running(book(alice, slug="demo"))
    launch = Launch.objects.get(reservation=r, state="running")

    shown = alice.ssh(r, 'echo "gpus=$NVIDIA_VISIBLE_DEVICES"; tr "\\0" " " < /proc/1/cmdline')
    assert shown.returncode == 0, shown.stderr
    assert f"gpus={','.join(launch.gpu_uuids)}\n" in shown.stdout
    assert shown.stdout.rstrip().endswith("sleep 3600")  # the container's init, not the host's
    known = Path(alice.env["XDG_CONFIG_HOME"]) / "gpucp" / "known_hosts"
    assert known.read_text().strip().endswith(launch.server.facts["ssh"]["host_key"])

    assert alice.ssh(r, "exit 7").returncode == 7

    # A viewer's key is refused with the gateway's one-line reason; another tenant does not even get the access
    # block, and its key is refused at the gateway all the same.
    refused = vera.ssh(r, "true")
    assert refused.returncode == 255 and "is not authorized for reservation" in refused.stderr
    assert otto.gpucp("ssh", "--print", str(r.public_id)).returncode == 4
    port = str(launch.server.facts["ssh"]["port"])
    direct = subprocess.run(
        ["ssh", "-p", port, "-i", str(otto.key), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
         "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes", f"{r.public_id}@127.0.0.1", "true"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert direct.returncode == 255 and "is not authorized for reservation" in direct.stderr

    # Each session is an event on the reservation: who, which key, from where.
    fingerprint = alice.gpucp("--json", "keys", "ls")
    events = wait_for(
        lambda: list(Reservation.objects.get(pk=r.pk).events.filter(data__kind="ssh_session", data__phase="close")),
        what="the session events",
    )
    assert events[0].data["user"] == "alice"
    assert events[0].data["fingerprint"] in fingerprint.stdout
    assert events[0].data["source"].startswith("127.0.0.1:")


@override_settings(DISPATCH_WARN_BEFORE_S=0, DISPATCH_STOP_GRACE_S=1)
def test_a_volume_written_on_one_server_is_read_on_the_other(team: dict[str, Any], nodes: list[Node]) -> None:
    alice = team["alice"]
    created = alice.gpucp("volumes", "create", "data", "--size-gib", "1", "--project", "demo")
    assert created.returncode == 0, created.stderr + created.stdout

    first = running(book(alice, slug="demo", extra=("--volume", "data")))
    assert alice.ssh(first, "echo written-by-the-first > /workspace/note.txt").returncode == 0
    first_server = Launch.objects.get(reservation=first, state="running").server
    assert alice.gpucp("cancel", str(first.public_id)).returncode == 0
    wait_for(lambda: Reservation.objects.get(pk=first.pk).state in ("completed", "cancelled"), what="the first ended")
    # The next one must land on the other server: the first one's is drained.
    Server.objects.filter(pk=first_server.pk).update(state=ServerState.DRAINING)

    second = running(book(alice, slug="demo", extra=("--volume", "data")))
    assert Launch.objects.get(reservation=second, state="running").server_id != first_server.pk
    read = alice.ssh(second, "cat", "/workspace/note.txt")
    assert (read.returncode, read.stdout) == (0, "written-by-the-first\n")


@override_settings(DISPATCH_WARN_BEFORE_S=6, DISPATCH_STOP_GRACE_S=1)
def test_an_open_session_is_warned_and_closed_when_the_window_ends(team: dict[str, Any]) -> None:
    alice = team["alice"]
    r = running(book(alice, slug="demo", minutes=0.25))  # a 15 s window
    remaining = (Reservation.objects.get(pk=r.pk).ends_at - timezone.now()).total_seconds()
    assert remaining > 6, "the window must still be open past the warning"
    session = alice.ssh(r, "sleep", "120")  # blocks until the gateway closes it
    assert session.returncode != 0
    assert "ends in" in session.stderr or "ends in" in session.stdout
    assert timezone.now() >= Reservation.objects.get(pk=r.pk).ends_at - timedelta(seconds=1)
