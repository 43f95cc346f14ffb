"""Helpers every bench shares: a database of its own, a free port, a web server that is up."""

from __future__ import annotations

import http.client
import socket
import subprocess
import time
from urllib.parse import urlparse


def fresh_database(url: str) -> None:
    """The bench owns its database: dropped and made again, so every run starts from the same empty schema."""
    import psycopg

    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    if not name.startswith("bench"):
        raise SystemExit(f"refusing to drop {name!r}: the bench database's name must start with 'bench'")
    admin = parsed._replace(path="/postgres", scheme="postgresql").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Until the web server answers /healthz; a server that exits first ends the bench."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"gunicorn exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("gunicorn did not come up")
