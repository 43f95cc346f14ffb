from __future__ import annotations

from typing import Any

from rest_framework import serializers

from controlplane.accounts.models import Project
from controlplane.inventory.models import GpuModel
from controlplane.reservations.api.fields import StartField, StrictStringField
from controlplane.reservations.models import Allocation, Reservation, ReservationEvent
from controlplane.reservations.specs import START_SKEW, ContainerSpec, GpuSpec, Window


class SpecSerializer(serializers.Serializer):
    """What to book: a GPU model or a minimum memory; a GPU count or a number of whole servers."""

    gpu_model = serializers.SlugRelatedField(
        slug_field="name",
        queryset=GpuModel.objects.all(),
        required=False,
        allow_null=True,
        help_text="Catalog name, e.g. H100-80GB.",
    )
    min_memory_mib = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    gpu_count = serializers.IntegerField(min_value=1, max_value=4096, required=False, allow_null=True)
    whole_servers = serializers.IntegerField(min_value=1, max_value=512, required=False, allow_null=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        errors = {}
        if (attrs.get("gpu_model") is None) == (attrs.get("min_memory_mib") is None):
            errors["gpu_model"] = ["Give either a GPU model or a minimum GPU memory, not both or neither."]
        if (attrs.get("gpu_count") is None) == (attrs.get("whole_servers") is None):
            errors["gpu_count"] = ["Give either a GPU count or a number of whole servers, not both or neither."]
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


def spec_from(data: dict[str, Any]) -> GpuSpec:
    model = data.get("gpu_model")
    return GpuSpec(
        gpu_model_id=model.pk if model else None,
        min_memory_mib=data.get("min_memory_mib"),
        gpu_count=data.get("gpu_count"),
        whole_servers=data.get("whole_servers"),
    )


class WindowSerializer(serializers.Serializer):
    start = StartField(help_text='ISO 8601, or "now".')
    end = serializers.DateTimeField()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        from django.utils import timezone

        errors = {}
        if attrs["end"] <= attrs["start"]:
            errors["end"] = ["The window must end after it starts."]
        if attrs["start"] < timezone.now() - START_SKEW:
            errors["start"] = ['The window cannot start in the past; use "now" to start at once.']
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class ContainerSerializer(serializers.Serializer):
    image = serializers.CharField(max_length=512)
    command = serializers.ListField(
        child=StrictStringField(allow_blank=True, trim_whitespace=False), required=False, default=list, max_length=256
    )
    env = serializers.DictField(
        child=StrictStringField(allow_blank=True, trim_whitespace=False), required=False, default=dict
    )


class ProjectSlugField(serializers.SlugRelatedField):
    """A project by slug; ``known`` holds projects the view has already read, so they are not read twice."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.known: dict[str, Project] = {}

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str) and data in self.known:
            return self.known[data]
        return super().to_internal_value(data)


class ReservationCreateSerializer(serializers.Serializer):
    project = ProjectSlugField(
        slug_field="slug",
        queryset=Project.objects.none(),
        help_text="The project's slug; you must be its owner or a member.",
    )
    name = serializers.CharField(max_length=120)
    spec = SpecSerializer()
    window = WindowSerializer()
    container = ContainerSerializer()

    def __init__(self, *args: Any, projects: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if projects is not None:
            # Only projects the caller can see: another tenant's slug reads as "does not exist".
            self.fields["project"].queryset = projects  # type: ignore[attr-defined]

    def to_domain(self) -> dict[str, Any]:
        data = self.validated_data
        return {
            "project": data["project"],
            "name": data["name"],
            "spec": spec_from(data["spec"]),
            "window": Window(data["window"]["start"], data["window"]["end"]),
            "container": ContainerSpec(
                image=data["container"]["image"], command=data["container"]["command"], env=data["container"]["env"]
            ),
        }


class ReservationReasonSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=1000, required=False, allow_blank=True, default="")


class ExtendSerializer(ReservationReasonSerializer):
    ends_at = serializers.DateTimeField(help_text="The new end; later than the current one.")


class SpecOutSerializer(serializers.Serializer):
    gpu_model = serializers.CharField(source="gpu_model.name", allow_null=True, default=None)
    min_memory_mib = serializers.IntegerField(allow_null=True)
    gpu_count = serializers.IntegerField(allow_null=True)
    whole_servers = serializers.IntegerField(allow_null=True)


class ReservationSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id", read_only=True)
    project: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    created_by = serializers.CharField(source="created_by.username", default=None, read_only=True)
    spec = SpecOutSerializer(source="*", read_only=True)

    class Meta:
        model = Reservation
        fields = [
            "id",
            "project",
            "name",
            "state",
            "spec",
            "starts_at",
            "ends_at",
            "image",
            "command",
            "env",
            "created_by",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class AllocationSerializer(serializers.ModelSerializer):
    gpu = serializers.CharField(source="gpu.uuid")
    server = serializers.CharField(source="gpu.server.hostname")
    index = serializers.IntegerField(source="gpu.index")
    gpu_model = serializers.CharField(source="gpu.model.name")

    class Meta:
        model = Allocation
        fields = ["gpu", "server", "index", "gpu_model", "starts_at", "ends_at", "active", "released_at"]
        read_only_fields = fields


class ReservationEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = ReservationEvent
        fields = ["from_state", "to_state", "actor_label", "reason", "data", "at"]
        read_only_fields = fields


class ReservationDetailSerializer(ReservationSerializer):
    allocations = AllocationSerializer(many=True, read_only=True)
    events = ReservationEventSerializer(many=True, read_only=True)

    class Meta(ReservationSerializer.Meta):
        fields = [*ReservationSerializer.Meta.fields, "allocations", "events"]
        read_only_fields = fields
