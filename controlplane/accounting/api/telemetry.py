"""Live telemetry of one reservation's GPUs, for its members: the latest sample and the per-minute series.

The fleet endpoints show telemetry to operators only, because a GPU's figures belong to whoever holds it at
the time. Here a tenant sees a GPU's figures only inside the period its reservation held that GPU: minutes
before the allocation began or after it ended (another tenant's time) are never returned, and the latest
sample only while the allocation is active and covers now.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal
from uuid import UUID

from django.db.models import Q
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.core.api.fields import AwareDateTimeField
from controlplane.core.api.query import query_data
from controlplane.core.errors import NotFound
from controlplane.fleet.models import GpuTelemetryMinute
from controlplane.reservations.models import Allocation, Reservation
from controlplane.reservations.selectors import reservations_visible_to

MINUTE = timedelta(minutes=1)
DEFAULT_LOOKBACK = timedelta(hours=1)
# A chart of a day per GPU is already 1,440 points; longer ranges are what the usage reports are for.
MAX_LOOKBACK = timedelta(hours=24)


def _floor_minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def _ceil_minute(at: datetime) -> datetime:
    floor = _floor_minute(at)
    return floor if floor == at else floor + MINUTE


@dataclass
class GpuTelemetry:
    allocation: Allocation
    held_from: datetime
    held_until: datetime
    latest: dict[str, Any] | None = None
    minutes: list[GpuTelemetryMinute] = field(default_factory=list)


@dataclass
class ReservationTelemetry:
    reservation: Reservation
    now: datetime
    since: datetime
    gpus: list[GpuTelemetry]


def _held_until(allocation: Allocation) -> datetime:
    # A cancelled or finished allocation stopped at its release, which may be before its booked end.
    if allocation.released_at is not None:
        return min(allocation.ends_at, allocation.released_at)
    return allocation.ends_at


def reservation_telemetry(
    *, user: Any, public_id: UUID | str, since: datetime | None, now: datetime
) -> ReservationTelemetry:
    """What ``user`` may see of the reservation's GPUs between ``since`` and ``now``.

    Two queries: the allocations (with the reservation, GPU, server and model joined) and the minutes of all
    of them at once. A reservation with no allocation costs one more, to tell "none yet" from "not yours".
    """
    since = since if since is not None else now - DEFAULT_LOOKBACK
    allocations = list(
        Allocation.objects.filter(reservation__in=reservations_visible_to(user), reservation__public_id=public_id)
        .select_related("reservation", "gpu__server", "gpu__model", "mig_device")
        .order_by("gpu__server__hostname", "gpu__index", "slice_start", "starts_at")
    )
    if allocations:
        reservation = allocations[0].reservation
    else:
        found = reservations_visible_to(user).filter(public_id=public_id).first()
        if found is None:
            # Another tenant's reservation reads exactly like one that does not exist.
            raise NotFound("No such reservation among yours.")
        reservation = found

    gpus: list[GpuTelemetry] = []
    series = Q()
    for allocation in allocations:
        held_from, held_until = allocation.starts_at, _held_until(allocation)
        item = GpuTelemetry(allocation=allocation, held_from=held_from, held_until=held_until)
        gpus.append(item)
        gpu = allocation.gpu
        if (
            allocation.active
            and held_from <= now < held_until
            and gpu.telemetry_at is not None
            and held_from <= gpu.telemetry_at <= now
        ):
            item.latest = {"at": gpu.telemetry_at, "values": gpu.telemetry}
        # A minute row folds every sample of that minute: only minutes wholly inside the period are this
        # tenant's. The current minute of a running allocation is partial, but all of it lies inside.
        first = max(_ceil_minute(held_from), _floor_minute(since))
        last = min(held_until - MINUTE, now)
        if first <= last:
            series |= Q(gpu_id=gpu.pk, minute__gte=first, minute__lte=last)

    if series:
        # A GPU's minutes go to every item on it: one per GPU, or one per slice of it the reservation holds
        # (the slices of one GPU share its readings, "readings": "parent").
        by_gpu: dict[int, list[GpuTelemetry]] = {}
        for item in gpus:
            by_gpu.setdefault(item.allocation.gpu_id, []).append(item)
        for row in GpuTelemetryMinute.objects.filter(series).order_by("gpu_id", "minute"):
            for item in by_gpu[row.gpu_id]:
                item.minutes.append(row)
    return ReservationTelemetry(reservation=reservation, now=now, since=since, gpus=gpus)


class TelemetryQuerySerializer(serializers.Serializer):
    since = AwareDateTimeField(
        required=False,
        help_text="Start of the minute series (ISO 8601); an hour ago by default, at most 24 hours back.",
    )

    def validate_since(self, value: datetime) -> datetime:
        if value < timezone.now() - MAX_LOOKBACK:
            raise serializers.ValidationError("At most 24 hours back; the usage reports cover longer ranges.")
        return value


class TelemetryLatestSerializer(serializers.Serializer):
    at = serializers.DateTimeField(help_text="When the agent took the sample.")
    values = serializers.DictField(
        help_text="DCGM field names (DCGM_FI_DEV_GPU_UTIL, ..._FB_USED, ..._POWER_USAGE, ...); a field the GPU "
        "does not support is absent.",
    )


class TelemetryMinuteSerializer(serializers.Serializer):
    minute = serializers.DateTimeField(help_text="Start of the minute (UTC).")
    samples = serializers.IntegerField()
    util_avg = serializers.FloatField(allow_null=True, help_text="Mean GPU utilization, percent.")
    util_max = serializers.FloatField(allow_null=True)
    fb_used_max_mib = serializers.FloatField(allow_null=True, help_text="Highest framebuffer memory used, MiB.")
    power_avg_w = serializers.FloatField(allow_null=True, help_text="Mean power draw, watts.")
    temp_max_c = serializers.FloatField(allow_null=True)
    sm_active_avg = serializers.FloatField(
        allow_null=True, help_text="Mean DCGM_FI_PROF_SM_ACTIVE (ratio 0-1); null where the GPU has no GPM."
    )
    tensor_active_avg = serializers.FloatField(allow_null=True, help_text="Mean DCGM_FI_PROF_PIPE_TENSOR_ACTIVE.")
    dram_active_avg = serializers.FloatField(allow_null=True, help_text="Mean DCGM_FI_PROF_DRAM_ACTIVE.")


class GpuTelemetrySerializer(serializers.Serializer):
    uuid = serializers.CharField(source="allocation.gpu.uuid")
    index = serializers.IntegerField(source="allocation.gpu.index")
    server = serializers.CharField(source="allocation.gpu.server.hostname")
    model = serializers.CharField(source="allocation.gpu.model.name")
    memory_mib = serializers.IntegerField(source="allocation.gpu.memory_mib")
    simulated = serializers.BooleanField(
        source="allocation.gpu.server.simulated", help_text="The figures come from the simulated GPU backend."
    )
    mig_device = serializers.CharField(
        source="allocation.mig_device.uuid", allow_null=True, default=None, help_text="A slice: its MIG- uuid."
    )
    mig_profile = serializers.CharField(
        source="allocation.mig_device.profile", allow_null=True, default=None, help_text='A slice: e.g. "1g.10gb".'
    )
    share = serializers.DecimalField(
        source="allocation.slice_fraction",
        max_digits=6,
        decimal_places=4,
        help_text="The part of the GPU held: 1 for a whole GPU, memory slices / 8 for a MIG slice.",
    )
    readings = serializers.SerializerMethodField(
        help_text='Whose figures these are: "gpu", the GPU\'s own; "parent", a MIG slice shown its parent GPU\'s '
        "readings whole (the agent samples per GPU; NVML gives no utilization per MIG device), which every slice "
        "of that GPU shares: read them with share."
    )
    held_from = serializers.DateTimeField()
    held_until = serializers.DateTimeField()
    live = serializers.SerializerMethodField(help_text="The allocation is active and covers now.")
    latest = TelemetryLatestSerializer(
        allow_null=True, help_text="Only while the allocation is active and covers now; null otherwise."
    )
    minutes = TelemetryMinuteSerializer(many=True)

    def get_readings(self, obj: GpuTelemetry) -> Literal["gpu", "parent"]:
        return "parent" if obj.allocation.mig_device_id is not None else "gpu"

    def get_live(self, obj: GpuTelemetry) -> bool:
        now = self.context["now"]
        return bool(obj.allocation.active and obj.held_from <= now < obj.held_until)


class ReservationTelemetrySerializer(serializers.Serializer):
    reservation = serializers.UUIDField(source="reservation.public_id")
    state = serializers.CharField(source="reservation.state")
    now = serializers.DateTimeField()
    since = serializers.DateTimeField()
    gpus = GpuTelemetrySerializer(many=True)


class ReservationTelemetryView(APIView):
    """The reservation's GPUs with their latest sample and per-minute series, for its project's members
    (viewers too) and operators. Another project's reservation is 404."""

    @extend_schema(
        parameters=[
            TelemetryQuerySerializer,
            OpenApiParameter("id", UUID, OpenApiParameter.PATH, description="The reservation's public id."),
        ],
        responses=ReservationTelemetrySerializer,
        summary="Live telemetry of a reservation's GPUs",
        description="Per GPU: the latest sample (DCGM field names) while the reservation holds it now, and the "
        "per-minute series (mean and peak utilization, peak memory, mean power, peak temperature) over the "
        "part of `[since, now]` inside the period the reservation held the GPU. Figures from outside that "
        "period belong to whoever held the GPU then and are never returned.",
    )
    def get(self, request: Request, id: UUID) -> Response:
        query = TelemetryQuerySerializer(data=query_data(request, TelemetryQuerySerializer))
        query.is_valid(raise_exception=True)
        now = timezone.now()
        result = reservation_telemetry(
            user=request.user, public_id=id, since=query.validated_data.get("since"), now=now
        )
        return Response(ReservationTelemetrySerializer(result, context={"now": now}).data)
