"""``Authorization: Bearer gcn_...``: a node agent speaking for its own server, never a user."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions

from controlplane.core import tokens
from controlplane.fleet.models import NodeCredential


class NodeCredentialAuthentication(authentication.BaseAuthentication):
    """Sets ``request.auth`` to the NodeCredential (its server preloaded) and ``request.user`` to anonymous."""

    keyword = "Bearer"

    def authenticate(self, request: Any) -> tuple[AnonymousUser, NodeCredential]:
        header = authentication.get_authorization_header(request).decode("latin-1")
        scheme, _, value = header.partition(" ")
        if not header or scheme.lower() != self.keyword.lower():
            raise exceptions.NotAuthenticated("A node credential (Authorization: Bearer gcn_...) is required.")
        value = value.strip()
        lookup = tokens.parse(value, tokens.NODE_CREDENTIAL)
        if lookup is None:
            raise exceptions.AuthenticationFailed("The bearer token is not a node credential.")
        credential = NodeCredential.objects.select_related("server").filter(lookup=lookup).first()
        if credential is None or not tokens.matches(value, credential.digest):
            raise exceptions.AuthenticationFailed("The node credential is not valid.")
        if credential.revoked_at is not None:
            raise exceptions.AuthenticationFailed("The node credential was revoked; enroll the node again.")
        return AnonymousUser(), credential

    def authenticate_header(self, request: Any) -> str:
        return self.keyword


class IsNodeAgent(permissions.BasePermission):
    def has_permission(self, request: Any, view: Any) -> bool:
        return isinstance(request.auth, NodeCredential)


class NodeCredentialScheme(OpenApiAuthenticationExtension):
    target_class = "controlplane.fleet.authentication.NodeCredentialAuthentication"
    name = "nodeCredential"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "A node credential, gcn_..., from enrollment."}
