"""The admin shows keys and removes them through the service; nobody adds one for a user there."""

from __future__ import annotations

import logging

import pytest

from controlplane.access.models import SshKey
from controlplane.access.services import ssh_key_create
from tests.access.keygen import ed25519_key, public_line
from tests.factories import UserFactory


def test_admin_lists_keys_and_cannot_add_or_change_them(admin_client):
    owner = UserFactory(username="alice")
    key = ssh_key_create(user=owner, name="laptop", public_key=public_line(ed25519_key()), actor=owner)
    listing = admin_client.get("/admin/access/sshkey/")
    assert listing.status_code == 200 and key.fingerprint.encode() in listing.content
    assert admin_client.get("/admin/access/sshkey/add/").status_code == 403
    page = admin_client.get(f"/admin/access/sshkey/{key.pk}/change/")
    assert page.status_code == 200 and b'name="name"' not in page.content  # shown, not editable


def test_admin_delete_goes_through_the_service(admin_client, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="controlplane.access.services")
    owner = UserFactory(username="alice")
    keys = [
        ssh_key_create(user=owner, name=f"k{n}", public_key=public_line(ed25519_key()), actor=owner) for n in (1, 2)
    ]
    response = admin_client.post(
        "/admin/access/sshkey/",
        {"action": "delete_selected", "_selected_action": [k.pk for k in keys], "post": "yes"},
    )
    assert response.status_code == 302
    assert not SshKey.objects.exists()
    removed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ssh key removed")]
    assert len(removed) == 2 and all("by=admin" in line for line in removed)
