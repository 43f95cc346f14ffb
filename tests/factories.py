"""factory-boy factories for the shared models. Each app's own factories live in its test directory."""

from __future__ import annotations

from functools import cache
from typing import Any

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password

from controlplane.accounts.choices import Role
from controlplane.accounts.models import ApiToken, Membership, Project
from controlplane.core import tokens

TEST_PASSWORD = "pw-for-tests"


@cache
def _test_password_hash() -> str:
    return make_password(TEST_PASSWORD)


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ["username"]
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.test")
    is_staff = False
    # Hashed once: a fresh PBKDF2 hash per user would dominate the run time of the suite.
    password = factory.LazyFunction(lambda: _test_password_hash())


class OperatorFactory(UserFactory):
    username = factory.Sequence(lambda n: f"operator{n}")
    is_staff = True


class ProjectFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Project

    name = factory.Sequence(lambda n: f"Project {n}")
    slug = factory.Sequence(lambda n: f"project-{n}")


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    project = factory.SubFactory(ProjectFactory)
    user = factory.SubFactory(UserFactory)
    role = Role.MEMBER


class ApiTokenFactory(factory.django.DjangoModelFactory):
    """``token.plaintext`` holds the secret, as only the creator ever knows it."""

    class Meta:
        model = ApiToken

    user = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"token {n}")

    @classmethod
    def _create(cls, model_class: type[ApiToken], *args: Any, **kwargs: Any) -> ApiToken:
        issued = tokens.issue(tokens.USER_TOKEN)
        kwargs.setdefault("lookup", issued.lookup)
        kwargs.setdefault("digest", issued.digest)
        token = super()._create(model_class, *args, **kwargs)
        token.plaintext = issued.plaintext  # type: ignore[attr-defined]
        return token


def member_of(project: Project, role: Role = Role.MEMBER, **user_fields: Any) -> Any:
    """A new user with ``role`` in ``project``."""
    user = UserFactory(**user_fields)
    MembershipFactory(project=project, user=user, role=role)
    return user
