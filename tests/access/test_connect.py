"""Reaching a running reservation: the keys a node's gateway accepts (in its desired state), the ``access``
block of the reservation's detail, and SSH sessions recorded as events on the reservation."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from controlplane.access import connect
from controlplane.access.services import ssh_key_create
from controlplane.access.web.portalkeys import is_portal_session, portal_key
from controlplane.dispatch import reports, services
from controlplane.dispatch.models import Launch
from controlplane.fleet import desired as fleet_hooks
from controlplane.reservations.models import Reservation
from nodeagent import schema
from tests.access.keygen import ed25519_key, public_line
from tests.dispatch.support import book, report
from tests.factories import ApiTokenFactory, UserFactory
from tests.reservations.fleet import gpu_model, project, server

pytestmark = pytest.mark.django_db

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGnYbGvqK0Yt3Q7sSx1L0e1m0JtO8yq4kqvXb0F1uXyZ"


def key_of(user: Any, name: str = "laptop") -> Any:
    return ssh_key_create(user=user, name=name, public_key=public_line(ed25519_key()), actor=user)


def with_gateway(srv: Any, *, port: int = 2222, address: str | None = "10.1.2.3") -> Any:
    srv.facts = {**(srv.facts or {}), "hostname": srv.hostname, "ssh": {"port": port, "host_key": HOST_KEY}}
    if address:
        srv.facts["ssh"]["address"] = address
    srv.save(update_fields=["facts"])
    return srv


def running(reservation: Reservation, srv: Any) -> Launch:
    services.desired_state_for(server=srv)
    launch = Launch.objects.get(reservation=reservation, server=srv)
    reports.containers_reported(server=srv, reports=[report(launch, "running")], now=timezone.now())
    reservation.refresh_from_db()
    launch.refresh_from_db()
    return launch


class Team:
    def __init__(self) -> None:
        self.owner, self.member, self.viewer, self.outsider = (UserFactory() for _ in range(4))
        self.project = project(owner=self.owner, member=self.member, viewer=self.viewer)
        self.keys = {name: key_of(getattr(self, name)) for name in ("owner", "member", "viewer", "outsider")}


@pytest.fixture
def team() -> Team:
    return Team()


# -- the keys in the desired state ------------------------------------------------------------------------


def own_keys(keys: list[Any]) -> list[Any]:
    """The users' own keys, without the portal keys the web proxy logs in with (access/web/portalkeys.py)."""
    return [k for k in keys if not is_portal_session(k.user, k.fingerprint)]


def test_desired_state_carries_the_keys_of_owners_and_members_only(team: Team) -> None:
    h100 = gpu_model()
    srv = server(h100, gpus=1)
    book(team.project, h100)
    [item], _ = services.desired_state_for(server=srv)
    got = {(k.user, k.fingerprint) for k in item.ssh_keys}
    portal = {name: portal_key(name) for name in (team.owner.username, team.member.username)}
    assert got == {
        (team.owner.username, team.keys["owner"].fingerprint),
        (team.member.username, team.keys["member"].fingerprint),
        *((name, key.fingerprint) for name, key in portal.items()),
    }
    assert {k.public_key for k in own_keys(item.ssh_keys)} == {
        team.keys["owner"].public_key,
        team.keys["member"].public_key,
    }
    # The portal keys are derived, the same in every process, and a viewer has none.
    assert portal_key(team.viewer.username).fingerprint not in {k.fingerprint for k in item.ssh_keys}
    assert {k.public_key for k in item.ssh_keys} >= {key.public_key for key in portal.values()}


def test_a_deactivated_member_and_a_removed_key_no_longer_travel(team: Team) -> None:
    h100 = gpu_model()
    srv = server(h100, gpus=1)
    book(team.project, h100)
    team.member.is_active = False
    team.member.save()
    team.keys["owner"].delete()
    [item], _ = services.desired_state_for(server=srv)
    # The owner keeps only the portal key; the deactivated member has none at all.
    assert [(k.user, k.fingerprint) for k in item.ssh_keys] == [
        (team.owner.username, portal_key(team.owner.username).fingerprint)
    ]


def test_each_project_gets_its_own_keys_on_a_shared_server(team: Team) -> None:
    h100 = gpu_model()
    srv = server(h100, gpus=2)
    other_owner = UserFactory()
    other = project(owner=other_owner)
    other_key = key_of(other_owner)
    mine, theirs = book(team.project, h100), book(other, h100)
    desired, _ = services.desired_state_for(server=srv)
    by_reservation = {item.reservation: {k.fingerprint for k in own_keys(item.ssh_keys)} for item in desired}
    assert by_reservation[str(theirs.public_id)] == {other_key.fingerprint}
    assert other_key.fingerprint not in by_reservation[str(mine.public_id)]


def test_keys_for_all_running_projects_are_read_in_one_query(team: Team, django_assert_max_num_queries: Any) -> None:
    h100 = gpu_model()
    srv = server(h100, gpus=4)
    for _ in range(4):
        owner = UserFactory()
        key_of(owner)
        book(project(owner=owner), h100)
    services.desired_state_for(server=srv)  # opens the windows
    with django_assert_max_num_queries(3):
        desired, _ = services.node_desired_state(server=srv)
    assert len(desired) == 4 and all(len(own_keys(item.ssh_keys)) == 1 for item in desired)


# -- the access block -------------------------------------------------------------------------------------


def test_known_hosts_line_and_command_name_the_port_unless_it_is_22() -> None:
    assert connect.known_hosts_line("h", 22, HOST_KEY) == f"h {HOST_KEY}"
    assert connect.known_hosts_line("h", 2222, HOST_KEY) == f"[h]:2222 {HOST_KEY}"
    assert connect.ssh_command("r", "h", 22) == "ssh r@h"
    assert connect.ssh_command("r", "h", 2222) == "ssh -p 2222 r@h"


def test_a_scheduled_reservation_is_not_ready_yet(team: Team) -> None:
    h100 = gpu_model()
    with_gateway(server(h100, gpus=1))
    r = book(team.project, h100, start_in=3600)
    block = connect.access_block(r)
    assert block == {
        "ready": False,
        "message": "SSH opens when the window starts and the container runs.",
        "ssh": [],
        "web": [],
        "terminal": False,
    }


def test_a_running_reservation_shows_the_ssh_command_and_known_hosts_line(team: Team) -> None:
    h100 = gpu_model()
    srv = with_gateway(server(h100, gpus=1), port=2201)
    r = book(team.project, h100)
    running(r, srv)
    block = connect.access_block(r)
    rid = str(r.public_id)
    assert block["ready"] is True
    assert block["ssh"] == [
        {
            "server": srv.hostname,
            "host": "10.1.2.3",
            "port": 2201,
            "user": rid,
            "command": f"ssh -p 2201 {rid}@10.1.2.3",
            "known_hosts": f"[10.1.2.3]:2201 {HOST_KEY}",
        }
    ]


def test_a_server_without_a_gateway_says_so(team: Team) -> None:
    h100 = gpu_model()
    srv = server(h100, gpus=1)
    r = book(team.project, h100)
    running(r, srv)
    block = connect.access_block(r)
    assert block["ready"] is False and srv.hostname in block["message"] and "no SSH gateway" in block["message"]


def test_the_address_defaults_to_the_reported_hostname(team: Team) -> None:
    h100 = gpu_model()
    srv = with_gateway(server(h100, gpus=1), address=None)
    r = book(team.project, h100)
    running(r, srv)
    [entry] = connect.access_block(r)["ssh"]
    assert entry["host"] == srv.hostname


def test_a_finished_reservation_is_closed(team: Team) -> None:
    h100 = gpu_model()
    srv = with_gateway(server(h100, gpus=1))
    r = book(team.project, h100)
    running(r, srv)
    Reservation.objects.filter(pk=r.pk).update(state="completed")
    r.refresh_from_db()
    assert connect.access_block(r)["ready"] is False


def test_the_api_detail_shows_access_to_the_team_and_404_to_others(team: Team) -> None:
    from rest_framework.test import APIClient

    h100 = gpu_model()
    srv = with_gateway(server(h100, gpus=1))
    r = book(team.project, h100)
    running(r, srv)

    def get(user: Any) -> Any:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {ApiTokenFactory(user=user).plaintext}")
        return client.get(f"/api/v1/reservations/{r.public_id}/")

    for user in (team.owner, team.member, team.viewer):
        answer = get(user)
        assert answer.status_code == 200
        assert answer.json()["access"]["ready"] is True
        assert answer.json()["access"]["ssh"][0]["known_hosts"].endswith(HOST_KEY)
    assert get(team.outsider).status_code == 404


# -- sessions as events -----------------------------------------------------------------------------------


def session_event(r: Reservation, phase: str, *, session_id: str = "s-1", **fields: Any) -> schema.AgentEvent:
    now = timezone.now()
    info = schema.SessionInfo(
        session_id=session_id,
        phase=phase,  # type: ignore[arg-type]
        user="alice",
        fingerprint="SHA256:abc",
        source="192.0.2.7:50000",
        started_at=now - timedelta(seconds=30),
        ended_at=now if phase == "close" else None,
        kinds=["shell"] if phase == "close" else [],
        reason="client disconnected" if phase == "close" else "",
        **fields,
    )
    return schema.AgentEvent(kind="session", ts=now, reservation=str(r.public_id), session=info)


def session_events(r: Reservation) -> list[Any]:
    return list(r.events.filter(data__kind="ssh_session").order_by("id"))


def test_a_session_is_recorded_once_per_phase_even_when_resent(team: Team) -> None:
    h100 = gpu_model()
    srv = with_gateway(server(h100, gpus=1))
    r = book(team.project, h100)
    running(r, srv)
    opened = session_event(r, "open")
    fleet_hooks.sessions_reported(srv, [opened], timezone.now())
    fleet_hooks.sessions_reported(srv, [opened, session_event(r, "close")], timezone.now())
    fleet_hooks.sessions_reported(srv, [session_event(r, "close")], timezone.now())
    events = session_events(r)
    assert [e.data["phase"] for e in events] == ["open", "close"]
    assert events[0].reason == f"SSH session s-1 opened by alice (SHA256:abc) from 192.0.2.7:50000 on {srv.hostname}"
    assert events[1].reason.endswith("closed: client disconnected")
    assert events[1].actor_label == "user:alice"
    assert events[1].data["server"] == srv.hostname and events[1].data["kinds"] == ["shell"]


def test_another_servers_agent_cannot_write_sessions_on_a_reservation(team: Team) -> None:
    h100 = gpu_model()
    srv, stranger = with_gateway(server(h100, gpus=1)), server(h100, gpus=1)
    r = book(team.project, h100, count=1)
    running(r, srv)
    fleet_hooks.sessions_reported(stranger, [session_event(r, "open")], timezone.now())
    assert session_events(r) == []


def test_a_session_for_an_unknown_reservation_is_ignored(team: Team) -> None:
    h100 = gpu_model()
    srv = with_gateway(server(h100, gpus=1))
    event = schema.AgentEvent(
        kind="session",
        ts=timezone.now(),
        reservation="not-a-uuid",
        session=session_event(book(team.project, h100), "open").session,
    )
    fleet_hooks.sessions_reported(srv, [event], timezone.now())
