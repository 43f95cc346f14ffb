from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.accounts.models import Project
from controlplane.core.api.fields import AwareDateTimeField, SlugRelatedField
from controlplane.inventory.models import GpuModel
from controlplane.reservations.api.fields import DurationField
from controlplane.reservations.api.serializers import (
    ContainerSerializer,
    ProjectSlugField,
    ReservationReasonSerializer,
    SpecSerializer,
    mount_from,
    spec_from,
)
from controlplane.reservations.specs import ContainerSpec
from controlplane.scheduling import selectors
from controlplane.scheduling.models import PriorityClass, QueuedRequest, QueuedRequestEvent


class QueuedRequestCreateSerializer(serializers.Serializer):
    project = ProjectSlugField(
        slug_field="slug",
        queryset=Project.objects.none(),
        help_text="The project's slug; you must be its owner or a member.",
    )
    name = serializers.CharField(max_length=120)
    spec = SpecSerializer()
    container = ContainerSerializer()
    duration = DurationField(
        help_text='How long it runs once started: "10m", "2h", "1d", "1h30m", an ISO 8601 duration ("PT10M"), '
        "or whole seconds (600)."
    )
    start_by = AwareDateTimeField(
        required=False, allow_null=True, default=None, help_text="Fail the request if it has not started by then."
    )
    priority_class = SlugRelatedField(
        slug_field="name",
        queryset=PriorityClass.objects.all(),
        required=False,
        help_text='The class by name: "high", "normal" (the default) or "preemptible" (runs only on GPUs nobody '
        "booked, at a discount, and yields them with notice).",
    )
    requeue = serializers.BooleanField(
        required=False,
        default=False,
        help_text="When its reservation is preempted, queue the same request again (to resume from a checkpoint).",
    )

    def __init__(self, *args: Any, projects: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if projects is not None:
            self.fields["project"].queryset = projects  # type: ignore[attr-defined]

    def to_domain(self) -> dict[str, Any]:
        data = self.validated_data
        container = data["container"]
        return {
            "project": data["project"],
            "name": data["name"],
            "spec": spec_from(data["spec"]),
            "container": ContainerSpec(
                image=container["image"],
                command=container["command"],
                env=container["env"],
                volumes=[mount_from(m) for m in container["volumes"]],
                network=container["network"],
            ),
            "duration": data["duration"],
            "start_by": data["start_by"],
            "priority_class": data.get("priority_class") or PriorityClass.objects.get(name="normal"),
            "requeue": data["requeue"],
        }


class QueuedRequestCancelSerializer(ReservationReasonSerializer):
    pass


class QueuedSpecSerializer(serializers.Serializer):
    gpu_model = serializers.CharField(allow_null=True)
    min_memory_mib = serializers.IntegerField(allow_null=True)
    gpu_count = serializers.IntegerField(allow_null=True)
    whole_servers = serializers.IntegerField(allow_null=True)


class QueuedRequestEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = QueuedRequestEvent
        fields = ["from_state", "to_state", "actor_label", "reason", "at"]


class QueuedRequestSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id", read_only=True)
    project = serializers.CharField(source="project.slug", read_only=True)
    priority_class = serializers.CharField(source="priority_class.name", read_only=True)
    spec = serializers.SerializerMethodField()
    container = serializers.JSONField(read_only=True)
    reservation = serializers.UUIDField(source="reservation.public_id", read_only=True, allow_null=True, default=None)
    requeued_from = serializers.UUIDField(
        source="requeued_from.public_id",
        read_only=True,
        allow_null=True,
        default=None,
        help_text="The request this one was queued again from, when its reservation was preempted.",
    )

    class Meta:
        model = QueuedRequest
        fields = [
            "id",
            "project",
            "name",
            "spec",
            "container",
            "duration_seconds",
            "start_by",
            "priority_class",
            "state",
            "reason",
            "reservation",
            "requeue",
            "requeued_from",
            "created_at",
            "started_at",
        ]

    @extend_schema_field(QueuedSpecSerializer)
    def get_spec(self, request: QueuedRequest) -> dict[str, Any]:
        spec = dict(request.spec)
        model_id = spec.pop("gpu_model_id", None)
        return QueuedSpecSerializer({"gpu_model": self._model_names().get(model_id), **spec}).data

    def _model_names(self) -> dict[int, str]:
        """The catalog's names by id, read once per answer (a list's rows share it): no query per row."""
        names = self.context.get("gpu_model_names") if isinstance(self.context, dict) else None
        if names is None:
            names = dict(GpuModel.objects.values_list("id", "name"))
            if isinstance(self.context, dict):
                self.context["gpu_model_names"] = names
        return names


class QueuedRequestDetailSerializer(QueuedRequestSerializer):
    position = serializers.SerializerMethodField(
        help_text="1-based place among queued requests of its class and above, in the order the pass serves "
        "them; null once it is not queued."
    )
    estimated_start = serializers.SerializerMethodField(
        help_text="The earliest window of its duration from booked windows; the queue ahead is not yet counted. "
        "Null when none is free in the week ahead, or once it is not queued."
    )
    events = QueuedRequestEventSerializer(many=True, read_only=True)

    class Meta(QueuedRequestSerializer.Meta):
        fields = [*QueuedRequestSerializer.Meta.fields, "position", "estimated_start", "events"]

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_position(self, request: QueuedRequest) -> int | None:
        return selectors.position(request)

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_estimated_start(self, request: QueuedRequest) -> str | None:
        at = selectors.estimated_start(request)
        return None if at is None else serializers.DateTimeField().to_representation(at)
