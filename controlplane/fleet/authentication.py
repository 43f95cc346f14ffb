"""``Authorization: Bearer gcn_...``: a node agent speaking for its own server, never a user."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.db import connection
from django.utils.dateparse import parse_datetime
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions

from controlplane.core import tokens
from controlplane.fleet.models import NodeCredential
from controlplane.inventory.models import Server


class NodeCredentialAuthentication(authentication.BaseAuthentication):
    """Sets ``request.auth`` to the NodeCredential (its server preloaded) and ``request.user`` to anonymous."""

    keyword = "Bearer"

    def authenticate(self, request: Any) -> tuple[AnonymousUser, NodeCredential]:
        value, lookup = self.presented(request)
        credential = _credential_with_server(lookup)
        if credential is None or not tokens.matches(value, credential.digest):
            raise exceptions.AuthenticationFailed("The node credential is not valid.")
        if credential.revoked_at is not None:
            raise exceptions.AuthenticationFailed("The node credential was revoked; enroll the node again.")
        return AnonymousUser(), credential

    def authenticate_header(self, request: Any) -> str:
        return self.keyword

    def presented(self, request: Any) -> tuple[str, str]:
        """The bearer token and its lookup part; a missing header or a token that is no node credential is a 401."""
        header = authentication.get_authorization_header(request).decode("latin-1")
        scheme, _, value = header.partition(" ")
        if not header or scheme.lower() != self.keyword.lower():
            raise exceptions.NotAuthenticated("A node credential (Authorization: Bearer gcn_...) is required.")
        value = value.strip()
        lookup = tokens.parse(value, tokens.NODE_CREDENTIAL)
        if lookup is None:
            raise exceptions.AuthenticationFailed("The bearer token is not a node credential.")
        return value, lookup


@functools.cache
def _credential_sql() -> str:
    qn = connection.ops.quote_name
    return (
        "SELECT s.*, c.id AS credential_id, c.digest AS credential_digest, "  # noqa: S608 - identifiers only
        "c.revoked_at AS credential_revoked_at "
        f"FROM {qn(NodeCredential._meta.db_table)} c JOIN {qn(Server._meta.db_table)} s ON s.id = c.server_id "
        "WHERE c.lookup = %s"
    )


def _datetime(value: datetime | str | None) -> datetime | None:
    # A column outside the model's fields gets no converter: SQLite hands back its stored text.
    if isinstance(value, str):
        parsed = parse_datetime(value)
        return parsed if parsed is None or parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return value


def _credential_with_server(lookup: str) -> NodeCredential | None:
    """The credential and its server in one statement, without building the ORM query on every heartbeat (the
    agent endpoint's hottest lookup: the query's compilation cost more than the database's work)."""
    server = next(iter(Server.objects.raw(_credential_sql(), [lookup])), None)
    if server is None:
        return None
    extra = server.__dict__
    return NodeCredential(
        id=extra.pop("credential_id"),
        server=server,
        lookup=lookup,
        digest=extra.pop("credential_digest"),
        revoked_at=_datetime(extra.pop("credential_revoked_at")),
    )


class CredentialRefused(Exception):
    """A node credential that is unknown, forged or revoked: a 401 with this sentence."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class PresentedNodeCredential:
    """A node credential as the request presented it, well-formed but not yet verified."""

    plaintext: str = field(repr=False)  # a secret: never in a log line or a traceback


class DeferredNodeCredentialAuthentication(NodeCredentialAuthentication):
    """The heartbeat's authentication: the header is checked here (a missing or malformed one is a 401 before
    the body is read), the credential itself by the statement that locks the node's server
    (``heartbeat_ingest_with_credential``), which refuses it with the same 401s. Verifying it here as well would
    cost every heartbeat one more statement."""

    def authenticate(self, request: Any) -> tuple[AnonymousUser, PresentedNodeCredential]:  # type: ignore[override]
        value, _ = self.presented(request)
        return AnonymousUser(), PresentedNodeCredential(value)


class IsNodeAgent(permissions.BasePermission):
    def has_permission(self, request: Any, view: Any) -> bool:
        return isinstance(request.auth, NodeCredential | PresentedNodeCredential)


class NodeCredentialScheme(OpenApiAuthenticationExtension):
    target_class = "controlplane.fleet.authentication.NodeCredentialAuthentication"
    match_subclasses = True
    name = "nodeCredential"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "A node credential, gcn_..., from enrollment."}
