"""A real OCI registry for the tests: distribution's registry v2 (Debian's ``docker-registry``), on a free
loopback port, with htpasswd authentication, storing under a temporary directory.

The Docker engine pulls from a plain-HTTP registry on 127.0.0.0/8 without being told to (its default insecure
range), so nothing about the engine changes. ``push`` tags a local image under the registry's name and pushes it
with credentials, returning the repository digest a pull resolves to.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

BINARY = "docker-registry"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def binary() -> str | None:
    """The registry's executable, or None when the package is not installed."""
    return shutil.which(BINARY) or (f"/usr/bin/{BINARY}" if os.access(f"/usr/bin/{BINARY}", os.X_OK) else None)


def _htpasswd(users: dict[str, str]) -> str:
    import bcrypt

    # distribution reads bcrypt entries only ($2y$ as Apache writes them; $2b$ is the same algorithm).
    return "".join(
        f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()}\n"
        for user, password in users.items()
    )


@dataclass
class Registry:
    host: str  # 127.0.0.1:<port>, as an image reference names it
    users: dict[str, str]
    root: Path
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    pushed: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def auth(self, user: str | None = None) -> dict[str, str]:
        """Docker SDK ``auth_config`` for ``user`` (the first user when not given)."""
        name = user or next(iter(self.users))
        return {"username": name, "password": self.users[name]}

    def push(self, client: Any, local_image: str, repository: str, tag: str = "latest", user: str | None = None) -> str:
        """Push ``local_image`` as ``<host>/<repository>:<tag>``; return its repository digest (``sha256:...``)."""
        target = f"{self.host}/{repository}"
        client.images.get(local_image).tag(target, tag=tag)
        digest = ""
        for line in client.images.push(target, tag=tag, auth_config=self.auth(user), stream=True, decode=True):
            if "error" in line:
                raise RuntimeError(f"push of {target}:{tag} failed: {line['error']}")
            aux = line.get("aux") or {}
            digest = aux.get("Digest", digest)
        if not digest:
            raise RuntimeError(f"push of {target}:{tag} reported no digest")
        self.pushed[f"{target}:{tag}"] = digest
        # The local tag would make the image present on the engine; the tests want to pull it.
        client.images.remove(f"{target}:{tag}", noprune=True)
        return digest

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None


def start_registry(root: Path, users: dict[str, str] | None = None, *, port: int | None = None) -> Registry:
    """Start a registry under ``root`` on a free loopback port; raise when it does not answer within 20 s."""
    exe = binary()
    if exe is None:
        raise RuntimeError(f"{BINARY} is not installed (Debian's docker-registry package)")
    users = users if users is not None else {"ci-pusher": "registry-pw-for-tests"}
    root.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    auth = ""
    if users:
        (root / "htpasswd").write_text(_htpasswd(users))
        auth = f"auth:\n  htpasswd:\n    realm: gpucp-test\n    path: {root / 'htpasswd'}\n"
    (root / "config.yml").write_text(
        "version: 0.1\n"
        "log:\n  level: info\n  accesslog:\n    disabled: true\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n  secret: gpucp-tests-only\n"
        f"{auth}"
    )
    log_path = root / "registry.log"
    with log_path.open("wb") as out:
        process = subprocess.Popen(
            [exe, "serve", str(root / "config.yml")], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    registry = Registry(host=f"127.0.0.1:{port}", users=users, root=root, process=process, log_path=log_path)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the registry exited with {process.returncode}: {registry.log()[-2000:]}")
        try:
            answer = requests.get(f"{registry.url}/v2/", timeout=1)
            if answer.status_code in (200, 401):
                return registry
        except requests.RequestException:
            pass
        time.sleep(0.1)
    registry.stop()
    raise RuntimeError(f"the registry did not answer on {registry.host} within 20 s: {registry.log()[-2000:]}")
