from __future__ import annotations

from collections.abc import Iterator

import pytest

from controlplane.celery import app as celery_app


@pytest.fixture
def eager_celery() -> Iterator[None]:
    before = celery_app.conf.task_always_eager
    celery_app.conf.update(task_always_eager=True, CELERY_TASK_ALWAYS_EAGER=True)
    yield
    celery_app.conf.update(task_always_eager=before, CELERY_TASK_ALWAYS_EAGER=before)
