from __future__ import annotations

import django_filters
from django.db.models import QuerySet

from controlplane.notifications.choices import EventType
from controlplane.notifications.models import Notification


class NotificationFilter(django_filters.FilterSet):
    unread = django_filters.BooleanFilter(method="filter_unread", label="Only unread (true) or only read (false)")
    type = django_filters.ChoiceFilter(field_name="event__type", choices=EventType.choices)

    class Meta:
        model = Notification
        fields = ["unread", "type"]

    # ``value: bool``: drf-spectacular reads a method filter's type from this hint (the filter never calls it
    # with None: an absent or empty ?unread= skips it).
    def filter_unread(self, queryset: QuerySet[Notification], name: str, value: bool) -> QuerySet[Notification]:
        return queryset.filter(read_at__isnull=value)
