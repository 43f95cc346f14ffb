"""``gpucp login``, ``logout`` and ``whoami``."""

from __future__ import annotations

import os
import socket
from dataclasses import replace
from typing import Any

import click

from gpucp import config
from gpucp.client import Api, find_token_id, path, session_login
from gpucp.errors import ApiError, GpucpError
from gpucp.output import emit_json, table
from gpucp.state import State, pass_state


def _prefix(token: str) -> str:
    parts = token.split("_", 2)
    return f"{parts[0]}_{parts[1]}_..." if len(parts) == 3 else "(unrecognised token)"


def _revoke(stored: config.Config, timeout: float) -> str:
    """Revoke the stored token through the API; what happened, in words."""
    assert stored.token
    api = Api(config.resolve_server(stored, stored.server), stored.token, timeout=timeout)
    try:
        token_id = stored.token_id or find_token_id(api, stored.token)
        if token_id is None:
            return "it was not found among your tokens"
        api.post(path("tokens", token_id, "revoke"))
    except ApiError as exc:
        if exc.status == 401:
            return "it was no longer valid"
        raise
    return "revoked"


@click.command()
@click.option(
    "--server",
    metavar="URL",
    help=f"The control plane (default: GPUCP_SERVER, the stored one, {config.DEFAULT_SERVER}).",
)
@click.option("--username", "-u", help="Sign in with this user's password (asked for, hidden); a token is created.")
@click.option(
    "--token", "token_value", metavar="TOKEN", help="Store this personal token (gcp_...) once the API accepts it."
)
@click.option(
    "--token-name", metavar="NAME", help='The name of the token created at sign-in (default "gpucp on HOSTNAME").'
)
@pass_state
def login(
    state: State, server: str | None, username: str | None, token_value: str | None, token_name: str | None
) -> None:
    """Sign in; keep a personal token (mode 0600).

    The token is kept in $XDG_CONFIG_HOME/gpucp/config.json (default ~/.config), mode 0600.
    With --username (or neither option) the password is asked for and a new personal token is created
    through the API's session login; with --token an existing token is checked and kept.
    """
    if username and token_value:
        raise click.UsageError("Give --username or --token, not both.")
    old = state.config
    url = config.resolve_server(old, server)
    if token_value is None:
        username = username or click.prompt("Username")
        password = click.prompt("Password", hide_input=True)
        name = token_name or f"gpucp on {socket.gethostname()}"
        created = session_login(Api(url, timeout=state.timeout), username=username, password=password, token_name=name)
        token, token_id, issued = str(created["token"]), int(created["id"]), True
    else:
        token, token_id, issued = token_value.strip(), None, False
    api = Api(url, token, timeout=state.timeout)
    me: dict[str, Any] = api.get(path("me"))
    if token_id is None:
        token_id = find_token_id(api, token)
    replaced = ""
    if old.token and old.token != token and old.issued_by_login and old.server == url:
        # The token this login replaces was created by an earlier login: do not leave it behind, alive.
        try:
            replaced = f"; the previous token: {_revoke(old, state.timeout)}"
        except GpucpError as exc:
            replaced = f"; the previous token could not be revoked ({exc.message})"
    saved = config.save(
        config.Config(server=url, token=token, token_id=token_id, username=me["username"], issued_by_login=issued)
    )
    if state.json:
        emit_json(me)
        return
    click.echo(f"Logged in to {url} as {me['username']} (token {_prefix(token)}, kept in {saved}){replaced}.")


@click.command()
@click.option(
    "--keep-token", is_flag=True, help="Forget the token here without revoking it (it may be used elsewhere)."
)
@pass_state
def logout(state: State, keep_token: bool) -> None:
    """Revoke the stored token and forget it.

    The token is revoked through the API, then removed from this machine; the server is kept.
    """
    stored = state.config
    if os.environ.get(config.TOKEN_ENV):
        click.echo(f"gpucp: {config.TOKEN_ENV} is set in the environment; it is not touched.", err=True)
    if not stored.token:
        click.echo("Not logged in.")
        return
    outcome = "kept (--keep-token)"
    if not keep_token:
        try:
            outcome = _revoke(stored, state.timeout)
        except GpucpError as exc:
            outcome = f"NOT revoked ({exc.message}); revoke it in the portal"
    config.save(replace(stored, token=None, token_id=None, issued_by_login=False))
    click.echo(
        f"Logged out of {stored.server}: token {_prefix(stored.token)} {outcome}, and removed from this machine."
    )


@click.command()
@pass_state
def whoami(state: State) -> None:
    """Who you are signed in as, and your projects.

    The caller of the stored token (or GPUCP_TOKEN), with their role in each project.
    """
    api = state.api()
    me: dict[str, Any] = api.get(path("me"))
    if state.json:
        emit_json(me)
        return
    role = " (operator)" if me.get("is_operator") else ""
    click.echo(f"{me['username']}{role} on {api.server}")
    memberships = me.get("memberships", [])
    if memberships:
        click.echo(
            table(["PROJECT", "ROLE", "NAME"], [[m["project_slug"], m["role"], m["project_name"]] for m in memberships])
        )
    else:
        click.echo("No projects.")
