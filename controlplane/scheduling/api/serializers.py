from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.core.api.fields import AwareDateTimeField, SlugRelatedField
from controlplane.inventory.models import GpuModel
from controlplane.reservations.api.fields import DurationField
from controlplane.reservations.api.serializers import (
    ContainerSerializer,
    ProjectWorkSerializer,
    ReservationReasonSerializer,
    SpecSerializer,
    container_from,
    spec_from,
)
from controlplane.scheduling import selectors
from controlplane.scheduling.choices import RequestState
from controlplane.scheduling.models import PriorityClass, QueuedRequest, QueuedRequestEvent
from controlplane.scheduling.order import Entry, ordered_queue


# A queued request: a booking's project, name, spec and container, read by the booking's own serializers
# (reservations/api/serializers.py), with a duration instead of a window.
class QueuedRequestCreateSerializer(ProjectWorkSerializer):
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
        help_text='The class by name: "normal" (the default), "high" or "preemptible" (runs only on GPUs nobody '
        "booked, at a discount, and yields them with notice). A restricted class (high) only where the "
        "project's quota policy allows it (400 naming `priority_class` otherwise).",
    )
    requeue = serializers.BooleanField(
        required=False,
        default=False,
        help_text="When its reservation is preempted, queue the same request again (to resume from a checkpoint).",
    )

    def to_domain(self) -> dict[str, Any]:
        data = self.validated_data
        return {
            "project": data["project"],
            "name": data["name"],
            "spec": spec_from(data["spec"]),
            "container": container_from(data["container"]),
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
    blocked_by = serializers.UUIDField(
        source="blocked_by.public_id",
        read_only=True,
        allow_null=True,
        default=None,
        help_text="The reservation whose end frees its GPUs, when the last pass found them busy.",
    )
    blocked_until = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text="Its shadow time: the earliest start the booked calendar left it at the last pass.",
    )
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
            "blocked_by",
            "blocked_until",
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
        help_text="1-based place in the queue, in the order the pass serves it (class, fair share, first come); "
        "null unless queued."
    )
    estimated_start = serializers.SerializerMethodField(
        help_text="Approximately when it starts: the earliest window of its duration from booked windows, plus "
        "the time the queued requests ahead of it for the same GPUs take to drain on the matching fleet. Null "
        "when no window is free in the week ahead, or unless queued."
    )
    events = QueuedRequestEventSerializer(many=True, read_only=True)

    class Meta(QueuedRequestSerializer.Meta):
        fields = [*QueuedRequestSerializer.Meta.fields, "position", "estimated_start", "events"]

    def _queue(self) -> list[Entry]:
        """The ordered queue, read once per answer and shared by position and estimated_start."""
        queue = self.context.get("queue") if isinstance(self.context, dict) else None
        if queue is None:
            queue = ordered_queue(now=timezone.now())
            if isinstance(self.context, dict):
                self.context["queue"] = queue
        return queue

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_position(self, request: QueuedRequest) -> int | None:
        if request.state != RequestState.QUEUED:
            return None
        return selectors.position(request, queue=self._queue())

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_estimated_start(self, request: QueuedRequest) -> str | None:
        if request.state != RequestState.QUEUED:
            return None
        at = selectors.estimated_start(request, queue=self._queue())
        return None if at is None else serializers.DateTimeField().to_representation(at)


class PriorityClassChangeSerializer(serializers.Serializer):
    priority_class = SlugRelatedField(
        slug_field="name", queryset=PriorityClass.objects.all(), help_text="The class to move the request to."
    )
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)


class FairShareSerializer(serializers.Serializer):
    project = serializers.CharField(help_text="The project's slug.")
    shares = serializers.IntegerField(help_text="Its shares, as an operator set them (1 unless set).")
    usage_gpu_hours = serializers.FloatField(help_text="GPU-hours run, decayed by the half-life.")
    normalized_usage = serializers.FloatField(help_text="U: its decayed usage over every project's.")
    normalized_shares = serializers.FloatField(help_text="S: its shares over those of the competing projects.")
    factor = serializers.FloatField(help_text="F = 2^(-U/S), in (0, 1]: higher is served first within a class.")
    half_life_days = serializers.FloatField()


class QueueEntrySerializer(serializers.Serializer):
    """One row of the operators' whole-queue view."""

    position = serializers.IntegerField(allow_null=True, help_text="Null for a held request.")
    id = serializers.UUIDField()
    project = serializers.CharField()
    name = serializers.CharField()
    priority_class = serializers.CharField()
    state = serializers.CharField()
    spec = serializers.CharField(help_text='What it waits for, in words: "4 x H100-80GB".')
    duration_seconds = serializers.IntegerField()
    fair_share_factor = serializers.FloatField(allow_null=True)
    reason = serializers.CharField(
        help_text='Why it has not started, from the last pass: "waiting for 4 x H100-80GB; blocked by reservation '
        '<id> until <ISO 8601>".'
    )
    blocked_by = serializers.UUIDField(allow_null=True)
    blocked_until = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()


class PriorityClassSerializer(serializers.ModelSerializer):
    """A queue class as the database holds it (operators edit it in the admin), so the portal copies none of it."""

    credit_multiplier = serializers.DecimalField(
        max_digits=6,
        decimal_places=3,
        read_only=True,
        help_text="Its bookings hold and are charged their GPUs' weight times this (a string decimal).",
    )
    allowed = serializers.SerializerMethodField(
        help_text="Whether you may submit in it for at least one of your projects: always for an unrestricted "
        "class; for a restricted one, when the quota policy of a project you own or are a member of is granted it."
    )

    class Meta:
        model = PriorityClass
        fields = ["name", "rank", "credit_multiplier", "notice_seconds", "preemptible", "restricted", "allowed"]

    @extend_schema_field(serializers.BooleanField())
    def get_allowed(self, klass: PriorityClass) -> bool:
        # The caller's grants are read once by the view and shared by every row (no query per class); None
        # stands for an operator, who may use any class.
        granted = self.context["granted"]
        return not klass.restricted or granted is None or klass.pk in granted
