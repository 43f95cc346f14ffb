"""/api/v1/ssh-keys/: the caller's own keys, each refusal a 400 in the API's one error shape naming the field."""

from __future__ import annotations

import logging

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from controlplane.access.models import SshKey
from controlplane.access.services import KEYS_PER_USER_MAX, ssh_key_create
from controlplane.access.sshkeys import MAX_KEY_BYTES
from tests.access.conftest import People
from tests.access.keygen import dsa_key, ecdsa_key, ed25519_key, private_openssh, public_line, rsa_key

URL = "/api/v1/ssh-keys/"


def add(people: People, user, line: str, name: str = "laptop"):  # type: ignore[no-untyped-def]
    return people.client(user).post(URL, {"name": name, "public_key": line}, format="json")


def refused(response, field: str = "public_key") -> dict:  # type: ignore[no-untyped-def]
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert set(error) >= {"code", "message", "fields"} and list(error["fields"]) == [field], error
    return error


@pytest.mark.parametrize(
    "make",
    [ed25519_key, lambda: ecdsa_key(ec.SECP256R1()), lambda: rsa_key(2048)],
    ids=["ed25519", "ecdsa-p256", "rsa-2048"],
)
def test_a_key_is_added_and_shown_with_its_fingerprint(people: People, make):
    line = public_line(make(), comment="alice@laptop")
    created = add(people, people.owner, line)
    assert created.status_code == 201, created.content
    body = created.json()
    key = SshKey.objects.get(pk=body["id"])
    assert key.user == people.owner
    assert body == {
        "id": key.pk,
        "name": "laptop",
        "key_type": key.key_type,
        "bits": key.bits,
        "fingerprint": key.fingerprint,
        "public_key": line.removesuffix(" alice@laptop"),
        "comment": "alice@laptop",
        "created_at": body["created_at"],
    }
    assert body["fingerprint"].startswith("SHA256:")
    listed = people.client(people.owner).get(URL).json()
    assert listed["count"] == 1 and listed["results"][0] == body
    assert people.client(people.owner).get(f"{URL}{key.pk}/").json() == body


def test_keys_are_their_users_only(people: People):
    key = ssh_key_create(user=people.owner, name="laptop", public_key=public_line(ed25519_key()), actor=people.owner)
    detail = f"{URL}{key.pk}/"
    assert people.client(people.owner).get(detail).status_code == 200
    for user in (people.other, people.operator):
        # Keys are personal: another user and an operator alike get the 404 of a key that does not exist.
        client = people.client(user)
        assert client.get(URL).json()["count"] == 0
        not_yours, missing = client.get(detail), client.get(f"{URL}999999/")
        # A 404 names the path it was asked for; with that set aside, the bytes are the same.
        assert not_yours.status_code == 404
        assert not_yours.content.replace(detail.encode(), b"<path>") == missing.content.replace(
            f"{URL}999999/".encode(), b"<path>"
        )
        assert client.delete(detail).status_code == 404
    anonymous = people.client(None)
    assert anonymous.get(URL).status_code == 401 and anonymous.get(detail).status_code == 401
    assert anonymous.post(URL, {"name": "x", "public_key": key.public_key}, format="json").status_code == 401
    assert anonymous.delete(detail).status_code == 401
    assert SshKey.objects.filter(pk=key.pk).exists()


def test_a_key_is_deleted_by_its_user(people: People, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="controlplane.access.services")
    created = add(people, people.owner, public_line(ed25519_key())).json()
    client = people.client(people.owner)
    assert client.delete(f"{URL}{created['id']}/").status_code == 204
    assert not SshKey.objects.filter(pk=created["id"]).exists()
    assert client.delete(f"{URL}{created['id']}/").status_code == 404
    lines = [r.getMessage() for r in caplog.records if r.name == "controlplane.access.services"]
    assert [line.split(":")[0] for line in lines] == ["ssh key added", "ssh key removed"]
    assert all(f"fingerprint={created['fingerprint']}" in line and "user=alice" in line for line in lines)


def test_the_same_key_twice_is_refused_naming_the_key(people: People):
    key = ed25519_key()
    assert add(people, people.owner, public_line(key, "one"), name="first").status_code == 201
    error = refused(add(people, people.owner, public_line(key, "another comment"), name="second"))
    assert error["code"] == "duplicate_key" and "'first'" in error["message"]
    assert SshKey.objects.filter(user=people.owner).count() == 1
    # Another user may hold the same public key: the fingerprint is unique per user.
    assert add(people, people.other, public_line(key), name="first").status_code == 201


def test_a_name_used_already_is_refused_naming_the_name(people: People):
    assert add(people, people.owner, public_line(ed25519_key()), name="laptop").status_code == 201
    assert refused(add(people, people.owner, public_line(ed25519_key()), name="laptop"), "name")["code"] == (
        "duplicate_name"
    )


@pytest.mark.parametrize("name", ["", "   ", "x" * 101, "a\x00b"], ids=["empty", "blank", "too-long", "nul"])
def test_a_bad_name_is_refused(people: People, name: str):
    refused(add(people, people.owner, public_line(ed25519_key()), name=name), "name")
    assert not SshKey.objects.exists()


def test_a_name_of_100_characters_is_accepted(people: People):
    assert add(people, people.owner, public_line(ed25519_key()), name="x" * 100).status_code == 201


@pytest.mark.parametrize(
    ("text", "code"),
    [
        (lambda: public_line(rsa_key(1024)), "weak_key"),
        (lambda: public_line(dsa_key()), "weak_key"),
        (lambda: private_openssh(ed25519_key()), "private_key"),
        (lambda: "ssh-ed25519 AAAAnotakey", "invalid_key"),
        (lambda: public_line(ed25519_key()) + " a\x00b", None),
        (lambda: public_line(ed25519_key(), "x" * MAX_KEY_BYTES), "invalid_key"),
        (lambda: "", None),
    ],
    ids=["rsa-1024", "dsa", "private", "malformed", "nul", "oversized", "empty"],
)
def test_a_refused_key_is_a_400_naming_public_key(people: People, text, code):
    error = refused(add(people, people.owner, text()))
    if code:
        assert error["code"] == code
    assert not SshKey.objects.exists()


def test_the_private_key_refusal_says_so(people: People):
    error = refused(add(people, people.owner, private_openssh(ed25519_key())))
    assert "This is a private key" in error["message"] and "not stored" in error["message"]


@pytest.mark.parametrize("body", [{}, {"name": "x"}, {"public_key": "x"}, {"name": [], "public_key": {}}])
def test_a_missing_or_mistyped_field_is_a_400(people: People, body):
    response = people.client(people.owner).post(URL, body, format="json")
    assert response.status_code == 400 and response.json()["error"]["fields"]


def test_a_user_holds_a_bounded_number_of_keys(people: People):
    for n in range(KEYS_PER_USER_MAX):
        ssh_key_create(user=people.owner, name=f"k{n}", public_key=public_line(ed25519_key()), actor=people.owner)
    assert refused(add(people, people.owner, public_line(ed25519_key()), name="one more"))["code"] == "too_many_keys"


def test_keys_cannot_be_changed(people: People):
    key = ssh_key_create(user=people.owner, name="laptop", public_key=public_line(ed25519_key()), actor=people.owner)
    client = people.client(people.owner)
    assert client.patch(f"{URL}{key.pk}/", {"name": "renamed"}, format="json").status_code == 405
    assert client.put(f"{URL}{key.pk}/", {"name": "renamed"}, format="json").status_code == 405


def test_the_list_filters_by_fingerprint_and_name(people: People):
    key = ssh_key_create(user=people.owner, name="laptop", public_key=public_line(ed25519_key()), actor=people.owner)
    ssh_key_create(user=people.owner, name="desktop", public_key=public_line(ed25519_key()), actor=people.owner)
    client = people.client(people.owner)
    assert [k["id"] for k in client.get(URL, {"fingerprint": key.fingerprint}).json()["results"]] == [key.pk]
    assert [k["id"] for k in client.get(URL, {"name": "laptop"}).json()["results"]] == [key.pk]


def test_the_list_takes_a_fixed_number_of_queries(people: People):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = people.client(people.owner)
    client.get(URL)  # the token's first use is stamped once; later requests do not write it

    def queries_for_list() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(URL).status_code == 200
        return len(captured)

    ssh_key_create(user=people.owner, name="k", public_key=public_line(ed25519_key()), actor=people.owner)
    one = queries_for_list()
    for n in range(9):
        ssh_key_create(user=people.owner, name=f"k{n}", public_key=public_line(ed25519_key()), actor=people.owner)
    assert queries_for_list() == one
