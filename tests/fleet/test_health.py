"""The probes: liveness asks nothing, readiness names each dependency and is 503 only without the database,
and no probe waits past its deadline whatever hangs. The faults are real: a closed port, a silent server, a
database address nobody answers at."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings
from rest_framework.test import APIClient

from tests.core.sockets import SilentServer, closed_port
from tests.dispatch.support import celery_broker


def redis_cache(url: str, timeout: float = 0.3) -> dict[str, Any]:
    return {
        "default": {
            "BACKEND": "controlplane.core.cache.FailOpenRedisCache",
            "LOCATION": url,
            "OPTIONS": {"socket_connect_timeout": timeout, "socket_timeout": timeout},
        }
    }


@pytest.fixture(autouse=True)
def no_check_in_flight() -> Iterator[None]:
    """A check still running when a test ends (one hung on that test's silent server) would be shared with the
    next test's probe, by design; each test starts with none in flight instead."""
    from concurrent.futures import wait

    from controlplane.core import health

    yield
    wait(list(health._runner._inflight.values()), timeout=10)
    health._runner._inflight.clear()


def states(body: dict[str, Any]) -> dict[str, str]:
    return {name: check["state"] for name, check in body["checks"].items()}


@pytest.fixture
def database_unreachable(transactional_db: Any) -> Iterator[None]:
    """New connections of the default database go where nothing answers (the probe's thread makes one)."""
    db = connections.settings["default"]
    saved = dict(db)
    if db["ENGINE"].endswith("sqlite3"):
        db["NAME"] = "/nonexistent/directory/controlplane.sqlite3"
    else:
        db["PORT"] = str(closed_port())
    try:
        yield
    finally:
        db.clear()
        db.update(saved)


def test_liveness_asks_nothing_and_answers_200(database_unreachable: None) -> None:
    response = APIClient().get("/livez")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_readiness_names_each_dependency_and_is_ok_when_all_answer(db: Any) -> None:
    for path in ("/readyz", "/healthz"):
        response = APIClient().get(path)
        assert response.status_code == 200, response.content
        body = response.json()
        assert body["status"] == "ok"
        assert states(body) == {"database": "ok", "cache": "ok", "broker": "ok"}
        assert {name: check["required"] for name, check in body["checks"].items()} == {
            "database": True,
            "cache": False,
            "broker": False,
        }


def test_without_redis_readiness_is_degraded_but_200(db: Any) -> None:
    url = f"redis://127.0.0.1:{closed_port()}/0"
    with override_settings(CACHES=redis_cache(url)), celery_broker(url, {"socket_connect_timeout": 0.3}):
        response = APIClient().get("/readyz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "degraded"
    assert states(body) == {"database": "ok", "cache": "down", "broker": "down"}
    assert "Connection refused" in body["checks"]["cache"]["error"]


def test_without_the_database_readiness_is_503(database_unreachable: None) -> None:
    response = APIClient().get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert states(body)["database"] == "down" and states(body)["cache"] == "ok"


@override_settings(HEALTH_CHECK_TIMEOUT_S=0.3)
def test_a_hung_dependency_answers_timeout_within_the_deadline_and_is_asked_once(db: Any) -> None:
    with SilentServer() as silent, override_settings(CACHES=redis_cache(f"redis://127.0.0.1:{silent.port}/0", 5)):
        started = time.monotonic()
        first = APIClient().get("/readyz")
        second = APIClient().get("/readyz")
        elapsed = time.monotonic() - started
        asked = silent.connections
    # Not a timing goal: a probe that waited for the hung socket would take its 5 s timeout, twice.
    assert elapsed < 4.5, elapsed
    for response in (first, second):
        assert response.status_code == 200
        assert states(response.json())["cache"] == "timeout"
    assert asked == 1, "the second probe waits on the check still in flight instead of starting another"
