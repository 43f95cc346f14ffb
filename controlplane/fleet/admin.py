"""Admin for enrollment secrets and telemetry. Secrets are shown once, as a message, when made."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from controlplane.core.errors import DomainError
from controlplane.fleet import services
from controlplane.fleet.models import GpuTelemetryMinute, JoinToken, NodeCredential


class JoinTokenForm(forms.ModelForm):
    ttl_s = forms.IntegerField(
        required=False,
        min_value=60,
        max_value=30 * 24 * 3600,
        help_text="Seconds until it expires; empty for the default.",
    )

    class Meta:
        model = JoinToken
        fields = ["note"]


@admin.register(JoinToken)
class JoinTokenAdmin(admin.ModelAdmin):
    list_display = ["lookup", "note", "created_by", "created_at", "expires_at", "used_at", "server", "revoked_at"]
    list_filter = ["used_at", "revoked_at"]
    search_fields = ["lookup", "note", "server__hostname"]
    list_select_related = ["created_by", "server"]
    actions = ["revoke"]

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = JoinTokenForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [] if obj is None else [f.name for f in JoinToken._meta.fields]

    def save_model(self, request: HttpRequest, obj: JoinToken, form: Any, change: bool) -> None:
        if change:
            return
        token, plaintext = services.join_token_create(
            actor=request.user, note=form.cleaned_data.get("note", ""), ttl_s=form.cleaned_data.get("ttl_s")
        )
        obj.pk = token.pk
        self.message_user(request, f"Join token (shown once, copy it now): {plaintext}", level=messages.WARNING)

    @admin.action(description="Revoke selected join tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[JoinToken]) -> None:
        for token in queryset:
            try:
                services.join_token_revoke(token=token, actor=request.user)
            except DomainError as exc:
                self.message_user(request, f"{token.lookup}: {exc.message}", level=messages.WARNING)


@admin.register(NodeCredential)
class NodeCredentialAdmin(admin.ModelAdmin):
    list_display = ["lookup", "server", "created_at", "revoked_at", "revoked_reason"]
    list_filter = ["revoked_at"]
    search_fields = ["lookup", "server__hostname"]
    list_select_related = ["server"]
    readonly_fields = ["server", "lookup", "created_at", "revoked_at", "revoked_reason"]
    exclude = ["digest"]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Revoke the credential of the selected servers")
    def revoke(self, request: HttpRequest, queryset: QuerySet[NodeCredential]) -> None:
        for credential in queryset.filter(revoked_at__isnull=True).select_related("server"):
            services.credential_revoke(
                server=credential.server, actor=request.user, reason=f"revoked in the admin by {request.user}"
            )


@admin.register(GpuTelemetryMinute)
class GpuTelemetryMinuteAdmin(admin.ModelAdmin):
    list_display = ["gpu", "minute", "samples", "util_max", "temp_max_c", "fb_used_max_mib"]
    list_select_related = ["gpu__server"]
    search_fields = ["gpu__uuid", "gpu__server__hostname"]
    date_hierarchy = "minute"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
