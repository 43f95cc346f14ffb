"""Two views of the fleet: what a tenant needs to see availability, and everything for operators."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.inventory.choices import ServerState
from controlplane.inventory.models import Gpu, GpuModel, GpuModelMigProfile, MigDevice, Rack, Server, ServerEvent, Site
from controlplane.inventory.selectors import server_power


class SiteSerializer(serializers.ModelSerializer):
    class Meta:
        model = Site
        fields = ["id", "name", "location", "pue", "electricity_price_per_kwh"]


class RackSerializer(serializers.ModelSerializer):
    class Meta:
        model = Rack
        fields = ["id", "site", "name"]


class GpuModelMigProfileSerializer(serializers.ModelSerializer):
    billing_weight = serializers.DecimalField(
        max_digits=8,
        decimal_places=4,
        allow_null=True,
        read_only=True,
        help_text="The operator's override, credits per slice-hour; null: the default (the memory share).",
    )
    effective_billing_weight = serializers.DecimalField(
        source="effective_weight",
        max_digits=12,
        decimal_places=4,
        read_only=True,
        help_text="What a slice-hour of this profile is charged: the override, else the GPU model's weight x "
        "memory slices / 8.",
    )
    weight_overridden = serializers.SerializerMethodField(help_text="An operator set this profile's weight.")
    price_per_hour = serializers.DecimalField(
        max_digits=14,
        decimal_places=4,
        read_only=True,
        help_text="The GPU model's price scaled as the weight is (model price x effective weight / model weight).",
    )

    def get_weight_overridden(self, obj: GpuModelMigProfile) -> bool:
        return obj.billing_weight is not None

    class Meta:
        model = GpuModelMigProfile
        fields = [
            "name",
            "memory_mib",
            "compute_slices",
            "memory_slices",
            "billing_weight",
            "effective_billing_weight",
            "weight_overridden",
            "price_per_hour",
        ]
        read_only_fields = fields


class MigProfileWeightSerializer(serializers.Serializer):
    billing_weight = serializers.DecimalField(
        max_digits=8,
        decimal_places=4,
        min_value=Decimal("0"),
        allow_null=True,
        help_text="Credits per slice-hour of this profile; null returns it to the default (the memory share).",
    )


class GpuModelSerializer(serializers.ModelSerializer):
    mig_profiles = GpuModelMigProfileSerializer(
        many=True, read_only=True, help_text="The MIG profiles a GPU of this model rents as slices."
    )

    class Meta:
        model = GpuModel
        fields = [
            "id",
            "name",
            "product_name",
            "vendor",
            "memory_mib",
            "price_per_gpu_hour",
            "currency",
            "billing_weight",
            "tdp_watts",
            "mig_profiles",
        ]


class PresentMigDeviceList(serializers.ListSerializer):
    """A GPU's MIG devices as it has them now: a gone device stays only in the history (allocations name it).
    Filtered from the prefetched rows, so a list of GPUs costs no query per GPU."""

    def to_representation(self, data: Any) -> list[Any]:
        devices = data.all() if hasattr(data, "all") else data
        return super().to_representation([d for d in devices if d.present])


class GpuMigDeviceSerializer(serializers.ModelSerializer):
    class Meta:
        model = MigDevice
        list_serializer_class = PresentMigDeviceList
        fields = [
            "uuid",
            "profile",
            "profile_id",
            "gpu_instance_id",
            "compute_instance_id",
            "memory_mib",
            "compute_slices",
            "memory_slices",
            "placement_start",
        ]
        read_only_fields = fields


class MigModeSerializer(serializers.Serializer):
    current = serializers.BooleanField(help_text="MIG is on now.")
    pending = serializers.BooleanField(help_text="MIG after the next GPU reset; differs from current while pending.")


class GpuSerializer(serializers.ModelSerializer):
    model: serializers.SlugRelatedField = serializers.SlugRelatedField(slug_field="name", read_only=True)
    server: serializers.SlugRelatedField = serializers.SlugRelatedField(slug_field="hostname", read_only=True)
    mig_mode = serializers.SerializerMethodField(help_text="Null when the GPU cannot do MIG.")
    mig_devices = GpuMigDeviceSerializer(many=True, read_only=True)

    @extend_schema_field(MigModeSerializer(allow_null=True))
    def get_mig_mode(self, obj: Gpu) -> dict[str, bool] | None:
        if not obj.mig:
            return None
        return {"current": bool(obj.mig.get("current")), "pending": bool(obj.mig.get("pending"))}

    class Meta:
        model = Gpu
        fields = [
            "id",
            "uuid",
            "server",
            "index",
            "model",
            "product_name",
            "memory_mib",
            "numa_node",
            "nvlink_peers",
            "present",
            "health",
            "vendor",
            "mig_mode",
            "mig_devices",
        ]
        read_only_fields = fields


class MigDesiredSerializer(serializers.Serializer):
    enabled = serializers.BooleanField()
    layout = serializers.ListField(child=serializers.CharField(max_length=32), max_length=8)


class OperatorGpuSerializer(GpuSerializer):
    mig_desired = MigDesiredSerializer(allow_null=True, read_only=True, help_text="The layout last asked for.")

    class Meta(GpuSerializer.Meta):
        fields = [
            *GpuSerializer.Meta.fields,
            "mig_desired",
            "mig_generation",
            "mig_change",
            "pci_bus_id",
            "health_reasons",
            "needs_acknowledgement",
            "telemetry",
            "telemetry_at",
            "last_seen_at",
        ]
        read_only_fields = fields


class ServerGpuSerializer(GpuSerializer):
    """A GPU nested in its server: the server is implied."""

    class Meta(GpuSerializer.Meta):
        fields = [f for f in GpuSerializer.Meta.fields if f != "server"]
        read_only_fields = fields


class GpuInUseSerializer(serializers.Serializer):
    """The reservation holding a GPU now, for operators."""

    reservation = serializers.UUIDField()
    name = serializers.CharField()
    project = serializers.CharField(help_text="Project slug: the tenant.")
    project_name = serializers.CharField()
    state = serializers.CharField()
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField()


class OperatorServerGpuSerializer(OperatorGpuSerializer):
    in_use = serializers.SerializerMethodField(help_text="The reservation holding the GPU now; null when free.")

    class Meta(OperatorGpuSerializer.Meta):
        fields = [*(f for f in OperatorGpuSerializer.Meta.fields if f != "server"), "in_use"]
        read_only_fields = fields

    @extend_schema_field(GpuInUseSerializer(allow_null=True))
    def get_in_use(self, obj: Gpu) -> dict[str, object] | None:
        # The view reads every GPU's holder in one query (``reservations.holders.gpus_in_use``) and passes it
        # in the context; holders are reservations', an app above this one, so the view must.
        in_use: dict[int, dict[str, object]] = self.context["gpus_in_use"]
        return in_use.get(obj.pk)


class AffectedReservationSerializer(GpuInUseSerializer):
    """A reservation a drain leaves in place: the same facts as a GPU's holder, and its GPUs there."""

    running = serializers.BooleanField(help_text="Its window has begun.")
    gpus = serializers.ListField(child=serializers.IntegerField(), help_text="Indexes of its GPUs on this server.")


class DrainPreviewSerializer(serializers.Serializer):
    server = serializers.CharField()
    state = serializers.CharField()
    reservations = AffectedReservationSerializer(
        many=True,
        help_text="Reservations holding GPUs of the server now or later. Draining keeps them: running ones run to "
        "their end and booked ones still start here; only new bookings go elsewhere.",
    )
    unhealthy_gpus = serializers.ListField(
        child=serializers.IntegerField(), help_text="Indexes of GPUs that are unhealthy or missing."
    )


class ServerPowerSerializer(serializers.Serializer):
    drawn_w = serializers.FloatField(allow_null=True, help_text="Sum of the fresh power readings; null: none.")
    rated_w = serializers.IntegerField(
        allow_null=True, help_text="rated_power_w, else the sum of the GPUs' TDPs; null: unknown."
    )
    share = serializers.FloatField(allow_null=True, help_text="drawn_w / rated_w.")
    gpus_reporting = serializers.IntegerField()


class ServerSerializer(serializers.ModelSerializer):
    site = serializers.SerializerMethodField()
    rack: serializers.SlugRelatedField = serializers.SlugRelatedField(
        slug_field="name", allow_null=True, read_only=True
    )
    gpus = ServerGpuSerializer(many=True, read_only=True)

    class Meta:
        model = Server
        fields = ["id", "hostname", "state", "site", "rack", "simulated", "gpus"]
        read_only_fields = fields

    def get_site(self, obj: Server) -> str | None:
        return obj.rack.site.name if obj.rack else None


class OperatorServerSerializer(ServerSerializer):
    gpus = OperatorServerGpuSerializer(many=True, read_only=True)  # type: ignore[assignment]
    credential = serializers.SerializerMethodField()
    power = serializers.SerializerMethodField(
        help_text="Power drawn now (the GPUs' latest readings, fresh ones only) against the server's rated power."
    )
    # "" while the server is not offline.
    state_before_offline = serializers.ChoiceField(choices=ServerState.choices, allow_blank=True, read_only=True)

    class Meta(ServerSerializer.Meta):
        fields = [
            *ServerSerializer.Meta.fields,
            "state_before_offline",
            "agent_version",
            "facts",
            "heartbeat_interval_s",
            "last_heartbeat_at",
            "last_heartbeat_seq",
            "created_at",
            "credential",
            "rated_power_w",
            "power",
        ]
        read_only_fields = fields

    @extend_schema_field(ServerPowerSerializer)
    def get_power(self, obj: Server) -> dict[str, object]:
        return server_power(obj, list(obj.gpus.all()))

    @extend_schema_field(
        {
            "type": ["object", "null"],
            "properties": {"lookup": {"type": "string"}, "created_at": {"type": "string", "format": "date-time"}},
        }
    )
    def get_credential(self, obj: Server) -> dict[str, object] | None:
        # Prefetched as ``active_credentials`` by the view; never the secret, only which one is live.
        active = getattr(obj, "active_credentials", None)
        if active is None:
            active = list(obj.credentials.filter(revoked_at__isnull=True))
        if not active:
            return None
        return {"lookup": active[0].lookup, "created_at": active[0].created_at}


class ServerEventSerializer(serializers.ModelSerializer):
    gpu: serializers.SlugRelatedField = serializers.SlugRelatedField(slug_field="uuid", allow_null=True, read_only=True)

    class Meta:
        model = ServerEvent
        fields = ["id", "at", "kind", "gpu", "from_state", "to_state", "actor_label", "reason", "data"]
        read_only_fields = fields


class ServerStateChangeSerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=ServerState.choices)
    reason = serializers.CharField(max_length=2000)


class MigRequestSerializer(serializers.Serializer):
    """An operator's MIG layout for one GPU: one GPU instance per entry, each with one compute instance."""

    enabled = serializers.BooleanField(help_text="MIG on or off.")
    layout = serializers.ListField(
        child=serializers.RegexField(r"^[0-9a-z.+]{1,32}$", help_text='A GPU instance profile, e.g. "3g.40gb".'),
        max_length=8,
        default=list,
        help_text='GPU instance profiles, e.g. ["3g.40gb", "2g.20gb", "1g.10gb"]; empty with MIG off.',
    )
    reason = serializers.CharField(max_length=2000, required=False, default="")


class ReasonSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=2000)
