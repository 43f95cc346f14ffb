from django.contrib import admin

from controlplane.templates.models import LaunchTemplate


@admin.register(LaunchTemplate)
class LaunchTemplateAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "project", "title", "updated_at"]
    list_filter = ["project"]
    search_fields = ["name", "title"]
