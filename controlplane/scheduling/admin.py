from django.contrib import admin

from controlplane.scheduling.models import PriorityClass, QueuedRequest, QueuedRequestEvent


@admin.register(PriorityClass)
class PriorityClassAdmin(admin.ModelAdmin):
    list_display = ("name", "rank", "credit_multiplier", "notice_seconds", "preemptible")


class QueuedRequestEventInline(admin.TabularInline):
    model = QueuedRequestEvent
    extra = 0
    readonly_fields = ("from_state", "to_state", "actor", "actor_label", "reason", "at")


@admin.register(QueuedRequest)
class QueuedRequestAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "priority_class", "state", "created_at", "started_at")
    list_filter = ("state", "priority_class")
    readonly_fields = ("public_id", "reservation", "created_at", "started_at")
    inlines = [QueuedRequestEventInline]
