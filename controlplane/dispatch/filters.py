from __future__ import annotations

import django_filters

from controlplane.dispatch.choices import LaunchState
from controlplane.dispatch.models import Launch


class LaunchFilter(django_filters.FilterSet):
    reservation = django_filters.UUIDFilter(field_name="reservation__public_id")
    state = django_filters.ChoiceFilter(choices=LaunchState.choices)
    server = django_filters.CharFilter(field_name="server__hostname")

    class Meta:
        model = Launch
        fields = ["reservation", "state", "server"]
