from __future__ import annotations

import re

from controlplane.accounts.models import ApiToken
from controlplane.core import tokens
from tests.factories import ApiTokenFactory, MembershipFactory, UserFactory


def test_admin_creates_a_token_and_shows_the_plaintext_once(admin_client):
    user = UserFactory(username="ci-bot")
    response = admin_client.post("/admin/accounts/apitoken/add/", {"user": user.pk, "name": "deploy"}, follow=True)
    assert response.status_code == 200
    text = " ".join(str(m) for m in response.context["messages"])
    plaintext = re.search(r"gcp_[0-9a-f]{12}_\S+", text).group(0)
    assert plaintext.encode() in response.content
    token = ApiToken.objects.get(user=user, name="deploy")
    assert tokens.matches(plaintext, token.digest)
    page = admin_client.get(f"/admin/accounts/apitoken/{token.pk}/change/")
    assert page.status_code == 200 and plaintext.encode() not in page.content


def test_admin_revoke_action(admin_client):
    token = ApiTokenFactory()
    admin_client.post("/admin/accounts/apitoken/", {"action": "revoke", "_selected_action": [token.pk]})
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_project_admin_shows_memberships_inline(admin_client):
    membership = MembershipFactory()
    page = admin_client.get(f"/admin/accounts/project/{membership.project.pk}/change/")
    assert page.status_code == 200
    assert b"memberships-0-role" in page.content
