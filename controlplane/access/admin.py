from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from controlplane.access import services
from controlplane.access.models import SshKey


@admin.register(SshKey)
class SshKeyAdmin(admin.ModelAdmin):
    """Operators see and remove keys here; they never add one: a key is its user's to add (API, portal)."""

    list_display = ["name", "user", "key_type", "bits", "fingerprint", "created_at"]
    list_filter = ["key_type"]
    search_fields = ["name", "fingerprint", "user__username"]
    fields = ("user", "name", "key_type", "bits", "fingerprint", "public_key", "comment", "created_at")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: SshKey | None = None) -> bool:
        return False

    def delete_model(self, request: HttpRequest, obj: SshKey) -> None:
        services.ssh_key_delete(key=obj, actor=request.user)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[SshKey]) -> None:
        # One by one through the service, so each removal is logged as the API's are.
        for key in queryset.select_related("user"):
            services.ssh_key_delete(key=key, actor=request.user)
