"""Secrets handed out once and stored hashed: API tokens, join tokens, node credentials.

A token reads ``<kind>_<lookup>_<secret>``. ``lookup`` is stored in clear and indexed so a request costs one
indexed query; only the SHA-256 of the whole token is stored, compared in constant time. The kind prefix
keeps a node credential from ever being accepted where a user token is expected, and the reverse.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

USER_TOKEN = "gcp"  # noqa: S105 - a token kind prefix, not a secret
JOIN_TOKEN = "gcj"  # noqa: S105 - a token kind prefix, not a secret
NODE_CREDENTIAL = "gcn"


@dataclass(frozen=True)
class IssuedToken:
    plaintext: str
    lookup: str
    digest: str


def issue(kind: str) -> IssuedToken:
    lookup = secrets.token_hex(6)
    plaintext = f"{kind}_{lookup}_{secrets.token_urlsafe(32)}"
    return IssuedToken(plaintext=plaintext, lookup=lookup, digest=digest(plaintext))


def digest(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def parse(plaintext: str, kind: str) -> str | None:
    """Return the lookup part when ``plaintext`` is a token of ``kind``, else None."""
    parts = plaintext.split("_", 2)
    if len(parts) != 3 or parts[0] != kind or len(parts[1]) != 12 or not parts[2]:
        return None
    return parts[1]


def matches(plaintext: str, stored_digest: str) -> bool:
    return hmac.compare_digest(digest(plaintext), stored_digest)
