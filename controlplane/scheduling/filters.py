import django_filters

from controlplane.scheduling.choices import RequestState
from controlplane.scheduling.models import QueuedRequest


class QueuedRequestFilter(django_filters.FilterSet):
    project = django_filters.CharFilter(field_name="project__slug", help_text="Project slug.")
    state = django_filters.MultipleChoiceFilter(choices=RequestState.choices)

    class Meta:
        model = QueuedRequest
        fields = ["project", "state"]
