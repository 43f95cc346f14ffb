"""The portal end to end: a real system (``manage.py runsystem``) driven through headless Chromium.

The browser script is tests/e2e/portal.e2e.mjs (playwright-core with Debian's chromium; no browser download).
Without chromium or npm the test skips on a developer's machine and fails under CI=true.
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
SCRIPT = Path(__file__).with_name("portal.e2e.mjs")
ARTIFACTS = ROOT / "test-artifacts" / "portal"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
TENANT_PASSWORD = "alice-e2e-password"
OPERATOR_PASSWORD = "operator-e2e-password"

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(cmd: list[str], *, cwd: Path, timeout: float) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def _build_portal(npm: str) -> None:
    if not (FRONTEND / "node_modules" / ".package-lock.json").exists():
        _run([npm, "ci", "--no-audit", "--no-fund"], cwd=FRONTEND, timeout=600)
    # Always rebuild: a stale dist/ would test yesterday's portal.
    _run([npm, "run", "build"], cwd=FRONTEND, timeout=600)


def _session(base: str) -> urllib.request.OpenerDirector:
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


def _wait_until_ready(base: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    """Up when the operator can sign in and every simulated server has reported its GPUs."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"runsystem exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            servers = json.loads(_session(base).open(f"{base}/api/v1/servers/?limit=100", timeout=5).read())
            ready = [s for s in servers["results"] if s["state"] == "ready" and s["gpus"]]
            if servers["count"] and len(ready) == servers["count"]:
                return
            last = f"{len(ready)} of {servers['count']} servers ready"
        except Exception as exc:  # still starting: any failure means "not yet"
            last = repr(exc)
        time.sleep(1)
    pytest.fail(f"the system did not come up in {timeout:.0f}s ({last}):\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def running_system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from django.db import connection

    if connection.vendor != "sqlite" and not os.environ.get("E2E_DATABASE_URL"):
        pytest.skip("the browser run starts a system of its own on SQLite; it runs in the SQLite leg")
    npm, node = shutil.which("npm"), shutil.which("node")
    if not npm or not node:
        service_missing("npm and node (needed to build and drive the portal)")
    if not Path(CHROMIUM).exists():
        service_missing(f"Chromium at {CHROMIUM}")
    _build_portal(npm)  # type: ignore[arg-type]

    var = tmp_path_factory.mktemp("e2e-var")
    port = _free_port()
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
        _wait_until_ready(base, proc, log, timeout=180)
        yield base
    finally:
        # runsystem leads its own process group (web, worker, beat, agents): stop that group only.
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def _scripts() -> list[Path]:
    """The main walk first, then every other browser script beside it (tests/e2e/*.e2e.mjs), by name."""
    others = sorted(p for p in SCRIPT.parent.glob("*.e2e.mjs") if p != SCRIPT)
    return [SCRIPT, *others]


def _run_script(script: Path, base: str) -> str:
    env = dict(
        os.environ,
        PORTAL_URL=base,
        TENANT_USER="alice",
        TENANT_PASSWORD=TENANT_PASSWORD,
        OPERATOR_USER="operator",
        OPERATOR_PASSWORD=OPERATOR_PASSWORD,
        ARTIFACTS_DIR=str(ARTIFACTS),
        CHROMIUM=CHROMIUM,
    )
    done = subprocess.run(
        ["node", str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    print(done.stdout)
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert f"e2e | PASS {script.name.removesuffix('.e2e.mjs')}" in done.stdout
    return done.stdout


def test_tenant_books_watches_and_cancels_and_operator_drains(running_system: str) -> None:
    _run_script(SCRIPT, running_system)
    for name in (
        "01-login",
        "02-dashboard",
        "03-availability",
        "05-reservation-running",
        "05b-telemetry-charts",
        "07-usage",
        "10-fleet",
    ):
        assert (ARTIFACTS / f"{name}.png").stat().st_size > 10_000, name


@pytest.mark.parametrize("script", _scripts()[1:], ids=lambda p: p.name.removesuffix(".e2e.mjs"))
def test_portal_script(running_system: str, script: Path) -> None:
    """Each further browser script (one per part of the portal) against the same running system."""
    _run_script(script, running_system)


def test_portal_unit_tests_pass() -> None:
    """The portal's own logic (Vitest): quota effect, API client, timeline layout, formatting."""
    npm = shutil.which("npm")
    if not npm or not shutil.which("node"):
        service_missing("npm and node (needed to run the portal's unit tests)")
    if not (FRONTEND / "node_modules" / ".package-lock.json").exists():
        _run([npm, "ci", "--no-audit", "--no-fund"], cwd=FRONTEND, timeout=600)  # type: ignore[list-item]
    _run([npm, "test"], cwd=FRONTEND, timeout=600)  # type: ignore[list-item]
