from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.accounts import services
from controlplane.accounts.choices import Role
from controlplane.accounts.models import ApiToken, Membership, Project
from controlplane.core import tokens
from controlplane.core.errors import Conflict, NotFound, PermissionDenied, ValidationFailed
from tests.factories import ApiTokenFactory, UserFactory


def roles(project: Project) -> dict[str, str]:
    return dict(Membership.objects.filter(project=project).values_list("user__username", "role"))


def test_operator_creates_project_with_its_first_owner(team):
    project = services.project_create(name="Borealis Lab", owner=team.stranger, actor=team.operator)
    assert project.slug == "borealis-lab"
    assert roles(project) == {"sam": Role.OWNER}


def test_non_operator_cannot_create_a_project(team):
    with pytest.raises(PermissionDenied):
        services.project_create(name="Mine", owner=team.owner, actor=team.owner)
    assert not Project.objects.filter(name="Mine").exists()


def test_duplicate_slug_is_a_conflict_naming_the_field(team):
    with pytest.raises(Conflict) as err:
        services.project_create(name="Atlas", owner=team.owner, actor=team.operator)
    assert err.value.fields == {"slug": ["A project with this slug already exists."]}


def test_owner_adds_and_promotes_a_member(team):
    services.membership_set(project=team.project, user=team.stranger, role=Role.VIEWER, actor=team.owner)
    services.membership_set(project=team.project, user=team.stranger, role=Role.OWNER, actor=team.owner)
    assert roles(team.project)["sam"] == Role.OWNER


def test_teammate_cannot_manage_members(team):
    with pytest.raises(PermissionDenied):
        services.membership_set(project=team.project, user=team.stranger, role=Role.MEMBER, actor=team.teammate)
    assert "sam" not in roles(team.project)


def test_last_owner_cannot_be_demoted(team):
    with pytest.raises(Conflict) as err:
        services.membership_set(project=team.project, user=team.owner, role=Role.MEMBER, actor=team.owner)
    assert err.value.code == "last_owner"
    assert "at least one owner" in err.value.message
    assert roles(team.project)["olive"] == Role.OWNER


def test_last_owner_cannot_be_removed(team):
    with pytest.raises(Conflict):
        services.membership_remove(project=team.project, user=team.owner, actor=team.operator)
    assert roles(team.project)["olive"] == Role.OWNER


def test_an_owner_may_leave_when_another_owner_remains(team):
    services.membership_set(project=team.project, user=team.teammate, role=Role.OWNER, actor=team.owner)
    services.membership_remove(project=team.project, user=team.owner, actor=team.owner)
    assert roles(team.project) == {"tom": Role.OWNER, "vera": Role.VIEWER}


def test_removing_a_non_member_is_not_found(team):
    with pytest.raises(NotFound):
        services.membership_remove(project=team.project, user=team.stranger, actor=team.owner)


def test_token_stores_only_the_digest(team):
    token, plaintext = services.api_token_create(user=team.owner, name="ci")
    assert tokens.parse(plaintext, tokens.USER_TOKEN) == token.lookup
    assert token.digest == tokens.digest(plaintext)
    assert plaintext not in {str(v) for v in ApiToken.objects.filter(pk=token.pk).values().first().values()}


def test_token_with_past_expiry_is_refused(team):
    with pytest.raises(ValidationFailed) as err:
        services.api_token_create(user=team.owner, name="ci", expires_at=timezone.now() - timedelta(seconds=1))
    assert "expires_at" in err.value.fields


def test_token_cannot_outlive_the_token_that_created_it(team):
    parent = ApiTokenFactory(user=team.owner, expires_at=timezone.now() + timedelta(days=1))
    with pytest.raises(ValidationFailed):
        services.api_token_create(
            user=team.owner, name="child", issued_with=parent, expires_at=timezone.now() + timedelta(days=30)
        )
    child, _ = services.api_token_create(user=team.owner, name="child", issued_with=parent)
    assert child.expires_at == parent.expires_at


def test_revoking_twice_keeps_the_first_time(team):
    token = ApiTokenFactory(user=team.owner)
    first = services.api_token_revoke(token=token, actor=team.owner).revoked_at
    second = services.api_token_revoke(token=token, actor=team.owner).revoked_at
    assert first is not None and first == second


def test_another_users_token_cannot_be_revoked(team):
    token = ApiTokenFactory(user=team.owner)
    with pytest.raises(NotFound):
        services.api_token_revoke(token=token, actor=UserFactory())
    token.refresh_from_db()
    assert token.revoked_at is None
