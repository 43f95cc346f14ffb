"""The keys the web proxy logs in to node gateways with: one ed25519 key per user, derived from SECRET_KEY.

A gateway accepts a reservation's keys from its desired state (docs/access.md, "Who may connect"); the access
app adds each owner's and member's portal key there beside their own keys, so the proxy reaches a container as
that user, under the gateway's rules (the window, the end-of-window warning, session events naming the user).
Nothing is stored: every web and worker process derives the same key, and a new SECRET_KEY gives new keys with
the next desired state. The private half never leaves the proxy's process.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.utils.crypto import salted_hmac

from controlplane.access.sshkeys import fingerprint_of

_SALT = "gpucp.access.web.portal-key"


@dataclass(frozen=True)
class PortalKey:
    user: str
    public_key: str  # "ssh-ed25519 AAAA..." (no comment), as the desired state carries keys
    fingerprint: str
    private_openssh: bytes = b""  # the private key in OpenSSH's format (asyncssh.import_private_key reads it)


def portal_key(username: str) -> PortalKey:
    """The user's portal key (by username: what a gateway's session event names)."""
    return _derive(settings.SECRET_KEY, username)


@functools.lru_cache(maxsize=8192)
def _derive(secret: str, username: str) -> PortalKey:
    seed = salted_hmac(_SALT, username, secret=secret, algorithm="sha256").digest()
    key = Ed25519PrivateKey.from_private_bytes(seed)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    return PortalKey(user=username, public_key=public, fingerprint=fingerprint_of(public), private_openssh=private)


def is_portal_session(username: str, fingerprint: str) -> bool:
    """Whether a gateway session was the proxy's (the user's portal key), not the user's own SSH client."""
    return portal_key(username).fingerprint == fingerprint
