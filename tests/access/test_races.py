"""One user's concurrent key writes, on PostgreSQL: the user's row lock keeps the checks true at the insert."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.access.models import SshKey
from controlplane.access.services import KEYS_PER_USER_MAX, ssh_key_create
from tests.access.keygen import ed25519_key, public_line
from tests.access.racing import race
from tests.factories import UserFactory


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
