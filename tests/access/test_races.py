"""One user's concurrent key writes, on PostgreSQL: the user's row lock keeps the checks true at the insert."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from controlplane.access.models import SshKey
from controlplane.access.services import KEYS_PER_USER_MAX, ssh_key_create
from controlplane.core.errors import ValidationFailed
from tests.access.keygen import ed25519_key, public_line
from tests.factories import UserFactory


def race(*work: Callable[[], object]) -> list[str]:
    """Run each callable in its own thread, released together; each one's outcome: "ok" or the refusal code."""
    barrier = threading.Barrier(len(work))
    outcomes: list[str] = []

    def run(job: Callable[[], object]) -> None:
        try:
            barrier.wait(timeout=10)
            job()
            outcomes.append("ok")
        except ValidationFailed as exc:
            outcomes.append(exc.code)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(job,)) for job in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return sorted(outcomes)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_same_key_added_twice_at_once_is_added_once():
    user: Any = UserFactory()
    line = public_line(ed25519_key())
    outcomes = race(
        lambda: ssh_key_create(user=user, name="one", public_key=line, actor=user),
        lambda: ssh_key_create(user=user, name="two", public_key=line, actor=user),
    )
    assert outcomes == ["duplicate_key", "ok"]
    assert SshKey.objects.filter(user=user).count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_last_free_place_is_taken_once():
    user: Any = UserFactory()
    for n in range(KEYS_PER_USER_MAX - 1):
        ssh_key_create(user=user, name=f"k{n}", public_key=public_line(ed25519_key()), actor=user)
    outcomes = race(
        *(
            lambda n=n: ssh_key_create(user=user, name=f"last{n}", public_key=public_line(ed25519_key()), actor=user)
            for n in range(4)
        )
    )
    assert outcomes == ["ok", "too_many_keys", "too_many_keys", "too_many_keys"]
    assert SshKey.objects.filter(user=user).count() == KEYS_PER_USER_MAX
