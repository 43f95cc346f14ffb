"""``gpucp keys add``, ``ls`` and ``rm``: the caller's SSH public keys, through ``/api/v1/ssh-keys/``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from gpucp.client import path
from gpucp.errors import ApiError
from gpucp.output import emit_json, table, when
from gpucp.state import State, pass_state

# The API's limits (docs/access.md, "Keys"): a name is cut to fit; a file is read only up to what could be a key.
NAME_MAX = 100
READ_MAX = 64 * 1024
# A private key is never sent, not even to be refused: its first line in the formats ssh-keygen, OpenSSL and
# PuTTY write. Whether a public key is acceptable is the API's to judge.
PRIVATE_MARKERS = ("PRIVATE KEY-----", "PuTTY-User-Key-File-")


def _read_key(file: Path) -> str:
    if str(file) == "-":
        text = sys.stdin.read(READ_MAX)
    else:
        try:
            with file.expanduser().open("r", encoding="utf-8", errors="replace") as handle:
                text = handle.read(READ_MAX)
        except OSError as exc:
            raise click.BadParameter(f"cannot read {file}: {exc.strerror}", param_hint="PATH")
    if any(marker in text for marker in PRIVATE_MARKERS):
        public = f" ({file}.pub)" if Path(f"{file}.pub").expanduser().is_file() else ""
        raise click.BadParameter(
            f"{file} is a private key, which must never leave your machine; it was not sent. "
            f"Give its public half{public}.",
            param_hint="PATH",
        )
    return text


def _default_name(text: str, file: Path) -> str:
    """The key's comment (``you@laptop``), else the file's name."""
    parts = text.strip().split(None, 2)
    name = parts[2].strip() if len(parts) == 3 else ""
    if not name:
        name = "stdin" if str(file) == "-" else file.name
    return name[:NAME_MAX]


def _find(api: Any, ref: str) -> dict[str, Any]:
    """A key of the caller's by its id, fingerprint (``SHA256:...``) or name."""
    if ref.isdigit():
        return dict(api.get(path("ssh-keys", ref)))
    field = "fingerprint" if ref.startswith("SHA256:") else "name"
    found = api.get(path("ssh-keys"), {field: ref})["results"]
    if not found:
        body = {"error": {"code": "not_found", "message": f"You have no SSH key with the {field} {ref!r}.",
                          "fields": {}}}  # fmt: skip
        raise ApiError(404, body)
    return dict(found[0])


def _line(key: dict[str, Any]) -> str:
    return f"{key['name']} ({key['key_type']}, {key['bits']} bits): {key['fingerprint']}"


@click.group()
def keys() -> None:
    """Your SSH public keys, which the SSH gateways accept from you."""


@keys.command(name="add")
@click.argument("file", metavar="PATH", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@click.option("--name", "-n", help="Your name for the key (default: its comment, else the file's name).")
@pass_state
def add(state: State, file: Path, name: str | None) -> None:
    """Add the public key in PATH (a .pub file; - reads stdin).

    \b
    gpucp keys add ~/.ssh/id_ed25519.pub
    """
    text = _read_key(file)
    api = state.api()
    key = api.post(path("ssh-keys"), {"name": name or _default_name(text, file), "public_key": text})
    if state.json:
        emit_json(key)
        return
    click.echo(f"Added {_line(key)}")


@keys.command(name="ls")
@pass_state
def list_keys(state: State) -> None:
    """List your SSH public keys, newest first."""
    page = state.api().get(path("ssh-keys"), {"limit": 500})
    if state.json:
        emit_json(page)
        return
    rows = [
        [k["id"], k["name"], k["key_type"], k["bits"], k["fingerprint"], when(k["created_at"], utc=state.utc)]
        for k in page["results"]
    ]
    if not rows:
        click.echo("You have no SSH keys: `gpucp keys add ~/.ssh/id_ed25519.pub` adds one.")
        return
    click.echo(table(["ID", "NAME", "TYPE", "BITS", "FINGERPRINT", "ADDED"], rows, right=[0, 3]))


@keys.command(name="rm")
@click.argument("ref", metavar="ID")
@pass_state
def remove(state: State, ref: str) -> None:
    """Remove one of your SSH keys, by its ID (or its fingerprint, or its name)."""
    api = state.api()
    key = _find(api, ref)
    api.request("DELETE", path("ssh-keys", key["id"]))
    if state.json:
        emit_json(key)
        return
    click.echo(f"Removed {_line(key)}")
