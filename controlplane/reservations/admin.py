from django.contrib import admin

from controlplane.reservations.models import Allocation, Reservation, ReservationEvent


class AllocationInline(admin.TabularInline):
    model = Allocation
    extra = 0
    can_delete = False
    readonly_fields = ["gpu", "starts_at", "ends_at", "active", "released_at"]


class EventInline(admin.TabularInline):
    model = ReservationEvent
    extra = 0
    can_delete = False
    readonly_fields = ["from_state", "to_state", "actor_label", "reason", "data", "at"]


@admin.register(Reservation)
class ReservationAdmin(admin.ModelAdmin):
    """Read-only: state changes go through the services so they are checked and leave an event."""

    list_display = ["public_id", "project", "name", "state", "starts_at", "ends_at"]
    list_filter = ["state"]
    search_fields = ["public_id", "name", "project__slug"]
    readonly_fields = [f.name for f in Reservation._meta.fields]
    inlines = [AllocationInline, EventInline]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False
