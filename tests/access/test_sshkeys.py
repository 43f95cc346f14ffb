"""The one definition of an acceptable SSH public key (controlplane/access/sshkeys.py), on real keys."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from controlplane.access.choices import KeyType
from controlplane.access.sshkeys import MAX_KEY_BYTES, parse_public_key
from controlplane.core.errors import ValidationFailed
from tests.access.keygen import dsa_key, ecdsa_key, ed25519_key, private_openssh, private_pem, public_line, rsa_key


def refusal(text: str) -> ValidationFailed:
    with pytest.raises(ValidationFailed) as caught:
        parse_public_key(text)
    assert list(caught.value.fields) == ["public_key"], caught.value.fields
    return caught.value


@pytest.mark.parametrize(
    ("make", "key_type", "bits"),
    [
        (ed25519_key, KeyType.ED25519, 256),
        (lambda: ecdsa_key(ec.SECP256R1()), KeyType.ECDSA_P256, 256),
        (lambda: ecdsa_key(ec.SECP384R1()), KeyType.ECDSA_P384, 384),
        (lambda: ecdsa_key(ec.SECP521R1()), KeyType.ECDSA_P521, 521),
        (lambda: rsa_key(2048), KeyType.RSA, 2048),
        (lambda: rsa_key(3072), KeyType.RSA, 3072),
    ],
    ids=["ed25519", "ecdsa-p256", "ecdsa-p384", "ecdsa-p521", "rsa-2048", "rsa-3072"],
)
def test_supported_keys_are_parsed_with_type_bits_and_the_fingerprint_ssh_keygen_prints(
    make, key_type, bits, tmp_path: Path
):
    line = public_line(make(), comment="alice@laptop")
    parsed = parse_public_key(line)
    assert (parsed.key_type, parsed.bits, parsed.comment) == (key_type, bits, "alice@laptop")
    assert parsed.public_key == line.rsplit(" ", 1)[0]
    # OpenSSH's own reading of the same file: "<bits> SHA256:<fingerprint> <comment> (<TYPE>)".
    pub = tmp_path / "key.pub"
    pub.write_text(line + "\n")
    printed = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub)], capture_output=True, text=True,
                             check=True, timeout=30).stdout.split()  # fmt: skip
    assert printed[:3] == [str(bits), parsed.fingerprint, "alice@laptop"]


def test_spacing_and_comment_do_not_change_the_key():
    line = public_line(ed25519_key())
    plain = parse_public_key(line)
    spaced = parse_public_key(f"\n  {line.replace(' ', '   ')}   my laptop, 2026  \n")
    assert (spaced.public_key, spaced.fingerprint) == (plain.public_key, plain.fingerprint)
    assert spaced.comment == "my laptop, 2026" and plain.comment == ""


def test_fingerprint_is_unpadded_base64_of_the_blob_digest():
    fingerprint = parse_public_key(public_line(ed25519_key())).fingerprint
    assert fingerprint.startswith("SHA256:") and len(fingerprint) == len("SHA256:") + 43
    assert not fingerprint.endswith("=")
    base64.b64decode(fingerprint.removeprefix("SHA256:") + "=")


def test_rsa_under_2048_bits_is_refused_as_weak():
    error = refusal(public_line(rsa_key(1024)))
    assert error.code == "weak_key" and "1024 bits" in error.message and "2048" in error.message


def test_dsa_is_refused_as_weak():
    error = refusal(public_line(dsa_key()))
    assert error.code == "weak_key" and "DSA" in error.message


@pytest.mark.parametrize("write", [private_openssh, private_pem], ids=["openssh", "pkcs8"])
def test_a_private_key_is_refused_and_named_for_what_it_is(write):
    error = refusal(write(ed25519_key()))
    assert error.code == "private_key"
    assert "private key" in error.message and "not stored" in error.message and ".pub" in error.message


def test_an_rsa_private_key_in_the_old_pem_format_is_refused_as_private():
    from cryptography.hazmat.primitives import serialization

    pem = rsa_key(2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )
    assert refusal(pem.decode()).code == "private_key"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "ssh-ed25519",
        "ssh-ed25519 not-base64!",
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5",  # a blob cut short
        "hello world",
        'from="10.0.0.1" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFVCb8KR0QtX8h0+t9JWv28MI7lwGc3ZW4A2ITyFfdAd',
    ],
    ids=["empty", "blank", "type-only", "bad-base64", "truncated", "prose", "authorized-keys-options"],
)
def test_malformed_keys_are_refused(text):
    assert refusal(text).code == "invalid_key"


def test_a_key_whose_type_does_not_match_its_blob_is_refused():
    line = public_line(ed25519_key())
    assert refusal(line.replace("ssh-ed25519", "ssh-rsa", 1)).code == "invalid_key"


def test_a_security_key_is_refused_rather_than_stored_as_its_plain_twin():
    # sk-ssh-ed25519@openssh.com: the ed25519 blob followed by the application; the library reads it as
    # plain ed25519, which would store a different key than the one given.
    def string(data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + data

    blob = string(b"sk-ssh-ed25519@openssh.com") + string(bytes(range(32))) + string(b"ssh:")
    error = refusal("sk-ssh-ed25519@openssh.com " + base64.b64encode(blob).decode())
    assert error.code == "unsupported_key" and "sk-ssh-ed25519@openssh.com" in error.message


def test_two_keys_pasted_together_are_refused():
    # The library alone would read the second line as the first key's comment.
    both = public_line(ed25519_key()) + "\n" + public_line(ed25519_key())
    assert "one key" in refusal(both).message


def test_nul_and_control_characters_are_refused():
    line = public_line(ed25519_key())
    assert "NUL" in refusal(line + " a\x00b").message
    assert "control" in refusal(line + " \x1b[31mred").message


def test_an_oversized_key_is_refused_before_it_is_parsed():
    line = public_line(ed25519_key(), comment="x" * MAX_KEY_BYTES)
    assert str(MAX_KEY_BYTES) in refusal(line).message


def test_rfc4716_and_pem_public_keys_are_refused_with_the_conversion_command():
    from cryptography.hazmat.primitives import serialization

    pem = (
        ed25519_key()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    assert "ssh-keygen -i -m PKCS8" in refusal(pem.decode()).message
    rfc4716 = "---- BEGIN SSH2 PUBLIC KEY ----\nAAAA\n---- END SSH2 PUBLIC KEY ----"
    assert "ssh-keygen -i -f" in refusal(rfc4716).message
