from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from controlplane.access import services, volumes
from controlplane.access.models import Dataset, ProjectNetwork, SshKey, Volume


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


@admin.register(Volume)
class VolumeAdmin(admin.ModelAdmin):
    """Writes go through the volume services, as the API's do: the same checks, the same charges on delete."""

    list_display = ["name", "project", "size_limit_gib", "shared", "used_bytes", "measured_at", "charged_until"]
    list_filter = ["shared"]
    search_fields = ["name", "project__slug"]
    readonly_fields = ["used_bytes", "measured_at", "charged_until", "created_by", "created_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: Volume | None = None) -> list[str]:
        # The name is the volume's directory and the project its parent: fixed once created.
        return [*self.readonly_fields, *(["project", "name"] if obj is not None else [])]

    def save_model(self, request: HttpRequest, obj: Volume, form: Any, change: bool) -> None:
        if change:
            volumes.volume_update(volume=obj, actor=request.user, size_limit_gib=obj.size_limit_gib, shared=obj.shared)
        else:
            created = volumes.volume_create(
                project=obj.project, name=obj.name, size_limit_gib=obj.size_limit_gib, shared=obj.shared,
                actor=request.user,
            )  # fmt: skip
            obj.pk = created.pk

    def delete_model(self, request: HttpRequest, obj: Volume) -> None:
        volumes.volume_delete(volume=obj, actor=request.user)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Volume]) -> None:
        for volume in queryset:
            volumes.volume_delete(volume=volume, actor=request.user)


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ["name", "description", "created_at"]
    search_fields = ["name"]
    filter_horizontal = ["allowed_projects"]


@admin.register(ProjectNetwork)
class ProjectNetworkAdmin(admin.ModelAdmin):
    """The Docker network each project's egress containers join; a project without a row has no egress."""

    list_display = ["project", "network_name", "updated_by", "updated_at"]
    search_fields = ["project__slug", "network_name"]
    fields = ["project", "network_name"]

    def save_model(self, request: HttpRequest, obj: ProjectNetwork, form: Any, change: bool) -> None:
        saved = volumes.project_network_set(project=obj.project, network_name=obj.network_name, actor=request.user)
        obj.pk = saved.pk if saved else None
