from __future__ import annotations

import django_filters

from controlplane.inventory.choices import GpuHealth, ServerState
from controlplane.inventory.models import Gpu, GpuModel, Rack, Server, Site


class RackFilter(django_filters.FilterSet):
    site = django_filters.ModelChoiceFilter(queryset=Site.objects.all())

    class Meta:
        model = Rack
        fields = ["site"]


class ServerFilter(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=ServerState.choices)
    site = django_filters.ModelChoiceFilter(field_name="rack__site", queryset=Site.objects.all())
    rack = django_filters.ModelChoiceFilter(queryset=Rack.objects.all())
    gpu_model = django_filters.ModelChoiceFilter(
        field_name="gpus__model", queryset=GpuModel.objects.all(), distinct=True
    )
    simulated = django_filters.BooleanFilter()

    class Meta:
        model = Server
        fields = ["state", "site", "rack", "gpu_model", "simulated"]


class GpuFilter(django_filters.FilterSet):
    server = django_filters.ModelChoiceFilter(queryset=Server.objects.all())
    model = django_filters.ModelChoiceFilter(queryset=GpuModel.objects.all())
    health = django_filters.ChoiceFilter(choices=GpuHealth.choices)
    present = django_filters.BooleanFilter()
    needs_acknowledgement = django_filters.BooleanFilter()

    class Meta:
        model = Gpu
        fields = ["server", "model", "health", "present", "needs_acknowledgement"]
