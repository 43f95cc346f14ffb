"""``gpucp open ID [NAME]``: a one-time link that opens one of a running reservation's web apps in the browser.

The control plane's ``POST /reservations/{id}/open/`` answers the link: good once, for a minute at most (never
past the window), and it signs the browser in to the app's own host at the web proxy. The command prints it
(one line on stdout, so ``$(gpucp open ID)`` is the link) and, with ``--browser``, opens it with Python's
``webbrowser`` (which honours ``$BROWSER``).
"""

from __future__ import annotations

import sys
import uuid
import webbrowser
from datetime import UTC, datetime
from typing import Any

import click

from gpucp.client import path
from gpucp.errors import Exit, GpucpError
from gpucp.output import emit_json, parse_time, when
from gpucp.state import State, pass_state

# The only protocol the proxy opens in a browser (an https or tcp port is reached with `gpucp ssh -L`).
WEB_PROTOCOL = "http"


class NoWebPorts(GpucpError):
    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=Exit.REFUSED, code="no_web_ports")


def web_ports(detail: dict[str, Any]) -> list[dict[str, Any]]:
    """The reservation's ports that open in the browser."""
    return [p for p in detail.get("ports") or [] if p.get("protocol", WEB_PROTOCOL) == WEB_PROTOCOL]


def default_port(detail: dict[str, Any]) -> str:
    """The name of the reservation's only web port; several are a usage error (name one), none a refusal."""
    ports = web_ports(detail)
    if len(ports) == 1:
        return str(ports[0]["name"])
    if ports:
        names = ", ".join(str(p["name"]) for p in ports)
        raise click.UsageError(f"The reservation has {len(ports)} web ports ({names}): name the one to open.")
    others = [f"{p['name']} ({p['port']}/{p['protocol']})" for p in detail.get("ports") or []]
    message = "The reservation declares no web ports (book with --port NAME:PORT)."
    if others:
        message += f" Its other ports ({', '.join(others)}) are reached with gpucp ssh -L."
    raise NoWebPorts(message)


@click.command(name="open")
@click.argument("reservation_id", metavar="ID", type=click.UUID)
@click.argument("name", metavar="[NAME]", required=False)
@click.option("--path", "where", metavar="PATH", help="Where to land on the app (default: the port's path).")
@click.option("--browser", is_flag=True, help="Open the link in the web browser too ($BROWSER chooses which).")
@pass_state
def open_app(state: State, reservation_id: uuid.UUID, name: str | None, where: str | None, browser: bool) -> None:
    """Print a one-time link to a running reservation's web app NAME.

    NAME is one of the reservation's http ports (`gpucp show ID` lists them); without it, its only one. The
    link is good once, for a minute: it signs the browser in to the app, whose address then stays the same.
    """
    api = state.api()
    if name is None:
        name = default_port(api.get(path("reservations", reservation_id)))
    body = {"port": name, **({"path": where} if where is not None else {})}
    link = api.post(path("reservations", reservation_id, "open"), body)
    if state.json:
        emit_json(link)
    else:
        click.echo(link["url"])
        if sys.stdout.isatty():
            left = max(0, round((parse_time(link["expires_at"]) - datetime.now(UTC)).total_seconds()))
            click.echo(
                f"gpucp: good once, until {when(link['expires_at'], utc=state.utc, seconds=True)} (in {left} s); "
                f"then the app is at {link['app_url']}",
                err=True,
            )
    if browser and not webbrowser.open(link["url"]):
        click.echo("gpucp: no web browser could be started; open the link above.", err=True)
