from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from controlplane.accounts import services
from controlplane.accounts.models import ApiToken, Membership, Project


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "requeue_on_interrupt", "created_at"]
    search_fields = ["slug", "name"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "lookup", "created_at", "expires_at", "revoked_at", "last_used_at"]
    list_filter = ["revoked_at"]
    search_fields = ["name", "lookup", "user__username"]
    autocomplete_fields = ["user"]
    actions = ["revoke"]

    def get_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> Any:
        if obj is None:
            return ["user", "name", "expires_at"]
        return ["user", "name", "lookup", "digest", "created_at", "expires_at", "revoked_at", "last_used_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> Any:
        if obj is None:
            return []
        # An existing token is changed only by revoking it; its digest is shown so it can be matched.
        return self.get_fields(request, obj)

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        if change:
            return
        token, plaintext = services.api_token_create(user=obj.user, name=obj.name, expires_at=obj.expires_at)
        obj.pk = token.pk
        obj.lookup, obj.digest, obj.created_at = token.lookup, token.digest, token.created_at
        # Shown once: only the digest is stored, so nobody can see this token again.
        self.message_user(
            request, f"Token created. Copy it now, it is not shown again: {plaintext}", level=messages.WARNING
        )

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        for token in queryset:
            services.api_token_revoke(token=token, actor=request.user)
        self.message_user(request, f"Revoked {queryset.count()} token(s).")
