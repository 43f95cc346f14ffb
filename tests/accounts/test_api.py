from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.accounts.choices import Role
from controlplane.accounts.models import ApiToken, Membership, Project
from tests.factories import ApiTokenFactory, MembershipFactory, ProjectFactory


def test_project_list_shows_only_the_callers_projects(team):
    response = team.client(team.viewer).get("/api/v1/projects/")
    assert response.status_code == 200
    assert [p["slug"] for p in response.json()["results"]] == ["atlas"]


def test_operator_lists_every_project(team):
    response = team.client(team.operator).get("/api/v1/projects/")
    assert {p["slug"] for p in response.json()["results"]} == {"atlas", "zephyr"}


def test_project_list_filters_by_slug(team):
    response = team.client(team.operator).get("/api/v1/projects/", {"slug": "zephyr"})
    assert [p["slug"] for p in response.json()["results"]] == ["zephyr"]


def test_another_tenants_project_is_not_found_not_forbidden(team):
    response = team.client(team.outsider).get(f"/api/v1/projects/{team.project.pk}/")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_project_list_query_count_does_not_grow_with_projects(team, django_assert_max_num_queries):
    for _ in range(10):
        MembershipFactory(user=team.viewer, project=ProjectFactory())
    with django_assert_max_num_queries(4):
        response = team.client(team.viewer).get("/api/v1/projects/")
    assert response.json()["count"] == 11


def test_operator_creates_a_project_with_an_owner(team):
    response = team.client(team.operator).post(
        "/api/v1/projects/", {"name": "Borealis", "owner": "sam", "requeue_on_interrupt": True}
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["slug"] == "borealis" and body["requeue_on_interrupt"] is True
    assert Membership.objects.get(project_id=body["id"]).role == Role.OWNER


def test_project_create_with_unknown_owner_names_the_field(team):
    response = team.client(team.operator).post("/api/v1/projects/", {"name": "Borealis", "owner": "nobody"})
    assert response.status_code == 400
    assert "owner" in response.json()["error"]["fields"]
    assert not Project.objects.filter(name="Borealis").exists()


def test_tenant_cannot_create_a_project(team):
    response = team.client(team.owner).post("/api/v1/projects/", {"name": "Mine", "owner": "olive"})
    assert response.status_code == 403


def test_owner_updates_the_project(team):
    response = team.client(team.owner).patch(
        f"/api/v1/projects/{team.project.pk}/", {"description": "vision", "requeue_on_interrupt": True}
    )
    assert response.status_code == 200
    team.project.refresh_from_db()
    assert team.project.description == "vision" and team.project.requeue_on_interrupt


def test_teammate_cannot_update_the_project(team):
    response = team.client(team.teammate).patch(f"/api/v1/projects/{team.project.pk}/", {"name": "Mine"})
    assert response.status_code == 403
    team.project.refresh_from_db()
    assert team.project.name == "Atlas"


def test_slug_is_read_only(team):
    team.client(team.owner).patch(f"/api/v1/projects/{team.project.pk}/", {"slug": "renamed"})
    team.project.refresh_from_db()
    assert team.project.slug == "atlas"


def test_members_are_listed_for_any_member(team):
    response = team.client(team.viewer).get(f"/api/v1/projects/{team.project.pk}/members/")
    assert response.status_code == 200
    assert {(m["username"], m["role"]) for m in response.json()["results"]} == {
        ("olive", "owner"),
        ("tom", "member"),
        ("vera", "viewer"),
    }


def test_outsider_cannot_see_members(team):
    response = team.client(team.outsider).get(f"/api/v1/projects/{team.project.pk}/members/")
    assert response.status_code == 404


def test_owner_adds_changes_and_removes_a_member(team):
    client = team.client(team.owner)
    base = f"/api/v1/projects/{team.project.pk}/members/"
    assert client.post(base, {"username": "sam", "role": "viewer"}).status_code == 201
    assert client.patch(f"{base}sam/", {"role": "member"}).json()["role"] == "member"
    assert client.delete(f"{base}sam/").status_code == 204
    assert not Membership.objects.filter(project=team.project, user=team.stranger).exists()


def test_adding_with_a_bad_role_names_the_field(team):
    response = team.client(team.owner).post(
        f"/api/v1/projects/{team.project.pk}/members/", {"username": "sam", "role": "admin"}
    )
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["role"]


def test_removing_the_last_owner_is_a_409_naming_the_rule(team):
    response = team.client(team.owner).delete(f"/api/v1/projects/{team.project.pk}/members/olive/")
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "last_owner"
    assert "at least one owner" in error["message"]


def test_demoting_the_last_owner_is_a_409(team):
    response = team.client(team.owner).patch(f"/api/v1/projects/{team.project.pk}/members/olive/", {"role": "viewer"})
    assert response.status_code == 409


def test_viewer_cannot_add_members(team):
    response = team.client(team.viewer).post(f"/api/v1/projects/{team.project.pk}/members/", {"username": "sam"})
    assert response.status_code == 403
    assert not Membership.objects.filter(project=team.project, user=team.stranger).exists()


def test_token_create_returns_the_plaintext_once(team):
    client = team.client(team.owner)
    created = client.post("/api/v1/tokens/", {"name": "ci"})
    assert created.status_code == 201
    plaintext = created.json()["token"]
    assert plaintext.startswith("gcp_")
    listed = client.get("/api/v1/tokens/").json()["results"]
    assert [t["name"] for t in listed] == ["ci"]
    assert "token" not in listed[0] and plaintext not in str(listed)
    assert "token" not in client.get(f"/api/v1/tokens/{created.json()['id']}/").json()


def test_created_token_authenticates(team):
    plaintext = team.client(team.owner).post("/api/v1/tokens/", {"name": "ci"}).json()["token"]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    assert client.get("/api/v1/me/").json()["username"] == "olive"


def test_token_created_with_a_token_inherits_its_expiry(team):
    parent = ApiTokenFactory(user=team.owner, expires_at=timezone.now() + timedelta(hours=1))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {parent.plaintext}")
    response = client.post("/api/v1/tokens/", {"name": "child"})
    assert response.status_code == 201
    assert ApiToken.objects.get(pk=response.json()["id"]).expires_at == parent.expires_at


def test_revoked_token_no_longer_authenticates(team):
    token = ApiTokenFactory(user=team.owner)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token.plaintext}")
    assert client.post(f"/api/v1/tokens/{token.pk}/revoke/").json()["active"] is False
    response = client.get("/api/v1/me/")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"


def test_token_delete_revokes(team):
    token = ApiTokenFactory(user=team.owner)
    assert team.client(team.owner).delete(f"/api/v1/tokens/{token.pk}/").status_code == 204
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_another_users_token_is_not_found(team):
    token = ApiTokenFactory(user=team.owner)
    assert team.client(team.teammate).post(f"/api/v1/tokens/{token.pk}/revoke/").status_code == 404
    assert team.client(team.operator).delete(f"/api/v1/tokens/{token.pk}/").status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None


def test_me_lists_memberships_with_roles(team):
    body = team.client(team.owner).get("/api/v1/me/").json()
    assert body["username"] == "olive" and body["is_operator"] is False
    assert [(m["project_slug"], m["role"]) for m in body["memberships"]] == [("atlas", "owner")]
    assert team.client(team.operator).get("/api/v1/me/").json()["is_operator"] is True


def test_session_login_requires_csrf_and_then_works(team):
    client = APIClient(enforce_csrf_checks=True)
    refused = client.post("/api/v1/auth/login/", {"username": "olive", "password": "pw-for-tests"})
    assert refused.status_code == 403
    csrf = client.get("/api/v1/auth/csrf/")
    token = csrf.json()["csrf_token"]
    assert client.cookies["csrftoken"].value
    logged_in = client.post(
        "/api/v1/auth/login/", {"username": "olive", "password": "pw-for-tests"}, HTTP_X_CSRFTOKEN=token
    )
    assert logged_in.status_code == 200, logged_in.content
    assert logged_in.json()["username"] == "olive"
    assert client.get("/api/v1/me/").json()["username"] == "olive"
    # Login rotates the CSRF token; a session write must carry the new one.
    new_token = client.cookies["csrftoken"].value
    assert client.post("/api/v1/tokens/", {"name": "portal"}).status_code == 403
    assert client.post("/api/v1/tokens/", {"name": "portal"}, HTTP_X_CSRFTOKEN=new_token).status_code == 201
    assert client.post("/api/v1/auth/logout/", HTTP_X_CSRFTOKEN=new_token).status_code == 204
    assert client.get("/api/v1/me/").status_code == 401


def test_login_with_a_wrong_password_is_refused(team):
    response = APIClient().post("/api/v1/auth/login/", {"username": "olive", "password": "nope"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_credentials"


def test_session_answers_200_signed_out_and_the_user_signed_in(team):
    client = APIClient(enforce_csrf_checks=True)
    signed_out = client.get("/api/v1/auth/session/")
    assert signed_out.status_code == 200
    assert signed_out.json() == {"authenticated": False, "user": None}
    token = client.get("/api/v1/auth/csrf/").json()["csrf_token"]
    login = client.post(
        "/api/v1/auth/login/", {"username": "olive", "password": "pw-for-tests"}, HTTP_X_CSRFTOKEN=token
    )
    assert login.status_code == 200
    signed_in = client.get("/api/v1/auth/session/").json()
    assert signed_in["authenticated"] is True
    assert signed_in["user"] == client.get("/api/v1/me/").json()
    client.post("/api/v1/auth/logout/", HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value)
    assert client.get("/api/v1/auth/session/").json() == {"authenticated": False, "user": None}


def test_session_speaks_of_the_browser_session_not_a_bearer_token(team):
    """A bearer token is not a portal session: the answer is 'signed out', still a 200 and never an error."""
    plaintext = team.client(team.owner).post("/api/v1/tokens/", {"name": "ci"}).json()["token"]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    assert client.get("/api/v1/me/").status_code == 200
    response = client.get("/api/v1/auth/session/")
    assert response.status_code == 200
    assert response.json() == {"authenticated": False, "user": None}
