from django.contrib import admin

from controlplane.dispatch.models import Launch, Requeue


@admin.register(Launch)
class LaunchAdmin(admin.ModelAdmin):
    list_display = [
        "launch_id",
        "reservation",
        "server",
        "generation",
        "state",
        "exit_code",
        "started_at",
        "finished_at",
    ]
    list_filter = ["state"]
    search_fields = ["launch_id", "reservation__public_id", "server__hostname"]
    readonly_fields = [f.name for f in Launch._meta.fields]


@admin.register(Requeue)
class RequeueAdmin(admin.ModelAdmin):
    list_display = ["interrupted", "follow_up", "created_at"]
