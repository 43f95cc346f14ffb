from typing import Any

from django.contrib import admin

from controlplane.ledger.models import LedgerEntry, QuotaPolicy


@admin.register(QuotaPolicy)
class QuotaPolicyAdmin(admin.ModelAdmin):
    list_display = ["project", "credits_per_period", "max_concurrent_gpus", "max_reservation_hours", "updated_at"]
    search_fields = ["project__slug"]


@admin.register(LedgerEntry)
class LedgerEntryAdmin(admin.ModelAdmin):
    """Read-only: a correction is a new entry made through the operator endpoints."""

    list_display = ["created_at", "project", "kind", "amount", "reservation", "actor_label", "reason"]
    list_filter = ["kind"]
    search_fields = ["project__slug", "reason"]

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False
