"""Admin for the inventory. Server state changes go through the lifecycle service, with a reason."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest

from controlplane.core.errors import DomainError
from controlplane.inventory.choices import ServerState
from controlplane.inventory.models import Gpu, GpuModel, GpuModelMigProfile, Rack, Server, ServerEvent, Site
from controlplane.inventory.services import server_set_state


@admin.register(Site)
class SiteAdmin(admin.ModelAdmin):
    list_display = ["name", "location"]
    search_fields = ["name", "location"]


@admin.register(Rack)
class RackAdmin(admin.ModelAdmin):
    list_display = ["name", "site"]
    list_filter = ["site"]
    search_fields = ["name", "site__name"]


class GpuModelMigProfileInline(admin.TabularInline):
    model = GpuModelMigProfile
    extra = 0
    fields = ["name", "memory_mib", "compute_slices", "memory_slices", "billing_weight"]


@admin.register(GpuModel)
class GpuModelAdmin(admin.ModelAdmin):
    list_display = ["name", "product_name", "memory_mib", "price_per_gpu_hour", "currency", "billing_weight"]
    search_fields = ["name", "product_name"]
    inlines = [GpuModelMigProfileInline]


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    can_delete = False
    fields = readonly_fields = (
        "index",
        "uuid",
        "model",
        "memory_mib",
        "present",
        "health",
        "health_reasons",
        "needs_acknowledgement",
    )
    show_change_link = True


class ServerAdminForm(forms.ModelForm):
    new_state = forms.ChoiceField(
        choices=[("", "(unchanged)"), *ServerState.choices],
        required=False,
        help_text="Moves the server along its lifecycle; recorded with the reason.",
    )
    reason = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))

    class Meta:
        model = Server
        fields = ["rack", "heartbeat_interval_s"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("new_state") and not (data.get("reason") or "").strip():
            self.add_error("reason", "A state change needs a reason.")
        return data


@admin.register(Server)
class ServerAdmin(admin.ModelAdmin):
    form = ServerAdminForm
    list_display = ["hostname", "state", "rack", "simulated", "agent_version", "last_heartbeat_at"]
    list_filter = ["state", "simulated", "rack__site"]
    search_fields = ["hostname"]
    readonly_fields = [
        "hostname",
        "state",
        "state_before_offline",
        "simulated",
        "agent_version",
        "facts",
        "last_heartbeat_at",
        "last_heartbeat_seq",
        "created_at",
    ]
    inlines = [GpuInline]
    list_select_related = ["rack__site"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # servers come from enrollment

    def save_model(self, request: HttpRequest, obj: Server, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        to = form.cleaned_data.get("new_state")
        if to:
            try:
                server_set_state(server=obj, to=to, actor=request.user, reason=form.cleaned_data["reason"])
            except DomainError as exc:
                self.message_user(request, exc.message, level=messages.ERROR)


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["uuid", "server", "index", "model", "present", "health", "needs_acknowledgement", "telemetry_at"]
    list_filter = ["health", "present", "needs_acknowledgement", "model"]
    search_fields = ["uuid", "server__hostname", "pci_bus_id"]
    list_select_related = ["server", "model"]
    readonly_fields = [f.name for f in Gpu._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(ServerEvent)
class ServerEventAdmin(admin.ModelAdmin):
    list_display = ["at", "server", "kind", "from_state", "to_state", "actor_label", "reason"]
    list_filter = ["kind"]
    search_fields = ["server__hostname", "reason", "actor_label"]
    list_select_related = ["server"]
    date_hierarchy = "at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
