"""``gpucp keys add``, ``ls`` and ``rm`` against a live server."""

from __future__ import annotations

import json
from pathlib import Path

from gpucp_support import Gpucp, World, token_of, user

from controlplane.access.models import SshKey
from controlplane.access.services import ssh_key_create
from tests.access.keygen import ed25519_key, private_openssh, public_line, rsa_key


def pub_file(tmp_path: Path, line: str, name: str = "id_ed25519.pub") -> Path:
    file = tmp_path / name
    file.write_text(line + "\n")
    return file


def test_keys_add_registers_the_file_and_prints_its_fingerprint(gpucp: Gpucp, world: World, tmp_path: Path):
    line = public_line(ed25519_key(), comment="alice@laptop")
    result = gpucp("keys", "add", str(pub_file(tmp_path, line)))
    assert result.exit_code == 0, result.output
    key = SshKey.objects.get(user=world.owner)
    assert key.name == "alice@laptop" and key.public_key == line.removesuffix(" alice@laptop")
    assert result.stdout == f"Added alice@laptop (ssh-ed25519, 256 bits): {key.fingerprint}\n"


def test_keys_add_names_it_by_the_option_or_the_file(gpucp: Gpucp, world: World, tmp_path: Path):
    assert gpucp("keys", "add", "--name", "work", str(pub_file(tmp_path, public_line(ed25519_key())))).exit_code == 0
    assert gpucp("keys", "add", str(pub_file(tmp_path, public_line(ed25519_key()), "k2.pub"))).exit_code == 0
    assert sorted(SshKey.objects.filter(user=world.owner).values_list("name", flat=True)) == ["k2.pub", "work"]


def test_keys_add_reads_stdin(gpucp: Gpucp, world: World):
    result = gpucp("--json", "keys", "add", "--name", "piped", "-", input=public_line(rsa_key(2048)) + "\n")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["name"], data["key_type"], data["bits"]) == ("piped", "ssh-rsa", 2048)
    assert data["fingerprint"] == SshKey.objects.get(user=world.owner).fingerprint


def test_keys_add_never_sends_a_private_key(gpucp: Gpucp, world: World, tmp_path: Path):
    private = tmp_path / "id_ed25519"
    private.write_text(private_openssh(ed25519_key()))
    pub_file(tmp_path, public_line(ed25519_key()))
    # No token: had it been sent, the answer would be "not logged in" (3), not a usage error (2).
    result = gpucp("keys", "add", str(private), token=None)
    assert result.exit_code == 2, result.output
    assert "private key" in result.stderr and "not sent" in result.stderr and f"{private}.pub" in result.stderr
    assert not SshKey.objects.exists()


def test_keys_add_shows_the_apis_refusal(gpucp: Gpucp, world: World, tmp_path: Path):
    file = pub_file(tmp_path, public_line(ed25519_key()))
    assert gpucp("keys", "add", str(file)).exit_code == 0
    again = gpucp("keys", "add", "--name", "again", str(file))
    assert again.exit_code == 1 and "You have added this key already" in again.stderr
    assert again.stderr.rstrip().endswith("(duplicate_key)")
    weak = gpucp("--json", "keys", "add", str(pub_file(tmp_path, public_line(rsa_key(1024)), "weak.pub")))
    assert weak.exit_code == 1 and weak.stdout == ""
    error = json.loads(weak.stderr)["error"]
    assert error["code"] == "weak_key" and list(error["fields"]) == ["public_key"]


def test_keys_add_of_a_missing_file_is_a_usage_error(gpucp: Gpucp, tmp_path: Path):
    result = gpucp("keys", "add", str(tmp_path / "nope.pub"))
    assert result.exit_code == 2 and "cannot read" in result.stderr


def test_keys_ls_lists_only_the_callers_keys(gpucp: Gpucp, world: World):
    assert gpucp("keys", "ls").stdout.startswith("You have no SSH keys")
    mine = ssh_key_create(user=world.owner, name="laptop", public_key=public_line(ed25519_key()), actor=world.owner)
    bob = user()
    ssh_key_create(user=bob, name="bobs", public_key=public_line(ed25519_key()), actor=bob)
    result = gpucp("--utc", "keys", "ls")
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["ID", "NAME", "TYPE", "BITS", "FINGERPRINT", "ADDED"]
    assert [row.split()[:5] for row in rows] == [[str(mine.pk), "laptop", "ssh-ed25519", "256", mine.fingerprint]]
    assert rows[0].endswith("UTC")
    listed = json.loads(gpucp("--json", "keys", "ls").stdout)
    assert [k["fingerprint"] for k in listed["results"]] == [mine.fingerprint]


def test_keys_rm_removes_by_id_fingerprint_or_name(gpucp: Gpucp, world: World):
    keys = [
        ssh_key_create(user=world.owner, name=f"k{n}", public_key=public_line(ed25519_key()), actor=world.owner)
        for n in range(3)
    ]
    by_id = gpucp("keys", "rm", str(keys[0].pk))
    assert by_id.exit_code == 0 and by_id.stdout == f"Removed k0 (ssh-ed25519, 256 bits): {keys[0].fingerprint}\n"
    assert gpucp("keys", "rm", keys[1].fingerprint).exit_code == 0
    assert json.loads(gpucp("--json", "keys", "rm", "k2").stdout)["id"] == keys[2].pk
    assert not SshKey.objects.exists()


def test_keys_rm_of_another_users_or_a_missing_key_is_not_found(gpucp: Gpucp, world: World):
    bob = user()
    theirs = ssh_key_create(user=bob, name="bobs", public_key=public_line(ed25519_key()), actor=bob)
    for ref in (str(theirs.pk), theirs.fingerprint, "bobs", "999999"):
        result = gpucp("keys", "rm", ref)
        assert result.exit_code == 4, (ref, result.output)
    assert SshKey.objects.filter(pk=theirs.pk).exists()
    # Bob himself may.
    assert gpucp("keys", "rm", str(theirs.pk), token=token_of(bob)[1]).exit_code == 0


def test_keys_need_a_login(gpucp: Gpucp):
    assert gpucp("keys", "ls", token=None).exit_code == 3
