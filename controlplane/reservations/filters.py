import django_filters

from controlplane.core.api.filters import AwareIsoDateTimeFilter
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Reservation


class ReservationFilter(django_filters.FilterSet):
    project = django_filters.CharFilter(field_name="project__slug", help_text="Project slug.")
    state = django_filters.MultipleChoiceFilter(choices=ReservationState.choices)
    ends_after = AwareIsoDateTimeFilter(
        field_name="ends_at", lookup_expr="gt", help_text="Windows that end after this instant."
    )
    starts_before = AwareIsoDateTimeFilter(
        field_name="starts_at", lookup_expr="lt", help_text="Windows that start before this instant."
    )
    ends_before = django_filters.IsoDateTimeFilter(
        field_name="ends_at",
        lookup_expr="lte",
        help_text="Windows that end at or before this instant; with ends_after, the reservations that ended in a "
        "period (the history).",
    )

    class Meta:
        model = Reservation
        fields = ["project", "state", "ends_after", "starts_before", "ends_before"]
