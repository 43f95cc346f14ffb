"""Standard Webhooks signatures (https://www.standardwebhooks.com/, "Signature scheme").

A secret is ``whsec_`` followed by base64 of 24 random bytes; the key is those bytes. A message is signed over
``{webhook-id}.{webhook-timestamp}.{body}`` with HMAC-SHA256, and ``webhook-signature`` holds
``v1,<base64 signature>``, several separated by spaces while a rotated-out secret is still valid.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Iterable

PREFIX = "whsec_"
# How far a receiver may let a timestamp drift before it refuses the message (replay protection).
TOLERANCE_S = 5 * 60


def new_secret() -> str:
    return PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def _key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(PREFIX))


def sign(secret: str, *, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<signature>`` for one secret."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signature_header(secrets_: Iterable[str], *, msg_id: str, timestamp: int, body: bytes) -> str:
    return " ".join(sign(s, msg_id=msg_id, timestamp=timestamp, body=body) for s in secrets_)


def headers(secrets_: Iterable[str], *, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature_header(secrets_, msg_id=msg_id, timestamp=timestamp, body=body),
        "content-type": "application/json",
    }


def verify(secret: str, *, msg_id: str, timestamp: str, signature: str, body: bytes, now: float) -> bool:
    """A receiver's check, as the specification describes it (used by the tests and the bench's receiver):
    the timestamp within ``TOLERANCE_S``, and one of the space-separated ``v1`` signatures matching."""
    try:
        ts = int(timestamp)
    except ValueError:
        return False
    if abs(now - ts) > TOLERANCE_S:
        return False
    expected = sign(secret, msg_id=msg_id, timestamp=ts, body=body)
    return any(hmac.compare_digest(expected, candidate) for candidate in signature.split(" "))
