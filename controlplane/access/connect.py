"""How a tenant reaches a running reservation: the ``access`` block of its API detail and the portal's Connect
panel. Per server it runs on: the exact ``ssh`` command, and the ``known_hosts`` line of that server's gateway
host key (reported by the agent with its facts), so nobody has to trust a host key on first use."""

from __future__ import annotations

from typing import Any

from controlplane.access.web.links import app_url
from controlplane.dispatch.choices import LaunchState
from controlplane.dispatch.models import Launch
from controlplane.reservations.choices import FINAL_STATES, ReservationState
from controlplane.reservations.specs import ports_from_stored

# States in which a session may be open: the agent accepts one while the container runs inside the window.
_CONNECTABLE = frozenset({ReservationState.STARTING, ReservationState.RUNNING})


def known_hosts_line(host: str, port: int, host_key: str) -> str:
    """OpenSSH's known_hosts form: ``host key`` on port 22, ``[host]:port key`` on any other."""
    name = host if port == 22 else f"[{host}]:{port}"
    return f"{name} {host_key}"


def ssh_command(user: str, host: str, port: int) -> str:
    return f"ssh {user}@{host}" if port == 22 else f"ssh -p {port} {user}@{host}"


def access_block(reservation: Any) -> dict[str, Any]:
    """``{"ready", "message", "ssh": [{server, host, port, user, command, known_hosts}]}`` for the reservation."""
    state = reservation.state
    if state in (ReservationState.PENDING, ReservationState.SCHEDULED):
        return _closed("SSH opens when the window starts and the container runs.")
    if state in FINAL_STATES or state == ReservationState.ENDING:
        return _closed("The reservation has ended; its container no longer accepts SSH.")
    launches = (
        Launch.objects.filter(reservation=reservation, state=LaunchState.RUNNING)
        .select_related("server")
        .order_by("server__hostname")
    )
    entries = []
    without_gateway = []
    user = str(reservation.public_id)
    for launch in launches:
        server = launch.server
        ssh = (server.facts or {}).get("ssh") if isinstance(server.facts, dict) else None
        if not ssh or not ssh.get("host_key") or not ssh.get("port"):
            without_gateway.append(server.hostname)
            continue
        host = str(ssh.get("address") or (server.facts or {}).get("hostname") or server.hostname)
        port = int(ssh["port"])
        entries.append(
            {
                "server": server.hostname,
                "host": host,
                "port": port,
                "user": user,
                "command": ssh_command(user, host, port),
                "known_hosts": known_hosts_line(host, port, str(ssh["host_key"])),
            }
        )
    if entries:
        # The web proxy goes through the same gateways (docs/proxy.md): the http ports open, and a terminal.
        web = [
            {**port.stored(), "url": app_url(user, port.name)}
            for port in ports_from_stored(list(reservation.ports or []))
            if port.protocol == "http"
        ]
        return {"ready": True, "message": "", "ssh": entries, "web": web, "terminal": True}
    if without_gateway:
        return _closed(f"The agent on {', '.join(without_gateway)} runs no SSH gateway.")
    if state in _CONNECTABLE:
        return _closed("The container is starting; SSH opens once it runs.")
    return _closed("The reservation is not running.")


def _closed(message: str) -> dict[str, Any]:
    return {"ready": False, "message": message, "ssh": [], "web": [], "terminal": False}
