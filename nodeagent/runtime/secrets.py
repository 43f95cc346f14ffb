"""A launch's project secrets (``DesiredContainer.secrets``) inside its container: as environment variables and as
files under ``/run/secrets/``. See docs/runtime.md, "Secrets".

A value is never written to a log line, a report or an exception message here: every refusal names the secret and
the variable, never what it holds. On the host the files live in the launch's directory, under a directory only the
agent's user can enter (mode 0700); the directory mounted into the container and the files in it are readable by
whatever user the image runs as. They go with the launch's directory when the runtime forgets the launch.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from nodeagent import schema
from nodeagent.runtime.mounts import LaunchRefused

SECRETS_MOUNT = "/run/secrets"
# Values shorter than this are not looked for in the agent's own messages (a one-letter value would mangle them).
REDACT_MIN_CHARS = 4
_BARRIER = "secrets"
_FILES = "files"


class SecretRefused(LaunchRefused):
    """A launch's secrets cannot be given to its container as asked (final: the launch is reported failed)."""


def reserved(name: str) -> bool:
    """Whether ``name`` is one of the runtime's own variables (the one rule: ``schema.runtime_env``)."""
    return schema.runtime_env(name)


def check(spec: schema.DesiredContainer) -> None:
    """Refuse secrets that would set the runtime's own variables, or two secrets aimed at one variable or file."""
    envs: dict[str, str] = {}
    files: set[str] = set()
    for secret in spec.secrets:
        if secret.env is not None:
            if reserved(secret.env):
                raise SecretRefused(
                    f"secret {secret.name} may not set {secret.env}: the runtime sets that variable itself "
                    f"(NVIDIA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES and GPUCP_* are reserved)"
                )
            if secret.env in envs:
                raise SecretRefused(f"secrets {envs[secret.env]} and {secret.name} both set {secret.env}")
            envs[secret.env] = secret.name
        if secret.file:
            if secret.name in files:
                raise SecretRefused(f"two secrets would be the file {SECRETS_MOUNT}/{secret.name}")
            files.add(secret.name)


def env_of(spec: schema.DesiredContainer) -> dict[str, str]:
    """The variables the launch's secrets set (checked by ``check`` first)."""
    return {secret.env: secret.value for secret in spec.secrets if secret.env is not None}


def files_dir(launch_dir: Path) -> Path:
    """Where the launch's secret files are on the host (mounted at ``/run/secrets``)."""
    return launch_dir / _BARRIER / _FILES


def prepare_files(launch_dir: Path, spec: schema.DesiredContainer) -> Path | None:
    """Write the launch's secret files (once per launch) and return the directory to mount at ``/run/secrets``;
    None when no secret is wanted as a file.

    ``<launch dir>/secrets`` is mode 0700: no other user of the host gets past it. Inside it, ``files`` (0755) and
    each file (0444) are readable by any user, so the container's user reads them whatever uid its image runs as
    (the bind mount shows the directory itself; the container never walks the host's path to it).

    Written once: a launch created again (a retry, or a racing agent that then adopts the container) keeps the
    values it was first given, the ones its container was made with; a new value applies from the next launch."""
    wanted = [secret for secret in spec.secrets if secret.file]
    if not wanted:
        return None
    barrier = launch_dir / _BARRIER
    barrier.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(barrier, 0o700)
    target = barrier / _FILES
    if target.is_dir():
        return target
    tmp = barrier / f".{_FILES}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o700)
    for secret in wanted:
        fd = os.open(tmp / secret.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
        try:
            os.write(fd, secret.value.encode())
            os.fsync(fd)
            os.fchmod(fd, 0o444)
        finally:
            os.close(fd)
    os.chmod(tmp, 0o755)  # noqa: S103 - behind the 0700 directory; read by the container, whatever its user
    # A rename: a directory only ever holds all of the launch's files.
    os.replace(tmp, target)
    return target


def redact(text: str, secrets: Iterable[schema.SecretValue]) -> str:
    """``text`` with every secret value it holds replaced by the secret's name: for the agent's own messages."""
    for secret in sorted(secrets, key=lambda item: len(item.value), reverse=True):
        if len(secret.value) >= REDACT_MIN_CHARS and secret.value in text:
            text = text.replace(secret.value, f"[secret {secret.name}]")
    return text
