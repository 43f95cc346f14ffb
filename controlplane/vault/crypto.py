"""Encryption at rest of project secrets and registry passwords (docs/images.md, "Encryption at rest").

Fernet (AES-128-CBC with HMAC-SHA256) under the keys of ``CONTROLPLANE_ENCRYPTION_KEYS``: the first encrypts,
every one decrypts (``MultiFernet``), so keys rotate. A value is never stored in the clear: without a usable key
``seal`` raises rather than store it, and a value no configured key opens is an error naming the setting, never
the value.
"""

from __future__ import annotations

import functools

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


class UndecryptableError(Exception):
    """A stored value that none of the configured keys opens (the key was changed without keeping the old one)."""


@functools.cache
def _fernet(keys: tuple[str, ...]) -> MultiFernet:
    if not keys:
        raise ImproperlyConfigured("CONTROLPLANE_ENCRYPTION_KEYS holds no key")
    fernets = []
    for i, key in enumerate(keys, start=1):
        try:
            fernets.append(Fernet(key.encode()))
        except (ValueError, TypeError):
            # The key itself is never repeated in the message.
            raise ImproperlyConfigured(
                f"CONTROLPLANE_ENCRYPTION_KEYS: key #{i} is not a Fernet key (32 bytes, url-safe base64); "
                "make one with: python -c 'from cryptography.fernet import Fernet; "
                "print(Fernet.generate_key().decode())'"
            ) from None
    return MultiFernet(fernets)


def cipher() -> MultiFernet:
    return _fernet(tuple(getattr(settings, "CONTROLPLANE_ENCRYPTION_KEYS", ())))


def seal(value: str) -> str:
    """``value`` encrypted under the first key, as ASCII text."""
    return cipher().encrypt(value.encode()).decode("ascii")


def unseal(token: str) -> str:
    """The value sealed in ``token``; UndecryptableError when no configured key opens it."""
    try:
        return cipher().decrypt(token.encode("ascii")).decode()
    except (InvalidToken, UnicodeError):
        raise UndecryptableError(
            "a stored value cannot be decrypted with CONTROLPLANE_ENCRYPTION_KEYS (was a key removed?)"
        ) from None


def reseal(token: str) -> str:
    """``token`` re-encrypted under the first key (key rotation)."""
    try:
        return cipher().rotate(token.encode("ascii")).decode("ascii")
    except InvalidToken:
        raise UndecryptableError(
            "a stored value cannot be decrypted with CONTROLPLANE_ENCRYPTION_KEYS (was a key removed?)"
        ) from None
