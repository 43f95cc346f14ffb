"""What the browser tests share: the portal built by npm, a real system (``manage.py runsystem``) of their own with
the demo users, and a browser script (``tests/e2e/*.e2e.mjs``: playwright-core with Debian's chromium, no browser
download) run against it. The fixtures over these are in conftest.py.

The browser runs once, in the SQLite leg of the suite (a system of its own on SQLite), unless E2E_DATABASE_URL
names a database for it. Without chromium or npm the tests skip on a developer's machine and fail under CI=true.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import service_missing

ROOT = Path(__file__).resolve().parents[2]
FRONTEND = ROOT / "frontend"
ARTIFACTS = ROOT / "test-artifacts" / "portal"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# Browser scripts with a pytest driver of their own (what they need beyond the running system), which
# test_portal.py's run of every script leaves out: webapps needs Docker and the lab image (test_portal_web_apps.py).
OWN_DRIVERS = frozenset({"webapps.e2e.mjs"})
TENANT_PASSWORD = "alice-e2e-password"
OPERATOR_PASSWORD = "operator-e2e-password"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_command(cmd: list[str], *, cwd: Path, timeout: float) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def npm_ci_if_needed(npm: str) -> None:
    if not (FRONTEND / "node_modules" / ".package-lock.json").exists():
        run_command([npm, "ci", "--no-audit", "--no-fund"], cwd=FRONTEND, timeout=600)


def build_portal() -> None:
    """Skip (fail under CI) in the other database leg or without the tools; else build the portal, always: a
    stale dist/ would test yesterday's portal."""
    from django.db import connection

    if connection.vendor != "sqlite" and not os.environ.get("E2E_DATABASE_URL"):
        pytest.skip("the browser run starts a system of its own on SQLite; it runs in the SQLite leg")
    npm, node = shutil.which("npm"), shutil.which("node")
    if not npm or not node:
        service_missing("npm and node (needed to build and drive the portal)")
    if not Path(CHROMIUM).exists():
        service_missing(f"Chromium at {CHROMIUM}")
    npm_ci_if_needed(npm)  # type: ignore[arg-type]
    run_command([npm, "run", "build"], cwd=FRONTEND, timeout=600)  # type: ignore[list-item]


def operator_session(base: str) -> urllib.request.OpenerDirector:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(f"{base}/api/v1/auth/csrf/", timeout=5).read()
    token = next(c.value for c in jar if c.name == "csrftoken")
    body = json.dumps({"username": "operator", "password": OPERATOR_PASSWORD}).encode()
    request = urllib.request.Request(  # noqa: S310 - the test builds an http URL itself
        f"{base}/api/v1/auth/login/",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "X-CSRFToken": token, "Referer": f"{base}/"},
    )
    opener.open(request, timeout=5).read()
    return opener


def wait_until_ready(base: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    """Up when the operator can sign in and every simulated server has reported its GPUs."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"runsystem exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            servers = json.loads(operator_session(base).open(f"{base}/api/v1/servers/?limit=100", timeout=5).read())
            ready = [s for s in servers["results"] if s["state"] == "ready" and s["gpus"]]
            if servers["count"] and len(ready) == servers["count"]:
                return
            last = f"{len(ready)} of {servers['count']} servers ready"
        except Exception as exc:  # still starting: any failure means "not yet"
            last = repr(exc)
        time.sleep(1)
    pytest.fail(f"the system did not come up in {timeout:.0f}s ({last}):\n{log.read_text()[-4000:]}")


def running_system(var: Path) -> Iterator[str]:
    """``runsystem`` (web, worker, beat, the web proxy on the web port + 1, the simulated agents: with Docker and
    their SSH gateways where an engine answers) on a free port with the demo users; yields its URL once every
    server is ready, and stops its process group after."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    # A throwaway SQLite system of its own, unless a database is named for the end-to-end run.
    if os.environ.get("E2E_DATABASE_URL"):
        env["DATABASE_URL"] = os.environ["E2E_DATABASE_URL"]
    env.update(
        CONTROLPLANE_VAR_DIR=str(var),
        DEMO_TENANT_PASSWORD=TENANT_PASSWORD,
        DEMO_OPERATOR_PASSWORD=OPERATOR_PASSWORD,
        PYTHONUNBUFFERED="1",
    )
    log = var / "runsystem.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "runsystem", "--no-frontend", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(base, proc, log, timeout=180)
        yield base
    finally:
        # runsystem leads its own process group (web, worker, beat, proxy, agents): stop that group only.
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        remove_containers(var)


def remove_containers(var: Path) -> None:
    """Remove the containers of the system run in ``var``. A stopped agent leaves its containers running (as a
    real one does across its restarts), and a reservation released just before the end may not be stopped yet:
    without this a lab or a ``sleep 7200`` would outlive the test."""
    from controlplane.system.management.commands.runsystem import container_scope
    from nodeagent.runtime.containers import LABEL_NODE

    try:
        import docker

        client = docker.from_env(timeout=30)
        client.ping()
    except Exception:  # no engine: the agents ran without containers
        return
    owners = f"{container_scope(var)}/"
    try:
        for container in client.containers.list(all=True, filters={"label": LABEL_NODE}):
            if container.labels.get(LABEL_NODE, "").startswith(owners):
                container.remove(force=True)
    finally:
        client.close()


def run_script(script: Path, base: str, *, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    """Run one browser script against the system at ``base`` (``env`` added to its environment); it must print its
    PASS line. Answers its output."""
    environ = dict(
        os.environ,
        **(env or {}),
        PORTAL_URL=base,
        TENANT_USER="alice",
        TENANT_PASSWORD=TENANT_PASSWORD,
        OPERATOR_USER="operator",
        OPERATOR_PASSWORD=OPERATOR_PASSWORD,
        ARTIFACTS_DIR=str(ARTIFACTS),
        CHROMIUM=CHROMIUM,
    )
    done = subprocess.run(
        ["node", str(script)], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=timeout, check=False
    )
    print(done.stdout)
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert f"e2e | PASS {script.name.removesuffix('.e2e.mjs')}" in done.stdout
    return done.stdout
