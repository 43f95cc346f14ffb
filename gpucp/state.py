"""What every command gets: the global flags, the stored config, and an API client for the caller."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import click

from gpucp import config
from gpucp.client import Api, path
from gpucp.errors import NotLoggedIn


@dataclass
class State:
    json: bool = False
    utc: bool = False
    timeout: float = 30.0
    _config: config.Config | None = field(default=None, repr=False)

    @property
    def config(self) -> config.Config:
        if self._config is None:
            self._config = config.load()
        return self._config

    def api(self) -> Api:
        """A client with the caller's token: GPUCP_TOKEN, else the stored one."""
        token = config.resolve_token(self.config)
        if not token:
            raise NotLoggedIn()
        return Api(config.resolve_server(self.config), token, timeout=self.timeout)


pass_state = click.make_pass_decorator(State, ensure=True)


def default_project(api: Api, given: str | None) -> str:
    """``given``, else the caller's only project; with several or none, the caller must say which."""
    if given:
        return given
    me: dict[str, Any] = api.get(path("me"))
    slugs = [m["project_slug"] for m in me.get("memberships", [])]
    if len(slugs) == 1:
        return str(slugs[0])
    if not slugs:
        raise click.UsageError(f"{me.get('username')} is in no project: give --project (operators may give any).")
    raise click.UsageError(f"You are in {len(slugs)} projects ({', '.join(slugs)}): give --project.")
