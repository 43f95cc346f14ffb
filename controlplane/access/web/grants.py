"""Who may open what through the web proxy, and where it runs: one rule for the API's Open and terminal links
and for every request the proxy relays.

The rule is the SSH gateway's (docs/access.md, "Who may connect"): the project's owners and members, active,
while the reservation's container runs inside its window. Viewers, other projects' members and operators who
are not members read "not found", as they would an id that does not exist. A grant's ``status`` says why not:

- ``not_found``: no such reservation among the caller's, or no such port;
- ``not_ready``: the window has not opened, the container is starting, or its agent runs no gateway;
- ``gone``: the window has ended (the proxy answers 410 and closes what is open).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit

from django.contrib.auth import get_user_model

from controlplane.access.connect import known_hosts_line
from controlplane.accounts.choices import BOOKING_ROLES
from controlplane.accounts.models import Membership
from controlplane.dispatch.choices import LaunchState
from controlplane.dispatch.models import Launch
from controlplane.reservations.choices import FINAL_STATES, ReservationState
from controlplane.reservations.models import Reservation
from controlplane.reservations.specs import WebPort, app_token, ports_from_stored

OK, NOT_FOUND, NOT_READY, GONE = "ok", "not_found", "not_ready", "gone"


@dataclass(frozen=True)
class Target:
    """A node gateway the proxy logs in to, as the control plane reaches it, and its host key line."""

    server: str
    host: str
    port: int
    known_hosts: str


@dataclass(frozen=True)
class Grant:
    status: str
    message: str
    reservation: str = ""
    reservation_pk: int = 0
    user: str = ""
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    port: WebPort | None = None  # None: the web terminal
    targets: tuple[Target, ...] = ()
    # The token a signing-in port (auth "jupyter") is opened with: the container has it as JUPYTER_TOKEN.
    token: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK


def _refused(status: str, message: str, **kwargs: object) -> Grant:
    return Grant(status=status, message=message, **kwargs)  # type: ignore[arg-type]


def not_found(reservation: str) -> Grant:
    return _refused(NOT_FOUND, f"No reservation {reservation} of yours, or no such app on it.")


def gateway_host(facts: dict[str, object], hostname: str) -> str:
    """Where the control plane reaches a node's gateway: the host of the agent's command listener (the address
    the control plane already reaches it at, docs/operations.md), else the gateway's address for tenants, else
    the node's hostname."""
    url = facts.get("command_url")
    if isinstance(url, str) and (host := urlsplit(url).hostname):
        return host
    ssh = facts.get("ssh") if isinstance(facts.get("ssh"), dict) else {}
    address = ssh.get("address") if isinstance(ssh, dict) else None
    return str(address or facts.get("hostname") or hostname)


def targets_of(reservation: Reservation) -> tuple[list[Target], list[str]]:
    """The gateways of the servers the reservation's container runs on, by server name; and the servers whose
    agent runs none."""
    targets: list[Target] = []
    without: list[str] = []
    launches = (
        Launch.objects.filter(reservation=reservation, state=LaunchState.RUNNING)
        .select_related("server")
        .order_by("server__hostname")
    )
    for launch in launches:
        server = launch.server
        facts = server.facts if isinstance(server.facts, dict) else {}
        ssh = facts.get("ssh") if isinstance(facts.get("ssh"), dict) else None
        if not ssh or not ssh.get("host_key") or not ssh.get("port"):
            without.append(server.hostname)
            continue
        host = gateway_host(facts, server.hostname)
        port = int(ssh["port"])
        targets.append(Target(server.hostname, host, port, known_hosts_line(host, port, str(ssh["host_key"]))))
    return targets, without


def grant_for(user_id: int, reservation_id: str, port_name: str | None, *, now: datetime) -> Grant:
    """May the user open ``port_name`` (None: a terminal) of the reservation now, and through which gateways."""
    user = get_user_model().objects.filter(pk=user_id, is_active=True).only("username").first()
    reservation = (
        Reservation.objects.filter(public_id=reservation_id).only("pk", "project_id", "state", "starts_at",
                                                                   "ends_at", "ports", "public_id").first()
    )  # fmt: skip
    if user is None or reservation is None:
        return not_found(reservation_id)
    role = Membership.objects.filter(project_id=reservation.project_id, user_id=user_id).values_list("role", flat=True)
    if not set(role) & BOOKING_ROLES:
        return not_found(reservation_id)
    port = None
    if port_name is not None:
        port = next((p for p in ports_from_stored(list(reservation.ports or [])) if p.name == port_name), None)
        if port is None or port.protocol != "http":
            return not_found(reservation_id)
    common = {
        "reservation": str(reservation.public_id),
        "reservation_pk": reservation.pk,
        "user": user.username,
        "starts_at": reservation.starts_at,
        "ends_at": reservation.ends_at,
        "port": port,
    }
    state = reservation.state
    if state in FINAL_STATES or state == ReservationState.ENDING or now >= reservation.ends_at:
        when = reservation.ends_at.strftime("%Y-%m-%d %H:%M UTC")
        return _refused(GONE, f"The reservation has ended (its window closed at {when}).", **common)
    if state in (ReservationState.PENDING, ReservationState.SCHEDULED) or now < reservation.starts_at:
        when = reservation.starts_at.strftime("%Y-%m-%d %H:%M UTC")
        return _refused(NOT_READY, f"The window has not opened; it opens at {when}.", **common)
    targets, without = targets_of(reservation)
    if not targets:
        if without:
            message = f"The agent on {', '.join(without)} runs no SSH gateway, which the web proxy goes through."
        else:
            message = "The container is starting; its apps open once it runs."
        return _refused(NOT_READY, message, **common)
    token = app_token(str(reservation.public_id)) if port is not None and port.auth != "none" else None
    return Grant(status=OK, message="", targets=tuple(targets), token=token, **common)  # type: ignore[arg-type]
