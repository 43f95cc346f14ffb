"""Shared fixtures. Services the tests need are real: under CI=true a missing one fails, never skips."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def service_missing(what: str) -> None:
    """Skip on a developer's machine; fail under CI, where every service must be up."""
    if IN_CI:
        pytest.fail(f"{what} is required under CI=true but is not reachable", pytrace=False)
    pytest.skip(f"{what} is not reachable")


# The agent's own tests: they run against Docker, fakes and doubles of the control plane, never its database, so
# one leg is enough (the SQLite one). A test there that touches the database, or is a fault test, runs as usual.
DATABASE_FREE = ("tests/nodeagent/", "tests/gateway/", "tests/runtime/")
DATABASE_FIXTURES = frozenset({"db", "transactional_db", "django_db_reset_sequences", "live_server"})


def _touches_no_database(item: pytest.Item) -> bool:
    return (
        item.nodeid.startswith(DATABASE_FREE)
        and "postgres" not in item.keywords
        and "faults" not in item.keywords
        and item.get_closest_marker("django_db") is None
        and not DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from django.db import connection

    if connection.vendor == "postgresql":
        once = pytest.mark.skip(reason="touches no database: runs once, in the SQLite leg of the suite")
        for item in items:
            if _touches_no_database(item):
                item.add_marker(once)
        return
    skip = pytest.mark.skip(reason="PostgreSQL behaviour: runs in the PostgreSQL leg of the suite")
    # Fault tests start and kill real processes: slow, and one run of them is enough. (The browser test runs
    # once too, in this SQLite leg: tests/e2e/test_portal.py starts a system of its own.)
    once = pytest.mark.skip(reason="fault test: runs once, in the PostgreSQL leg of the suite")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)
        elif "faults" in item.keywords or "/faults/" in f"/{item.nodeid}":
            item.add_marker(once)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):  # type: ignore[no-untyped-def]
    """Drop what the live server's keep-alive handler threads still hold before the test database goes.

    Each of those threads keeps its persistent connection (CONN_MAX_AGE, as in production) until its
    socket closes, which for an agent's keep-alive session is never; PostgreSQL then refuses to drop the
    test database ("being accessed by other users") and leaves it behind.
    """
    yield
    from django.db import connection

    with django_db_blocker.unblock():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )


@pytest.fixture(scope="session")
def redis_url() -> str:
    import redis

    url = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except Exception as exc:
        service_missing(f"Redis at {url} ({exc})")
    return url


@pytest.fixture(scope="session")
def docker_client():  # type: ignore[no-untyped-def]
    import docker

    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as exc:
        service_missing(f"the Docker engine ({exc})")
    return client


@pytest.fixture(scope="session")
def oci_registry(docker_client, tmp_path_factory):  # type: ignore[no-untyped-def]
    """A real registry (Debian's docker-registry) on a free loopback port, with htpasswd users, holding the test
    image under the private name ``team/trainer:v1`` (``.pushed`` maps it to its digest). Stopped at the end."""
    from nodeagent.runtime.localimage import DEFAULT_TAG, ensure_busybox_image
    from tests import registry_support

    if registry_support.binary() is None:
        service_missing("an OCI registry (Debian's docker-registry package)")
    ensure_busybox_image(docker_client, DEFAULT_TAG)
    registry = registry_support.start_registry(
        tmp_path_factory.mktemp("oci-registry"), {"ci-pusher": "registry-pw-for-tests", "reader": "reader-pw"}
    )
    try:
        registry.push(docker_client, DEFAULT_TAG, "team/trainer", "v1")
        yield registry
    finally:
        registry.stop()


@pytest.fixture
def api_client():  # type: ignore[no-untyped-def]
    from rest_framework.test import APIClient

    return APIClient()


@pytest.fixture
def make_user(db) -> Callable[..., object]:  # type: ignore[no-untyped-def]
    from django.contrib.auth import get_user_model

    counter = {"n": 0}

    def make(username: str | None = None, *, is_staff: bool = False, password: str = "pw-for-tests"):  # type: ignore[no-untyped-def]
        counter["n"] += 1
        name = username or f"user{counter['n']}"
        return get_user_model().objects.create_user(
            username=name, password=password, is_staff=is_staff, email=f"{name}@example.test"
        )

    return make


@pytest.fixture(autouse=True)
def _migration_data(request: pytest.FixtureRequest) -> None:
    # A transactional test's flush empties every table, the rows data migrations create (the priority classes)
    # included; a database test that runs after one gets them back, as a fresh database has them.
    uses_db = {"db", "transactional_db", "live_server"} & set(request.fixturenames)
    if request.node.get_closest_marker("django_db") is None and not uses_db:
        return
    request.getfixturevalue("_django_db_helper")
    for name in sorted(uses_db - {"live_server"}):
        request.getfixturevalue(name)
    from tests.scheduling.support import restore_priority_classes

    restore_priority_classes()
    # Launch templates: the shipped operator-wide ones (controlplane/templates/shipped.py), loaded idempotently.
    from django.utils import timezone

    from controlplane.templates.models import LaunchTemplate
    from controlplane.templates.shipped import load

    load(LaunchTemplate, now=timezone.now())
