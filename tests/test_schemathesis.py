"""The OpenAPI schema is what the API does (issue 12): schemathesis, every check, against a live system and the
schema it serves at /api/v1/schema/, as a tenant and as an operator, each with a personal bearer token.

The system is a ``manage.py runsystem`` of its own (web, worker, agents) on a throwaway SQLite database, so what
the run creates, changes and deletes (it drains servers, revokes credentials, books and cancels) touches no other
test. It runs once, in the SQLite leg. Bounded: ``EXAMPLES`` cases per operation and phase, a fixed seed, so a
failure reproduces (the report names ``st replay`` commands) and the whole test takes a couple of minutes.

By hand, against any running system: see docs/api.md, "How the schema is checked".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import service_missing
from tests.runsystem_support import RunningSystem

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "10"))
SEED = os.environ.get("SCHEMATHESIS_SEED", "1")
TENANT_PASSWORD = "alice-schemathesis-password"
OPERATOR_PASSWORD = "operator-schemathesis-password"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "schemathesis"
CONFIG = Path(__file__).with_name("schemathesis.toml")
# An operator's moves that take a simulated node off the system for good: a retired server or a revoked
# credential cannot enroll again, its agent exits, and runsystem stops everything on that crash loop. They are
# tested last, alone (``operator-node-lifecycle``), after which the system is not used again.
NODE_ENDING = ["/api/v1/servers/{id}/state/", "/api/v1/servers/{id}/revoke-credential/"]


@pytest.fixture(scope="module")
def live_system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from django.db import connection

    if connection.vendor != "sqlite":
        pytest.skip("schemathesis runs against a system of its own on SQLite; it runs in the SQLite leg")
    try:
        import schemathesis  # noqa: F401
    except ImportError:
        service_missing("schemathesis (pip install -e '.[dev]')")
    system = RunningSystem(
        tmp_path_factory.mktemp("schemathesis-var"),
        extra_env={
            "DEMO_TENANT_PASSWORD": TENANT_PASSWORD,
            "DEMO_OPERATOR_PASSWORD": OPERATOR_PASSWORD,
            # Thousands of requests a minute from one user: the throttle's 429 is documented, but a run that
            # hits it tests the throttle instead of the operations.
            "API_THROTTLE_USER": "1000000/min",
            "API_THROTTLE_ANON": "1000000/min",
        },
    )
    try:
        system.wait_for(r"agents up; Ctrl-C stops everything", timeout=180)
        yield f"http://127.0.0.1:{system.port}"
    finally:
        system.stop()


def personal_token(base: str, username: str, password: str) -> str:
    """Sign in as the portal does, then create a personal API token, as a user would."""
    session = requests.Session()
    session.get(f"{base}/api/v1/auth/csrf/", timeout=10).raise_for_status()
    headers = {"X-CSRFToken": session.cookies["csrftoken"], "Referer": f"{base}/"}
    login = session.post(
        f"{base}/api/v1/auth/login/", json={"username": username, "password": password}, headers=headers, timeout=10
    )
    login.raise_for_status()
    headers["X-CSRFToken"] = session.cookies["csrftoken"]
    created = session.post(f"{base}/api/v1/tokens/", json={"name": "schemathesis"}, headers=headers, timeout=10)
    created.raise_for_status()
    return str(created.json()["token"])


def run_schemathesis(base: str, token: str, who: str, selection: list[str]) -> tuple[dict, str, float]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    report = ARTIFACTS / f"{who}.json"
    report.unlink(missing_ok=True)
    argv = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(CONFIG),
        "run",
        f"{base}/api/v1/schema/",
        "--checks",
        "all",
        "--max-examples",
        str(EXAMPLES),
        "--seed",
        SEED,
        "--workers",
        "1",
        "--header",
        f"Authorization: Bearer {token}",
        "--request-timeout",
        "30",
        "--report",
        "json",
        "--report-json-path",
        str(report),
        "--no-color",
        *selection,
    ]
    if only := os.environ.get("SCHEMATHESIS_INCLUDE_PATH_REGEX"):  # by hand: narrow a run to what is being mended
        argv += ["--include-path-regex", only]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    (ARTIFACTS / f"{who}.txt").write_text(output)
    if not report.exists():
        pytest.fail(f"schemathesis wrote no report ({done.returncode}):\n{output[-6000:]}")
    return json.loads(report.read_text()), output, elapsed


def summary(result: dict) -> str:
    lines = [f"{f['code']} {f['title']}: {f['count']} ({', '.join(f['operations'][:8])})" for f in result["failures"]]
    lines += [f"error: {e['title']}: {e['count']}" for e in result["errors"]]
    return "\n".join(lines)


def _each(flag: str, paths: list[str]) -> list[str]:
    return [arg for path in paths for arg in (flag, path)]


# In this order: the node-ending operations last.
RUNS = [
    ("tenant", "alice", TENANT_PASSWORD, [], 60),
    ("operator", "operator", OPERATOR_PASSWORD, _each("--exclude-path", NODE_ENDING), 60),
    ("operator-node-lifecycle", "operator", OPERATOR_PASSWORD, _each("--include-path", NODE_ENDING), 2),
]


@pytest.mark.parametrize(("who", "username", "password", "selection", "at_least"), RUNS, ids=[r[0] for r in RUNS])
def test_the_api_does_what_its_schema_says(
    live_system: str, who: str, username: str, password: str, selection: list[str], at_least: int
) -> None:
    token = personal_token(live_system, username, password)
    result, output, elapsed = run_schemathesis(live_system, token, who, selection)
    print(f"schemathesis as {who}: {result['test_cases']} in {elapsed:.0f}s")
    tested = result["operations"]
    assert tested.get("tested", 0) >= at_least, f"schemathesis tested too little: {tested}\n{output[-3000:]}"
    assert not result["failures"] and not result["errors"], (
        f"schemathesis as {who} found failures:\n{summary(result)}\n\n{output[-12000:]}"
    )
