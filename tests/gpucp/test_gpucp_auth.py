"""``gpucp login``, ``logout`` and ``whoami`` against a live server."""

from __future__ import annotations

import json
import socket
import stat
from pathlib import Path

from gpucp_support import Gpucp, World, invoke, token_of, user

from controlplane.accounts.models import ApiToken
from gpucp import config
from tests.factories import TEST_PASSWORD


def stored() -> dict:  # type: ignore[type-arg]
    return json.loads(config.config_path().read_text())


def token_row(plaintext: str) -> ApiToken:
    return ApiToken.objects.get(lookup=plaintext.split("_")[1])


def test_login_with_a_password_creates_a_token_and_keeps_it_0600(world: World, config_home: Path):
    result = invoke(["login", "--server", world.url, "--username", "alice"], input=f"{TEST_PASSWORD}\n")
    assert result.exit_code == 0, result.output
    # The password prompt hides what is typed: it never reaches the output.
    assert TEST_PASSWORD not in result.output
    assert "Logged in to" in result.stdout and "as alice" in result.stdout
    path = config_home / "gpucp" / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    saved = stored()
    assert saved["server"] == world.url and saved["username"] == "alice" and saved["issued_by_login"] is True
    row = token_row(saved["token"])
    assert row.user == world.owner and row.pk == saved["token_id"] and row.is_active()
    assert row.name == f"gpucp on {socket.gethostname()}"
    # The stored login is what the next command uses, with nothing in the environment.
    me = invoke(["--json", "whoami"])
    assert me.exit_code == 0, me.output
    assert json.loads(me.stdout)["username"] == "alice"


def test_a_wrong_password_exits_3_with_the_apis_message_and_stores_nothing(world: World, config_home: Path):
    result = invoke(["login", "--server", world.url, "-u", "alice"], input="not-the-password\n")
    assert result.exit_code == 3
    assert "The username or password is not correct. (invalid_credentials)" in result.stderr
    assert not (config_home / "gpucp" / "config.json").exists()
    assert not ApiToken.objects.filter(user=world.owner).exclude(digest=token_row(world.token).digest).exists()


def test_login_with_a_token_checks_it_and_finds_its_id(world: World):
    result = invoke(["login", "--server", world.url, "--token", world.token])
    assert result.exit_code == 0, result.output
    saved = stored()
    assert saved["token"] == world.token and saved["token_id"] == token_row(world.token).pk
    assert saved["issued_by_login"] is False


def test_login_with_a_wrong_token_exits_3_and_stores_nothing(world: World, config_home: Path):
    result = invoke(["login", "--server", world.url, "--token", "gcp_0123456789ab_not-a-real-secret"])
    assert result.exit_code == 3
    assert "(authentication_failed)" in result.stderr
    assert not (config_home / "gpucp" / "config.json").exists()


def test_username_and_token_together_are_a_usage_error(world: World):
    result = invoke(["login", "--server", world.url, "-u", "alice", "--token", world.token])
    assert result.exit_code == 2
    assert "not both" in result.stderr


def test_logout_revokes_the_token_and_removes_it_but_keeps_the_server(world: World):
    invoke(["login", "--server", world.url, "-u", "alice"], input=f"{TEST_PASSWORD}\n")
    token = stored()["token"]
    result = invoke(["logout"])
    assert result.exit_code == 0, result.output
    assert "revoked" in result.stdout
    assert not token_row(token).is_active()
    saved = stored()
    assert saved["token"] is None and saved["server"] == world.url
    after = invoke(["whoami"])
    assert after.exit_code == 3
    assert "Not logged in" in after.stderr


def test_logout_keep_token_forgets_it_without_revoking(world: World):
    invoke(["login", "--server", world.url, "--token", world.token])
    result = invoke(["logout", "--keep-token"])
    assert result.exit_code == 0, result.output
    assert token_row(world.token).is_active()
    assert stored()["token"] is None


def test_logout_when_the_server_is_gone_still_forgets_the_token_and_says_so(world: World):
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens there now
    config.save(config.Config(server=f"http://127.0.0.1:{port}", token=world.token, token_id=1))
    result = invoke(["logout"])
    assert result.exit_code == 0
    assert "NOT revoked" in result.stdout
    assert stored()["token"] is None
    assert token_row(world.token).is_active()


def test_a_second_login_revokes_the_token_the_first_one_created(world: World):
    invoke(["login", "--server", world.url, "-u", "alice"], input=f"{TEST_PASSWORD}\n")
    first = stored()["token"]
    invoke(["login", "--server", world.url, "-u", "alice"], input=f"{TEST_PASSWORD}\n")
    second = stored()["token"]
    assert first != second
    assert not token_row(first).is_active() and token_row(second).is_active()


def test_a_login_never_revokes_a_token_it_was_given(world: World):
    invoke(["login", "--server", world.url, "--token", world.token])
    invoke(["login", "--server", world.url, "-u", "alice"], input=f"{TEST_PASSWORD}\n")
    # The first token may be a CI's: only `gpucp logout` revokes a token gpucp did not create.
    assert token_row(world.token).is_active()


def test_whoami_shows_the_user_and_their_projects(gpucp: Gpucp, world: World):
    result = gpucp("whoami")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == f"alice on {world.url}"
    assert "demo" in result.stdout and "owner" in result.stdout
    data = json.loads(gpucp("--json", "whoami").stdout)
    assert data["memberships"] == [
        {"project_id": world.project.pk, "project_slug": "demo", "project_name": world.project.name, "role": "owner"}
    ]


def test_a_wrong_token_exits_3_with_the_apis_error(gpucp: Gpucp):
    result = gpucp("whoami", token="gcp_0123456789ab_wrong")
    assert result.exit_code == 3
    assert result.stdout == ""
    assert result.stderr.startswith("gpucp: ") and "(authentication_failed)" in result.stderr
    # Under --json, stderr carries the API's own error body.
    body = json.loads(gpucp("--json", "whoami", token="gcp_0123456789ab_wrong").stderr)
    assert body["error"]["code"] == "authentication_failed" and "message" in body["error"]


def test_a_revoked_token_exits_3(gpucp: Gpucp):
    other, plaintext = token_of(user())
    ApiToken.objects.filter(pk=other.pk).update(revoked_at=other.created_at)
    assert gpucp("whoami", token=plaintext).exit_code == 3
