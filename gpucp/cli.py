"""The ``gpucp`` command: the group, its global flags, and how a failure is reported."""

from __future__ import annotations

import json
from typing import Any

import click

from gpucp import __version__, auth, keys, logs, reservations, ssh, usage, volumes, web
from gpucp.client import DEFAULT_TIMEOUT_S
from gpucp.errors import EXIT_CODES_HELP, GpucpError
from gpucp.state import State

EPILOG = (
    EXIT_CODES_HELP
    + """

\b
Environment:
  GPUCP_SERVER, GPUCP_TOKEN  override the stored server and token (scripts, CI)
  XDG_CONFIG_HOME            where gpucp/config.json is kept (default ~/.config)"""
)


class Group(click.Group):
    """Reports a GpucpError on stderr (the API's error body as JSON under --json) and exits with its code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GpucpError as exc:
            state = ctx.obj if isinstance(ctx.obj, State) else State()
            if state.json:
                click.echo(json.dumps(exc.body, ensure_ascii=False), err=True)
            else:
                click.echo(f"gpucp: {exc.message} ({exc.code})", err=True)
            ctx.exit(int(exc.exit_code))


@click.group(cls=Group, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--json", "json_output", is_flag=True, help="Print the API's JSON instead of tables.")
@click.option("--utc", is_flag=True, help="Show times in UTC instead of the local time zone.")
@click.option(
    "--timeout", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_TIMEOUT_S, show_default=True,
    help="Seconds to wait for each answer.",
)  # fmt: skip
@click.version_option(__version__, prog_name="gpucp")
@click.pass_context
def cli(ctx: click.Context, json_output: bool, utc: bool, timeout: float) -> None:
    """gpucp: rent GPUs from the command line, through the control plane's public API."""
    ctx.obj = State(json=json_output, utc=utc, timeout=timeout)


for command in (
    auth.login,
    auth.logout,
    auth.whoami,
    reservations.gpus,
    reservations.book,
    reservations.list_reservations,
    reservations.show,
    reservations.extend,
    reservations.keep,
    reservations.cancel,
    logs.logs,
    ssh.ssh,
    web.open_app,
    usage.usage,
    keys.keys,
    volumes.volumes,
):
    cli.add_command(command)


def main() -> None:
    cli(prog_name="gpucp")
