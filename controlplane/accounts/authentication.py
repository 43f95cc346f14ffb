"""``Authorization: Bearer gcp_...`` for automation. Node credentials (``gcn_``) are never users."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone
from rest_framework import authentication, exceptions

from controlplane.accounts.models import ApiToken
from controlplane.core import tokens


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Any) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, value = header.partition(" ")
        if scheme.lower() != self.keyword.lower():
            return None
        value = value.strip()
        lookup = tokens.parse(value, tokens.USER_TOKEN)
        if lookup is None:
            raise exceptions.AuthenticationFailed("The bearer token is not a user API token.")
        token = ApiToken.objects.select_related("user").filter(lookup=lookup).first()
        if token is None or not tokens.matches(value, token.digest):
            raise exceptions.AuthenticationFailed("The API token is not valid.")
        now = timezone.now()
        if not token.is_active(now):
            raise exceptions.AuthenticationFailed("The API token has expired or was revoked.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("The token's user is disabled.")
        # Writing last_used_at on every request would make every read a write; once a minute is enough.
        if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request: Any) -> str:
        return self.keyword
