from __future__ import annotations

from collections.abc import Iterator

import pytest

from controlplane.celery import app as celery_app
from tests.e2e import portal_support


@pytest.fixture
def eager_celery() -> Iterator[None]:
    before = celery_app.conf.task_always_eager
    celery_app.conf.update(task_always_eager=True, CELERY_TASK_ALWAYS_EAGER=True)
    yield
    celery_app.conf.update(task_always_eager=before, CELERY_TASK_ALWAYS_EAGER=before)


@pytest.fixture(scope="session")
def built_portal() -> None:
    """The portal built once per run, for the browser tests (skipped in the other database leg; portal_support)."""
    portal_support.build_portal()


@pytest.fixture(scope="module")
def running_system(built_portal: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real system of the browser tests' own (``runsystem`` with the demo users): its URL."""
    yield from portal_support.running_system(tmp_path_factory.mktemp("e2e-var"))
