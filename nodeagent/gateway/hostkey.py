"""The gateway's host key: ed25519, made once in the agent's state directory and kept across restarts, so the
line tenants put in known_hosts stays true for the life of the node."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import asyncssh

log = logging.getLogger(__name__)

HOST_KEY_FILE = "ssh_host_ed25519_key"


class HostKeyError(Exception):
    """The host key file exists but cannot be used; the message says which file and why."""


def load_or_create(state_dir: str | Path) -> asyncssh.SSHKey:
    directory = Path(state_dir)
    path = directory / HOST_KEY_FILE
    try:
        key = asyncssh.read_private_key(str(path))
    except FileNotFoundError:
        pass
    except (asyncssh.KeyImportError, OSError, ValueError) as exc:
        # Never replaced silently: a new key would make every tenant's known_hosts line a warning.
        raise HostKeyError(f"cannot read the SSH host key {path}: {exc}; move it aside to make a new one") from exc
    else:
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            log.warning("%s is readable by others (mode %o); it should be 0600", path, mode)
        return key
    key = asyncssh.generate_private_key("ssh-ed25519")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = directory / f".{HOST_KEY_FILE}.tmp"
    # Created 0600 from the start, written whole, then renamed: a crash leaves the old state or the new key.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, key.export_private_key("openssh"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    log.info("made a new SSH host key in %s", path)
    return key


def public_line(key: asyncssh.SSHKey) -> str:
    """``ssh-ed25519 AAAA...``: the OpenSSH public key line without a comment."""
    algorithm, blob, *_ = key.export_public_key("openssh").decode().split()
    return f"{algorithm} {blob}"
