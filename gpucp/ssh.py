"""``gpucp ssh ID``: write the gateway's host key where OpenSSH will check it, then run OpenSSH.

The control plane's ``access`` block gives, per server the reservation runs on, the exact ``ssh`` target and
the ``known_hosts`` line of that server's gateway. The line goes to gpucp's own known_hosts file (beside its
config, mode 0600) and ssh runs with ``StrictHostKeyChecking=yes`` against it: the host key is the one the
agent reported, never trusted on first use. gpucp exits with ssh's own status: the remote command's exit
status, or 255 when ssh itself failed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import click

from gpucp import config
from gpucp.client import path
from gpucp.errors import Exit, GpucpError
from gpucp.output import emit_json
from gpucp.state import State, pass_state


class NotReady(GpucpError):
    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=Exit.REFUSED, code="not_ready")


def known_hosts_path() -> Path:
    return config.config_dir() / "known_hosts"


def remember_host_key(line: str, *, file: Path | None = None) -> Path:
    """Put ``line`` ("[host]:port key") in gpucp's known_hosts, replacing any older key of the same host:port.

    Written to a temporary file that ``mkstemp`` makes 0600, then renamed, like the config."""
    file = file or known_hosts_path()
    host = line.split(" ", 1)[0]
    try:
        kept = [old for old in file.read_text().splitlines() if old.split(" ", 1)[0] != host and old.strip()]
    except FileNotFoundError:
        kept = []
    file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".known_hosts.", dir=file.parent)
    try:
        with os.fdopen(fd, "w") as out:
            out.write("\n".join([*kept, line]) + "\n")
        os.replace(tmp, file)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return file


def ssh_argv(
    entry: dict[str, Any],
    *,
    known_hosts: Path,
    identity: str | None,
    forwards: tuple[str, ...],
    options: tuple[str, ...],
    command: tuple[str, ...],
    ssh: str = "ssh",
) -> list[str]:
    argv = [ssh, "-p", str(entry["port"]), "-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes"]
    if identity:
        argv += ["-i", identity, "-o", "IdentitiesOnly=yes"]
    for forward in forwards:
        argv += ["-L", forward]
    for option in options:
        argv += ["-o", option]
    argv.append(f"{entry['user']}@{entry['host']}")
    if command:
        argv += ["--", *command]
    return argv


@click.command(context_settings={"ignore_unknown_options": False})
@click.argument("reservation_id", metavar="ID", type=click.UUID)
@click.option("--server", help="Which server, when the reservation runs on several (default: the first).")
@click.option("-i", "--identity", metavar="FILE", help="The private key to use (ssh -i).")
@click.option(
    "-L",
    "forwards",
    multiple=True,
    metavar="[BIND:]PORT:HOST:HOSTPORT",
    help="Forward a local port into the container (ssh -L); repeatable.",
)
@click.option("-o", "options", multiple=True, metavar="OPTION", help="An OpenSSH option (ssh -o); repeatable.")
@click.option(
    "--print",
    "print_only",
    is_flag=True,
    help="Print the ssh command (the host key is still written).",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@pass_state
def ssh(
    state: State,
    reservation_id: uuid.UUID,
    server: str | None,
    identity: str | None,
    forwards: tuple[str, ...],
    options: tuple[str, ...],
    print_only: bool,
    command: tuple[str, ...],
) -> None:
    """Open a shell in a running reservation's container, or run COMMAND there (after --).

    The gateway's host key is written to gpucp's known_hosts first, and OpenSSH checks it strictly.
    Exits with ssh's status (the remote command's, or 255 when ssh failed).
    """
    detail = state.api().get(path("reservations", reservation_id))
    access = detail.get("access") or {}
    entries = list(access.get("ssh") or [])
    if not access.get("ready") or not entries:
        raise NotReady(str(access.get("message") or "The reservation accepts no SSH session now."))
    if server is not None:
        entries = [e for e in entries if e["server"] == server]
        if not entries:
            names = ", ".join(e["server"] for e in access["ssh"])
            raise click.UsageError(f"The reservation runs on {names}, not on {server}.")
    elif len(entries) > 1:
        click.echo(
            f"gpucp: the reservation runs on {len(entries)} servers; connecting to {entries[0]['server']} "
            "(--server chooses another)",
            err=True,
        )
    entry = entries[0]
    file = remember_host_key(entry["known_hosts"])
    binary = os.environ.get("GPUCP_SSH") or "ssh"
    argv = ssh_argv(
        entry, known_hosts=file, identity=identity, forwards=forwards, options=options, command=command, ssh=binary
    )
    if print_only:
        if state.json:
            emit_json({"argv": argv, "known_hosts_file": str(file), "access": entry})
        else:
            click.echo(" ".join(_quote(part) for part in argv))
        return
    found = shutil.which(binary)
    if found is None:
        raise click.UsageError(f"{binary} was not found: install the OpenSSH client (openssh-client).")
    sys.stdout.flush()
    sys.stderr.flush()
    # A child, not exec: gpucp stays a well-behaved click command (and testable); ssh owns the terminal.
    code = subprocess.call([found, *argv[1:]])
    raise SystemExit(code)


def _quote(part: str) -> str:
    import shlex

    return shlex.quote(part)
