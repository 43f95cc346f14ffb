"""What makes a pasted SSH public key acceptable: the one definition, used by the API and the admin.

The key is parsed by ``cryptography`` (``load_ssh_public_key``), never by hand; what is stored is what the
library writes back (``public_bytes(OpenSSH, OpenSSH)``), so a key with odd spacing and the same key written
cleanly are one key, with one fingerprint. Every refusal names ``public_key``.
"""

from __future__ import annotations

import base64
import hashlib
import warnings
from dataclasses import dataclass

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed25519, rsa
from cryptography.utils import CryptographyDeprecationWarning

from controlplane.access.choices import KeyType
from controlplane.core.errors import ValidationFailed

FIELD = "public_key"
# A 16384-bit RSA key, the largest OpenSSH accepts, is about 2.8 KiB in this format; anything far past that
# is not a key, and bounding it bounds the parsing work a request may ask for.
MAX_KEY_BYTES = 16 * 1024
RSA_MIN_BITS = 2048
# OpenSSH's own ceiling (SSH_RSA_MAXIMUM_MODULUS_SIZE): a larger key could never log in.
RSA_MAX_BITS = 16384
EC_TYPES = {
    "secp256r1": KeyType.ECDSA_P256,
    "secp384r1": KeyType.ECDSA_P384,
    "secp521r1": KeyType.ECDSA_P521,
}
EXAMPLE = "ssh-ed25519 AAAA... you@laptop"
SUPPORTED = "ssh-ed25519, ecdsa-sha2-nistp256/384/521 or ssh-rsa of at least 2048 bits"
# What the first line of a private key looks like in every format ssh-keygen, OpenSSL and PuTTY write.
PRIVATE_MARKERS = ("PRIVATE KEY-----", "PuTTY-User-Key-File-")


@dataclass(frozen=True)
class ParsedKey:
    key_type: KeyType
    bits: int
    public_key: str  # "<type> <base64 blob>", as the library writes it back, without the comment
    comment: str
    fingerprint: str  # "SHA256:<unpadded base64>", as `ssh-keygen -l` prints it


def refuse(message: str, code: str = "invalid_key") -> ValidationFailed:
    return ValidationFailed(message, code=code, fields={FIELD: [message]})


def fingerprint_of(public_key: str) -> str:
    """OpenSSH's SHA256 fingerprint of a normalised key: the digest of its wire-format blob."""
    blob = base64.b64decode(public_key.split(" ")[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode("ascii").rstrip("=")


def parse_public_key(text: str) -> ParsedKey:
    """Parse one OpenSSH public key line (``ssh-ed25519 AAAA... comment``), or raise ``ValidationFailed``."""
    if "\x00" in text:
        raise refuse("The key contains a NUL character; paste the text of the .pub file.")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise refuse(f"The key is longer than {MAX_KEY_BYTES} bytes; an SSH public key is one short line.")
    text = text.strip()
    if not text:
        raise refuse(f"Paste a public key, such as {EXAMPLE}.")
    if any(marker in text for marker in PRIVATE_MARKERS):
        raise refuse(
            "This is a private key, which must never leave your machine; it was not stored. Paste the public "
            "half instead: the .pub file beside it, or what `ssh-keygen -y -f KEYFILE` prints.",
            code="private_key",
        )
    if text.startswith("---- BEGIN SSH2 PUBLIC KEY"):
        raise refuse("This key is in the RFC 4716 format; `ssh-keygen -i -f FILE` prints it in OpenSSH's.")
    if text.startswith("-----BEGIN"):
        raise refuse("This key is in PEM format; `ssh-keygen -i -m PKCS8 -f FILE` prints it in OpenSSH's.")
    if "\n" in text or "\r" in text:
        # The library would take the second line for part of the first one's comment.
        raise refuse("Paste one key, on one line; add each key on its own.")
    if any((ord(c) < 32 and c != "\t") or ord(c) == 127 for c in text):
        # The comment is shown in terminals (`gpucp keys ls`), where control characters would act.
        raise refuse("The key contains control characters.")
    try:
        with warnings.catch_warnings():
            # DSA keys still load, with a deprecation warning; they are refused below.
            warnings.simplefilter("ignore", CryptographyDeprecationWarning)
            key = serialization.load_ssh_public_key(text.encode("utf-8"))
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise refuse(f"This is not an OpenSSH public key ({exc}); it should read like {EXAMPLE}.")
    key_type, bits = _type_and_bits(key)
    normalised = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode("ascii")
    written_type = text.split(None, 1)[0]
    if written_type != normalised.split(" ", 1)[0]:
        # The library reads a security-key (FIDO) key as its plain twin; storing that would change the key.
        raise refuse(f"{written_type} keys are not supported; use {SUPPORTED}.", code="unsupported_key")
    parts = text.split(None, 2)
    comment = parts[2].strip() if len(parts) == 3 else ""
    return ParsedKey(
        key_type=key_type, bits=bits, public_key=normalised, comment=comment, fingerprint=fingerprint_of(normalised)
    )


def _type_and_bits(key: object) -> tuple[KeyType, int]:
    if isinstance(key, ed25519.Ed25519PublicKey):
        return KeyType.ED25519, 256
    if isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name in EC_TYPES:
        return EC_TYPES[key.curve.name], key.curve.key_size
    if isinstance(key, rsa.RSAPublicKey):
        if key.key_size < RSA_MIN_BITS:
            raise refuse(
                f"This RSA key has {key.key_size} bits; at least {RSA_MIN_BITS} are required. "
                "Make a new key: `ssh-keygen -t ed25519`.",
                code="weak_key",
            )
        if key.key_size > RSA_MAX_BITS:
            raise refuse(f"This RSA key has {key.key_size} bits, more than OpenSSH accepts ({RSA_MAX_BITS}).")
        return KeyType.RSA, key.key_size
    if isinstance(key, dsa.DSAPublicKey):
        raise refuse(
            "DSA (ssh-dss) keys are weak, and OpenSSH no longer accepts them. Make a new key: `ssh-keygen -t ed25519`.",
            code="weak_key",
        )
    raise refuse(f"This key type is not supported; use {SUPPORTED}.", code="unsupported_key")
