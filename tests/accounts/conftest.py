from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from controlplane.accounts.choices import Role
from tests.factories import OperatorFactory, ProjectFactory, UserFactory, member_of


class Team:
    """A project with an owner, a teammate (member) and a viewer, plus an outsider with a project of their own."""

    def __init__(self) -> None:
        self.project = ProjectFactory(slug="atlas", name="Atlas")
        self.owner = member_of(self.project, Role.OWNER, username="olive")
        self.teammate = member_of(self.project, Role.MEMBER, username="tom")
        self.viewer = member_of(self.project, Role.VIEWER, username="vera")
        self.other_project = ProjectFactory(slug="zephyr", name="Zephyr")
        self.outsider = member_of(self.other_project, Role.OWNER, username="oscar")
        self.operator = OperatorFactory(username="opal")
        self.stranger = UserFactory(username="sam")

    def client(self, user: Any) -> APIClient:
        client = APIClient()
        client.force_authenticate(user)
        return client


@pytest.fixture
def team(db: Any) -> Team:
    return Team()
