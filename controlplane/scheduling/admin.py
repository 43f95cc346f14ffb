from django.contrib import admin

from controlplane.scheduling.models import PriorityClass, ProjectShare, QueuedRequest, QueuedRequestEvent


@admin.register(PriorityClass)
class PriorityClassAdmin(admin.ModelAdmin):
    list_display = ("name", "rank", "restricted", "credit_multiplier", "notice_seconds", "preemptible")
    # A restricted class is granted to a project by adding its quota policy here.
    filter_horizontal = ("allowed_policies",)


@admin.register(ProjectShare)
class ProjectShareAdmin(admin.ModelAdmin):
    list_display = ("project", "shares")
    search_fields = ("project__slug", "project__name")


class QueuedRequestEventInline(admin.TabularInline):
    model = QueuedRequestEvent
    extra = 0
    readonly_fields = ("from_state", "to_state", "actor", "actor_label", "reason", "at")


@admin.register(QueuedRequest)
class QueuedRequestAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "priority_class", "state", "created_at", "started_at")
    list_filter = ("state", "priority_class")
    readonly_fields = ("public_id", "reservation", "blocked_by", "blocked_until", "created_at", "started_at")
    inlines = [QueuedRequestEventInline]
