import django_filters

from controlplane.core.api.filters import AwareIsoDateTimeFilter
from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import BudgetAlert, LedgerEntry, MemberCap


class LedgerEntryFilter(django_filters.FilterSet):
    project = django_filters.CharFilter(field_name="project__slug", help_text="Project slug.")
    kind = django_filters.MultipleChoiceFilter(choices=EntryKind.choices)
    reservation = django_filters.UUIDFilter(field_name="reservation__public_id")
    created_after = AwareIsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = AwareIsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = LedgerEntry
        fields = ["project", "kind", "reservation", "created_after", "created_before"]


class BudgetAlertFilter(django_filters.FilterSet):
    project = django_filters.CharFilter(field_name="project__slug", help_text="Project slug.")
    period_key = django_filters.CharFilter(help_text="The UTC month, e.g. 2026-11.")

    class Meta:
        model = BudgetAlert
        fields = ["project", "period_key"]


class MemberCapFilter(django_filters.FilterSet):
    project = django_filters.CharFilter(field_name="project__slug", help_text="Project slug.")

    class Meta:
        model = MemberCap
        fields = ["project"]
