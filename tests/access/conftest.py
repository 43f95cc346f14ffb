from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from tests.factories import ApiTokenFactory, OperatorFactory, UserFactory


class People:
    """A key's owner, another user, an operator, and each one's client, signed in with a real token."""

    def __init__(self) -> None:
        self.owner: Any = UserFactory(username="alice")
        self.other: Any = UserFactory(username="bob")
        self.operator: Any = OperatorFactory(username="opal")

    def client(self, user: Any | None) -> APIClient:
        client = APIClient()
        if user is not None:
            token: Any = ApiTokenFactory(user=user)
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {token.plaintext}")
        return client


@pytest.fixture
def people(db: Any) -> People:
    return People()
