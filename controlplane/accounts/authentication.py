"""``Authorization: Bearer gcp_...`` for automation. Node credentials (``gcn_``) are never users."""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone
from rest_framework import authentication, exceptions

from controlplane.accounts.models import ApiToken
from controlplane.core import rows, tokens


@functools.cache
def _token_sql(vendor: str) -> str:
    """Written once per database vendor: every API request runs it."""
    user = get_user_model()
    return (
        f"SELECT t.id, t.digest, t.expires_at, t.revoked_at, t.last_used_at, {rows.select_list(user, 'u', 'u_')} "  # noqa: S608 - names from metadata
        f"FROM {ApiToken._meta.db_table} t INNER JOIN {user._meta.db_table} u ON u.id = t.user_id "
        "WHERE t.lookup = %s"
    )


def token_for(lookup: str) -> ApiToken | None:
    """The token with this lookup and its user, in one read (every API request makes it).

    The user comes whole; of the token, what authentication uses (any other field is read if asked for)."""
    with connection.cursor() as cursor:
        cursor.execute(_token_sql(connection.vendor), [lookup])
        row = cursor.fetchone()
    if row is None:
        return None
    token_id, digest, expires_at, revoked_at, last_used_at, *user_values = row
    user = rows.build(get_user_model(), user_values)
    token = rows.loaded(
        ApiToken,
        {
            "id": token_id,
            "user_id": user.pk,
            "lookup": lookup,
            "digest": digest,
            "expires_at": rows.instant(expires_at),
            "revoked_at": rows.instant(revoked_at),
            "last_used_at": rows.instant(last_used_at),
        },
    )
    token.user = user
    return token


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
        token = token_for(lookup)
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
