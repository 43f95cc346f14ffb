"""Helpers for the gateway tests: keys made by ssh-keygen, and Debian's OpenSSH client run as a subprocess."""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nodeagent import schema
from tests.runtime import support as runtime_support

CLIENT_TIMEOUT_S = 30


@dataclass(frozen=True)
class Keypair:
    path: Path
    public: str  # "ssh-ed25519 AAAA..." without the comment
    fingerprint: str  # "SHA256:..."

    def authorized(self, user: str) -> schema.AuthorizedKey:
        return schema.AuthorizedKey(user=user, public_key=self.public, fingerprint=self.fingerprint)


def keygen(directory: Path, name: str) -> Keypair:
    path = directory / f"id_{name}"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)], check=True)
    public = " ".join(path.with_suffix(".pub").read_text().split()[:2])
    listed = subprocess.run(["ssh-keygen", "-l", "-f", str(path)], check=True, capture_output=True, text=True)
    return Keypair(path=path, public=public, fingerprint=listed.stdout.split()[1])


class FakeClock:
    """The gateway's wall clock, moved by the test: windows are judged against it."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now or datetime.now(UTC).replace(microsecond=0)

    def __call__(self) -> datetime:
        return self.now


class OpenSsh:
    """The OpenSSH client against one gateway, trusting only the host key line the gateway reports."""

    def __init__(self, *, port: int, host_key_line: str, directory: Path) -> None:
        self.port = port
        self.known_hosts = directory / f"known_hosts_{port}"
        self.known_hosts.write_text(f"[127.0.0.1]:{port} {host_key_line}\n")

    def options(self, key: Keypair) -> list[str]:
        return [
            "-i", str(key.path),
            "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "BatchMode=yes",
            "-o", "IdentitiesOnly=yes",
            "-o", "ConnectTimeout=10",
            "-F", "/dev/null",
        ]  # fmt: skip

    def ssh(
        self,
        key: Keypair,
        user: str,
        command: str,
        *flags: str,
        input: bytes | None = None,
        timeout: float = CLIENT_TIMEOUT_S,
    ) -> subprocess.CompletedProcess[bytes]:
        argv = ["ssh", "-p", str(self.port), *self.options(key), *flags, f"{user}@127.0.0.1"]
        argv += [command] if command else []
        return subprocess.run(argv, input=input, capture_output=True, timeout=timeout, check=False)

    def popen_argv(self, key: Keypair, user: str, *flags: str) -> list[str]:
        return ["ssh", "-p", str(self.port), *self.options(key), *flags, f"{user}@127.0.0.1"]

    def popen(self, key: Keypair, user: str, *flags: str, command: str | None = None, **kwargs: Any) -> Any:
        argv = self.popen_argv(key, user, *flags)
        return subprocess.Popen([*argv, command] if command is not None else argv, **kwargs)

    def scp(self, key: Keypair, *paths: str, legacy: bool = False) -> subprocess.CompletedProcess[bytes]:
        argv = ["scp", "-P", str(self.port), *self.options(key), *(["-O"] if legacy else ["-s"]), *paths]
        return subprocess.run(argv, capture_output=True, timeout=CLIENT_TIMEOUT_S, check=False)

    def sftp(self, key: Keypair, user: str, batch: Sequence[str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
        script = cwd / "sftp-batch"
        script.write_text("\n".join(batch) + "\n")
        argv = ["sftp", "-P", str(self.port), *self.options(key), "-b", str(script), f"{user}@127.0.0.1"]
        return subprocess.run(argv, capture_output=True, timeout=CLIENT_TIMEOUT_S, check=False, cwd=cwd)

    def remote(self, user: str, path: str) -> str:
        return f"{user}@127.0.0.1:{path}"


# The runtime tests' poll, a little faster.
wait_for = functools.partial(runtime_support.wait_for, timeout=10.0, interval=0.05)
